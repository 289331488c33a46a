"""The trainer's samples, built from trajectories: the one builder, shared by training and its replay.

A checkpoint trains on :func:`build_training_samples` of its trajectories (``stages/training.py``:
``run_training``), and ``lineage.replay`` rebuilds a checkpoint's training set with the same function on
the same rows at their pinned Delta versions, so a replay is the same computation as the training. A
single-turn trajectory becomes a sample from its prompt's tokens and its completion; a ``multi_turn``
one (a live session or an environment episode) from its exact tokens, loss mask and per-token
advantages (:func:`multi_turn_sample`); hinted OPD's signal and the grounding flags apply on top.
"""

from __future__ import annotations

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.rewards.advantages import token_advantages, token_step_index
from tentalis_pipelines.training import multiturn, opd
from tentalis_pipelines.training.grounding_policy import apply_flags
from tentalis_pipelines.training.trainer import TrainSample


def build_training_samples(lake: Lakehouse, tokenizer, trajectories: list[dict], versions: dict[str, int | None] | None = None, *,
                           grounding_policy: str = "off", grounding_penalty: float = 1.0, grounding_counts: dict[str, int] | None = None,
                           ) -> tuple[list[TrainSample], dict[str, dict]]:
    """The trainer's samples for ``trajectories`` (in their order), from their rollouts read at
    ``versions['rollouts']`` (None: the current version). Also returns the rollouts by id. Training
    and ``lineage.replay`` both build the set here, so a replay is the same computation on the same rows.

    ``grounding_policy`` (``penalize`` or ``block``) applies the batches' ``grounding_flags`` (at
    ``versions['grounding_flags']``) to the samples (``training/grounding_policy.py``); the penalized
    tokens and blocked turns are added to ``grounding_counts``."""
    ids = {r["rollout_id"] for r in trajectories}
    rollout_version = (versions or {}).get("rollouts")
    names = lake.dataset("rollouts", version=rollout_version).schema.names
    columns = ["rollout_id", "prompt_text", "completion", "steps", "completion_token_ids", "sampling_logprobs", "temperature"]
    # multi-turn rows' exact prompt; the skills a prompt was given (recorded in the lineage)
    columns += [c for c in ("prompt_token_ids", "session_id", "skill_ids") if c in names]
    rollouts: dict[str, dict] = {}
    for b in sorted({r["batch_id"] for r in trajectories}):
        for r in lake.read("rollouts", batch_id=b, columns=columns, version=rollout_version).to_pylist():
            if r["rollout_id"] in ids:
                rollouts[r["rollout_id"]] = r
    guided_ids = {r["rollout_id"] for r in trajectories if r.get("guide_hint_id")}
    if guided_ids:  # hint-guided samples live in their own table (training/guide.py)
        guided_version = (versions or {}).get("guided_rollouts")
        for b in sorted({r["batch_id"] for r in trajectories if r.get("guide_hint_id")}):
            for g in lake.read("guided_rollouts", batch_id=b, version=guided_version).to_pylist():
                if g["rollout_id"] in guided_ids:
                    rollouts[g["rollout_id"]] = {**g, "sampling_logprobs": g["behaviour_logprobs"], "guided": True}
    missing = ids - set(rollouts)
    if missing:
        raise ValueError(f"{len(missing)} trajectories have no rollout row (rollouts@{rollout_version}): {sorted(missing)[:5]}; "
                         "re-run the batch's rollouts and trajectories")
    flags = {}
    if grounding_policy != "off":
        flags = flags_by_rollout(lake, sorted({r["batch_id"] for r in trajectories}), (versions or {}).get("grounding_flags"))
    counts = grounding_counts if grounding_counts is not None else {}

    def grounded(sample: TrainSample, rollout_id: str) -> TrainSample:
        out, n = apply_flags(sample, flags.get(rollout_id, []), grounding_policy, grounding_penalty, rollout_id=rollout_id)
        for k, v in n.items():
            counts[k] = counts.get(k, 0) + v
        return out

    prompt_cache: dict[str, list[int]] = {}
    samples = []
    for t in trajectories:
        ro = rollouts[t["rollout_id"]]
        if not ro["completion_token_ids"]:
            continue
        if t.get("kind") == "multi_turn":  # a live session or an episode: exact tokens, loss mask, per-turn advantages
            sample = multi_turn_sample(ro, t)
            # A guided episode (training/episode_guide.py): the un-hinted prompt, the hinted sampler's log-probs.
            sample.guided = bool(ro.get("guided"))
            samples.append(grounded(sample, t["rollout_id"]))
            continue
        p = prompt_cache.setdefault(ro["prompt_text"], tokenizer(ro["prompt_text"], add_special_tokens=False)["input_ids"])
        token_adv = None
        if t.get("advantage_mode") == "process":
            # Outcome advantage on every token, plus the process advantage of the token's step.
            owner = token_step_index(tokenizer, ro["completion_token_ids"], ro["completion"], ro["steps"] or [])
            token_adv = token_advantages(owner, float(t["advantage"]), t["step_advantages"] or [])
        w_rl = 1.0 if t.get("w_rl") is None else float(t["w_rl"])
        w_opd = 0.0 if t.get("w_opd") is None else float(t["w_opd"])
        if t.get("opd_signal") is not None or w_rl != 1.0:
            # Hinted OPD (training/opd.py): w_rl * A_rl + w_opd * (log pi_teacher - log pi_student), per token.
            rl = token_adv if token_adv is not None else [float(t["advantage"])] * len(ro["completion_token_ids"])
            token_adv = opd.combine_advantages(rl, t.get("opd_signal"), w_rl=w_rl, w_opd=w_opd)
        samples.append(grounded(TrainSample(p, list(ro["completion_token_ids"]), float(t["advantage"]), token_advantages=token_adv,
                                            old_logps=ro["sampling_logprobs"], temperature=ro["temperature"], guided=bool(ro.get("guided"))),
                                t["rollout_id"]))
    return samples, rollouts


def multi_turn_sample(rollout: dict, trajectory: dict) -> TrainSample:
    """The trainer's sample for a ``multi_turn`` trajectory and its rollout (exact tokens, the mask,
    per-token advantages, sampling log-probs where every trained token has one). A hinted segment's
    per-token advantage is ``w_rl * A_turn + w_opd * opd`` (``training/opd.py``)."""
    token_adv = list(trajectory["token_advantages"])
    w_rl = 1.0 if trajectory.get("w_rl") is None else float(trajectory["w_rl"])
    w_opd = 0.0 if trajectory.get("w_opd") is None else float(trajectory["w_opd"])
    if trajectory.get("opd_signal") is not None or w_rl != 1.0:
        token_adv = opd.combine_advantages(token_adv, trajectory.get("opd_signal"), w_rl=w_rl, w_opd=w_opd)
    return multiturn.train_sample(
        rollout["prompt_token_ids"], rollout["completion_token_ids"], trajectory["loss_mask"], token_adv,
        advantage=float(trajectory["advantage"]), old_logps=rollout.get("sampling_logprobs"), temperature=rollout.get("temperature"),
    )


def flags_by_rollout(lake: Lakehouse, batch_ids: list[str], version: int | None = None) -> dict[str, list[dict]]:
    """rollout id -> its grounding flags, for ``batch_ids`` (at Delta ``version``; {} without the table)."""
    if not lake.exists("grounding_flags"):
        return {}
    out: dict[str, list[dict]] = {}
    for b in batch_ids:
        for r in lake.read("grounding_flags", batch_id=b, version=version).to_pylist():
            out.setdefault(r["rollout_id"], []).append(r)
    return out
