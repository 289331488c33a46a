"""The manager's meta-RL stages: train the llm manager on failed rollouts, evaluate it, gate it.

See ``training/manager_rl.py`` for the method. Failed rollouts of task batches are split by task (a
stable hash) into the manager's training side and its held-out side. Training samples
``num_generations`` reviews per failure from the serving manager, measures each usable hint by the
serving worker's rescue (or the dense reward), and runs one GRPO update of the manager's adapter; the
checkpoint is a ``manager_checkpoints`` row with its lineage (the failures, every sampled review in
``manager_samples``, the table versions). Evaluation writes one greedy review per held-out failure and
what its hint did (``manager_evals``); the gate compares a candidate with the serving manager on the
same failures (paired bootstrap of the rescue rate) and refuses one whose scores drift further from the
verifier's; a pass moves ``manager_serving`` (``tentalis promote --role manager`` by hand).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tentalis_pipelines import audit, lineage
from tentalis_pipelines.inference.base import Generation, SamplingParams
from tentalis_pipelines.inference.models import resolve_model
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.rewards.hint_reward import HintQuery, hint_rewards, solution_steps
from tentalis_pipelines.rewards.llm_manager import (
    HINT_BRIDGE,
    HINT_MAX_NEW_TOKENS,
    PREFILL,
    SCORE_ADAPTER,
    SCORE_MAX_NEW_TOKENS,
    LLMManager,
    first_pass,
    first_pass_stops,
    hint_prompt,
    needs_hint_pass,
    parse_reply,
    read_hint,
    reply_body,
    score_adapter_of,
)
from tentalis_pipelines.rewards.managers import ReviewInput, VerifierManager
from tentalis_pipelines.rewards.math_answers import answers_match
from tentalis_pipelines.rewards.steps import parse_completion
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.kinds import TaskBatch, batch_kind
from tentalis_pipelines.training import checkpoints as ckpt
from tentalis_pipelines.training import manager_rl, opd, serving
from tentalis_pipelines.training.manager_rl import ManagerRLConfig, ReviewOutcome

GATE_BENCHMARK = "manager-hints"  # gate_decisions.benchmark of the manager's gate
ROLE = "manager"


@dataclass(frozen=True)
class Failure:
    """A failed rollout of a task batch, with what the manager and the worker need to revisit it."""

    batch_id: str
    rollout_id: str
    task_id: str
    task_prompt: str
    reference: str
    prompt_text: str
    completion: str
    review_input: ReviewInput
    verifier_score: float
    steps: tuple[str, ...] = ()  # the task's reference solution steps, when it has them (the dense reward scores them)

    @property
    def correct(self) -> bool:
        return self.review_input.correct


def collect_failures(lake: Lakehouse, *, heldout: bool, config: ManagerRLConfig, batch_ids: list[str] | None = None,
                     limit: int | None = None, correct: bool = False, exclude: set[str] | frozenset = frozenset(),
                     per_task: int = 1, exclude_tasks: set[str] | frozenset = frozenset()) -> list[Failure]:
    """``per_task`` failed rollouts per task (lowest group index first), newest batches first, on one side
    of the held-out split; at most ``limit``. Only task batches with reviews count (a failure needs a
    verifier). ``correct``: the rollouts the verifier accepted instead (their reviews train and test the
    score alone). ``exclude``: rollout ids to pass over (those earlier manager checkpoints trained on);
    ``exclude_tasks``: task ids to pass over."""
    from tentalis_pipelines.stages.reviews import review_inputs

    if not lake.exists("reviews"):
        return []
    if batch_ids is None:
        reviewed = lake.read("reviews", columns=["batch_id", "created_at"]).to_pylist()
        newest: dict[str, Any] = {}
        for r in reviewed:
            newest[r["batch_id"]] = max(newest.get(r["batch_id"], r["created_at"]), r["created_at"])
        batch_ids = sorted(newest, key=lambda b: (newest[b], b), reverse=True)
    verifier = VerifierManager()
    out: list[Failure] = []
    seen: Counter[str] = Counter()
    for batch_id in batch_ids:
        if not isinstance(batch_kind(lake, batch_id), TaskBatch):
            continue
        tasks = {t["task_id"]: t for t in lake.read("tasks", batch_id=batch_id).to_pylist()}
        for r, x in sorted(review_inputs(lake, batch_id), key=lambda p: (p[0]["task_id"], p[0]["group_index"])):
            tid = r["task_id"]
            if (x.correct != correct or seen[tid] >= per_task or r["rollout_id"] in exclude
                    or tid in exclude_tasks or manager_rl.is_heldout(tid, config.heldout_fraction, config.split_seed) != heldout):
                continue
            seen[tid] += 1
            out.append(Failure(batch_id, r["rollout_id"], tid, tasks[tid]["prompt"], x.reference, r["prompt_text"],
                               r["completion"], x, verifier.review(x).score, solution_steps(tasks[tid])))
            if limit is not None and len(out) >= limit:
                return out
    return out


def answer_form(f: Failure) -> str:
    """The stratum the score's demonstrations are balanced within (``manager_rl.balanced_indices``): whether the
    answer is in the ``<answer>`` tags. The verifier scores the two forms apart (0.1 or 0.0 for a wrong answer,
    1.0 or 0.7 for a right one); a sample in which one form is mostly accepted teaches the form, not the work."""
    return "tagged" if f.review_input.answer_tagged else "untagged"


def collect_accepted(lake: Lakehouse, *, heldout: bool, config: ManagerRLConfig, limit: int | None,
                     batch_ids: list[str] | None = None, exclude: set[str] | frozenset = frozenset(),
                     exclude_tasks: set[str] | frozenset = frozenset()) -> list[Failure]:
    """The accepted rollouts a manager reviews for its score alone, in training and on the held-out side:
    ``config.accepted_per_task`` per task, at most ``limit``."""
    return collect_failures(lake, heldout=heldout, config=config, batch_ids=batch_ids, limit=limit, correct=True,
                            exclude=exclude, per_task=config.accepted_per_task, exclude_tasks=exclude_tasks)


def trained_tasks(lake: Lakehouse) -> set[str]:
    """Every task a manager checkpoint of this home reviewed in training (``manager_samples``): never held out,
    even when an update drew its split with another key (before ``split_seed``, the sampling seed keyed it)."""
    if not lake.exists("manager_samples"):
        return set()
    return {r["task_id"] for r in lake.read("manager_samples", columns=["task_id"]).to_pylist()}


def manager_prompts(backend, failures: list[Failure]) -> list[str]:
    """The llm manager's exact prompt for each failure (pre-filled up to the score, as in production)."""
    mgr = LLMManager(backend)
    return [mgr.prompt(f.task_prompt, f.completion, f.review_input) for f in failures]


@dataclass(frozen=True)
class SampledReview:
    """One review as the llm manager writes it: the reply (pre-filled up to the score) and, when the
    reply wrote no hint, the second pass that asked for it (``llm_manager.hint_prompt``)."""

    score: float | None
    hint: str
    reply: Any  # the reply's Generation
    hint_prompt: str | None = None
    hint_reply: Any = None  # the hint pass's Generation

    @property
    def text(self) -> str:
        return PREFILL + self.reply.text + ("" if self.hint_reply is None else f' [hint pass] {self.hint_reply.text}')


@dataclass(frozen=True)
class ProposedReview:
    """A hint another reviewer proposes for a failure (``ManagerRLConfig.hint_proposals``), written where the
    manager writes its hint: after ``context``'s reply (one of the manager's own sampled reviews of the same
    failure, up to its hint) and ``HINT_BRIDGE``, as the hint pass asks for it."""

    hint: str
    proposer: str
    context: SampledReview
    score: float | None = None  # a proposal teaches the hint alone

    def prompt(self, manager_prompt: str) -> str:
        return hint_prompt(manager_prompt, self.context.reply.text)

    @property
    def text(self) -> str:
        return PREFILL + reply_body(self.context.reply.text) + HINT_BRIDGE + self.hint + '"'


def _context_review(group: list[SampledReview]) -> SampledReview:
    """The sampled review a proposal is written after: the first whose score parsed, else the first."""
    return next((r for r in group if r.score is not None), group[0])


def sample_reviews(backend, prompts: list[str], *, n: int, temperature: float, max_new_tokens: int, seed: int,
                   hint_prefix: str = "", score_backend=None) -> list[list[SampledReview]]:
    """``n`` reviews per prompt, each completed by the hint pass when its reply parsed but wrote no hint, or
    always with a ``hint_prefix`` (what ``LLMManager.review_many`` does, here at ``temperature``). With a
    ``score_backend`` (a checkpoint's score adapter) the score is its, as in ``LLMManager.review_many``; one
    review per prompt then, and its reply keeps no token ids (it was written by two adapters: nothing trains on it)."""
    params = SamplingParams(num_generations=n, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                            stop=first_pass_stops(hint_prefix))
    if score_backend is not None:
        gens = [[Generation(text=text, token_ids=[], finish_reason="stop", prompt_tokens=0, seconds=0.0)]
                for text in first_pass(backend, prompts, params, score_backend)]
    else:
        gens = backend.generate(prompts, params) if prompts else []
    parsed = [[parse_reply(g.text) for g in group] for group in gens]
    ask = [(i, j) for i, group in enumerate(parsed) for j, p in enumerate(group) if needs_hint_pass(p, hint_prefix)]
    hint_prompts = {(i, j): hint_prompt(prompts[i], gens[i][j].text, hint_prefix) for i, j in ask}
    hint_gens = {}
    if ask:
        out = backend.generate([hint_prompts[a] for a in ask], SamplingParams(
            num_generations=1, max_new_tokens=HINT_MAX_NEW_TOKENS, temperature=temperature, seed=seed + 1, stop=('"',)))
        hint_gens = {a: g[0] for a, g in zip(ask, out)}
    result = []
    for i, group in enumerate(gens):
        row = []
        for j, g in enumerate(group):
            p = parsed[i][j]
            if (i, j) in hint_gens:
                row.append(SampledReview(p[0], read_hint(hint_gens[(i, j)].text, hint_prefix), g, hint_prompts[(i, j)],
                                         hint_gens[(i, j)]))
            else:
                row.append(SampledReview(None if p is None else p[0], "" if p is None else p[2].strip(), g))
        result.append(row)
    return result


def rescue(worker, policy: PolicySettings, items: list[tuple[Failure, str]], *, k: int, seed: int) -> list[int]:
    """For each (failure, hint): how many of ``k`` worker samples drawn with the hint after the task (as
    guidance draws them, ``opd.hinted_prompt``) the verifier accepts."""
    if not items:
        return []
    prompts = [opd.hinted_prompt(f.prompt_text, f.task_prompt, h) for f, h in items]
    params = SamplingParams(num_generations=k, max_new_tokens=policy.max_new_tokens, temperature=policy.temperature,
                            top_p=policy.top_p, seed=seed)
    gens = worker.generate(prompts, params)
    return [sum(answers_match(parse_completion(g.text).answer, f.reference) for g in group) for (f, _), group in zip(items, gens)]


def outcomes_for(worker, policy: PolicySettings, config: ManagerRLConfig, failures: list[Failure],
                 reviews: list[list[tuple[float | None, str]]], *, k: int, seed: int) -> list[list[ReviewOutcome]]:
    """What each review's hint did: screened, then measured by rescue (or the dense reward) when usable. A
    rollout the verifier accepted needs no hint: its reviews are scored on their score alone (value 0)."""
    todo, where = [], []
    for i, (f, group) in enumerate(zip(failures, reviews)):
        for j, (_, hint) in enumerate(group):
            if not f.correct and manager_rl.hint_decision(hint, f.reference) == opd.USED:
                todo.append((f, hint.strip()))
                where.append((i, j))
    rescued = rescue(worker, policy, todo, k=k, seed=seed) if config.reward == "rescue" else [0] * len(todo)
    dense: list[float | None] = [None] * len(todo)
    if config.reward == "dense" and todo:
        dense = [d.reward for d in hint_rewards(worker.model, worker.tokenizer,
                                                [HintQuery(f.prompt_text, f.task_prompt, h, f.reference, f.steps) for f, h in todo],
                                                dtype=policy.dtype)]
    measured = {pos: (n, d) for pos, n, d in zip(where, rescued, dense)}
    out = []
    for i, (f, group) in enumerate(zip(failures, reviews)):
        row = []
        for j, (score, hint) in enumerate(group):
            n, d = measured.get((i, j), (0, None))
            used = (i, j) in measured
            row.append(ReviewOutcome(score, hint, manager_rl.hint_decision(hint, f.reference), n,
                                     k if used and config.reward == "rescue" else 0, f.verifier_score, d))
        out.append(row)
    return out


def _versions(lake: Lakehouse) -> dict[str, int | None]:
    return {t: v for t, v in lineage.table_versions(lake).items() if t in ("rollouts", "reviews", "tasks", "step_scores")}


def record_manager_checkpoint(lake: Lakehouse, manifest: dict, path: Path, algorithm: str, rollouts: list[Failure],
                              metrics: dict, created) -> dict[str, Any]:
    """Append and return the ``manager_checkpoints`` row of a saved manager checkpoint (its lineage already
    written): the rollouts it learned from, its metrics, not promoted."""
    row = {"checkpoint_id": manifest["checkpoint_id"], "parent_id": manifest["parent_id"], "base_model": manifest["base_model"],
           "adapter_uri": path.as_posix(), "algorithm": algorithm, "config": json.dumps(manifest["config"], default=str),
           "trained_on": manifest["batches"], "trajectory_ids": sorted(f.rollout_id for f in rollouts),
           "trajectory_count": len(rollouts), "metrics": json.dumps(metrics, default=str), "promoted": False, "created_at": created}
    lake.append("manager_checkpoints", [row])
    return row


def train_manager(lake: Lakehouse, paths: Paths, policy: PolicySettings, config: ManagerRLConfig, *, manager_model: str,
                  batch_ids: list[str] | None = None, manager_backend=None, worker=None, grpo: dict | None = None) -> dict[str, Any]:
    """One GRPO update of the serving manager on the training side's failures; returns the new
    ``manager_checkpoints`` row (not promoted: the gate or a person decides). ``manager_backend`` /
    ``worker``: backends to sample with (tests); by default the serving manager's and worker's."""
    from tentalis_pipelines.rewards.advantages import group_advantages
    from tentalis_pipelines.training.trainer import GRPOConfig, TrainSample, build_policy, train_grpo

    # Fresh rollouts only, as the worker trains on fresh trajectories: none an earlier manager checkpoint learned from.
    used = ({i for r in lake.read("manager_checkpoints", columns=["trajectory_ids"]).to_pylist() for i in r["trajectory_ids"] or ()}
            if lake.exists("manager_checkpoints") else set())
    failures = collect_failures(lake, heldout=False, config=config, batch_ids=batch_ids, limit=config.max_failures, exclude=used)
    if not failures:
        raise ValueError("no fresh failed rollouts on the manager's training side (earlier manager checkpoints used "
                         f"{len(used)}): run task batches (`tentalis run --no-train`) whose rollouts the verifier rejects, "
                         "then train the manager")
    # Accepted answers too, for the score alone: trained on failures only, "always low" would look accurate.
    accepted_wanted = round(config.success_share * len(failures))
    failures += collect_accepted(lake, heldout=False, config=config, batch_ids=batch_ids, exclude=used, limit=accepted_wanted)
    versions = _versions(lake)
    parent_id, parent_adapter = serving.serving_policy(lake, ROLE)
    if score_adapter_of(parent_adapter) is not None:
        raise ValueError(f"the serving manager {parent_id} writes its scores with a score adapter of its own, and a review "
                         "update trains one adapter for the whole reply: train its score with `tentalis manager train --part "
                         "score`, or serve a manager without a score adapter (`tentalis promote --role manager`) and train "
                         "its review first")
    worker_version, worker_adapter = serving.serving_policy(lake)
    model_dir = resolve_model(manager_model, paths.models)
    if manager_backend is None:
        manager_backend = policy.make_backend(model_dir, parent_adapter)
    if worker is None:
        worker = policy.make_backend(resolve_model(policy.model, paths.models), worker_adapter)
    prompts = manager_prompts(manager_backend, failures)
    sampled = sample_reviews(manager_backend, prompts, n=config.num_generations, temperature=config.temperature,
                             max_new_tokens=config.max_new_tokens, seed=config.seed, hint_prefix=config.hint_prefix)
    # A proposer's hint (hint_proposals) joins each failure's group after the sampled reviews: measured by the same
    # reward, trained only when it is worth most (ties go to the manager's own, which come first).
    proposed = [[ProposedReview(h, config.hint_proposals, _context_review(group))] if h else []
                for f, group in zip(failures, sampled) for h in [manager_rl.proposed_hint(f.review_input, config.hint_proposals)]]
    reviews = [[(r.score, r.hint) for r in group + extra] for group, extra in zip(sampled, proposed)]
    outcomes = outcomes_for(worker, policy, config, failures, reviews, k=config.rescue_samples, seed=config.seed + 1)
    keys, rewards, parts = [], [], []
    for f, group in zip(failures, outcomes):
        for o in group:
            keys.append(f.rollout_id)
            rewards.append(manager_rl.manager_reward(o, reward=config.reward, accuracy_weight=config.accuracy_weight))
            parts.append(manager_rl.reward_parts(o, reward=config.reward, accuracy_weight=config.accuracy_weight))
    best_of_n = config.update == "best_of_n"
    gcfg = GRPOConfig(**{"learning_rate": config.learning_rate, "num_iterations": config.num_iterations, "seed": config.seed,
                         "max_completion_length": config.max_new_tokens, "temperature": config.temperature,
                         "per_step_rows": config.per_step_rows or len(rewards), "dtype": policy.dtype,
                         # CISPO caps the importance weight but keeps every token's gradient: a demonstration's
                         # unlikely tokens (a sampled plan) are not clipped out after the first step; and each step at
                         # ratio 1, so a demonstration the model moves away from keeps its weight (round 17).
                         **({"loss_type": "cispo", "old_logprobs": "current"} if best_of_n else {}), **(grpo or {})})
    scale = gcfg.trajectory_settings()["scale_rewards"]
    if best_of_n:  # rejection-sampling fine-tuning: the chosen reviews' tokens, advantage 1; the rest untrained
        chosen = [w for group in manager_rl.best_of_n_selection(outcomes, [f.correct for f in failures], reward=config.reward,
                                                                min_value=config.best_min_value) for w in group]
        score_adv, hint_adv = [w[0] for w in chosen], [w[1] for w in chosen]
    elif config.credit == "fields":  # each part normalised in its group on its own, for its own tokens
        score_adv, _ = group_advantages(keys, [p[0] for p in parts], scale_rewards=scale)
        hint_adv, _ = group_advantages(keys, [p[1] for p in parts], scale_rewards=scale)
    else:
        score_adv, _ = group_advantages(keys, rewards, scale_rewards=scale)
        hint_adv = score_adv
    targets: list[int] = []
    if best_of_n and config.score_targets == "verifier":  # the sampled scores teach nothing: the verifier's do
        targets = manager_rl.balanced_indices([f.correct for f in failures], strata=[answer_form(f) for f in failures])
        score_adv = [0.0] * len(score_adv)
    tok = manager_backend.tokenizer
    flat = [(f, j, g, o) for f, group, extra, outs in zip(failures, sampled, proposed, outcomes)
            for j, (g, o) in enumerate(zip(group + extra, outs, strict=True))]
    prompt_of = {f.rollout_id: p for f, p in zip(failures, prompts)}
    prompt_ids = {r: tok(p, add_special_tokens=False)["input_ids"] for r, p in prompt_of.items()}
    # A review's tokens as sampled (the stop '}' included) with their group-relative advantages and sampling
    # log-probs: the score's tokens the score's advantage, the rest the hint's (one advantage under credit
    # "review"); a hint pass is a second sample (its own prompt: the reply and the bridge) with the hint's.
    samples = []
    for (f, _, r, _), s_adv, h_adv in zip(flat, score_adv, hint_adv):
        if isinstance(r, ProposedReview):  # a proposer's hint, after its context reply's body: every token a
            if h_adv:                      # demonstration; not sampled, so the trainer takes the old log-probs
                ids = tok(r.hint + '"', add_special_tokens=False)["input_ids"]
                samples.append(TrainSample(tok(r.prompt(prompt_of[f.rollout_id]), add_special_tokens=False)["input_ids"], ids, h_adv,
                                           token_advantages=[h_adv] * len(ids), temperature=config.temperature))
            continue
        reply_ids = list(r.reply.token_ids or ())
        if reply_ids and (not best_of_n or s_adv or h_adv):
            token_adv = (manager_rl.field_token_advantages(len(reply_ids), manager_rl.score_token_count(tok.decode, reply_ids),
                                                           s_adv, h_adv) if config.credit == "fields" or best_of_n else None)
            samples.append(TrainSample(prompt_ids[f.rollout_id], reply_ids, h_adv, token_advantages=token_adv,
                                       old_logps=list(r.reply.logprobs) if r.reply.logprobs else None, temperature=config.temperature))
        if r.hint_reply is not None and r.hint_reply.token_ids and (not best_of_n or h_adv):
            samples.append(TrainSample(tok(r.hint_prompt, add_special_tokens=False)["input_ids"], list(r.hint_reply.token_ids), h_adv,
                                       old_logps=list(r.hint_reply.logprobs) if r.hint_reply.logprobs else None,
                                       temperature=config.temperature))
    for i in targets:  # the verifier's score after the pre-filled prompt, every token a demonstration; no sampling
        f = failures[i]  # log-probs (it was not sampled): the trainer takes the old log-probs in a no-grad pass
        ids = tok(manager_rl.score_target_text(f.verifier_score), add_special_tokens=False)["input_ids"]
        samples.append(TrainSample(prompt_ids[f.rollout_id], ids, 1.0, token_advantages=[1.0] * len(ids),
                                   temperature=config.temperature))
    checkpoint_id = manager_rl.manager_checkpoint_id(None if parent_id == serving.BASE else parent_id,
                                                     [f.rollout_id for f in failures], config.seed, nonce=ckpt.new_checkpoint_id())
    if not samples:
        raise ValueError(f"no review of the {len(failures)} failures and accepted answers was good enough to train on "
                         f"(update best_of_n: no hint worth more than best_min_value = {config.best_min_value}, and no score "
                         "near the verifier's for both failures and accepted answers): sample more reviews per failure "
                         "(--num-generations), lower --best-min-value, or use --update grpo")
    model = build_policy(model_dir, Path(parent_adapter) if parent_adapter else None, gcfg)
    result = train_grpo(model, tok, samples, gcfg)
    created = now_utc()
    sample_rows = [{"checkpoint_id": checkpoint_id, "sample_id": manager_rl.sample_id(checkpoint_id, f.rollout_id, j),
                    "batch_id": f.batch_id, "rollout_id": f.rollout_id, "task_id": f.task_id, "sample_index": j,
                    "manager_version": parent_id, "proposer": g.proposer if isinstance(g, ProposedReview) else "manager",
                    "worker_version": worker_version, "review_text": g.text,
                    "score": o.score, "hint": o.hint, "hint_decision": o.hint_decision, "rescue_k": o.rescue_k,
                    "rescued": o.rescued, "dense_reward": o.dense_reward, "verifier_score": o.verifier_score,
                    "worker_correct": f.correct, "reward": r, "advantage": a, "score_advantage": sa, "credit": config.credit,
                    "created_at": created}
                   for (f, j, g, o), r, a, sa in zip(flat, rewards, hint_adv, score_adv)]
    lake.append("manager_samples", sample_rows)
    versions["manager_samples"] = lineage.table_versions(lake).get("manager_samples")
    # The manager's own reviews (a group's first num_generations): the proposals are reported on their own.
    all_outcomes = [o for group in outcomes for o in group[:config.num_generations]]
    on_failures = [o for f, group in zip(failures, outcomes) if not f.correct for o in group[:config.num_generations]]
    used = [o for o in on_failures if o.hint_decision == opd.USED]
    metrics = {"reward_mean": sum(rewards) / len(rewards), "samples": len(samples), "update": config.update,
               "hint_demonstrations": sum(1 for a in hint_adv if a > 0) if best_of_n else None,
               "score_demonstrations": sum(1 for a in score_adv if a > 0) + len(targets) if best_of_n else None,
               "score_targets": config.score_targets if best_of_n else None,
               "hint_proposals": config.hint_proposals,
               "proposals_offered": sum(len(extra) for extra in proposed),
               "proposal_demonstrations": sum(1 for (_, _, g, _), a in zip(flat, hint_adv) if isinstance(g, ProposedReview) and a > 0),
               "failures": len(on_failures) // config.num_generations, "accepted": len(failures) - len(on_failures) // config.num_generations,
               "accepted_wanted": accepted_wanted,
               "usable_hint_share": len(used) / len(on_failures),
               "rescue_rate": (sum(o.rescued for o in used) / sum(o.rescue_k for o in used)) if used and config.reward == "rescue" else None,
               "score_error": manager_rl.mean_score_error(all_outcomes),
               "unparseable": sum(o.score is None for o in all_outcomes),
               "loss": result.metrics.get("loss"), "worker_version": worker_version}
    manifest = {"manifest_version": lineage.MANIFEST_VERSION, "role": ROLE, "checkpoint_id": checkpoint_id,
                "parent_id": None if parent_id == serving.BASE else parent_id, "base_model": manager_model,
                "worker_version": worker_version, "created_at": created.isoformat(), "code_version": lineage.code_version(),
                "config": {"manager": config.as_dict(), "grpo": {k: v for k, v in vars(gcfg).items() if k != "lora_target_modules"}},
                "tables": versions, "batches": sorted({f.batch_id for f in failures}),
                "failures": [{"batch_id": f.batch_id, "rollout_id": f.rollout_id} for f in failures],
                "manager_samples": [r["sample_id"] for r in sample_rows],
                "samples": len(samples), "samples_digest": lineage.samples_digest(samples)}
    lake.append("lineage", lineage.manager_lineage_rows(manifest))  # before the checkpoint row, as for the worker
    path = ckpt.save_adapter(model, paths.checkpoints / "managers", checkpoint_id,
                             extra=lambda folder: lineage.write_manifest_file(folder, manifest))
    return record_manager_checkpoint(lake, manifest, path, gcfg.loss_type, failures, metrics, created)


def score_trained_rollouts(lake: Lakehouse) -> set[str]:
    """The rollouts an earlier score update of this home trained a score adapter on (``part = "score"``)."""
    if not lake.exists("manager_checkpoints"):
        return set()
    return {i for r in lake.read("manager_checkpoints", columns=["trajectory_ids", "metrics"]).to_pylist()
            if json.loads(r["metrics"] or "{}").get("part") == manager_rl.SCORE_PART for i in r["trajectory_ids"] or ()}


def train_manager_score(lake: Lakehouse, paths: Paths, policy: PolicySettings, config: ManagerRLConfig, *, manager_model: str,
                        batch_ids: list[str] | None = None, grpo: dict | None = None) -> dict[str, Any]:
    """One update of the serving manager's **score adapter** (``part = "score"``): a LoRA of its own that writes
    the score (``llm_manager.SCORE_ADAPTER``), trained on the verifier's scores written in the reply's format
    after the manager's exact prompt, as many failures as accepted answers in each form of answer, tagged or not
    (``manager_rl.balanced_indices`` by :func:`answer_form`), from the training side, none an earlier score update of this home used. It starts from the serving
    manager's score adapter, or a fresh one. The manager's own adapter, which writes the critique and the hint,
    is saved unchanged beside it: nothing here moves the hints (on one adapter every score update cost them
    rescue, experiments/manager_rl round 16). Nothing is sampled and no worker is asked. Returns the new
    ``manager_checkpoints`` row (not promoted)."""
    from transformers import AutoTokenizer

    from tentalis_pipelines.training.trainer import GRPOConfig, TrainSample, build_policy, train_grpo

    used = score_trained_rollouts(lake)
    rows = collect_failures(lake, heldout=False, config=config, batch_ids=batch_ids, limit=config.max_failures, exclude=used)
    rows += collect_accepted(lake, heldout=False, config=config, batch_ids=batch_ids, exclude=used, limit=len(rows))
    chosen = [rows[i] for i in manager_rl.balanced_indices([f.correct for f in rows], strata=[answer_form(f) for f in rows])]
    if not chosen:
        forms = ", ".join(f"{form}: {sum(not f.correct for f in rows if answer_form(f) == form)} failures and "
                          f"{sum(f.correct for f in rows if answer_form(f) == form)} accepted"
                          for form in sorted({answer_form(f) for f in rows}))
        raise ValueError(f"the score adapter learns from failures and accepted answers alike, in each form of answer "
                         f"(tagged or not), and the training side has {sum(not f.correct for f in rows)} fresh failures and "
                         f"{sum(f.correct for f in rows)} fresh accepted answers ({forms or 'none'}; earlier score updates used "
                         f"{len(used)}): run task batches under a worker that solves some tasks (`tentalis run --no-train`), "
                         "then train the score")
    versions = _versions(lake)
    parent_id, parent_adapter = serving.serving_policy(lake, ROLE)
    worker_version, _ = serving.serving_policy(lake)
    model_dir = resolve_model(manager_model, paths.models)
    tok = AutoTokenizer.from_pretrained(model_dir)
    samples = []
    # The verifier's score after the manager's exact prompt (pre-filled up to the score), every token a demonstration.
    for f, prompt in zip(chosen, manager_prompts(SimpleNamespace(tokenizer=tok), chosen)):
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        ids = tok(manager_rl.score_target_text(f.verifier_score), add_special_tokens=False)["input_ids"]
        samples.append(TrainSample(prompt_ids, ids, 1.0, token_advantages=[1.0] * len(ids), temperature=1.0))
    gcfg = GRPOConfig(**{"learning_rate": config.learning_rate, "num_iterations": config.num_iterations, "seed": config.seed,
                         "max_completion_length": SCORE_MAX_NEW_TOKENS, "temperature": 1.0, "dtype": policy.dtype,
                         "per_step_rows": config.per_step_rows or len(samples), "loss_type": "cispo",
                         # Demonstrations, never sampled: each step against the policy as it is (ratio 1). Against the
                         # pre-update policy the weight of every target the model moves away from shrinks, and the
                         # class that gains first takes all (round 17: `1,` for every rollout, 34 nats over `10,`).
                         "old_logprobs": "current", **(grpo or {})})
    parent_score = score_adapter_of(parent_adapter)
    score_model = build_policy(model_dir, parent_score, gcfg)
    result = train_grpo(score_model, tok, samples, gcfg)
    # The review adapter as the parent has it (a fresh LoRA, whose B is zero, is the untrained manager itself).
    review_model = build_policy(model_dir, Path(parent_adapter) if parent_adapter else None, gcfg)
    checkpoint_id = manager_rl.manager_checkpoint_id(None if parent_id == serving.BASE else parent_id,
                                                     [f.rollout_id for f in chosen], config.seed, nonce=ckpt.new_checkpoint_id())
    created = now_utc()
    accepted = sum(f.correct for f in chosen)
    metrics = {"part": manager_rl.SCORE_PART, "update": "score", "score_targets": "verifier", "samples": len(samples),
               "score_demonstrations": len(samples), "hint_demonstrations": 0, "failures": len(chosen) - accepted,
               "accepted": accepted, "accepted_wanted": len(chosen) - accepted, "loss": result.metrics.get("loss"),
               "score_adapter_parent": parent_id if parent_score is not None else None, "worker_version": worker_version}
    manifest = {"manifest_version": lineage.MANIFEST_VERSION, "role": ROLE, "checkpoint_id": checkpoint_id,
                "parent_id": None if parent_id == serving.BASE else parent_id, "base_model": manager_model, "part": manager_rl.SCORE_PART,
                "worker_version": worker_version, "created_at": created.isoformat(), "code_version": lineage.code_version(),
                "config": {"manager": config.as_dict(), "grpo": {k: v for k, v in vars(gcfg).items() if k != "lora_target_modules"}},
                "tables": versions, "batches": sorted({f.batch_id for f in chosen}),
                "failures": [{"batch_id": f.batch_id, "rollout_id": f.rollout_id} for f in chosen], "manager_samples": [],
                "samples": len(samples), "samples_digest": lineage.samples_digest(samples)}
    lake.append("lineage", lineage.manager_lineage_rows(manifest))  # before the checkpoint row, as for the worker

    def extra(folder: Path) -> None:
        score_model.save_pretrained(str(folder / SCORE_ADAPTER), safe_serialization=True)
        lineage.write_manifest_file(folder, manifest)

    path = ckpt.save_adapter(review_model, paths.checkpoints / "managers", checkpoint_id, extra=extra)
    return record_manager_checkpoint(lake, manifest, path, gcfg.loss_type, chosen, metrics, created)


def evaluate_manager(lake: Lakehouse, paths: Paths, policy: PolicySettings, config: ManagerRLConfig, checkpoint_id: str, *,
                     manager_model: str, batch_ids: list[str] | None = None, manager_backend=None, worker=None,
                     limit: int | None = None, score_backend=None) -> list[dict[str, Any]]:
    """A manager (``checkpoint_id`` or 'base') on the held-out failures: one greedy review each (as the
    llm manager reviews in production, the score by the checkpoint's score adapter when it has one;
    ``score_backend``: that adapter's backend, for tests), its hint's rescue of the serving worker with
    ``eval_rescue_samples`` samples at a seed shared by every manager compared; and on up to
    ``eval_accepted`` held-out accepted answers, a greedy review for its score alone. A task any manager
    update of this home trained on is never evaluated (``trained_tasks``). Replaces the manager's earlier
    ``manager_evals`` rows; returns the new ones."""
    seen = trained_tasks(lake)
    failures = collect_failures(lake, heldout=True, config=config, batch_ids=batch_ids, limit=limit, exclude_tasks=seen)
    if not failures:
        raise ValueError("no failed rollouts on the manager's held-out side that no manager update trained on: run more "
                         "task batches first")
    failures += collect_accepted(lake, heldout=True, config=config, batch_ids=batch_ids, limit=config.eval_accepted,
                                 exclude_tasks=seen)
    worker_version, worker_adapter = serving.serving_policy(lake)
    if manager_backend is None:
        adapter = None
        if checkpoint_id != serving.BASE:
            row = ckpt.checkpoint_row(lake, checkpoint_id, table="manager_checkpoints")
            if row is None:
                raise ValueError(f"no manager checkpoint {checkpoint_id!r} in manager_checkpoints: train one with `tentalis manager train`")
            adapter = ckpt.verify_adapter(row["adapter_uri"])
        model_dir = resolve_model(manager_model, paths.models)
        manager_backend = policy.make_backend(model_dir, adapter)
        if score_backend is None and (score_dir := score_adapter_of(adapter)) is not None:
            score_backend = policy.make_backend(model_dir, score_dir)
    if worker is None:
        worker = policy.make_backend(resolve_model(policy.model, paths.models), worker_adapter)
    prompts = manager_prompts(manager_backend, failures)
    sampled = sample_reviews(manager_backend, prompts, n=1, temperature=0.0, max_new_tokens=config.max_new_tokens, seed=config.seed,
                             hint_prefix=config.hint_prefix, score_backend=score_backend)
    reviews = [[(group[0].score, group[0].hint)] for group in sampled]
    seed = config.seed + 7919
    outcomes = outcomes_for(worker, policy, ManagerRLConfig(**{**config.as_dict(), "reward": "rescue"}), failures, reviews,
                            k=config.eval_rescue_samples, seed=seed)
    created = now_utc()
    rows = [{"checkpoint_id": checkpoint_id, "rollout_id": f.rollout_id, "task_id": f.task_id, "worker_version": worker_version,
             "score": o.score, "hint": o.hint, "hint_decision": o.hint_decision, "rescue_k": o.rescue_k, "rescued": o.rescued,
             "verifier_score": o.verifier_score, "worker_correct": f.correct, "seed": seed, "created_at": created}
            for f, (o,) in zip(failures, outcomes)]
    lake.replace_where("manager_evals", {"checkpoint_id": checkpoint_id}, rows)
    return rows


def rescue_by_failure(rows: list[dict]) -> dict[str, float]:
    """{failed rollout_id: rescue rate} (0 for a hint that was not usable); accepted rollouts need no hint."""
    return {r["rollout_id"]: (r["rescued"] / r["rescue_k"] if r["rescue_k"] else 0.0) for r in rows if not r["worker_correct"]}


def manager_incumbent(lake: Lakehouse, checkpoint_id: str) -> str:
    """What a candidate manager is compared with: the serving manager, or its parent when it serves itself."""
    current = serving.serving_checkpoint(lake, ROLE)
    if current != checkpoint_id:
        return current
    row = ckpt.checkpoint_row(lake, checkpoint_id, table="manager_checkpoints")
    return (row or {}).get("parent_id") or serving.BASE


def decide_manager_gate(lake: Lakehouse, checkpoint_id: str, config: ManagerRLConfig, *, apply: bool = True):
    """The manager's gate: paired bootstrap of the rescue rate against the incumbent on the same held-out
    failures (measured with the same worker), and no more than ``score_tolerance`` worse score error,
    class-balanced (``manager_rl.balanced_score_error``: failures dominate, so a plain mean would pass a
    manager that scores everything low), and a gap between its scores of accepted answers and of failures
    no more than ``score_tolerance`` smaller than the incumbent's (``manager_rl.score_separation``; its
    paired bootstrap interval is given in the reason). Both score rules need ``gate_min_accepted``
    accepted answers reviewed by both managers; with fewer the gate raises ``GateNotReady``.
    With ``apply`` the decision is a ``gate_decisions`` row (benchmark ``manager-hints``) and a pass moves
    ``manager_serving``. Returns (incumbent, GateDecision, candidate error, incumbent error)."""
    import dataclasses

    from tentalis_pipelines.evaluation.benchmarks import gate_decision
    from tentalis_pipelines.promotion import GateNotReady

    incumbent = manager_incumbent(lake, checkpoint_id)
    evals = lake.read("manager_evals").to_pylist() if lake.exists("manager_evals") else []
    cand = [r for r in evals if r["checkpoint_id"] == checkpoint_id]
    inc = [r for r in evals if r["checkpoint_id"] == incumbent]
    for who, rows in ((checkpoint_id, cand), (incumbent, inc)):
        if not rows:
            raise GateNotReady(f"no manager_evals rows for {who!r}: run `tentalis manager evaluate --checkpoint {who}` first")
    workers = {r["worker_version"] for r in cand} | {r["worker_version"] for r in inc}
    if len(workers) > 1:
        raise GateNotReady(f"the two managers' hints were measured with different workers ({sorted(workers)}): evaluate both "
                           "again under the serving worker so the gate compares like with like")
    paired = {r["rollout_id"] for r in cand} & {r["rollout_id"] for r in inc}  # the score is compared on accepted answers too
    accepted = sum(1 for r in cand if r["rollout_id"] in paired and r["worker_correct"])
    if accepted < config.gate_min_accepted:
        # experiments/manager_rl round 6: a manager passed on 10 accepted answers (score gap +0.135 vs +0.083)
        # whose scores did not separate on the worker's next 256 rollouts (-0.033 vs +0.334). Round 8: the
        # score rules pass that manager on 10 accepted answers in 33% of draws, on 40 in 16%, on 60 in 10%.
        raise GateNotReady(
            f"only {accepted} held-out accepted answers were reviewed by both {checkpoint_id!r} and {incumbent!r}; the score "
            f"checks need at least {config.gate_min_accepted} (gate_min_accepted): run more task batches under the serving "
            "worker (`tentalis run --no-train`), then evaluate both again with more accepted answers (`tentalis manager "
            "evaluate --accepted-per-task/--eval-accepted`); or lower --min-accepted, leaving the score's discrimination "
            "unchecked")
    cv, iv = rescue_by_failure(cand), rescue_by_failure(inc)
    decision = gate_decision(cv, iv, margin=config.gate_margin)
    err = {name: manager_rl.balanced_score_error([(r["score"], r["verifier_score"], r["worker_correct"]) for r in rows
                                                   if r["rollout_id"] in paired])
           for name, rows in (("cand", cand), ("inc", inc))}
    if decision.promote and err["cand"] > err["inc"] + config.score_tolerance:
        decision = dataclasses.replace(decision, promote=False, reason=(
            f"rejected: its scores drift from the verifier's (class-balanced mean error {err['cand']:.3f} vs {err['inc']:.3f}, "
            f"tolerance {config.score_tolerance}); the hints alone would pass: {decision.reason}"))
    sep = {name: manager_rl.score_separation([(r["score"], r["verifier_score"], r["worker_correct"]) for r in rows
                                               if r["rollout_id"] in paired])
           for name, rows in (("cand", cand), ("inc", inc))}
    inc_score = {r["rollout_id"]: r["score"] for r in inc}
    sep_diff = manager_rl.separation_difference([(r["score"], inc_score[r["rollout_id"]], r["worker_correct"])
                                                 for r in cand if r["rollout_id"] in paired])
    if sep_diff is not None:  # what the gap's comparison rests on, in every decision's words
        decision = dataclasses.replace(decision, reason=(
            f"{decision.reason}; score gap {sep['cand']:+.3f} vs {sep['inc']:+.3f} on {accepted} accepted answers "
            f"(95% CI of the difference [{sep_diff[1]:+.3f}, {sep_diff[2]:+.3f}])"))
    if decision.promote and sep["cand"] is not None and sep["inc"] is not None and sep["cand"] < sep["inc"] - config.score_tolerance:
        decision = dataclasses.replace(decision, promote=False, reason=(
            f"rejected: its scores separate accepted answers from failures less (mean score gap {sep['cand']:+.3f} vs "
            f"{sep['inc']:+.3f}, tolerance {config.score_tolerance}): helpful maybe, not discriminating; {decision.reason}"))
    if apply:
        row = {"checkpoint_id": checkpoint_id, "benchmark": GATE_BENCHMARK, "incumbent": incumbent, **decision.as_dict(),
               "margin": float(config.gate_margin), "created_at": now_utc()}
        lake.replace_where("gate_decisions", {"checkpoint_id": checkpoint_id, "benchmark": GATE_BENCHMARK}, [row])
        audit.record(lake, actor="gate", action="gate_decision", subject=checkpoint_id, from_state=incumbent,
                     to_state="promote" if decision.promote else "reject", reason=f"{GATE_BENCHMARK}: {decision.reason}",
                     detail={"role": ROLE, "score_error": err["cand"], "incumbent_score_error": err["inc"],
                             "score_separation": sep["cand"], "incumbent_score_separation": sep["inc"],
                             "accepted_answers": accepted,
                             "score_separation_ci": list(sep_diff[1:]) if sep_diff is not None else None})
        if decision.promote:
            serving.promote(lake, checkpoint_id, actor="gate", action="gate", role=ROLE,
                            reason=f"{GATE_BENCHMARK} vs {incumbent}: {decision.reason}")
    return incumbent, decision, err["cand"], err["inc"]
