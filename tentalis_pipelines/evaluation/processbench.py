"""ProcessBench (Zheng et al., 2024): can a judge find the earliest wrong step of a solution?

Each sample is a problem, a solution split into steps, and ``label`` = the 0-based index of the earliest
wrong step, or ``-1`` when every step is correct. A judge predicts that index, either with the per-step
judge (the first step whose majority score is -1, else -1) or with ProcessBench's own first-error critic
prompt (see :mod:`tentalis_pipelines.rewards.judge`).

The published metric, per split: accuracy on the erroneous samples (``label != -1`` and the prediction
is exactly the label), accuracy on the correct samples (``label == -1`` and the prediction is ``-1``),
and their harmonic mean, F1. A prediction the judge could not produce (``None``: no vote parsed) is
never a match, as in the reference implementation. Accuracies are fractions in [0, 1] here; the
markdown table shows percentages, as the paper does.

The data is read from ``$TENTALIS_DATA_DIR/processbench/<split>.jsonl`` (never copied into the
repository); any JSONL path with the same fields works too.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tentalis_pipelines.rewards.judge import JudgePRM, JudgeRequest, first_wrong_step
from tentalis_pipelines.settings import data_dir as default_data_dir

SPLITS = ("gsm8k", "math", "olympiadbench", "omnimath")
MODES = ("first_error", "per_step")
_FIELDS = ("id", "problem", "steps", "label")


@dataclass(frozen=True)
class ProcessBenchSample:
    """One ProcessBench item; ``label`` is the 0-based earliest wrong step or -1 (all correct)."""

    id: str
    problem: str
    steps: tuple[str, ...]
    label: int
    generator: str = ""
    final_answer_correct: bool | None = None


@dataclass(frozen=True)
class SplitMetrics:
    """ProcessBench's numbers for one split (accuracies in [0, 1]; ``None`` when a class is empty)."""

    n: int
    n_error: int
    n_correct: int
    error_accuracy: float | None
    correct_accuracy: float | None
    f1: float | None
    unparsed: int  # predictions the judge could not make (counted as wrong)


@dataclass
class ItemPrediction:
    """One sample's prediction with the judge's evidence: ``votes`` are the first-error votes, or, in
    per-step mode, one list of step-score votes per step (``step_scores`` holds the aggregated scores)."""

    id: str
    label: int
    prediction: int | None
    votes: list[Any]
    rationale: str
    step_scores: list[float | None] | None = None

    @property
    def match(self) -> bool:
        return self.prediction is not None and self.prediction == self.label


@dataclass
class SplitResult:
    split: str
    metrics: SplitMetrics
    items: list[ItemPrediction]


@dataclass
class ProcessBenchResult:
    """Per-split metrics and per-item predictions of one evaluation run."""

    mode: str
    model: str
    num_votes: int
    splits: dict[str, SplitResult] = field(default_factory=dict)
    seconds: float = 0.0
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def average_f1(self) -> float | None:
        """Mean F1 over the evaluated splits (the paper's headline number when all four are run)."""
        f1s = [s.metrics.f1 for s in self.splits.values() if s.metrics.f1 is not None]
        return sum(f1s) / len(f1s) if f1s else None

    def summary(self) -> dict[str, Any]:
        """The numbers without the per-item predictions (one JSON line)."""
        return {
            "mode": self.mode,
            "model": self.model,
            "num_votes": self.num_votes,
            "seconds": round(self.seconds, 1),
            "average_f1": self.average_f1,
            "settings": self.settings,
            "splits": {name: asdict(s.metrics) for name, s in self.splits.items()},
        }

    def to_dict(self) -> dict[str, Any]:
        """Everything, per-item predictions included."""
        out = self.summary()
        out["items"] = {name: [asdict(i) for i in s.items] for name, s in self.splits.items()}
        return out


# --------------------------------------------------------------------------- loading
def split_path(split: str, data_dir: str | Path | None = None) -> Path:
    """``<data_dir>/processbench/<split>.jsonl``; ``data_dir`` defaults to ``$TENTALIS_DATA_DIR``.

    Raises ``FileNotFoundError`` naming ``TENTALIS_DATA_DIR`` when the folder is unset or the file is
    missing, so a misconfigured machine fails with the fix in the message.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown ProcessBench split {split!r}: choose one of {', '.join(SPLITS)}")
    root = Path(data_dir).expanduser() if data_dir is not None else default_data_dir()
    if root is None:
        raise FileNotFoundError(
            "ProcessBench data folder is not set: export TENTALIS_DATA_DIR=<folder holding "
            f"processbench/{split}.jsonl> (the Makefile uses ../shared/data)"
        )
    path = root / "processbench" / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"ProcessBench split {split!r} not found at {path}: set TENTALIS_DATA_DIR to the folder that "
            f"holds processbench/{split}.jsonl"
        )
    return path


def _parse_line(raw: str, where: str) -> ProcessBenchSample:
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object")
    missing = [k for k in _FIELDS if k not in row]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    steps, label = row["steps"], row["label"]
    if not isinstance(steps, list) or not steps or not all(isinstance(s, str) for s in steps):
        raise ValueError(f"{where}: 'steps' must be a non-empty list of strings")
    if isinstance(label, bool) or not isinstance(label, int) or not -1 <= label < len(steps):
        raise ValueError(f"{where}: 'label' must be -1 or a step index below {len(steps)}, got {label!r}")
    fac = row.get("final_answer_correct")
    return ProcessBenchSample(
        id=str(row["id"]),
        problem=str(row["problem"]),
        steps=tuple(steps),
        label=label,
        generator=str(row.get("generator", "")),
        final_answer_correct=bool(fac) if fac is not None else None,
    )


def load_split(path: str | Path, *, limit: int | None = None, seed: int = 0) -> list[ProcessBenchSample]:
    """Read a ProcessBench JSONL file; a malformed line is an error naming the file and line.

    With ``limit`` below the file's size, a seeded uniform sample of ``limit`` items is returned (in file
    order): a random sample, not the first lines, so the error/correct mix stays representative.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"ProcessBench file {path} not found (the data folder is set by TENTALIS_DATA_DIR)")
    samples = []
    with path.open(encoding="utf-8") as f:
        for no, raw in enumerate(f, start=1):
            if raw.strip():
                samples.append(_parse_line(raw, f"{path}:{no}"))
    return sample_items(samples, limit=limit, seed=seed)


def sample_items(samples: Sequence[ProcessBenchSample], *, limit: int | None, seed: int = 0) -> list[ProcessBenchSample]:
    """A seeded sample of ``limit`` items in their original order (all of them when ``limit`` is None)."""
    if limit is None or limit >= len(samples):
        return list(samples)
    if limit < 0:
        raise ValueError("limit must be >= 0")
    keep = sorted(random.Random(seed).sample(range(len(samples)), limit))
    return [samples[i] for i in keep]


def load_processbench(split: str, *, data_dir: str | Path | None = None, limit: int | None = None,
                      seed: int = 0) -> list[ProcessBenchSample]:
    """One split from the data folder (``$TENTALIS_DATA_DIR`` by default), optionally sampled."""
    return load_split(split_path(split, data_dir), limit=limit, seed=seed)


# --------------------------------------------------------------------------- metric
def processbench_metrics(labels: Sequence[int], predictions: Sequence[int | None]) -> SplitMetrics:
    """Accuracy on erroneous samples, accuracy on correct samples and their harmonic mean (F1)."""
    if len(labels) != len(predictions):
        raise ValueError(f"{len(labels)} labels but {len(predictions)} predictions")
    error = [(y, p) for y, p in zip(labels, predictions) if y != -1]
    correct = [(y, p) for y, p in zip(labels, predictions) if y == -1]

    def acc(pairs: list[tuple[int, int | None]]) -> float | None:
        return sum(p is not None and p == y for y, p in pairs) / len(pairs) if pairs else None

    a_err, a_cor = acc(error), acc(correct)
    if a_err is None or a_cor is None:
        f1 = None
    else:
        f1 = 0.0 if a_err + a_cor == 0 else 2 * a_err * a_cor / (a_err + a_cor)
    return SplitMetrics(
        n=len(labels),
        n_error=len(error),
        n_correct=len(correct),
        error_accuracy=a_err,
        correct_accuracy=a_cor,
        f1=f1,
        unparsed=sum(p is None for p in predictions),
    )


# --------------------------------------------------------------------------- evaluation
def predict(samples: Sequence[ProcessBenchSample], judge: JudgePRM, mode: str = "first_error") -> list[ItemPrediction]:
    """Predict the earliest wrong step of every sample with one batched judge call.

    ``first_error``: ProcessBench's critic prompt, majority over the votes. ``per_step``: every step is
    scored; the prediction is the first step whose majority score is -1, else -1 (steps the judge could
    not score, or was unsure about, do not count as errors).
    """
    requests = [JudgeRequest(problem=s.problem, steps=s.steps) for s in samples]
    if mode == "first_error":
        return [
            ItemPrediction(id=s.id, label=s.label, prediction=j.prediction, votes=list(j.votes), rationale=j.rationale)
            for s, j in zip(samples, judge.first_errors(requests))
        ]
    if mode == "per_step":
        out = []
        for s, steps in zip(samples, judge.score_steps(requests)):
            first = next((j for j in steps if j.score is not None and j.score < 0), None)
            out.append(
                ItemPrediction(
                    id=s.id,
                    label=s.label,
                    prediction=first_wrong_step(steps),
                    votes=[list(j.votes) for j in steps],
                    rationale=first.rationale if first else "",
                    step_scores=[j.score for j in steps],
                )
            )
        return out
    raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")


def evaluate_processbench(splits: Mapping[str, Sequence[ProcessBenchSample]], judge: JudgePRM,
                          mode: str = "first_error", settings: Mapping[str, Any] | None = None) -> ProcessBenchResult:
    """Run the judge over each split's samples and compute ProcessBench's metrics per split."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
    result = ProcessBenchResult(
        mode=mode,
        model=getattr(judge.backend, "model_name", "unknown"),
        num_votes=judge.config.num_votes,
        settings=dict(settings or {}),
    )
    t0 = time.perf_counter()
    for name, samples in splits.items():
        items = predict(samples, judge, mode)
        metrics = processbench_metrics([i.label for i in items], [i.prediction for i in items])
        result.splits[name] = SplitResult(split=name, metrics=metrics, items=items)
    result.seconds = time.perf_counter() - t0
    return result


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def markdown_table(result: ProcessBenchResult) -> str:
    """A markdown table of the per-split numbers (percentages), with the average F1 when there are
    several splits."""
    lines = [
        f"ProcessBench — model `{result.model}`, mode `{result.mode}`, {result.num_votes} vote(s), "
        f"{result.seconds:.0f} s",
        "",
        "| split | n | erroneous | correct | acc. erroneous | acc. correct | F1 | unparsed |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in result.splits.items():
        m = s.metrics
        lines.append(
            f"| {name} | {m.n} | {m.n_error} | {m.n_correct} | {_pct(m.error_accuracy)} | "
            f"{_pct(m.correct_accuracy)} | {_pct(m.f1)} | {m.unparsed} |"
        )
    if len(result.splits) > 1:
        lines.append(f"| **average** | | | | | | {_pct(result.average_f1)} | |")
    return "\n".join(lines)
