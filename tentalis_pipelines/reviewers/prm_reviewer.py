"""The PRM head as a reviewer: trained from our own labels, stored as versions with lineage, used as a
step scorer.

A trained head lands as a version folder ``<home>/reviewers/prm_head/v0001/`` (``head.pt`` and
``manifest.json``), written to a temporary folder and renamed into place, so a reader sees a whole
version or none. The manifest says what it learned from (lineage, like a worker checkpoint's
``lineage.json``): the GSM8K train file (path, SHA-256, the problem ids labelled), the problems the
contamination guard refused and why, the Delta versions of ``tasks``, ``rollouts`` and ``step_labels``
and the rollout ids whose consensus labels it used, the label counts per kind, the trunk (model, layer,
dtype), the threshold and its held-out F1, and the code version.

As a step scorer (``review.step_scorer = "prm_head"``), the newest version scores each step with
P(correct) in [0, 1], the calculator's convention (1 correct, 0 wrong): ``step_reward`` takes it as is.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tentalis_pipelines.reviewers.prm_head import (
    HeadCheckpoint,
    HeadConfig,
    choose_rule,
    feature_dim,
    head_features,
    load_trunk,
    out_of_fold_scores,
    score_steps,
    train_head,
)
from tentalis_pipelines.reviewers.prm_labels import (
    LabelledSolution,
    build_label_set,
    label_rollout,
    load_gsm8k_train,
    processbench_items,
    processbench_style,
    screen_problems,
)

REVIEWER = "prm_head"
TRAIN_COMMAND = "tentalis prm train"
_VERSION = re.compile(r"^v(\d{4,})$")


class PRMHeadNotTrained(RuntimeError):
    """``prm_head`` was chosen as the step scorer, but no trained head exists under the home."""


class PRMHeadGameable(PRMHeadNotTrained):
    """``prm_head`` was chosen as a training run's step scorer, but the newest head reads the model's own
    surprise: a policy trained on it learns to write what the base model expects, not what is right."""


def reviewer_dir(home: str | Path) -> Path:
    """Where the head's versions live: ``<home>/reviewers/prm_head``."""
    return Path(home) / "reviewers" / REVIEWER


def versions(home: str | Path) -> list[str]:
    """The stored versions, oldest first (folders ``vNNNN`` holding a manifest)."""
    root = reviewer_dir(home)
    if not root.is_dir():
        return []
    found = [p.name for p in root.iterdir() if _VERSION.match(p.name) and (p / "manifest.json").is_file()]
    return sorted(found, key=lambda n: int(n[1:]))


def latest_version(home: str | Path) -> Path:
    """The newest version's folder; :class:`PRMHeadNotTrained` (naming the command that trains one) when
    there is none."""
    found = versions(home)
    if not found:
        raise PRMHeadNotTrained(
            f"step scorer 'prm_head' needs a trained PRM head, and there is none under {reviewer_dir(home)}. "
            f"Train one with `{TRAIN_COMMAND}` (it needs TENTALIS_DATA_DIR with gsm8k/train.jsonl), or set "
            "review.step_scorer back to 'calculator'")
    return reviewer_dir(home) / found[-1]


def step_scorer_version(home: str | Path) -> Path:
    """The newest version, if it may score a learning run's steps: a head that reads the model's surprise
    (``features`` surprise or hidden+surprise) judges ProcessBench best, but as a reward it pays for text
    the base model expects. With it as the step scorer the policy first never learned the format (held-out
    accuracy 3 % against the calculator's 29 %, experiments/prm_step_scorer round 2); with the format rule
    of ``stages.step_scores`` it learned the format and then wrote fluent wrong arithmetic (8 %, round 4;
    23 % with the step rewards only centred, round 6). So it raises :class:`PRMHeadGameable` naming the fix."""
    folder = latest_version(home)
    features = manifest_of(folder).get("config", {}).get("features", "hidden")  # (heads before the setting read the hidden state)
    if features != "hidden":
        raise PRMHeadGameable(
            f"PRM head {folder.name} reads the model's own surprise (features = {features}): it judges ProcessBench best, "
            "but as a training reward it pays for text the base model expects: the policy learned to write fluent wrong steps "
            f"(experiments/prm_step_scorer, rounds 2, 4 and 6). Train a hidden-state head for step scoring: `{TRAIN_COMMAND} --features hidden`, or set "
            "review.step_scorer back to 'calculator'")
    return folder


def save_version(home: str | Path, checkpoint: HeadCheckpoint) -> Path:
    """Store ``checkpoint`` as the next version, atomically (a temporary folder renamed into place)."""
    root = reviewer_dir(home)
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        found = versions(home)
        name = f"v{(int(found[-1][1:]) + 1) if found else 1:04d}"
        tmp = root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        checkpoint.manifest = {**checkpoint.manifest, "version": name}
        checkpoint.save(tmp)
        try:
            os.rename(tmp, root / name)  # fails if another writer took this name first: try the next one
            return root / name
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(f"could not store a new PRM head version under {root}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------ lakehouse labels
def rollout_labels(lake) -> tuple[list[LabelledSolution], dict[str, Any]]:
    """Consensus labels of the policy's own rollouts in the lakehouse (calculator, verifier and, where the
    ``step_labels`` table has a row for every step, Monte-Carlo labels), with the lineage: each table's
    Delta version (pinned before reading) and the rollout ids kept."""
    pinned: dict[str, int | None] = {}
    for name in ("tasks", "rollouts", "step_labels"):
        dt = lake.table(name)
        pinned[name] = None if dt is None else dt.version()
    if pinned["rollouts"] is None or pinned["tasks"] is None:
        return [], {"tables": pinned, "rollout_ids": []}
    tasks = {(t["batch_id"], t["task_id"]): t for t in lake.read("tasks", version=pinned["tasks"],
                                                                  columns=["batch_id", "task_id", "prompt", "reference"]).to_pylist()}
    mc: dict[tuple[str, str], dict[int, float]] = {}
    if pinned["step_labels"] is not None:
        for r in lake.read("step_labels", version=pinned["step_labels"], columns=["batch_id", "rollout_id", "step_index", "label"]).to_pylist():
            mc.setdefault((r["batch_id"], r["rollout_id"]), {})[int(r["step_index"])] = r["label"]
    out, kept = [], []
    for r in lake.read("rollouts", version=pinned["rollouts"], columns=["batch_id", "rollout_id", "task_id", "steps", "answer"]).to_pylist():
        task = tasks.get((r["batch_id"], r["task_id"]))
        steps = list(r["steps"] or [])
        if task is None or not steps or not task.get("reference"):
            continue
        by_step = mc.get((r["batch_id"], r["rollout_id"]), {})
        mc_labels = [by_step.get(i) for i in range(len(steps))] if by_step else None
        sol = label_rollout(f"{r['batch_id']}/{r['rollout_id']}", task["prompt"], steps, r["answer"], task["reference"], mc_labels)
        if sol is not None:
            out.append(sol)
            kept.append(sol.problem_id)
    return out, {"tables": pinned, "rollout_ids": kept}


# ------------------------------------------------------------------------------------------ training
@dataclass(frozen=True)
class TrainSettings:
    """What ``tentalis prm train`` trains on and how (defaults: the benchmarked recipe)."""

    # 600 keeps labelling, the whole model's pass over both renderings and a ProcessBench evaluation inside
    # 30 minutes on a 2-core CPU; the default head has four weights (experiments/prm_head, fifth pass).
    train_problems: int = 600
    corruptions: int = 2
    # How the rule's threshold is chosen: on the out-of-fold scores of every labelled problem, ``folds``
    # heads each trained without one fold (cross-fitting); ``folds`` 1: on one held-out slice of
    # ``held_out`` of the problems, as before (its ProcessBench F1 moved 17-27 across draws).
    folds: int = 5
    held_out: float = 0.2
    seed: int = 0
    use_embeddings: bool = True
    max_tokens: int = 1024
    renderings: str = "pbstyle"  # (chosen on held-out labels, experiments/prm_head) plain | pbstyle | both: our steps as GSM8K writes them, in ProcessBench's shape, or both
    # Each step of the lakehouse's own consensus-labelled rollouts weighs this much in the loss (GSM8K steps
    # weigh 1), and the rollouts also train as the policy wrote them (a step scorer reads them that way): a
    # few hundred of the policy's steps beside thousands of GSM8K ones barely moved the head (round 7);
    # weighted 10 and in both renderings they raised its step AUC on the policy's steps of unseen problems
    # from 0.60-0.70 to 0.83-0.85 (experiments/prm_step_scorer, round 8; chosen on that AUC, our own labels),
    # and with right rollouts labelled too the head beat the calculator as a step scorer (+9.4, round 9).
    # It costs the head ProcessBench (10.9): a judge is trained with --no-rollouts (docs/reviewers.md).
    rollout_weight: float = 10.0

    def __post_init__(self):
        if self.renderings not in RENDERINGS:
            raise ValueError(f"TrainSettings.renderings {self.renderings!r} is not one of {RENDERINGS}")
        if self.folds < 1:
            raise ValueError(f"TrainSettings.folds must be 1 (one held-out slice) or more (cross-fitting), got {self.folds}")
        if not (self.rollout_weight > 0 and math.isfinite(self.rollout_weight)):
            raise ValueError(f"TrainSettings.rollout_weight must be a positive number, got {self.rollout_weight} "
                             "(to train without the lakehouse's rollouts: tentalis prm train --no-rollouts)")


RENDERINGS = ("plain", "pbstyle", "both")


def rendered(solutions: Sequence[LabelledSolution], renderings: str, seed: int) -> list[LabelledSolution]:
    """The solutions as ``renderings`` asks: as labelled (``plain``), in ProcessBench's shape
    (:func:`~tentalis_pipelines.reviewers.prm_labels.processbench_style`, seeded), or both."""
    rng = random.Random(seed)
    styled = [processbench_style(s, rng) for s in solutions] if renderings != "plain" else []
    return list(solutions) * (renderings != "pbstyle") + styled


def problem_group(solution: LabelledSolution) -> str:
    """The unit no fold or held-out slice may split: a GSM8K problem's id (its reference and corruptions),
    or, for the policy's rollouts (one id each), the problem's text, so two rollouts of one task stay together."""
    return f"rollout-problem:{solution.problem}" if is_rollout(solution) else solution.problem_id


def is_rollout(solution: LabelledSolution) -> bool:
    """Whether the solution is one of the policy's rollouts (as labelled, or in ProcessBench's shape)."""
    return solution.kind.split("+")[0] == "rollout"


def _split(labelled: Sequence[LabelledSolution], held_out: float, seed: int):
    pids = sorted({problem_group(s) for s in labelled})
    random.Random(seed).shuffle(pids)
    held = set(pids[: int(len(pids) * held_out)])
    return [s for s in labelled if problem_group(s) not in held], [s for s in labelled if problem_group(s) in held]


def train_reviewer(home: str | Path, model_dir: str | Path, data_root: Path, *, lake=None, config: HeadConfig | None = None,
                   settings: TrainSettings | None = None, cache_dir: Path | None = None) -> Path:
    """Label (GSM8K train, screened by the contamination guard, plus the lakehouse's own rollouts when
    ``lake`` is given), extract the trunk's features, train the head, choose its threshold on a held-out
    slice of the labels, and store it as a new version with its lineage. Returns the version folder."""
    from tentalis_pipelines import contamination
    from tentalis_pipelines.evaluation.processbench import SPLITS
    from tentalis_pipelines.lineage import code_version

    config = config or HeadConfig()
    settings = settings or TrainSettings()
    gsm8k = data_root / "gsm8k" / "train.jsonl"
    problems = load_gsm8k_train(gsm8k, limit=settings.train_problems, seed=settings.seed)
    items, _, _ = contamination.static_items(("gsm8k", "math500"), data_root, required=("gsm8k",))
    pb_path = data_root / "processbench"
    pb_splits = [s for s in SPLITS if (pb_path / f"{s}.jsonl").is_file()]
    items += processbench_items(data_root, pb_splits)
    index = contamination.ContaminationIndex(items, cache_dir or contamination.default_cache_dir(Path(home)))
    screened = screen_problems(problems, index, use_embeddings=settings.use_embeddings)
    labelled = build_label_set(screened.clean, seed=settings.seed, corruptions=settings.corruptions)
    lake_lineage: dict[str, Any] = {}
    if lake is not None:
        own, lake_lineage = rollout_labels(lake)
        labelled += own
    trunk = load_trunk(model_dir, config.layer, full=config.surprise)
    read = replace(config, max_tokens=settings.max_tokens)
    if settings.folds >= 2:
        # Every problem in both renderings (plain, then ProcessBench's shape); the training rendering trains.
        val = rendered(labelled, "both", settings.seed)
        # The training rendering trains; a rollout trains in both (plain is how the policy writes it).
        trains = [(i < len(labelled)) if settings.renderings == "plain" else (i >= len(labelled))
                  if settings.renderings == "pbstyle" else True for i in range(len(val))]
        trains = [t or is_rollout(s) for t, s in zip(trains, val)]
        f_val = head_features(trunk, [(s.problem, s.steps) for s in val], read)
        val_scores = out_of_fold_scores(f_val, [s.labels for s in val], [problem_group(s) for s in val], config,
                                        folds=settings.folds, seed=settings.seed, trains=trains,
                                        weights=[settings.rollout_weight if is_rollout(s) else 1.0 for s in val])
        train, f_train = [s for s, t in zip(val, trains) if t], [f for f, t in zip(f_val, trains) if t]
    else:
        train, val = _split(labelled, settings.held_out, settings.seed)
        if not train or not val:
            raise ValueError(f"too few consensus-labelled solutions to train a PRM head ({len(labelled)}): raise train_problems")
        plain_rollouts = [s for s in train if is_rollout(s)] if settings.renderings == "pbstyle" else []
        train, val = rendered(train, settings.renderings, settings.seed) + plain_rollouts, rendered(val, "both", settings.seed)
        f_train = head_features(trunk, [(s.problem, s.steps) for s in train], read)
        f_val = head_features(trunk, [(s.problem, s.steps) for s in val], read)
    x = np.concatenate([f for f in f_train if len(f)])
    y = np.concatenate([np.asarray(s.labels[: len(f)]) for s, f in zip(train, f_train) if len(f)])
    w = np.concatenate([np.full(len(f), settings.rollout_weight if is_rollout(s) else 1.0, dtype=np.float32)
                        for s, f in zip(train, f_train) if len(f)])
    head = train_head(x, y, config, w)
    if settings.folds < 2:
        val_scores = score_steps(head, f_val)
    # The rule's threshold on held-out scores in both renderings (still only our own labels).
    rule, val_f1 = choose_rule(val_scores, [s.first_error for s in val], config.rule)
    threshold = rule.threshold
    config = replace(config, drop=rule.drop, max_tokens=settings.max_tokens)
    kinds: dict[str, int] = {}
    for s in labelled:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    manifest = {
        "reviewer": REVIEWER,
        "trunk": {"model": str(model_dir), "layer": config.layer, "layers": list(config.read_layers),
                  "pooling": config.pooling, "dtype": str(trunk.dtype).removeprefix("torch.")},
        "held_out_f1": val_f1,
        "threshold_from": (f"{settings.folds}-fold out-of-fold scores" if settings.folds >= 2
                           else f"a held-out slice of {settings.held_out:.0%} of the problems"),
        "settings": settings.__dict__,
        "lineage": {
            "gsm8k_train": {"path": str(gsm8k), "sha256": _sha256(gsm8k), "problem_ids": [p.problem_id for p in screened.clean]},
            "contamination": {"screened_against": sorted({it.benchmark for it in items}),
                              "refused": [{"problem_id": p.problem_id, "match": m.as_dict()} for p, m in screened.refused]},
            "lakehouse": lake_lineage,
            "labels": {"solutions": len(labelled), "kinds": kinds, "train_steps": int(len(y)), "train_correct": int(y.sum()),
                       "train_rollout_steps": sum(len(f) for s, f in zip(train, f_train) if is_rollout(s)),
                       "held_out_solutions": len(val)},
        },
        "code": code_version(),
    }
    return save_version(home, HeadCheckpoint(head, config, threshold, trunk.name, manifest))


# ------------------------------------------------------------------------------------------ scoring
class PRMHeadScorer:
    """The newest stored head with its trunk, scoring steps: ``score_steps(problems, steps) -> [[P(correct)]]``."""

    def __init__(self, home: str | Path, model_dir: str | Path, *, version: str | None = None):
        folder = reviewer_dir(home) / version if version else latest_version(home)
        if not (folder / "manifest.json").is_file():
            raise PRMHeadNotTrained(f"no PRM head version at {folder}: list them under {reviewer_dir(home)}, or train one "
                                    f"with `{TRAIN_COMMAND}`")
        self.folder = folder
        self.checkpoint = HeadCheckpoint.load(folder)
        self.trunk = load_trunk(model_dir, self.checkpoint.config.layer, full=self.checkpoint.config.surprise)
        want = feature_dim(self.checkpoint.config, self.trunk.model.config.hidden_size)
        if want != int(self.checkpoint.head.mean.shape[0]):
            raise ValueError(f"PRM head {folder} reads {int(self.checkpoint.head.mean.shape[0])}-wide features, but {model_dir} "
                             f"gives {want} (hidden size {self.trunk.model.config.hidden_size}): train a head for this model "
                             f"({TRAIN_COMMAND})")

    @property
    def version(self) -> str:
        return self.folder.name

    def score(self, problems: Sequence[str], solutions: Sequence[Sequence[str]]) -> list[list[float | None]]:
        """P(correct) of every step, ``None`` for steps past the head's token budget."""
        feats = head_features(self.trunk, list(zip(problems, solutions)), self.checkpoint.config)
        scores = score_steps(self.checkpoint.head, feats)
        return [s + [None] * (len(sol) - len(s)) for s, sol in zip(scores, solutions)]

    def score_steps(self, requests) -> list[list[Any]]:
        """The judge's interface (``rewards.judge.JudgePRM.score_steps``): one ``StepJudgement`` per step of
        each ``JudgeRequest``, ``score`` = P(correct) in [0, 1] (the calculator's scale), one vote."""
        from tentalis_pipelines.rewards.judge import StepJudgement

        requests = list(requests)
        scores = self.score([r.problem for r in requests], [list(r.steps) for r in requests])
        return [[StepJudgement(s, [] if s is None else [s], self.rationale(s)) for s in ss] for ss in scores]

    def rationale(self, score: float | None) -> str:
        if score is None:
            return "beyond the PRM head's token budget: not scored"
        verdict = "wrong" if score < self.checkpoint.threshold else "correct"  # the step alone, at the rule's threshold
        return f"prm_head {self.version}: P(correct) {score:.3f} ({verdict} at threshold {self.checkpoint.threshold:.3f})"


def manifest_of(folder: str | Path) -> dict[str, Any]:
    return json.loads((Path(folder) / "manifest.json").read_text())
