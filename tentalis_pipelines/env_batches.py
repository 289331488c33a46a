"""Environment batches: agent episodes as a batch's rollouts, the verifier's verdict as their review.

A batch whose tasks come from an agent environment (``environment = 'terminal'``, registered by
``tasks.batches.register_terminal_batch``) is of the environment batch kind (``stages/kinds.py``:
``EnvironmentBatch``), which hands the usual stages to the functions here:

* rollouts: G episodes per task (``reset(task)``, a policy turn and ``step(action)`` up to the turn
  limit, the final verifier) with :class:`~tentalis_pipelines.envs.policies.ChatPolicy` on the serving
  policy (the base model or the serving LoRA checkpoint) at the policy's temperature, all episodes of
  the batch in lock step (``envs.runner.run_episodes``). Each episode lands exactly as a session
  segment does (``envs.runner.episode_to_turns`` then ``training/multiturn.build_segments``): the
  prompt token ids, every token after them (assistant turns and, between them, the observations and
  template tokens), the assistant mask (1 on the sampled tokens only), the turn spans, the sampling
  log-probs, the finish reason and the policy version. The episode's id is its first rollout's id
  (one segment per episode with ``ChatPolicy``, which keeps the exact ids); ``steps`` holds the commands
  run, ``answer`` the submitted answer and ``parse_mode`` ``episode:<end kind>``
  (``submitted | turn_limit | hostile | error``);
* step_scores: one per assistant turn where the environment gives a deterministic signal
  (:func:`turn_step_score`, scorer ``environment``): a step whose ``info`` holds ``step_score`` (and
  ``step_reason``), that score (any environment family may set it); else terminal, the command's exit status (1 for 0, else 0)
  or 0 for a turn without a command; mini-SWE the same, and for a run of the tests whether they passed;
  BFCL, 0 when a call raised or returned an error, 1 when every call ran, 0 for a call the parser
  refused, nothing for a reply without calls (BFCL's way to end a user turn). They are recorded, not
  trained on: ``multi_turn`` rows take the episode's advantage (docs/environments.md);
* reviews: one per episode (:func:`build_environment_reviews`). The score is always the verifier's
  (the final check is the ground truth). With ``manager = 'verifier'`` critique and hint are the
  verdict's (``envs/verdicts.py``: ``verdict_review``, how the episode ended and what the check found, a
  short generic hint by failure type); with ``manager = 'llm'`` the configured llm manager writes them from the
  episode's transcript (``LLMManager.review_episodes``) and ``reviewer`` names it;
* trajectories: ``multi_turn`` rows; the G episodes of a task are one GRPO group (reward = the review's
  score + ``episode_format_weight`` x the format reward, :func:`episode_weights`; advantage = (reward -
  group mean) / (group std + eps)), the advantage on every assistant token of the episode and nothing
  on the observations.

* guided_rollouts (``--method guide``): each task whose every episode failed is resampled with the
  manager's hint, an annealed expert prefix of its demonstration, or both
  (:func:`build_environment_guided_rollouts`; ``training/episode_guide.py`` says where the help goes and
  what the student is trained on); the passed ones join their group in the trajectories.

Hinted OPD is not built for environment batches yet: their ``teacher_logprobs`` rows are empty.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from tentalis_pipelines.envs.base import Episode, end_kind
from tentalis_pipelines.envs.bfcl import ENVIRONMENT as BFCL
from tentalis_pipelines.envs.runner import episode_to_turns
from tentalis_pipelines.envs.swe_tasks import ENVIRONMENT as SWE
from tentalis_pipelines.envs.terminal_tasks import TerminalTask, solution_tools
from tentalis_pipelines.envs.verdicts import VERIFIER, verdict_review
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.rewards.advantages import group_advantages
from tentalis_pipelines.rewards.scoring import RewardWeights, combine
from tentalis_pipelines.training import episode_guide, multiturn
from tentalis_pipelines.training.policy_lag import with_policy_lag

if TYPE_CHECKING:
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.settings import Paths


def environments() -> tuple[str, ...]:
    """The environments whose batches this module runs: every environment family of the registry
    (``tasks/families``: terminal, bfcl, swe and those of installed packages)."""
    from tentalis_pipelines.tasks.families import environment_families

    return tuple(environment_families())


# The reward is the review's score alone (the verifier's verdict).
WEIGHTS = RewardWeights(outcome=0.0, format=0.0, process=0.0, manager=1.0)


def is_environment_batch(lake: Lakehouse, batch_id: str) -> bool:
    """Whether every task of the batch is an environment's (``environment`` names one of :func:`environments`)."""
    if not lake.exists("tasks"):
        return False
    envs = lake.read("tasks", batch_id=batch_id, columns=["environment"]).column("environment").to_pylist()
    known = environments()
    return bool(envs) and all(e in known for e in envs)


# --------------------------------------------------------------------------- step scores
STEP_SCORER = "environment"
CALL_LIKE = re.compile(r"[A-Za-z_][\w.]*\s*\(")  # something written as a call: name( or obj.name(


def turn_step_score(environment: str, turn: dict[str, Any]) -> tuple[float | None, str]:
    """(score, why) of one assistant turn of an episode transcript (``AssistantTurn`` as a dict: its
    ``action`` and ``info``): 1 for a step that worked, 0 for one that failed, None where the
    environment gives no deterministic signal (see the module doc)."""
    info, action = turn.get("info") or {}, turn.get("action")
    if "step_score" in info:  # an environment that scores its own turns (e.g. an installed family's)
        score = info["step_score"]
        return (None if score is None else float(score)), str(info.get("step_reason") or "the environment's step score")
    if action is None:
        if environment == BFCL:
            # A reply in words (or anything without a call in it) is BFCL's way to end a user turn: no
            # signal. A reply that tried a call the parser refused (os.system(...), an unknown tool,
            # positional arguments) is a failed step.
            if not info.get("format_error") or not CALL_LIKE.search(str(turn.get("text") or "")):
                return None, "no calls: the reply ends the user turn"
            return 0.0, f"refused call: {info['format_error']}"
        return 0.0, f"format error: {info.get('format_error') or 'no action'}"
    if environment == BFCL:
        calls, failed = len(info.get("calls") or []), int(info.get("failed_calls") or 0)
        return (0.0, f"{failed} of {calls} call(s) failed") if failed else (1.0, f"{calls} call(s) ran")
    code = info.get("exit_code")
    if code is None:
        return None, "no exit status"
    if info.get("timed_out"):
        return 0.0, "the command timed out"
    if environment == SWE and "run_tests.py" in str(action):
        return (1.0, "the tests pass") if code == 0 else (0.0, f"the tests fail (exit status {code})")
    return (1.0 if code == 0 else 0.0), f"exit status {code}"


def build_environment_step_scores(lake: Lakehouse, batch_id: str) -> tuple[int, dict[str, Any]]:
    """One ``step_scores`` row per assistant turn of every episode (``step_index`` = the turn, as in the
    rollouts' ``steps``; ``rollout_id`` = the episode id), scored by :func:`turn_step_score`."""
    rows = []
    for eid, ep in sorted(_episodes(lake, batch_id).items()):
        rec = ep["episode"]
        environment = str(rec.get("environment") or "")
        for i, turn in enumerate((rec.get("transcript") or {}).get("turns") or []):
            score, why = turn_step_score(environment, turn)
            step = turn.get("action") if turn.get("action") is not None else str(turn.get("text") or "")[:200]
            rows.append({"batch_id": batch_id, "rollout_id": eid, "step_index": i, "step_text": step, "scorer": STEP_SCORER,
                         "score": score, "votes": [] if score is None else [score], "rationale": why})
    n = lake.write_batch("step_scores", batch_id, rows)
    scored = [r["score"] for r in rows if r["score"] is not None]
    return n, {"num_step_scores": n, "scorer": STEP_SCORER, "scored_steps": len(scored),
               "mean_step_score": round(sum(scored) / len(scored), 3) if scored else None,
               "advantage": "not used: multi_turn rows take the episode's advantage"}


# --------------------------------------------------------------------------- rollouts
def episode_id(batch_id: str, task_id: str, policy_version: str, group_index: int) -> str:
    """The episode's id: the id its (first) rollout gets, as a task batch's rollout ids are made."""
    key = f"{batch_id}\x1f{task_id}\x1f{policy_version}\x1f{group_index}"
    return "r-" + hashlib.sha1(key.encode()).hexdigest()[:16]


def segment_rollout_id(episode: str, segment: int) -> str:
    return episode if segment == 0 else f"{episode}-{segment}"


def chat_policy(lake: Lakehouse, paths: Paths, policy: PolicySettings, backend=None):
    """(policy version, ChatPolicy) of the serving policy: the backend's model when given (a transformers
    backend), else the policy's model with the serving checkpoint's adapter, as the rollouts stage loads it."""
    from tentalis_pipelines.envs.policies import ChatPolicy
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.training import serving

    version, adapter = serving.serving_policy(lake)
    kwargs = {"max_new_tokens": policy.max_new_tokens, "temperature": policy.temperature, "top_p": policy.top_p, "seed": policy.seed}
    if backend is not None and getattr(backend, "model", None) is not None and getattr(backend, "tokenizer", None) is not None:
        return version, ChatPolicy(backend.model, backend.tokenizer, **kwargs)
    if policy.backend != "transformers":
        raise ValueError(f"environment batches run episodes with the transformers backend (the exact token ids of every turn); "
                         f"the policy's backend is {policy.backend!r}")
    return version, ChatPolicy.load(resolve_model(policy.model, paths.models), adapter, device=policy.device, dtype=policy.dtype, **kwargs)


def make_env(environment: str, max_turns: int):
    """A fresh environment of ``environment`` for episodes of at most ``max_turns`` turns: its family's
    (``tasks/families``: ``TaskFamily.make_env``)."""
    from tentalis_pipelines.tasks.families import family_of_environment

    return family_of_environment(environment).make_env(max_turns)


def task_from_row(row: dict) -> Any:
    """The environment task of a ``tasks`` row (its family's ``task_from_row``)."""
    from tentalis_pipelines.tasks.families import family_of_environment

    return family_of_environment(row["environment"]).task_from_row(row)


def load_tasks(lake: Lakehouse, batch_id: str) -> list[tuple[dict, Any]]:
    rows = sorted(lake.read("tasks", batch_id=batch_id).to_pylist(), key=lambda t: t["task_id"])
    if not rows:
        raise ValueError(f"batch {batch_id!r} has no tasks: materialise the tasks asset for it first")
    known = environments()
    unknown = sorted({r["environment"] for r in rows} - set(known))
    if unknown:
        raise ValueError(f"batch {batch_id!r} has tasks of unknown environments {unknown}; known: {', '.join(known)}")
    return [(r, task_from_row(r)) for r in rows]


def episode_record(episode: Episode, task: Any) -> dict[str, Any]:
    """What the ``episode`` column of its rollouts holds: how it ended and the verifier's verdict, and the
    episode's transcript (``Episode.transcript``: every message and turn without the token ids, which the
    segment holds), so that ``episodes.py`` exports the episode whole (ATIF)."""
    return {"environment": episode.environment, "end_reason": episode.end_reason, "passed": bool(episode.verdict.passed),
            "reward": float(episode.verdict.reward), "detail": episode.verdict.detail, "turns": episode.turns_used,
            "max_turns": episode.max_turns, "format_errors": sum(1 for t in episode.turns if t.action is None),
            "check_kind": getattr(task, "kind", "answer"), "level": task.level, "transcript": episode.transcript(),
            # the programs of the task's known solution (terminal tasks): what the verifier's hint may name
            **({"tools": solution_tools(task.solution)} if isinstance(task, TerminalTask) and task.solution else {}),
            # the mini-SWE reward-hacking detector's findings (swe_tamper), for forensics.verifier_tampering
            "tampering": next((t.info["tampering"] for t in reversed(episode.turns) if t.info.get("tampering")), [])}


def _transcript(messages: list[dict]) -> str:
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in messages if isinstance(m, dict))


def episode_rollout_rows(batch_id: str, task: Any, group_index: int, episode: Episode, *, policy_version: str, model: str,
                         temperature: float, max_tokens: int | None, created_at) -> list[dict]:
    """An episode's rollout rows (one per segment; one with ``ChatPolicy``), shaped as a sessions batch's."""
    eid = episode_id(batch_id, task.task_id, policy_version, group_index)
    turns = episode_to_turns(episode, session_id=eid, model=model, policy_version=policy_version, backend="transformers",
                             temperature=temperature, max_tokens=max_tokens, created_at=created_at)
    segments = multiturn.build_segments(eid, turns)
    answer = next((t.info.get("answer") for t in reversed(episode.turns) if t.info.get("answer") is not None), None)
    common = {"batch_id": batch_id, "task_id": task.task_id, "group_index": group_index, "policy_version": policy_version,
              "backend": "transformers", "model": model, "prompt_text": _transcript(json.loads(turns[0]["messages"])) if turns else "",
              "steps": [t.action if t.action is not None else "" for t in episode.turns], "answer": answer,
              "parse_mode": f"episode:{end_kind(episode.end_reason)}", "temperature": temperature, "created_at": created_at,
              "session_id": eid, "episode": json.dumps(episode_record(episode, task), sort_keys=True)}
    if not segments:  # no turn with tokens (the episode failed before its first turn): a row without tokens
        return [{**common, "rollout_id": eid, "completion": "", "prompt_tokens": 0, "completion_tokens": 0, "completion_token_ids": [],
                 "sampling_logprobs": None, "finish_reason": "error", "seconds": 0.0, "prompt_token_ids": [], "assistant_mask": [],
                 "turn_spans": []}]
    by_id = {t["turn_id"]: t for t in turns}
    texts = {f"{eid}-{t.index}": t.text for t in episode.turns}
    rows = []
    for seg in segments:
        seg_turns = [by_id[s.turn_id] for s in seg.spans]
        rows.append({**common, "rollout_id": segment_rollout_id(eid, seg.segment), "policy_version": seg.policy_version,
                     "completion": "\n".join(texts[s.turn_id] for s in seg.spans), "prompt_tokens": len(seg.prompt_ids),
                     "completion_tokens": len(seg.completion_ids), "completion_token_ids": seg.completion_ids,
                     "sampling_logprobs": seg.old_logps, "finish_reason": seg_turns[-1].get("finish_reason") or "stop",
                     "seconds": sum((t.get("latency_ms") or 0.0) for t in seg_turns) / 1000.0, "prompt_token_ids": seg.prompt_ids,
                     "assistant_mask": seg.assistant_mask,
                     "turn_spans": [{"turn_id": s.turn_id, "turn_index": s.turn_index, "start": s.start, "end": s.end} for s in seg.spans]})
    return rows


def build_environment_rollouts(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, backend=None) -> tuple[int, dict[str, Any]]:
    """``policy.num_generations`` episodes per task of the batch, in lock step, landed as multi-turn rollouts."""
    from tentalis_pipelines.envs.runner import run_episodes

    tasks = load_tasks(lake, batch_id)
    version, chat = chat_policy(lake, paths, policy, backend)
    runs = [(row, task, g) for row, task in tasks for g in range(policy.num_generations)]
    by_env: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, (row, _, _) in enumerate(runs):
        by_env[(row["environment"], int(json.loads(row["metadata"]).get("max_turns", 8)))].append(i)
    t0 = time.perf_counter()
    episodes: dict[int, Episode] = {}
    for (environment, max_turns), idx in by_env.items():
        done = run_episodes(lambda e=environment, m=max_turns: make_env(e, m), [runs[i][1] for i in idx], chat.generate_batch)
        episodes.update(zip(idx, done))
    wall = time.perf_counter() - t0
    created = now_utc()
    rows = []
    for i, (_, task, g) in enumerate(runs):
        ep = episodes[i]
        if ep.task_id != task.task_id:
            raise RuntimeError(f"episode of {ep.task_id} came back for {task.task_id}")
        rows += episode_rollout_rows(batch_id, task, g, ep, policy_version=version, model=policy.model_name,
                                     temperature=policy.temperature, max_tokens=policy.max_new_tokens, created_at=created)
    n = lake.write_batch("rollouts", batch_id, rows)
    eps = [episodes[i] for i in range(len(runs))]
    ends: dict[str, int] = defaultdict(int)
    levels: dict[int, list[bool]] = defaultdict(list)
    for (_, task, _), e in zip(runs, eps):
        ends[end_kind(e.end_reason)] += 1
        levels[task.level].append(e.passed)
    return n, {"num_rollouts": n, "episodes": len(eps), "policy_version": version, "passed": sum(e.passed for e in eps),
               "success_rate": round(sum(e.passed for e in eps) / max(len(eps), 1), 4),
               "success_per_level": {str(lv): round(sum(v) / len(v), 4) for lv, v in sorted(levels.items())},
               "end_reasons": dict(sorted(ends.items())), "turns_mean": round(sum(e.turns_used for e in eps) / max(len(eps), 1), 3),
               "segments_per_episode": round(n / max(len(eps), 1), 3), "seconds": round(wall, 2),
               "assistant_tokens": sum(sum(r["assistant_mask"]) for r in rows),
               "context_tokens": sum(len(r["assistant_mask"]) - sum(r["assistant_mask"]) for r in rows),
               # what decoding cost: the KV budget and the peak held under it, prefill, reuse, evictions
               "decoding": chat.stats}


# --------------------------------------------------------------------------- reviews, trajectories
def _episodes(lake: Lakehouse, batch_id: str) -> dict[str, dict]:
    """episode id -> (the task id, group index and episode record of its rollouts), from the rollouts."""
    out = {}
    for r in lake.read("rollouts", batch_id=batch_id, columns=["session_id", "task_id", "group_index", "episode"]).to_pylist():
        out.setdefault(r["session_id"], {"task_id": r["task_id"], "group_index": r["group_index"],
                                         "episode": json.loads(r["episode"] or "{}")})
    return out


# An observation in the manager's transcript keeps at most this many characters (a listing or a tool's result
# can be long; the whole transcript is then clipped by ``llm_manager.clip_transcript`` to fit an 8k context).
REVIEW_OBSERVATION_CHARS = 600


def review_transcript(record: dict[str, Any]) -> str:
    """What the llm manager reads of an episode (its ``episode`` record): the task (the user's messages
    before the first turn), each assistant turn and what came back (observations cut to
    :data:`REVIEW_OBSERVATION_CHARS`), and the final check's outcome. The system prompt (BFCL: 4-8k tokens
    of function docs) and demonstrations are left out so the work itself fits the manager's context."""
    transcript = record.get("transcript") or {}
    lines = []
    for m in transcript.get("messages") or []:
        kind = m.get("kind") or m.get("role")
        if kind in ("system", "demonstration"):
            continue
        text = str(m.get("content") or "")
        if m.get("role") != "assistant" and kind != "instruction" and len(text) > REVIEW_OBSERVATION_CHARS:
            text = text[:REVIEW_OBSERVATION_CHARS] + f" [... {len(text) - REVIEW_OBSERVATION_CHARS} characters cut ...]"
        lines.append(f"{'agent' if m.get('role') == 'assistant' else kind}: {text}")
    outcome = "passed" if record.get("passed") else "failed"
    lines.append(f"final check: {outcome} ({record.get('end_reason') or 'unknown end'}): {record.get('detail') or 'no detail'}")
    return "\n".join(lines)


def build_environment_reviews(lake: Lakehouse, batch_id: str, manager: str = VERIFIER, llm_manager=None) -> tuple[int, dict[str, Any]]:
    """One review per episode, ``rollout_id`` = the episode id (= its first rollout's id), ``session_id`` =
    the episode id. The score is the verifier's verdict; critique and hint are the verdict's
    (``envs.verdicts.verdict_review``), or with ``manager = 'llm'`` the llm manager's (``llm_manager``: an
    ``LLMManager`` or a function that builds one) from :func:`review_transcript`, the verdict's where it
    wrote nothing (the critique says so). Other managers (human, hackable) have nothing to say about an
    episode: the verdict's review, ``configured_manager`` in the metadata says so."""
    created = now_utc()
    episodes = sorted(_episodes(lake, batch_id).items())
    llm_texts: list[tuple[str, str]] | None = None
    reviewer = VERIFIER
    if manager == "llm":
        if llm_manager is None:
            raise ValueError("manager 'llm' needs a judge model: set the review resource's judge settings")
        if callable(llm_manager):  # a function that builds it: the model loads only when it is used
            llm_manager = llm_manager()
        llm_texts = llm_manager.review_episodes([(review_transcript(ep["episode"]), float(ep["episode"].get("reward") or 0.0))
                                                 for _, ep in episodes])
        reviewer = f"llm-manager:{getattr(llm_manager, 'version', 'base')}"
    from tentalis_pipelines.tasks.families import environment_families

    family_hints = {env: dict(f.hints) for env, f in environment_families().items()}  # each family's own wording
    rows, failures = [], defaultdict(int)
    for k, (eid, ep) in enumerate(episodes):
        rec = ep["episode"]
        review = verdict_review(passed=bool(rec.get("passed")), reward=float(rec.get("reward") or 0.0), detail=str(rec.get("detail") or ""),
                                end_reason=str(rec.get("end_reason") or "error: no episode record"),
                                check_kind=str(rec.get("check_kind") or "answer"), format_errors=int(rec.get("format_errors") or 0),
                                turns=int(rec.get("turns") or 0), max_turns=int(rec.get("max_turns") or 0),
                                tools=[str(t) for t in rec.get("tools") or []],
                                family_hints=family_hints.get(str(rec.get("environment") or "")))
        failures[review.pop("failure")] += 1
        if llm_texts is not None:
            critique, hint = llm_texts[k]
            review["manager"] = "llm"
            review["critique"] = critique or f"(the manager wrote no critique; the verifier's) {review['critique']}"
            review["hint"] = hint or review["hint"]
        rows.append({"batch_id": batch_id, "rollout_id": eid, **review, "created_at": created, "session_id": eid, "reviewer": reviewer,
                     "rubric": f"{rec.get('environment') or 'env'}-final-state",
                     "review_id": ("llm-" if llm_texts is not None else "verdict-") + hashlib.sha1(f"{batch_id}\x1f{eid}".encode()).hexdigest()[:16]})
    n = lake.write_batch("reviews", batch_id, rows)
    return n, {"num_reviews": n, "manager": "llm" if llm_texts is not None else VERIFIER, "reviewer": reviewer,
               "score_mean": round(sum(r["score"] for r in rows) / max(n, 1), 4), "outcomes": dict(sorted(failures.items()))}


def episode_weights(format_weight: float = 0.0) -> RewardWeights:
    """The reward of an episode: the verifier's score (the review's) plus ``format_weight`` times the
    format reward (:func:`episode_guide.format_share`: the share of its turns with a well-formed action or
    tool call, ToolRL's format term). The format reward is its own component, recorded on every row
    (``format_reward``) beside the outcome (``outcome_reward``: 1 when the final check passed); the gate
    and the benchmarks read the outcome only, so a policy that formats every turn and solves nothing
    scores 0 there whatever this weight."""
    if format_weight < 0:
        raise ValueError(f"episode_format_weight must be >= 0, got {format_weight}")
    return RewardWeights(outcome=0.0, format=float(format_weight), process=0.0, manager=1.0)


def guided_episode_successes(lake: Lakehouse, batch_id: str) -> list[dict]:
    """The batch's guided episodes (``guided_rollouts`` rows with an ``episode``) that passed and can be
    trained on (one segment: ``turn_spans`` set); none when the table does not exist yet."""
    if not lake.exists("guided_rollouts"):
        return []
    names = lake.dataset("guided_rollouts").schema.names
    if "episode" not in names:
        return []
    return [g for g in lake.read("guided_rollouts", batch_id=batch_id).to_pylist()
            if g.get("episode") and g["correct"] and g.get("turn_spans")]


def build_environment_trajectories(lake: Lakehouse, batch_id: str, *, scale_rewards: str = "group", dynamic_sampling: bool = False,
                                   w_rl: float = 1.0, w_opd: float = 0.0, format_weight: float = 0.0) -> tuple[int, dict[str, Any]]:
    """``multi_turn`` rows: the G episodes of a task are its GRPO group (reward = the episode's review
    score + ``format_weight`` x its format reward, :func:`episode_weights`); an episode's advantage is on
    every assistant token of its rollouts, 0 and masked elsewhere. With ``--method guide`` the guided
    episodes of an all-fail group that passed (:func:`guided_episode_successes`) join its group, so the
    group has signal; their rows name what produced them (``guide_hint_id``) and train without the hint
    (the trainer's guided ratio)."""
    weights = episode_weights(format_weight)
    scores: dict[str, float] = {}
    for r in lake.read("reviews", batch_id=batch_id).to_pylist():
        scores[r["rollout_id"]] = float(r["score"])  # one per episode (the check_reviews check)
    records = {eid: ep["episode"] for eid, ep in _episodes(lake, batch_id).items()}
    formats = {eid: episode_guide.format_share(int(rec.get("turns") or 0), int(rec.get("format_errors") or 0)) for eid, rec in records.items()}
    passed = {eid: bool(rec.get("passed")) for eid, rec in records.items()}
    rollouts = sorted(lake.read("rollouts", batch_id=batch_id).to_pylist(), key=lambda r: (r["task_id"], r["group_index"], r["rollout_id"]))
    guided = guided_episode_successes(lake, batch_id)
    for g in guided:
        rec = json.loads(g["episode"])
        scores[g["rollout_id"]] = float(g["manager_score"])
        formats[g["rollout_id"]] = float(g["format_score"])
        passed[g["rollout_id"]] = bool(rec.get("passed"))
    guided_ids = {g["rollout_id"]: g["hint_id"] for g in guided}
    # A guided episode is its own rollout row (its table's): the same columns the loop below reads.
    rollouts += [{**g, "session_id": g["rollout_id"]} for g in sorted(guided, key=lambda g: (g["task_id"], g["group_index"], g["rollout_id"]))]
    rewards = {e: combine(weights, outcome=0.0, format=formats.get(e, 0.0), process=None, manager=scores[e]) for e in scores}
    episodes = sorted({(r["task_id"], r["group_index"], r["session_id"]) for r in rollouts if r["session_id"] in scores})
    adv, signal = group_advantages([t for t, _, _ in episodes], [rewards[e] for _, _, e in episodes], scale_rewards=scale_rewards)
    by_episode = {e: (a, s) for (_, _, e), a, s in zip(episodes, adv, signal)}
    created = now_utc()
    rows, skipped = [], []
    for ro in rollouts:
        eid = ro["session_id"]
        spans = ro["turn_spans"] or []
        if eid not in by_episode or not spans:
            skipped.append(ro["rollout_id"])
            continue
        a, has_signal = by_episode[eid]
        reward = rewards[eid]
        mask, token_adv = multiturn.segment_token_arrays(len(ro["completion_token_ids"]), spans, {s["turn_id"]: a for s in spans})
        rows.append({
            "batch_id": batch_id, "rollout_id": ro["rollout_id"], "task_id": ro["task_id"], "group_index": ro["group_index"],
            "policy_version": ro["policy_version"], "outcome_reward": 1.0 if passed.get(eid) else 0.0,
            "format_reward": formats.get(eid, 0.0), "process_reward": None,
            "step_rewards": [], "manager_score": scores[eid], "overlong_penalty": 0.0, "reward": reward, "reward_weights": weights.to_json(),
            "advantage": a, "step_advantages": [], "advantage_mode": "episode",
            "kept": bool(has_signal) if dynamic_sampling else True, "created_at": created, "opd_signal": None,
            "w_rl": float(w_rl), "w_opd": float(w_opd), "kind": "multi_turn", "loss_mask": mask, "token_advantages": token_adv,
            "turn_rewards": [reward] * len(spans), "turn_advantages": [a] * len(spans), "guide_hint_id": guided_ids.get(ro["rollout_id"]),
        })
    n = lake.write_batch("trajectories", batch_id, with_policy_lag(lake, rows))  # how stale each row is
    groups = {t for t, _, _ in episodes}
    return n, {"num_trajectories": n, "kind": "multi_turn", "episodes": len(episodes), "groups": len(groups),
               "groups_with_signal": len({t for (t, _, e) in episodes if by_episode[e][1]}), "kept": sum(r["kept"] for r in rows),
               "guided_rows": sum(r["guide_hint_id"] is not None for r in rows),
               "format_weight": float(format_weight),
               "format_rate": round(sum(r["format_reward"] for r in rows) / max(n, 1), 4),
               "skipped_rollouts": ", ".join(skipped[:10]) or None,
               "reward_mean": round(sum(r["reward"] for r in rows) / max(n, 1), 4)}


# --------------------------------------------------------------------------- guided resampling
def level_success(lake: Lakehouse, batch_id: str) -> dict[int, float]:
    """Per level, the share of the batch's episodes that passed: the policy's recent success on the level,
    which the expert prefix's length anneals with (``episode_guide.prefix_turns``)."""
    by_level: dict[int, list[bool]] = defaultdict(list)
    for ep in _episodes(lake, batch_id).values():
        rec = ep["episode"]
        by_level[int(rec.get("level") or 0)].append(bool(rec.get("passed")))
    return {lv: sum(v) / len(v) for lv, v in by_level.items()}


def verified_demonstrations(lake: Lakehouse, batch_id: str) -> dict[str, tuple[str, list[str]]]:
    """The batch's verified demonstrations from the ``demonstrations`` table (an oracle, a stronger model
    or a person, each replayed in the environment; ``tentalis demos``), the newest per task:
    ``{task_id: (source, actions)}``. The source names the row (``<source>#<demonstration_id>``), so a
    prefixed episode's row leads back to the demonstration that gave its prefix. Unverified rows and
    rows with no actions are never used; without the table, ``{}`` (the scripted oracle is used)."""
    if not lake.exists("demonstrations"):
        return {}
    rows = lake.read("demonstrations", batch_id=batch_id,
                     columns=["demonstration_id", "task_id", "source", "actions", "verified", "created_at"]).to_pylist()
    out: dict[str, tuple[str, list[str]]] = {}
    for r in sorted(rows, key=lambda r: (str(r["created_at"] or ""), r["demonstration_id"])):
        if r["verified"] and r["actions"]:
            out[r["task_id"]] = (f"{r['source']}#{r['demonstration_id']}", [str(a) for a in r["actions"]])
    return out


def plan_guided_episodes(lake: Lakehouse, batch_id: str, config) -> tuple[list[dict], Counter, list[tuple[str, str]], dict[int, float]]:
    """Which all-fail groups of the batch are resampled and with what: ``(plans, skipped reasons, the
    all-fail groups, the success per level)``. A plan names its task, policy version, the chosen hint
    (``guide.GroupHint`` or None), the hint text put in context (``in_context``; "" for the ablation),
    k and the prefix replies, the demonstration's source, its rescue kind and its ``rescue_id``. Groups
    with a success are never planned, held-out tasks never (see :func:`build_environment_guided_rollouts`)."""
    from tentalis_pipelines.envs.guided import demonstration
    from tentalis_pipelines.training import guide
    from tentalis_pipelines.training.opd import hint_id

    rescue = config.guide_rescue
    tasks = {row["task_id"]: (row, task) for row, task in load_tasks(lake, batch_id)}
    episodes = _episodes(lake, batch_id)
    versions = {r["session_id"]: r["policy_version"]
                for r in lake.read("rollouts", batch_id=batch_id, columns=["session_id", "policy_version"]).to_pylist()}
    reviews = {r["rollout_id"]: r for r in lake.read("reviews", batch_id=batch_id).to_pylist()}
    missing = sorted(set(episodes) - set(reviews))
    if missing:
        raise ValueError(f"{len(missing)} episodes of batch {batch_id!r} have no review (e.g. {missing[0]}): materialise reviews first")
    ordered = sorted(episodes.items(), key=lambda kv: (kv[1]["task_id"], kv[1]["group_index"]))
    failed = guide.all_fail_groups((ep["task_id"], versions[eid], bool(ep["episode"].get("passed"))) for eid, ep in ordered)
    success = level_success(lake, batch_id)
    stored = verified_demonstrations(lake, batch_id) if rescue in ("prefix", "both") else {}
    plans: list[dict] = []
    skipped: Counter = Counter()
    for task_id, version in failed:
        row, task = tasks[task_id]
        if episode_guide.task_split(row) == episode_guide.HELD_OUT_SPLIT:
            skipped["held-out task: never given a hint or a prefix"] += 1
            continue
        hint = None
        if rescue in ("hint", "both"):
            group = [{**reviews[eid], "group_index": ep["group_index"]} for eid, ep in ordered if ep["task_id"] == task_id]
            hint, why = guide.choose_hint(task_id, version, group, episode_guide.hint_references(row))
            if hint is None and rescue == "hint":
                skipped[why] += 1
                continue
        source, demo, k = "", [], 0
        if rescue in ("prefix", "both"):
            # a reviewed demonstration (a row with lineage) first; else the task's scripted oracle
            source, demo = stored.get(task_id) or demonstration(task)
            k = episode_guide.prefix_turns(len(demo), success.get(int(task.level), 0.0), max_fraction=config.guide_prefix_max_fraction,
                                           threshold=config.guide_prefix_threshold)
            # The prefix's turns count against the turn limit: the policy keeps at least one.
            k = max(0, min(k, int(json.loads(row["metadata"]).get("max_turns", 8)) - 1))
        if hint is None and k == 0:
            skipped["no usable hint and the prefix annealed to 0 turns"] += 1
            continue
        in_context = hint.hint if hint is not None and config.guide_with_hint else ""
        hid = hint_id(hint.source_rollout_id, hint.hint_source, hint.hint) if hint is not None else None
        kind = "both" if in_context and k else "hint" if in_context else "prefix" if k else "resample"
        plans.append({"row": row, "task": task, "version": version, "hint": hint, "in_context": in_context, "k": k,
                      "prefix": demo[:k], "source": source if k else "", "kind": kind,
                      "rescue_id": episode_guide.rescue_id(task_id, version, "hint" if kind in ("hint", "resample") else kind, hid, source, k)})
    return plans, skipped, failed, success


def build_environment_guided_rollouts(lake: Lakehouse, paths: Paths, batch_id: str, policy: PolicySettings, config,
                                      backend=None) -> tuple[int, dict[str, Any]]:
    """``--method guide`` on an environment batch: each group (task) in which every episode failed is
    resampled, ``config.guide_generations`` episodes with help in the first observation
    (``envs/guided.GuidedEnv``; ``training/episode_guide.py`` says where and why):

    * ``guide_rescue = hint``: the manager's hint (``guide.choose_hint`` over the group's reviews: the
      verifier's failure-type hint, the llm manager's or the trained manager's), screened by the OPD
      hint filter and, for terminal tasks, refused when it contains the expected output
      (``episode_guide.hint_references``); a group without a usable hint is not resampled;
    * ``prefix``: the first k turns of the task's verified demonstration (the ``demonstrations`` table's
      newest, :func:`verified_demonstrations`; else its scripted oracle, ``guided.demonstration``),
      k from the level's success in this batch (``episode_guide.prefix_turns``; a group whose k is 0
      is not resampled);
    * ``both``: the hint and the prefix (the hint alone where k is 0, the prefix alone without a hint).

    ``guide_with_hint = false`` (the ablation) picks the hint as above but leaves it out of the context.
    Held-out tasks are never resampled. Every guided episode is a ``guided_rollouts`` row (passed or not,
    so SQL counts the rescued groups) naming its rescue, hint, demonstration and k; a passed one becomes
    a trajectory of its group (``build_environment_trajectories``), trained on its un-hinted prompt with
    the hinted sampler's log-probs as the behaviour policy (``episode_guide.guided_sample``)."""
    from tentalis_pipelines.envs.guided import GuidedEnv
    from tentalis_pipelines.envs.runner import prompt_messages_per_turn, run_episodes

    plans, skipped, failed, success = plan_guided_episodes(lake, batch_id, config)
    for p in plans:  # the plan skips held-out tasks; a plan that holds one anyway stops the stage loudly
        episode_guide.check_trainable(p["task"])
    chat = None
    if plans:
        serving, chat = chat_policy(lake, paths, policy, backend)
        for p in [p for p in plans if p["version"] != serving]:
            skipped[f"sampled by {p['version']}, not the serving policy {serving}"] += 1
        plans = [p for p in plans if p["version"] == serving]
    created = now_utc()
    rows = []
    by_env: dict[tuple[str, int], list[tuple[dict, int]]] = defaultdict(list)
    for p in plans:
        for i in range(config.guide_generations):
            by_env[(p["row"]["environment"], int(json.loads(p["row"]["metadata"]).get("max_turns", 8)))].append((p, i))
    for (environment, max_turns), runs in by_env.items():
        envs = [GuidedEnv(make_env(environment, max_turns), hint=p["in_context"], prefix=p["prefix"]) for p, _ in runs]
        made = iter(envs)  # run_episodes makes one environment per task, in order
        done = run_episodes(made.__next__, [p["task"] for p, _ in runs], chat.generate_batch)
        for (p, i), env, ep in zip(runs, envs, done):
            rows.append(_guided_episode_row(batch_id, p, i, env, ep, chat.tokenizer, policy, created, prompt_messages_per_turn))
    n = lake.write_batch("guided_rollouts", batch_id, rows)
    rescued = {r["task_id"] for r in rows if r["correct"]}
    return n, {"all_fail_groups": len(failed), "resampled_groups": len(plans), "rescued_groups": len(rescued),
               "guided_episodes": n, "guided_successes": sum(r["correct"] for r in rows), "rescue": config.guide_rescue,
               "rescues": dict(Counter(p["kind"] for p in plans)),
               "prefix_turns": {p["task"].task_id: p["k"] for p in plans if p["k"]} or None,
               "level_success": {str(lv): round(v, 4) for lv, v in sorted(success.items())},
               "not_resampled": ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items())) or "none",
               "untrainable": sum(1 for r in rows if r["correct"] and not r["turn_spans"])}


def _guided_episode_row(batch_id: str, plan: dict, index: int, env, episode: Episode, tokenizer, policy, created, prompts_of) -> dict:
    """One guided episode as a ``guided_rollouts`` row; its token columns hold the student's sample
    (``episode_guide.guided_sample``) when the episode is one segment, else nothing (not trained on: a
    later segment's prompt would hold the hint)."""
    from tentalis_pipelines.training import guide

    task, hint = plan["task"], plan["hint"]
    eid = guide.guided_rollout_id(batch_id, task.task_id, plan["version"], plan["rescue_id"], index)
    turns = episode_to_turns(episode, session_id=eid, model=policy.model_name, policy_version=plan["version"], backend="transformers",
                             temperature=policy.temperature, max_tokens=policy.max_new_tokens, created_at=created)
    segments = multiturn.build_segments(eid, turns)
    behaviour_prompt = prompts_of(episode)[0] if episode.turns else []
    plain_prompt = [{"role": m["role"], "content": m["content"]} for m in env.plain_messages]
    sample = {"prompt_token_ids": [], "completion_token_ids": [], "assistant_mask": [], "behaviour_logprobs": None}
    spans: list[dict] = []
    if len(segments) == 1:
        seg = segments[0]
        spans = [{"turn_id": s.turn_id, "turn_index": s.turn_index, "start": s.start, "end": s.end} for s in seg.spans]
        # The hint is in the first prompt only: the student's prompt is the same messages rendered without it
        # (a prefix alone changes nothing there: the prompt the policy saw is kept token for token).
        plain_ids = episode_guide.render_prompt_ids(tokenizer, plain_prompt) if plan["in_context"] else seg.prompt_ids
        sample = episode_guide.guided_sample(plain_ids, seg.completion_ids, spans,
                                             {f"{eid}-{t.index}": t.logprobs for t in episode.turns})
    answer = next((t.info.get("answer") for t in reversed(episode.turns) if t.info.get("answer") is not None), None)
    fmt = sum(1 for t in episode.turns if t.action is None)
    return {
        "batch_id": batch_id, "rollout_id": eid, "task_id": task.task_id, "group_index": index, "policy_version": plan["version"],
        "hint_id": plan["rescue_id"], "hint_source": hint.hint_source if hint is not None else "", "hint": hint.hint if hint is not None else "",
        "source_rollout_id": hint.source_rollout_id if hint is not None else None, "hint_votes": hint.votes if hint is not None else None,
        "hint_reward": None, "prompt_text": _transcript(plain_prompt), "behaviour_prompt_text": _transcript(behaviour_prompt),
        "completion": "\n".join(t.text for t in episode.turns), "steps": [t.action if t.action is not None else "" for t in episode.turns],
        "answer": answer, "completion_tokens": len(sample["completion_token_ids"]), "completion_token_ids": sample["completion_token_ids"],
        "behaviour_logprobs": sample["behaviour_logprobs"], "finish_reason": turns[-1]["finish_reason"] if turns else "error",
        "temperature": float(policy.temperature), "correct": bool(episode.passed),
        "format_score": episode_guide.format_share(episode.turns_used, fmt), "step_rewards": [],
        "manager_score": float(episode.verdict.reward), "created_at": created,
        "rescue": plan["kind"], "prefix_turns": plan["k"], "demo_source": plan["source"] or None,
        "prompt_token_ids": sample["prompt_token_ids"], "assistant_mask": sample["assistant_mask"], "turn_spans": spans,
        "session_id": eid, "episode": json.dumps(episode_record(episode, task), sort_keys=True),
    }


# --------------------------------------------------------------------------- checks
def episodes_per_task(lake: Lakehouse, batch_id: str, num_generations: int) -> tuple[bool, str, dict[str, int]]:
    """Every task has exactly ``num_generations`` episodes (distinct group indices), and every rollout
    names a task of the batch."""
    tasks = set(lake.read("tasks", batch_id=batch_id, columns=["task_id"]).column("task_id").to_pylist())
    groups: dict[str, set[int]] = defaultdict(set)
    for r in lake.read("rollouts", batch_id=batch_id, columns=["task_id", "group_index"]).to_pylist():
        groups[r["task_id"]].add(int(r["group_index"]))
    wrong = sorted(t for t in tasks | set(groups) if t not in tasks or groups.get(t) != set(range(num_generations)))
    if wrong:
        return False, f"{len(wrong)} task(s) without exactly {num_generations} episodes: {', '.join(wrong[:5])}", {"tasks": len(tasks),
                                                                                                                "wrong": len(wrong)}
    return True, f"{len(tasks)} tasks x {num_generations} episodes", {"tasks": len(tasks)}


def one_review_per_episode(lake: Lakehouse, batch_id: str) -> tuple[bool, str, dict[str, int]]:
    """Every episode has exactly one review (``rollout_id`` = the episode id), and no review is an orphan."""
    from collections import Counter

    episodes = set(_episodes(lake, batch_id))
    counts = Counter(r["rollout_id"] for r in lake.read("reviews", batch_id=batch_id, columns=["rollout_id"]).to_pylist())
    missing, doubled, orphans = sorted(episodes - set(counts)), sorted(e for e, n in counts.items() if n > 1), sorted(set(counts) - episodes)
    if missing or doubled or orphans:
        return False, (f"{len(missing)} episode(s) without a review, {len(doubled)} reviewed twice, "
                       f"{len(orphans)} review(s) of unknown episodes"), {"missing": len(missing), "doubled": len(doubled),
                                                                            "orphans": len(orphans)}
    return True, f"{len(episodes)} episodes, one review each", {"episodes": len(episodes)}
