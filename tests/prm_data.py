"""The PRM head's test data folder (shared by tests/test_prm_head.py and tests/test_prm_agreement.py): six
GSM8K-style training problems with a ProcessBench problem planted among them, one GSM8K test question, one
ProcessBench item; and the head trained on it the way both files train it."""

from __future__ import annotations

import json
from pathlib import Path

from tentalis_pipelines.reviewers.prm_head import HeadConfig
from tentalis_pipelines.reviewers.prm_reviewer import TrainSettings, train_reviewer

TRAIN = [
    ("Tom has 3 bags with 4 apples each. He eats 2. How many apples are left?",
     "He had 3*4 = <<3*4=12>>12 apples.\nHe has 12-2 = <<12-2=10>>10 left.\n#### 10"),
    ("A pen costs 5 dollars. Ann buys 6 pens and pays with 50 dollars. How much change does she get?",
     "The pens cost 5*6 = <<5*6=30>>30 dollars.\nHer change is 50-30 = <<50-30=20>>20 dollars.\n#### 20"),
    ("A farm has 7 cows and 9 times as many hens. How many animals are there?",
     "There are 7*9 = <<7*9=63>>63 hens.\nThere are 63+7 = <<63+7=70>>70 animals.\n#### 70"),
    ("Mia reads 12 pages a day for 5 days, then 8 pages. How many pages did she read?",
     "She read 12*5 = <<12*5=60>>60 pages in 5 days.\nIn all 60+8 = <<60+8=68>>68 pages.\n#### 68"),
    ("A box holds 24 eggs. Sam has 3 boxes and breaks 5 eggs. How many eggs are whole?",
     "He has 24*3 = <<24*3=72>>72 eggs.\nWhole: 72-5 = <<72-5=67>>67 eggs.\n#### 67"),
    ("Lee earns 15 dollars an hour and works 8 hours, then spends 40 dollars. How much is left?",
     "He earns 15*8 = <<15*8=120>>120 dollars.\nLeft: 120-40 = <<120-40=80>>80 dollars.\n#### 80"),
]
PLANTED = "Sue lives in a fun neighborhood. One weekend, the neighbors placed 18 pink plastic flamingos out on Sue's front yard."


def write_data_root(tmp_path: Path) -> Path:
    """A data folder: GSM8K train (with a ProcessBench problem planted in it), GSM8K test, ProcessBench gsm8k."""
    root = tmp_path / "data"
    (root / "gsm8k").mkdir(parents=True)
    (root / "processbench").mkdir()
    rows = [{"question": q, "answer": a} for q, a in TRAIN]
    rows.insert(2, {"question": PLANTED, "answer": "She has 18*2 = <<18*2=36>>36.\n#### 36"})
    (root / "gsm8k" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "gsm8k" / "test.jsonl").write_text(json.dumps({"question": "An unrelated test question about 9 boats?", "answer": "#### 9"}) + "\n")
    (root / "processbench" / "gsm8k.jsonl").write_text(json.dumps(
        {"id": "gsm8k-0", "problem": PLANTED, "steps": ["18 flamingos.", "The answer is 18."], "label": -1}) + "\n")
    return root


def train_tiny_head(home: Path, tiny: Path, root: Path, seed: int = 0) -> Path:
    return train_reviewer(home, tiny, root, config=HeadConfig(layer=2, epochs=40, seed=seed),
                          settings=TrainSettings(train_problems=50, held_out=0.34, seed=seed, use_embeddings=False),
                          cache_dir=home / "cache")
