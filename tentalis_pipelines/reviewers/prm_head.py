"""A process reward head on the embedded model's frozen trunk: P(step correct) from a hidden state.

The solution is read once by the trunk (the policy's base model, frozen, ``dtype=auto``: bf16 where the
CPU computes it natively) as ``problem \\n\\n step_1 \\n\\n step_2 ...``; the hidden state of layer
``layer`` at the last token of each step is that step's feature. Only the first ``layer`` blocks run
(the layers above it would not change the feature), so a middle layer costs a fraction of a forward.
A small head (linear, or one hidden layer) maps the standardised feature to a logit, trained with binary
cross-entropy on consensus labels (:mod:`tentalis_pipelines.reviewers.prm_labels`), seeded and
deterministic (full-batch Adam on CPU, fixed epochs).

A solution's first-error prediction is its first step scoring below ``threshold``; the threshold is chosen
on a held-out slice of the *training* labels (:func:`choose_threshold`), never on a benchmark.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tentalis_pipelines.hardware import resolve_device, resolve_dtype

SEPARATOR = "\n\n"


# ------------------------------------------------------------------------------------------ features
def tokenize_solution(tokenizer, problem: str, steps: Sequence[str], max_tokens: int) -> tuple[list[int], list[int]]:
    """Token ids of ``problem`` and the steps (each after a blank line) and the index of each step's last
    token. Steps are tokenised one by one, so their boundaries are exact. Steps that end beyond
    ``max_tokens`` are cut off (fewer ends than steps)."""
    ids, spans = tokenize_solution_spans(tokenizer, problem, steps, max_tokens)
    return ids, [end for _, end in spans]


def tokenize_solution_spans(tokenizer, problem: str, steps: Sequence[str], max_tokens: int
                            ) -> tuple[list[int], list[tuple[int, int]]]:
    """:func:`tokenize_solution` with each kept step's ``(first, last)`` token index (inclusive; a step's
    tokens start with its blank-line separator)."""
    ids = list(tokenizer(problem, add_special_tokens=False)["input_ids"])[: max_tokens // 2]
    spans = []
    for step in steps:
        piece = tokenizer(SEPARATOR + step, add_special_tokens=False)["input_ids"]
        if len(ids) + len(piece) > max_tokens:
            break
        spans.append((len(ids), len(ids) + len(piece) - 1))
        ids += piece
    return ids, spans


POOLINGS = ("last", "mean", "last+mean")
FEATURES = ("hidden", "surprise", "hidden+surprise")


@dataclass
class Trunk:
    """The frozen base model cut after ``layer`` blocks, with its tokenizer, device and dtype."""

    model: Any
    tokenizer: Any
    layer: int
    device: torch.device
    dtype: torch.dtype
    name: str = ""
    # The whole model's final norm and LM head (``load_trunk(..., full=True)``): every block runs, the
    # features still come from block ``layer``, and the logits give each token's surprise (:func:`step_surprise`).
    lm_head: Any = None
    digit_tokens: dict[int, bool] = field(default_factory=dict)  # token id -> its text holds a digit (filled lazily)


def load_trunk(model_dir: str | Path, layer: int, *, device: str = "auto", dtype: str = "auto", full: bool = False) -> Trunk:
    """Load a causal LM's base model (``AutoModelForCausalLM(...).model``) keeping its first ``layer``
    blocks; ``layer`` must be between 1 and the model's depth. ``full``: keep every block, the final norm
    and the LM head too (what :func:`step_surprise` needs; a full forward costs more)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    lm = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dt)
    base = lm.model
    depth = len(base.layers)
    if not 1 <= layer <= depth:
        raise ValueError(f"PRM head layer {layer} is outside the model's 1..{depth} blocks ({model_dir})")
    lm_head = None
    if full:
        lm_head = lm.lm_head.to(dev).eval()
        for p in lm_head.parameters():
            p.requires_grad_(False)
    else:
        base.layers = base.layers[:layer]
        base.config.num_hidden_layers = layer
        base.norm = nn.Identity()  # the final norm belongs to the last block's output, not this layer's
    base.to(dev).eval()
    for p in base.parameters():
        p.requires_grad_(False)
    return Trunk(base, AutoTokenizer.from_pretrained(str(model_dir)), layer, dev, dt, name=Path(str(model_dir)).name,
                 lm_head=lm_head)


SURPRISE_FEATURES = ("mean log-prob", "min log-prob", "digit mean log-prob", "digit min log-prob")


def step_surprise(token_logprobs: torch.Tensor, spans: Sequence[tuple[int, int]], digit: Sequence[bool]) -> torch.Tensor:
    """``[steps, 4]``: per step span ``(first, last)``, the mean and the minimum of ``token_logprobs`` (the
    model's log-probability of each token given the ones before it) over the span's tokens, then the same
    over its tokens whose text holds a digit (``digit[j]``; the whole span when none does). A wrong number
    is a number the model did not expect: a signal that does not depend on how the head's features drift
    between domains."""
    rows = []
    for a, b in spans:
        seg = token_logprobs[a: b + 1]
        num = torch.tensor([digit[j] for j in range(a, b + 1)], dtype=torch.bool, device=seg.device)
        dig = seg[num] if bool(num.any()) else seg
        rows.append(torch.stack([seg.mean(), seg.min(), dig.mean(), dig.min()]))
    return torch.stack(rows) if rows else torch.zeros((0, len(SURPRISE_FEATURES)))


def _digit_flags(trunk: Trunk, ids: Sequence[int]) -> list[bool]:
    out = []
    for t in ids:
        if t not in trunk.digit_tokens:
            trunk.digit_tokens[t] = any(c.isdigit() for c in trunk.tokenizer.decode([t]))
        out.append(trunk.digit_tokens[t])
    return out


def step_features(trunk: Trunk, solutions: Sequence[tuple[str, Sequence[str]]], *, max_tokens: int = 1024,
                  batch_tokens: int = 4096, layers: Sequence[int] | None = None, pooling: str = "last") -> list[np.ndarray]:
    """See :func:`step_features_and_surprise` (the features alone)."""
    return step_features_and_surprise(trunk, solutions, max_tokens=max_tokens, batch_tokens=batch_tokens, layers=layers,
                                      pooling=pooling)[0]


@torch.inference_mode()
def step_features_and_surprise(trunk: Trunk, solutions: Sequence[tuple[str, Sequence[str]]], *, max_tokens: int = 1024,
                               batch_tokens: int = 4096, layers: Sequence[int] | None = None, pooling: str = "last",
                               surprise: bool = False) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """One float32 array ``[steps kept, dim]`` per ``(problem, steps)``: the trunk's last hidden state at
    each step's last token (``pooling="last"``), its mean over the step's tokens (``"mean"``: less tied to
    how a step happens to end), or both concatenated (``"last+mean"``, ``dim`` = 2 x hidden). Solutions are
    batched by length (right padding, attention mask), so the result does not depend on the batch they
    land in beyond float rounding. With ``layers`` (each at most the trunk's), the arrays are
    ``[steps kept, len(layers), dim]``: several layers from one pass. With ``surprise`` (a ``full`` trunk),
    the second list holds each solution's ``[steps kept, 4]`` :func:`step_surprise` (else it is None)."""
    if layers is not None and not all(1 <= x <= trunk.layer for x in layers):
        raise ValueError(f"layers {list(layers)} must lie in 1..{trunk.layer} (the trunk's depth)")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling {pooling!r} is not one of {POOLINGS}")
    if surprise and trunk.lm_head is None:
        raise ValueError("surprise features need the whole model's LM head: load the trunk with load_trunk(..., full=True)")
    encoded = [tokenize_solution_spans(trunk.tokenizer, p, s, max_tokens) for p, s in solutions]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    out: list[np.ndarray | None] = [None] * len(encoded)
    surprises: list[np.ndarray | None] = [None] * len(encoded)
    full = trunk.lm_head is not None  # every block runs: block `layer` is a hidden state, not the last one
    pad = trunk.tokenizer.pad_token_id if trunk.tokenizer.pad_token_id is not None else 0
    dim = trunk.model.config.hidden_size * (2 if pooling == "last+mean" else 1)
    i = 0
    while i < len(order):
        j = i + 1
        while j < len(order) and len(encoded[order[j]][0]) * (j - i + 1) <= batch_tokens:
            j += 1
        batch = order[i:j]
        longest = max(len(encoded[k][0]) for k in batch)
        ids = torch.full((len(batch), longest), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, k in enumerate(batch):
            toks = encoded[k][0]
            ids[row, : len(toks)] = torch.tensor(toks)
            mask[row, : len(toks)] = 1
        res = trunk.model(input_ids=ids.to(trunk.device), attention_mask=mask.to(trunk.device),
                          output_hidden_states=layers is not None or full)
        if layers is not None:
            h = torch.stack([res.hidden_states[x] for x in layers], 2)
        else:
            h = res.hidden_states[trunk.layer] if full else res.last_hidden_state
        for row, k in enumerate(batch):
            toks, spans = encoded[k]
            if surprise:
                logits = trunk.lm_head(res.last_hidden_state[row, : len(toks) - 1]).float()
                lp = torch.zeros(len(toks), device=logits.device)  # the first token has no context: never in a step
                lp[1:] = torch.log_softmax(logits, -1).gather(1, ids[row, 1: len(toks), None].to(logits.device))[:, 0]
                surprises[k] = step_surprise(lp, spans, _digit_flags(trunk, toks)).cpu().numpy()
            if not spans:
                out[k] = np.zeros((0, dim) if layers is None else (0, len(layers), dim), np.float32)
                continue
            out[k] = pool_steps(h[row].float(), spans, pooling).cpu().numpy()
        i = j
    return [o for o in out], ([x for x in surprises] if surprise else None)  # type: ignore[misc]


def pool_steps(hidden: torch.Tensor, spans: Sequence[tuple[int, int]], pooling: str) -> torch.Tensor:
    """Per step, the hidden state ``hidden [tokens, ...]`` at the span's last token, the mean over the
    span's tokens, or both concatenated on the last axis."""
    last = hidden[[end for _, end in spans]]
    if pooling == "last":
        return last
    mean = torch.stack([hidden[a: b + 1].mean(0) for a, b in spans])
    return mean if pooling == "mean" else torch.cat([last, mean], -1)


# ------------------------------------------------------------------------------------------ the head
class PRMHead(nn.Module):
    """Standardise, then a linear layer (``hidden=0``) or one hidden layer with GELU (and dropout while
    training), to one logit."""

    def __init__(self, dim: int, hidden: int = 0, dropout: float = 0.0):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("scale", torch.ones(dim))
        # (the Sequential keeps its layout of old checkpoints; dropout sits outside it, it has no weights)
        self.net = nn.Linear(dim, 1) if hidden <= 0 else nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = (x - self.mean) / self.scale
        if isinstance(self.net, nn.Linear):
            return self.net(z).squeeze(-1)
        return self.net[2](self.dropout(self.net[1](self.net[0](z)))).squeeze(-1)


@dataclass(frozen=True)
class HeadConfig:
    """How the head is trained and what it reads. ``layer``: the deepest trunk block it reads (``layers``:
    several blocks, concatenated; empty means ``layer`` alone); ``pooling``: a step's last token, the mean
    over its tokens, or both (:func:`step_features`); ``center``: subtract the solution's mean step
    feature (what is left is how a step differs from its neighbours, not the solution's style);
    ``hidden``: 0 for a linear head; ``weight_decay`` is L2 on the weights (AdamW); ``rule`` and ``drop``:
    the :class:`DecisionRule` kind (its threshold is chosen on held-out labels)."""

    # The recipe chosen on held-out labels (experiments/prm_head, third pass): block 10, mean-pooled, L2 1.0.
    layer: int = 10
    hidden: int = 0
    epochs: int = 300
    lr: float = 1e-2
    weight_decay: float = 1.0
    seed: int = 0
    balance: bool = True  # weight the classes equally in the loss
    max_tokens: int = 1024
    dropout: float = 0.0  # between the hidden layer and the output (hidden > 0 only)
    layers: tuple[int, ...] = ()
    pooling: str = "mean"
    center: bool = False
    rule: str = "threshold"
    drop: float = 1.0
    # What a step's feature is: the trunk's hidden state at block ``layer`` (pooled), the step's surprise
    # under the whole model (step_surprise: four log-prob statistics, a full forward), or both concatenated.
    # The surprise judges best (experiments/prm_head, fifth pass), but as a step reward it pays for text the
    # base model expects and the policy never learns the answer format (experiments/prm_step_scorer, round 2):
    # the default stays the hidden state, the only kind a learning run may score steps with.
    features: str = "hidden"

    def __post_init__(self):
        object.__setattr__(self, "layers", tuple(int(x) for x in self.layers))  # a manifest gives a list
        if self.layers and max(self.layers) != self.layer:
            raise ValueError(f"HeadConfig.layers {list(self.layers)} must end at layer {self.layer} (the trunk is cut there)")
        if self.pooling not in POOLINGS:
            raise ValueError(f"HeadConfig.pooling {self.pooling!r} is not one of {POOLINGS}")
        if self.rule not in RULES:
            raise ValueError(f"HeadConfig.rule {self.rule!r} is not one of {RULES}")
        if self.features not in FEATURES:
            raise ValueError(f"HeadConfig.features {self.features!r} is not one of {FEATURES}")

    @property
    def surprise(self) -> bool:
        """Whether the head reads the steps' surprise (the trunk must then be the whole model)."""
        return self.features != "hidden"

    @property
    def hidden_state(self) -> bool:
        """Whether the head reads the trunk's hidden state."""
        return self.features != "surprise"

    @property
    def read_layers(self) -> tuple[int, ...]:
        return self.layers or (self.layer,)


def feature_dim(config: HeadConfig, hidden_size: int) -> int:
    """How wide the features ``config`` reads from a trunk of ``hidden_size`` are (:func:`head_features`)."""
    per_layer = hidden_size * (2 if config.pooling == "last+mean" else 1)
    return per_layer * len(config.read_layers) * config.hidden_state + (len(SURPRISE_FEATURES) if config.surprise else 0)


def head_features(trunk: Trunk, solutions: Sequence[tuple[str, Sequence[str]]], config: HeadConfig) -> list[np.ndarray]:
    """The features ``config`` reads, one ``[steps kept, dim]`` array per solution: :func:`step_features`
    of its layers (concatenated) and pooling, centred per solution when ``config.center``, then the
    step's four :func:`step_surprise` columns (``config.features`` "hidden+surprise"); or those four alone
    ("surprise")."""
    feats, surprise = step_features_and_surprise(trunk, solutions, max_tokens=config.max_tokens, layers=config.read_layers,
                                                 pooling=config.pooling, surprise=config.surprise)
    shaped = [shape_features(f, config.center) for f in feats]
    if surprise is None:
        return shaped
    return [np.concatenate([f, u.astype(np.float32)], 1) if config.hidden_state else u.astype(np.float32)
            for f, u in zip(shaped, surprise)]


def shape_features(f: np.ndarray, center: bool) -> np.ndarray:
    """``[steps, layers, dim]`` -> ``[steps, layers * dim]``, minus the solution's mean step when ``center``."""
    x = np.asarray(f, dtype=np.float32)
    x = x.reshape(len(x), int(np.prod(x.shape[1:])))  # (-1 cannot be inferred for a solution with no step kept)
    return x - x.mean(0, keepdims=True) if center and len(x) else x


def train_head(features: np.ndarray, labels: np.ndarray, config: HeadConfig, weights: np.ndarray | None = None) -> PRMHead:
    """BCE-train a head on ``features [n, dim]`` and 0/1 ``labels [n]``: seeded, full batch, CPU, so the
    same inputs give the same weights. ``weights [n]`` (non-negative, not all zero) weight each step's
    loss, e.g. to let a few hundred of the policy's own steps count beside thousands of GSM8K ones; the
    class balance (``config.balance``) is then computed on weighted counts. None: every step weighs 1."""
    if features.ndim != 2 or len(features) != len(labels) or len(labels) == 0:
        raise ValueError(f"train_head needs features [n, dim] and n labels, got {features.shape} and {len(labels)}")
    y = torch.as_tensor(np.asarray(labels, dtype=np.float32))
    if not set(torch.unique(y).tolist()) <= {0.0, 1.0}:
        raise ValueError("PRM labels must be 0 (wrong) or 1 (correct)")
    w = torch.ones_like(y) if weights is None else torch.as_tensor(np.asarray(weights, dtype=np.float32))
    if w.shape != y.shape or bool((w < 0).any()) or not bool(torch.isfinite(w).all()) or float(w.sum()) <= 0:
        raise ValueError(f"train_head's weights must be {len(y)} finite non-negative numbers, not all zero")
    torch.manual_seed(config.seed)
    x = torch.as_tensor(np.asarray(features, dtype=np.float32))
    head = PRMHead(x.shape[1], config.hidden, config.dropout)
    head.mean.copy_(x.mean(0))
    head.scale.copy_(x.std(0).clamp_min(1e-4))
    pos = float((w * y).sum())
    neg = float((w * (1 - y)).sum())
    pos_weight = torch.tensor(neg / pos if config.balance and pos > 0 and neg > 0 else 1.0)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=pos_weight, reduction="none")
    opt = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    head.train()
    for _ in range(config.epochs):
        opt.zero_grad()
        # (with every weight 1 this is BCEWithLogitsLoss's mean, so unweighted heads train as before)
        loss = (w * loss_fn(head(x), y)).sum() / w.sum()
        loss.backward()
        opt.step()
    head.eval()
    return head


@torch.inference_mode()
def score_steps(head: PRMHead, features: Sequence[np.ndarray]) -> list[list[float]]:
    """P(correct) of every step of every solution (the sigmoid of the head's logit)."""
    out = []
    for f in features:
        out.append(torch.sigmoid(head(torch.as_tensor(np.asarray(f, dtype=np.float32)))).tolist() if len(f) else [])
    return out


def fold_of(groups: Sequence[str], folds: int, seed: int) -> dict[str, int]:
    """Each distinct group (a problem id) to a fold in ``0..folds-1``: the sorted groups shuffled with
    ``seed``, then dealt round-robin, so fold sizes differ by at most one group."""
    if folds < 2:
        raise ValueError(f"cross-fitting needs at least 2 folds, got {folds}")
    distinct = sorted(set(groups))
    if len(distinct) < folds:
        raise ValueError(f"{len(distinct)} problem(s) cannot fill {folds} folds: label more problems or use fewer folds")
    random.Random(seed).shuffle(distinct)
    return {g: i % folds for i, g in enumerate(distinct)}


def out_of_fold_scores(features: Sequence[np.ndarray], labels: Sequence[Sequence[int]], groups: Sequence[str],
                       config: HeadConfig, *, folds: int = 5, seed: int = 0,
                       trains: Sequence[bool] | None = None, weights: Sequence[float] | None = None) -> list[list[float]]:
    """Cross-fitted step scores: each solution (``features[i]`` ``[steps, dim]``, its step ``labels[i]``, its
    problem ``groups[i]``) scored by a head trained on the solutions of the *other* folds, so no score comes
    from a head that saw the solution's problem. ``trains[i]`` false keeps a solution out of every head's
    training (it is still scored): a rendering used only to choose the rule. A threshold chosen on these
    scores rests on every labelled problem, not on one held-out slice (experiments/prm_head, fourth pass:
    the slice's threshold moved ProcessBench F1 between 17 and 27 across draws). ``weights[i]`` weighs
    every step of solution ``i`` in the heads' loss (:func:`train_head`)."""
    if not len(features) == len(labels) == len(groups):
        raise ValueError(f"out_of_fold_scores needs one label list and one group per solution, got "
                         f"{len(features)} features, {len(labels)} label lists, {len(groups)} groups")
    trains = [True] * len(features) if trains is None else list(trains)
    weights = [1.0] * len(features) if weights is None else list(weights)
    if len(weights) != len(features):
        raise ValueError(f"out_of_fold_scores needs one weight per solution, got {len(weights)} for {len(features)}")
    fold = fold_of(groups, folds, seed)
    out: list[list[float]] = [[] for _ in features]
    for k in range(folds):
        fit = [i for i, f in enumerate(features) if trains[i] and fold[groups[i]] != k and len(f)]
        if not fit:
            raise ValueError(f"fold {k} leaves no training solution: label more problems or use fewer folds")
        head = train_head(np.concatenate([np.asarray(features[i], dtype=np.float32) for i in fit]),
                          np.concatenate([np.asarray(labels[i][: len(features[i])]) for i in fit]), config,
                          np.concatenate([np.full(len(features[i]), weights[i], dtype=np.float32) for i in fit]))
        scored = [i for i, g in enumerate(groups) if fold[g] == k]
        for i, s in zip(scored, score_steps(head, [features[i] for i in scored])):
            out[i] = s
    return out


# ------------------------------------------------------------------------------------------ decisions
def first_error(scores: Sequence[float | None], threshold: float) -> int:
    """The first step whose score is below ``threshold``, else -1 (unscored steps never count as errors)."""
    return next((i for i, s in enumerate(scores) if s is not None and s < threshold), -1)


def first_error_with_flags(scores: Sequence[float | None], threshold: float, flags: Sequence[bool]) -> int:
    """:func:`first_error`, where a step the calculator flags (``flags[i]`` true) counts as an error too."""
    n = max(len(scores), len(flags))
    for i in range(n):
        s = scores[i] if i < len(scores) else None
        if (i < len(flags) and flags[i]) or (s is not None and s < threshold):
            return i
    return -1


RULES = ("threshold", "drop", "argmin")


@dataclass(frozen=True)
class DecisionRule:
    """How a solution's step scores become its first-error prediction.

    * ``threshold``: the first step scoring below ``threshold`` (:func:`first_error`).
    * ``drop``: the first step scoring below ``threshold``, or more than ``drop`` below the running mean
      of the steps before it: less tied to the absolute score level, which moves between domains.
    * ``argmin``: the lowest-scoring step when its score is below ``threshold``, else none.
    """

    kind: str = "threshold"
    threshold: float = 0.5
    drop: float = 1.0

    def __post_init__(self):
        if self.kind not in RULES:
            raise ValueError(f"decision rule {self.kind!r} is not one of {RULES}")

    def predict(self, scores: Sequence[float | None]) -> int:
        """The first-error index (-1: all correct); unscored steps (``None``) are never errors."""
        if self.kind == "threshold":
            return first_error(scores, self.threshold)
        if self.kind == "argmin":
            scored = [(s, i) for i, s in enumerate(scores) if s is not None]
            if not scored:
                return -1
            low, at = min(scored)
            return at if low < self.threshold else -1
        total, seen = 0.0, 0
        for i, s in enumerate(scores):
            if s is None:
                continue
            if s < self.threshold or (seen and s < total / seen - self.drop):
                return i
            total += s
            seen += 1
        return -1


def choose_rule(scores: Sequence[Sequence[float]], labels: Sequence[int], kind: str = "threshold",
                drops: Sequence[float] = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4)) -> tuple[DecisionRule, float]:
    """The :class:`DecisionRule` of ``kind`` that maximises ProcessBench's F1 on held-out solutions with
    known first errors (our own labels, never a benchmark's); returns ``(rule, F1)``. The thresholds tried
    are 101 evenly spaced quantiles of :func:`choose_threshold`'s candidates (``threshold`` itself is
    :func:`choose_threshold`'s); for ``drop`` every ``drops`` value is tried too (ties go to the first)."""
    from tentalis_pipelines.evaluation.processbench import processbench_metrics

    if kind == "threshold":
        t, f1 = choose_threshold(scores, labels)
        return DecisionRule("threshold", t), f1
    values = sorted({float(s) for ss in scores for s in ss})
    if not values:
        raise ValueError("choose_rule needs at least one scored step")
    cands = [values[0] - 1e-6] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 1e-6]
    cands = sorted(set(np.quantile(np.asarray(cands), np.linspace(0, 1, 101)).tolist()))
    best: tuple[DecisionRule, float] = (DecisionRule(kind, cands[0]), -1.0)
    for d in drops if kind == "drop" else (1.0,):
        for t in cands:
            rule = DecisionRule(kind, float(t), float(d))
            f1 = processbench_metrics(list(labels), [rule.predict(s) for s in scores]).f1 or 0.0
            if f1 - best[1] > 1e-12:  # strictly better: ties keep the earlier rule
                best = (rule, f1)
    return best


def choose_threshold(scores: Sequence[Sequence[float]], labels: Sequence[int], *,
                     flags: Sequence[Sequence[bool]] | None = None) -> tuple[float, float]:
    """The threshold that maximises ProcessBench's F1 (accuracy on erroneous and on correct solutions,
    harmonic mean) over held-out solutions with known first errors; returns ``(threshold, F1)``. Candidates
    are the midpoints between the distinct scores and the two ends (1e-6 beyond the lowest and the highest
    score); past 400 candidates, 401 evenly spaced quantiles of them. Ties go to the lowest threshold."""
    from tentalis_pipelines.evaluation.processbench import processbench_metrics

    values = sorted({float(s) for ss in scores for s in ss})
    if not values:
        raise ValueError("choose_threshold needs at least one scored step")
    cands = [values[0] - 1e-6] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1] + 1e-6]
    if len(cands) > 400:  # quantiles are plenty for a threshold
        cands = sorted(set(np.quantile(np.asarray(cands), np.linspace(0, 1, 401)).tolist()))
    best = (cands[0], -1.0)
    for t in cands:
        if flags is None:
            preds = [first_error(s, t) for s in scores]
        else:
            preds = [first_error_with_flags(s, t, f) for s, f in zip(scores, flags)]
        f1 = processbench_metrics(list(labels), preds).f1 or 0.0
        if f1 > best[1] + 1e-12:
            best = (float(t), f1)
    return best


# ------------------------------------------------------------------------------------------ extra feature
_LATEX = [(re.compile(r"\\d?frac\{([^{}]+)\}\{([^{}]+)\}"), r"(\1)/(\2)"), (re.compile(r"\\(?:times|cdot)"), "×"),
          (re.compile(r"\\div"), "÷"), (re.compile(r"\\[()\[\],!;]|\\text\{[^{}]*\}"), " ")]


def plain_arithmetic(text: str) -> str:
    """LaTeX arithmetic written plainly for the calculator: ``\\(3 \\times 4 = 12\\)`` -> ``3 × 4 = 12``."""
    for pattern, repl in _LATEX:
        text = pattern.sub(repl, text)
    return text.replace("\\$", "$")


def calculator_flags(problem: str, steps: Sequence[str]) -> list[bool]:
    """Which steps state a false equation (``rewards.process.check_steps`` on the plain-written steps)."""
    from tentalis_pipelines.rewards.process import check_steps

    return [c.score == 0.0 for c in check_steps(problem, [plain_arithmetic(s) for s in steps])]


# ------------------------------------------------------------------------------------------ checkpoints
@dataclass
class HeadCheckpoint:
    """A trained head with what it needs to score: its config, threshold and where it came from."""

    head: PRMHead
    config: HeadConfig
    threshold: float
    base_model: str
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def rule(self) -> DecisionRule:
        """The decision rule: the config's kind at the stored (held-out) threshold."""
        return DecisionRule(self.config.rule, self.threshold, self.config.drop)

    def save(self, folder: str | Path) -> Path:
        """``head.pt`` (the weights) and ``manifest.json`` (config, threshold, lineage; indented with sorted keys,
        a value JSON cannot hold written as its text) in ``folder``, made if missing; saving again overwrites."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in self.head.state_dict().items()}, folder / "head.pt")
        meta = {"config": asdict(self.config), "threshold": self.threshold, "base_model": self.base_model,
                "dim": int(self.head.mean.shape[0]), **self.manifest}
        (folder / "manifest.json").write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> HeadCheckpoint:
        """A saved head; ``head.pt`` is read as plain weights only (a file that would run code is refused)."""
        folder = Path(folder)
        meta = json.loads((folder / "manifest.json").read_text())
        # A head stored before pooling (or features) was a setting read each step's last token's hidden state:
        # load it as it was trained.
        cfg = HeadConfig(**{"pooling": "last", "features": "hidden", **meta["config"]})
        head = PRMHead(int(meta["dim"]), cfg.hidden, cfg.dropout)
        head.load_state_dict(torch.load(folder / "head.pt", weights_only=True))
        head.eval()
        rest = {k: v for k, v in meta.items() if k not in ("config", "threshold", "base_model", "dim")}
        return cls(head, cfg, float(meta["threshold"]), str(meta["base_model"]), rest)
