"""The grounding token tagger: all-MiniLM-L6-v2 with a token-classification head, and how it joins the rules.

Input: ``[CLS] answer [SEP] context [SEP]`` (the answer first, so truncation only ever cuts context);
label 1 on the answer's tokens inside a corrupted span, 0 on its other tokens, ignored on the context.
Trained on :mod:`grounding_data`'s train split (every weight of MiniLM plus the head: a few CPU minutes).

Predicted spans: runs of answer tokens with P(unsupported) >= ``threshold``, runs separated only by
whitespace joined, each widened to whole words. :func:`combine` unions them with the deterministic
check's flags: a rules flag wins where the two overlap (its boundaries are the claim's), a tagger span
that no rule covers is added (the tagger sees what rules cannot: a true value in the wrong field).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tentalis_pipelines.reviewers.grounding import Flag, check_answer
from tentalis_pipelines.reviewers.grounding_data import Pair

MAX_LENGTH = 256
DETECTOR = "tagger"
TAGGER_META = "tagger.json"


@dataclass
class TaggerConfig:
    """How the tagger trains. Unsupported tokens are a few percent of an answer's tokens: with plain
    cross-entropy the tagger learned to flag nothing (experiments/grounding), so the loss weighs them by
    ``positive_weight`` (``None``: the training tokens' ratio of supported to unsupported), and the
    threshold is chosen on ``held_out`` of the training sessions (span F1, :func:`choose_threshold`);
    ``held_out`` 0 keeps ``threshold``."""

    epochs: int = 3
    batch_size: int = 16
    learning_rate: float = 5e-5
    threshold: float = 0.5
    seed: int = 0
    max_length: int = MAX_LENGTH
    positive_weight: float | None = None
    held_out: float = 0.15


def _tokenizer_and_model(folder: Path, fresh_head: bool):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    model = AutoModelForTokenClassification.from_pretrained(str(folder), num_labels=2, local_files_only=True,
                                                            **({"ignore_mismatched_sizes": True} if fresh_head else {}))
    return tok, model


class GroundingTagger:
    """A trained tagger (:func:`train_tagger` or :meth:`load`) that predicts unsupported spans."""

    def __init__(self, tokenizer, model, threshold: float = 0.5, max_length: int = MAX_LENGTH):
        self.tokenizer, self.model, self.threshold, self.max_length = tokenizer, model, threshold, max_length
        self.positive_weight: float | None = None  # set by train_tagger: the loss weight it used
        self.held_out_f1: float | None = None  # set by train_tagger: exact-span F1 at the chosen threshold
        self.model.eval()

    @classmethod
    def load(cls, folder: str | Path, threshold: float | None = None) -> GroundingTagger:
        """A saved tagger at its stored threshold (``tagger.json``; 0.5 for a tagger saved without one),
        or at ``threshold`` when given."""
        folder = Path(folder)
        if not (folder / "config.json").exists():
            raise FileNotFoundError(f"no grounding tagger at {folder}: train one with "
                                    "`python -m experiments.grounding.grounding_bench --save <folder>` or set review.grounding_tagger to ''")
        tok, model = _tokenizer_and_model(folder, fresh_head=False)
        meta = folder / TAGGER_META
        stored = json.loads(meta.read_text())["threshold"] if meta.is_file() else 0.5
        return cls(tok, model, stored if threshold is None else threshold)

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        (folder / TAGGER_META).write_text(json.dumps({"threshold": self.threshold, "max_length": self.max_length,
                                                      "positive_weight": self.positive_weight, "held_out_f1": self.held_out_f1}))
        return folder

    def encode(self, answers: Sequence[str], contexts: Sequence[str]):
        return self.tokenizer(list(answers), list(contexts), truncation="only_second", max_length=self.max_length,
                              padding=True, return_offsets_mapping=True, return_tensors="pt")

    def probabilities(self, answer: str, context: str) -> list[tuple[int, int, float]]:
        """(char start, char end, P(unsupported)) for each of the answer's tokens."""
        import torch

        enc = self.encode([answer], [context])
        offsets = enc.pop("offset_mapping")[0].tolist()
        seq = enc.sequence_ids(0)
        with torch.inference_mode():
            probs = torch.softmax(self.model(**enc).logits[0], -1)[:, 1].tolist()
        return [(s, e, p) for (s, e), sid, p in zip(offsets, seq, probs) if sid == 0 and e > s]

    def predict(self, answer: str, context: str) -> list[Flag]:
        return spans_from_tokens(answer, self.probabilities(answer, context), self.threshold)


def spans_from_tokens(answer: str, tokens: Sequence[tuple[int, int, float]], threshold: float) -> list[Flag]:
    """Runs of tokens at or above ``threshold`` as flags (runs split only by whitespace joined; each
    widened to whole words, trailing punctuation left out)."""
    runs: list[list[int]] = []
    for s, e, p in tokens:
        if p < threshold:
            continue
        if runs and (answer[runs[-1][1]:s].strip() == "" or s <= runs[-1][1]):
            runs[-1][1] = max(runs[-1][1], e)
        else:
            runs.append([s, e])
    flags = []
    for s, e in runs:
        while s > 0 and _wordy(answer, s - 1):
            s -= 1
        while e < len(answer) and _wordy(answer, e):
            e += 1
        flags.append(Flag(s, e, "entity", "the tagger finds no support for it", answer[s:e], DETECTOR))
    return flags


def _wordy(text: str, i: int) -> bool:
    """Whether ``text[i]`` belongs to the word around it (``$1,250.50``, ``ORD-1``, ``Joe's``, ``72°F``)."""
    c = text[i]
    if re.match(r"[\w$€£%°'’/\-]", c):
        return True
    return c in ".,:" and 0 < i < len(text) - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()


def combine(rules: Sequence[Flag], tagged: Sequence[Flag]) -> list[Flag]:
    """The rules' flags plus each tagger span that overlaps none of them (see the module doc)."""
    out = list(rules)
    for t in tagged:
        if all(t.end <= r.start or t.start >= r.end for r in rules):
            out.append(t)
    return sorted(out, key=lambda f: (f.start, f.end))


def detect(answer: str, context: str, tagger: GroundingTagger | None = None) -> list[Flag]:
    """The grounding check as the product runs it: the rules, joined with the tagger's spans when given."""
    rules = check_answer(answer, context)
    return rules if tagger is None else combine(rules, tagger.predict(answer, context))


def token_labels(enc, pairs: Sequence[Pair]):
    """Each encoded token's label: 1 for an answer token inside a gold span, 0 for another answer token,
    -100 (ignored) for the context, the special tokens and the padding."""
    import torch

    labels = torch.full(enc["input_ids"].shape, -100, dtype=torch.long)
    for i, p in enumerate(pairs):
        seq = enc.sequence_ids(i)
        for j, (s, e) in enumerate(enc["offset_mapping"][i].tolist()):
            if seq[j] == 0 and e > s:
                labels[i, j] = int(any(s < ge and e > gs for gs, ge, _ in p.spans))
    return labels


def positive_weight(label_rows) -> float:
    """The loss weight of an unsupported token: supported answer tokens per unsupported one in ``label_rows``
    (token labels, -100 ignored); 1.0 when either class is missing."""
    import torch

    labels = torch.cat([torch.as_tensor(x).reshape(-1) for x in label_rows]) if label_rows else torch.zeros(0)
    pos, neg = int((labels == 1).sum()), int((labels == 0).sum())
    return neg / pos if pos and neg else 1.0


def tagger_loss(logits, labels, weight: float):
    """Token cross-entropy over the answer's tokens (label -100 ignored), an unsupported token counting
    ``weight`` times a supported one (normalised by the summed weights)."""
    import torch

    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100,
                                             weight=torch.tensor([1.0, float(weight)], dtype=logits.dtype))


def span_counts(pairs: Sequence[Pair], predictions: Sequence[Sequence[Flag]]) -> tuple[int, int, int]:
    """Exact-span (true positives, false positives, false negatives): a flag counts only when its (start,
    end) equals a gold span's, each gold span matched once."""
    tp = fp = fn = 0
    for pair, flags in zip(pairs, predictions):
        gold = {(a, b) for a, b, _ in pair.spans}
        pred = {(f.start, f.end) for f in flags}
        tp, fp, fn = tp + len(gold & pred), fp + len(pred - gold), fn + len(gold - pred)
    return tp, fp, fn


def choose_threshold(pairs: Sequence[Pair], token_probs: Sequence[Sequence[tuple[int, int, float]]],
                     grid: Sequence[float] = tuple(round(0.05 * k, 2) for k in range(1, 20))) -> tuple[float, float]:
    """The threshold of ``grid`` with the best exact-span F1 on held-out ``pairs`` (their answers' token
    probabilities from :meth:`GroundingTagger.probabilities`); ties go to the higher threshold (fewer
    flags). Returns ``(threshold, F1)``."""
    best = (grid[-1], -1.0)
    for t in sorted(grid, reverse=True):
        tp, fp, fn = span_counts(pairs, [spans_from_tokens(p.answer, tok, t) for p, tok in zip(pairs, token_probs)])
        f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
        if f1 > best[1] + 1e-12:
            best = (t, f1)
    return best


def threshold_split(pairs: Sequence[Pair], config: TaggerConfig) -> tuple[list[Pair], list[Pair]]:
    """(fit, held): ``config.held_out`` of the pairs' sessions kept to choose the threshold, by a hash salted
    apart from the benchmark's train/test split (with the same seed, an unsalted hash would hold out only
    sessions that split had already sent to test: none of the pairs given)."""
    from tentalis_pipelines.reviewers.grounding_data import split_by_session

    if config.held_out <= 0:
        return list(pairs), []
    return split_by_session(list(pairs), test_fraction=config.held_out, seed=config.seed, salt="tagger-threshold")


def train_tagger(pairs: Sequence[Pair], model_dir: str | Path, config: TaggerConfig | None = None, on_step=None) -> GroundingTagger:
    """Fine-tune MiniLM (``model_dir``: the all-MiniLM-L6-v2 folder) with a fresh 2-label head on ``pairs``,
    unsupported tokens weighted in the loss, the threshold chosen on held-out sessions (:class:`TaggerConfig`)."""
    import torch

    config = config or TaggerConfig()
    torch.manual_seed(config.seed)
    fit, held = threshold_split(pairs, config)
    if not fit:
        raise ValueError(f"no training pairs left after holding out {config.held_out:.0%} of {len(pairs)} pairs' sessions")
    tok, model = _tokenizer_and_model(Path(model_dir), fresh_head=True)
    tagger = GroundingTagger(tok, model, config.threshold, config.max_length)
    weight = config.positive_weight
    if weight is None:
        weight = positive_weight([token_labels(tagger.encode([p.answer], [p.context]), [p]) for p in fit])
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
    order = list(range(len(fit)))
    rng = random.Random(config.seed)
    total = config.epochs * ((len(fit) + config.batch_size - 1) // config.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, 1 - step / max(total, 1)))
    model.train()
    step = 0
    for _ in range(config.epochs):
        rng.shuffle(order)
        for k in range(0, len(order), config.batch_size):
            batch = [fit[i] for i in order[k:k + config.batch_size]]
            enc = tagger.encode([p.answer for p in batch], [p.context for p in batch])
            labels = token_labels(enc, batch)
            enc.pop("offset_mapping")
            loss = tagger_loss(model(**enc).logits, labels, weight)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            step += 1
            if on_step is not None:
                on_step(step, total, float(loss.detach()))
    model.eval()
    tagger.positive_weight = weight
    if held:
        tagger.threshold, tagger.held_out_f1 = choose_threshold(held, [tagger.probabilities(p.answer, p.context) for p in held])
    return tagger
