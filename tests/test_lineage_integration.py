"""Lineage you can replay, retraction, and the audit table, over real Delta tables and real training.

Three learning cycles (tiny random Llama, four rollouts per batch) train c1 <- c2 <- c3, each promoted.
Then (must-hold 1) the training sets come back exactly from the manifests on a fresh copy of the
tables after the live tables changed, and (must-hold 2) retracting a review that c2 trained on (and
c3 inherited) deletes it from disk, lists both, moves serving to c1 and says why in `audit`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tentalis_pipelines import lineage
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import training as stage_training
from tentalis_pipelines.stages.rollouts import current_policy
from tentalis_pipelines.stages.training import train_checkpoint
from tentalis_pipelines.training.trainer import GRPOConfig

PROMPTS = {"b1": "What is 2 + 3?", "b2": "What is 4 + 4?", "b3": "What is 9 - 2?"}
ANSWERS = {"b1": "5", "b2": "8", "b3": "7"}
REVIEWED = "b2/b2-r0/human"  # the review retracted in must-hold 2: a human's review of b2's first rollout
SECRET = "UNIQUE-CRITIQUE-b2-r0: the reviewer's words that must leave the disk"


def critique(batch_id: str, i: int) -> str:
    return SECRET if (batch_id, i) == ("b2", 0) else f"critique {batch_id} {i}"


def write_batch(lake: Lakehouse, tok, batch_id: str, policy_version: str, *, advantages=(1.3, -0.7, -0.7, 0.1), texts=None) -> None:
    """Tasks, rollouts, step scores, reviews (hints on rollouts 0 and 2) and trajectories of one batch."""
    prompt, answer = PROMPTS.get(batch_id, "What is 1 + 1?"), ANSWERS.get(batch_id, "2")
    texts = texts or [f" <answer>{answer}</answer>", " 7", " <answer>6</answer>", " five"]
    now = now_utc()
    rollouts, steps, reviews, trajectories = [], [], [], []
    for i, (text, adv) in enumerate(zip(texts, advantages)):
        rid = f"{batch_id}-r{i}"
        ids = tok(text, add_special_tokens=False)["input_ids"]
        rollouts.append({
            "batch_id": batch_id, "rollout_id": rid, "task_id": "t0", "group_index": i, "policy_version": policy_version,
            "backend": "transformers", "model": "tiny", "prompt_text": prompt, "completion": text, "steps": [text], "answer": None,
            "parse_mode": "fallback", "prompt_tokens": 5, "completion_tokens": len(ids), "completion_token_ids": ids,
            "sampling_logprobs": [-1.0 - 0.1 * k for k in range(len(ids))], "finish_reason": "stop", "temperature": 0.7 + 0.1 * i,
            "seconds": 0.1, "created_at": now,
        })
        steps.append({"batch_id": batch_id, "rollout_id": rid, "step_index": 0, "step_text": text, "scorer": "verifier",
                      "score": float(i == 0), "votes": [], "rationale": ""})
        manager = "human" if (batch_id, i) == ("b2", 0) else "verifier"
        reviews.append({"batch_id": batch_id, "rollout_id": rid, "manager": manager, "score": float(i == 0),
                        "critique": critique(batch_id, i), "hint": f"hint {batch_id} {i}" if i in (0, 2) else "", "created_at": now})
        trajectories.append({
            "batch_id": batch_id, "rollout_id": rid, "task_id": "t0", "group_index": i, "policy_version": policy_version,
            "outcome_reward": float(i == 0), "format_reward": 0.0, "process_reward": None, "step_rewards": [],
            "manager_score": float(i == 0), "overlong_penalty": 0.0, "reward": float(i == 0), "reward_weights": "{}",
            "advantage": adv, "step_advantages": [], "advantage_mode": "outcome", "kept": True, "created_at": now,
        })
    lake.write_batch("tasks", batch_id, [{"batch_id": batch_id, "task_id": "t0", "source": "test", "environment": "math",
                                          "prompt": prompt, "reference": answer, "difficulty": 1, "metadata": "{}", "created_at": now}])
    lake.write_batch("rollouts", batch_id, rollouts)
    lake.write_batch("step_scores", batch_id, steps)
    lake.write_batch("reviews", batch_id, reviews)
    lake.write_batch("trajectories", batch_id, trajectories)
    if batch_id == "b2":
        lake.append("human_reviews", [{"rollout_id": "b2-r0", "batch_id": "b2", "reviewer": "dana", "score": 1.0,
                                       "critique": SECRET, "hint": "hint b2 0", "source": "reviews.jsonl", "line": 1, "imported_at": now}])


@pytest.fixture(scope="module")
def cycles(tmp_path_factory, tiny_model_dir):
    """Three cycles c1 <- c2 <- c3, each promoted; what the trainer received in each (a spy on train_grpo)."""
    from transformers import AutoTokenizer

    home = tmp_path_factory.mktemp("lineage") / "home"
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    seen: list[list] = []
    real = stage_training.train_grpo

    def spy(model, tokenizer, samples, config, *, state=None, on_step=None):
        seen.append(list(samples))
        return real(model, tokenizer, samples, config, state=state, on_step=on_step)

    mp = pytest.MonkeyPatch()
    mp.setattr(stage_training, "train_grpo", spy)
    policy = PolicySettings(model=str(tiny_model_dir))
    cfg = GRPOConfig(beta=0.0, per_step_rows=4, dtype="float32", device="cpu")
    ids = []
    try:
        for batch in ("b1", "b2", "b3"):
            version, _ = current_policy(lake, paths)
            write_batch(lake, tok, batch, version)
            ids.append(train_checkpoint(lake, paths, policy, cfg, promote=True).metadata["checkpoint_id"])
    finally:
        mp.undo()
    return {"home": home, "ids": ids, "seen": seen, "tok": tok}


def copy_home(src: Path, dst: Path) -> tuple[Paths, Lakehouse]:
    shutil.copytree(src, dst)
    paths = Paths.from_env(dst)
    return paths, Lakehouse(paths.lakehouse)


def test_the_manifest_replays_the_same_training_set_on_a_fresh_copy_after_the_tables_changed(cycles, tmp_path, tiny_model_dir):
    c1, c2, c3 = cycles["ids"]
    tok = cycles["tok"]
    _, live = copy_home(cycles["home"], tmp_path / "live")

    # What each manifest says, by hand: the versions are the tables' versions when each run started.
    m1, m3 = lineage.load_manifest(live, c1), lineage.load_manifest(live, c3)
    assert m1["parent_id"] is None and m3["parent_id"] == c2 and m3["ancestors"] == [c2, c1]
    # b1..b3 were each written as one commit per table (tasks, rollouts, step_scores, reviews, trajectories): v0, v1, v2.
    assert m1["tables"] == {"tasks": 0, "rollouts": 0, "step_scores": 0, "reviews": 0, "trajectories": 0}
    assert m3["tables"] == {"tasks": 2, "rollouts": 2, "step_scores": 2, "reviews": 2, "trajectories": 2}
    assert [t["rollout_id"] for t in m3["trajectories"]] == ["b3-r0", "b3-r1", "b3-r2", "b3-r3"]
    assert [r["review_key"] for r in m3["hints"]] == ["b3/b3-r0/verifier", "b3/b3-r2/verifier"]
    assert m3["samples"] == 4 and m3["config"]["per_step_rows"] == 4 and m3["code_version"]["git_commit"]
    # The JSON file in the checkpoint folder is the same manifest.
    folder = Path(next(r for r in live.read("checkpoints").to_pylist() if r["checkpoint_id"] == c3)["adapter_uri"])
    assert json.loads((folder / lineage.MANIFEST_FILE).read_text()) == m3
    # "Which reviews / hints taught c2" is one query.
    hints = live.sql(f"select row_id from lineage where checkpoint_id = '{c2}' and kind = 'hint' order by row_id").column(0).to_pylist()
    assert hints == [REVIEWED, "b2/b2-r2/verifier"]

    # The live tables move on: b1 is re-run (new completions and advantages), b2's rollouts are
    # replaced, and a new batch arrives.
    write_batch(live, tok, "b1", "base", advantages=(0.5, 0.5, -0.5, -0.5), texts=[" 1", " 2", " 3", " 4"])
    rows = live.read("rollouts", batch_id="b2").to_pylist()
    for r in rows:
        r["completion_token_ids"] = [1, 2, 3]
    live.write_batch("rollouts", "b2", rows)
    write_batch(live, tok, "b4", c3)
    now = stage_training.build_samples(live, tok, lineage.order_trajectories(
        [r for r in live.read("trajectories").to_pylist() if r["batch_id"] == "b1"]))[0]
    assert now != cycles["seen"][0]  # today's tables would train on something else

    # A fresh checkout of the tables (no checkpoint folders needed): every manifest replays exactly.
    _, fresh = copy_home(tmp_path / "live", tmp_path / "fresh")
    shutil.rmtree(tmp_path / "fresh" / "checkpoints")
    for cid, trained in zip(cycles["ids"], cycles["seen"]):
        replayed = lineage.replay(fresh, cid, tok)
        assert replayed == trained, cid
        assert len(replayed) == 4 and replayed[0].temperature == pytest.approx(0.7)
    assert lineage.verify_replay(fresh, c2)[0]  # the tokenizer from the manifest's model folder, the digest compared




def _critiques_on_disk(table_dir: Path) -> list[str]:
    """Every critique in every parquet file under a table's folder (all versions' files, not the snapshot)."""
    out = []
    for path in table_dir.rglob("*.parquet"):
        if "_delta_log" not in path.parts:
            out += pq.read_table(path, columns=["critique"]).column("critique").to_pylist()
    return out










