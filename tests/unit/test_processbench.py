"""ProcessBench: loading (fixture written here, never the shared data), seeded sampling, the published
F1 metric on hand-made labels, and both prediction modes through a scripted judge."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tentalis_pipelines.evaluation.processbench import (
    evaluate_processbench,
    load_processbench,
    load_split,
    markdown_table,
    processbench_metrics,
    split_path,
)
from tentalis_pipelines.inference.base import Generation, SamplingParams
from tentalis_pipelines.rewards.judge import JudgeConfig, JudgePRM


class ScriptedBackend:
    """Replies from a function of the prompt, the same reply for every sample."""

    name = "scripted"
    model_name = "scripted-judge"
    tokenizer = None

    def __init__(self, script):
        self.script = script
        self.calls = 0

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        self.calls += 1
        return [
            [Generation(text=self.script(p), token_ids=[], finish_reason="stop", prompt_tokens=0, seconds=0.0)] * params.num_generations
            for p in prompts
        ]


ROWS = [
    {"id": "t-0", "generator": "g", "problem": "2 + 2 * 3?", "steps": ["2 * 3 = 6", "2 + 6 = 8"], "final_answer_correct": True, "label": -1},
    {"id": "t-1", "generator": "g", "problem": "5 - 1 + 2?", "steps": ["5 - 1 = 4", "4 + 2 = 7 WRONG"], "final_answer_correct": False, "label": 1},
    {"id": "t-2", "generator": "g", "problem": "3 * 3?", "steps": ["3 * 3 = 10 WRONG", "so 10"], "final_answer_correct": False, "label": 0},
    {"id": "t-3", "generator": "g", "problem": "1 + 1?", "steps": ["1 + 1 = 2"], "final_answer_correct": True, "label": -1},
    {"id": "t-4", "generator": "g", "problem": "9 / 3?", "steps": ["9 / 3 = 3", "so 3", "done"], "final_answer_correct": True, "label": -1},
]


def _write(path: Path, rows: list[dict], extra: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + extra, encoding="utf-8")
    return path


def test_load_and_seeded_sample(tmp_path: Path) -> None:
    path = _write(tmp_path / "pb.jsonl", ROWS)
    everything = load_split(path)
    assert [s.id for s in everything] == [r["id"] for r in ROWS]
    assert everything[1].steps == ("5 - 1 = 4", "4 + 2 = 7 WRONG") and everything[1].label == 1
    a, b = load_split(path, limit=3, seed=7), load_split(path, limit=3, seed=7)
    assert [s.id for s in a] == [s.id for s in b] and len(a) == 3
    ids = [s.id for s in a]
    assert ids == sorted(ids)  # a sample, kept in file order
    assert {tuple(s.id for s in load_split(path, limit=2, seed=k)) for k in range(10)} != {tuple(ids[:2])}
    assert len(load_split(path, limit=50)) == len(ROWS)


def test_malformed_lines_name_file_and_line(tmp_path: Path) -> None:
    bad_label = dict(ROWS[0], label=5)
    with pytest.raises(ValueError, match=r"pb\.jsonl:2: 'label'"):
        load_split(_write(tmp_path / "pb.jsonl", [ROWS[0], bad_label]))
    with pytest.raises(ValueError, match=r"pb2\.jsonl:2: not valid JSON"):
        load_split(_write(tmp_path / "pb2.jsonl", [ROWS[0]], extra="{oops\n"))
    with pytest.raises(ValueError, match="missing field"):
        load_split(_write(tmp_path / "pb3.jsonl", [{"id": "x", "problem": "p"}]))


def test_data_dir_comes_from_tentalis_data_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("TENTALIS_DATA_DIR", raising=False)
    with pytest.raises(FileNotFoundError, match="TENTALIS_DATA_DIR"):
        split_path("gsm8k")
    monkeypatch.setenv("TENTALIS_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="TENTALIS_DATA_DIR") as missing:
        split_path("gsm8k")
    assert str(tmp_path / "processbench" / "gsm8k.jsonl") in str(missing.value)
    _write(tmp_path / "processbench" / "gsm8k.jsonl", ROWS)
    assert [s.id for s in load_processbench("gsm8k", limit=2, seed=1)] == [s.id for s in load_processbench("gsm8k", data_dir=tmp_path, limit=2, seed=1)]
    with pytest.raises(ValueError, match="unknown ProcessBench split"):
        split_path("nope", tmp_path)


def test_f1_on_hand_made_labels() -> None:
    labels = [-1, -1, 2, 0, 1]
    preds = [-1, 0, 2, None, 1]  # correct: 1 of 2; erroneous: 2 of 3 (the None never matches)
    m = processbench_metrics(labels, preds)
    assert (m.n, m.n_error, m.n_correct, m.unparsed) == (5, 3, 2, 1)
    assert m.error_accuracy == pytest.approx(2 / 3) and m.correct_accuracy == pytest.approx(1 / 2)
    assert m.f1 == pytest.approx(2 * (2 / 3) * (1 / 2) / (2 / 3 + 1 / 2))  # = 4/7
    # Predicting "no error" everywhere is perfect on correct samples and useless overall.
    always_fine = processbench_metrics(labels, [-1] * 5)
    assert always_fine.correct_accuracy == 1.0 and always_fine.error_accuracy == 0.0 and always_fine.f1 == 0.0
    # A wrong step index is a miss even though the sample is flagged as erroneous.
    assert processbench_metrics([2], [1]).error_accuracy == 0.0
    assert processbench_metrics([2], [2]).f1 is None  # no correct samples: F1 undefined
    with pytest.raises(ValueError):
        processbench_metrics([1], [])


def test_evaluate_both_modes_with_a_scripted_judge(tmp_path: Path) -> None:
    samples = load_split(_write(tmp_path / "pb.jsonl", ROWS))

    def first_error(prompt: str) -> str:
        # Points at the first paragraph containing WRONG (that is the label), except for t-2.
        paragraphs = re.findall(r"<paragraph_(\d+)>\n(.*?)\n</paragraph_", prompt, re.S)
        if "3 * 3?" in prompt:
            return "I cannot decide."
        wrong = [int(i) for i, text in paragraphs if "WRONG" in text]
        return f"\\boxed{{{wrong[0] if wrong else -1}}}"

    backend = ScriptedBackend(first_error)
    judge = JudgePRM(backend, JudgeConfig(num_votes=2))
    res = evaluate_processbench({"toy": samples}, judge, "first_error", settings={"seed": 0})
    split = res.splits["toy"]
    assert backend.calls == 1
    assert [i.prediction for i in split.items] == [-1, 1, None, -1, -1]
    assert split.items[2].votes == [None, None] and split.items[1].votes == [1, 1]
    m = split.metrics
    assert (m.correct_accuracy, m.error_accuracy, m.unparsed) == (1.0, 0.5, 1)
    assert res.summary()["splits"]["toy"]["f1"] == pytest.approx(2 / 3)

    def per_step(prompt: str) -> str:
        under_review = prompt.split("Step under review")[1]
        return "\\boxed{-1}" if "WRONG" in under_review else "The step is correct."

    backend = ScriptedBackend(per_step)
    res = evaluate_processbench({"toy": samples}, JudgePRM(backend, JudgeConfig(num_votes=3)), "per_step")
    items = res.splits["toy"].items
    assert backend.calls == 1  # every step of every sample in one generate call
    assert [i.prediction for i in items] == [-1, 1, 0, -1, -1]
    assert items[1].step_scores == [1.0, -1.0] and items[1].votes == [[1.0] * 3, [-1.0] * 3]
    assert res.splits["toy"].metrics.f1 == 1.0

    table = markdown_table(res)
    assert "| split | n |" in table and "| toy | 5 | 2 | 3 | 100.0 | 100.0 | 100.0 | 0 |" in table
    with pytest.raises(ValueError, match="unknown mode"):
        evaluate_processbench({"toy": samples}, judge, "vibes")
