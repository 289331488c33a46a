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

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tentalis_pipelines.reviewers.grounding import Flag, check_answer
from tentalis_pipelines.reviewers.grounding_data import Pair

MAX_LENGTH = 256
DETECTOR = "tagger"


@dataclass
class TaggerConfig:
    epochs: int = 3
    batch_size: int = 16
    learning_rate: float = 5e-5
    threshold: float = 0.5
    seed: int = 0
    max_length: int = MAX_LENGTH


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
        self.model.eval()

    @classmethod
    def load(cls, folder: str | Path, threshold: float = 0.5) -> GroundingTagger:
        folder = Path(folder)
        if not (folder / "config.json").exists():
            raise FileNotFoundError(f"no grounding tagger at {folder}: train one with "
                                    "`python bench/grounding_bench.py --save <folder>` or set review.grounding_tagger to ''")
        tok, model = _tokenizer_and_model(folder, fresh_head=False)
        return cls(tok, model, threshold)

    def save(self, folder: str | Path) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
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


def _labels(enc, pairs: Sequence[Pair]):
    import torch

    labels = torch.full(enc["input_ids"].shape, -100, dtype=torch.long)
    for i, p in enumerate(pairs):
        seq = enc.sequence_ids(i)
        for j, (s, e) in enumerate(enc["offset_mapping"][i].tolist()):
            if seq[j] == 0 and e > s:
                labels[i, j] = int(any(s < ge and e > gs for gs, ge, _ in p.spans))
    return labels


def train_tagger(pairs: Sequence[Pair], model_dir: str | Path, config: TaggerConfig | None = None, on_step=None) -> GroundingTagger:
    """Fine-tune MiniLM (``model_dir``: the all-MiniLM-L6-v2 folder) with a fresh 2-label head on ``pairs``."""
    import torch

    config = config or TaggerConfig()
    torch.manual_seed(config.seed)
    tok, model = _tokenizer_and_model(Path(model_dir), fresh_head=True)
    tagger = GroundingTagger(tok, model, config.threshold, config.max_length)
    opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.01)
    order = list(range(len(pairs)))
    rng = random.Random(config.seed)
    total = config.epochs * ((len(pairs) + config.batch_size - 1) // config.batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: max(0.0, 1 - step / max(total, 1)))
    model.train()
    step = 0
    for _ in range(config.epochs):
        rng.shuffle(order)
        for k in range(0, len(order), config.batch_size):
            batch = [pairs[i] for i in order[k:k + config.batch_size]]
            enc = tagger.encode([p.answer for p in batch], [p.context for p in batch])
            labels = _labels(enc, batch)
            enc.pop("offset_mapping")
            loss = model(**enc, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            step += 1
            if on_step is not None:
                on_step(step, total, float(loss.detach()))
    model.eval()
    return tagger
