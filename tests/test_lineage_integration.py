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
from typer.testing import CliRunner

from tentalis_pipelines import audit, lineage, promotion, retraction
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages import training as stage_training
from tentalis_pipelines.stages.rollouts import current_policy
from tentalis_pipelines.stages.training import train_checkpoint
from tentalis_pipelines.training import serving
from tentalis_pipelines.training.samples import build_training_samples
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
    now = build_training_samples(live, tok, lineage.order_trajectories(
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


def test_cli_lineage_prints_versions_and_ids(cycles, monkeypatch):
    from tentalis_pipelines.cli import app

    c1, c2, c3 = cycles["ids"]
    monkeypatch.setenv("TENTALIS_HOME", str(cycles["home"]))
    monkeypatch.setenv("DAGSTER_HOME", str(cycles["home"] / "dagster"))
    runner = CliRunner()
    out = runner.invoke(app, ["lineage", c3, "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["tables"]["reviews"] == 2 and [t["rollout_id"] for t in data["trajectories"]][:1] == ["b3-r0"]
    out = runner.invoke(app, ["lineage", c2, "--verify"], terminal_width=250)
    assert out.exit_code == 0, out.output
    assert "matches" in out.output and "b2-r0" in out.output and REVIEWED in out.output and c1 in out.output
    out = runner.invoke(app, ["lineage", "ckpt-nope"])
    assert out.exit_code == 2 and "ckpt-nope" in out.output


def test_retracting_a_review_deletes_it_from_disk_and_moves_serving_off_every_checkpoint_that_used_it(cycles, tmp_path, monkeypatch):
    from tentalis_pipelines.cli import app

    c1, c2, c3 = cycles["ids"]
    paths, lake = copy_home(cycles["home"], tmp_path / "home")
    assert serving.serving_checkpoint(lake) == c3
    assert SECRET in _critiques_on_disk(Path(lake.root) / "reviews")  # the checks below can see it
    assert len([p for p in Path(lake.root).rglob("*") if p.is_file() and SECRET[:40].encode() in p.read_bytes()]) == 3
    monkeypatch.setenv("TENTALIS_HOME", str(paths.home))
    monkeypatch.setenv("DAGSTER_HOME", str(paths.home / "dagster"))

    out = CliRunner().invoke(app, ["retract", "--review", REVIEWED, "--reason", "the reviewer withdrew it: wrong rubric",
                                   "--actor", "alice", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.output)
    # b2's review of r0 (and its human_reviews source) goes, with b2's whole group t0: the four
    # trajectories whose advantages were normalised with that score.
    assert result["deleted"] == {"human_reviews": 1, "reviews": 1, "trajectories": 4}
    assert result["affected"] == {c2: "direct", c3: f"inherited from {c2}"}
    assert (result["serving_before"], result["serving_after"]) == (c3, c1)

    # Gone from every file on disk after vacuum, not only from the current snapshot.
    for name in ("reviews", "human_reviews"):
        assert SECRET not in _critiques_on_disk(Path(lake.root) / name), name
    # Nor in any byte of the lakehouse, Delta logs included (an unpartitioned table's log statistics
    # held the critique's first 64 characters; the retraction cuts that log to its current version).
    leaks = [p for p in Path(lake.root).rglob("*") if p.is_file() and SECRET[:40].encode() in p.read_bytes()]
    assert leaks == [] and result["purged_log_files"]["human_reviews"] > 0
    assert [r for r in lake.read("trajectories", batch_id="b2").to_pylist()] == []
    assert sorted(r["rollout_id"] for r in lake.read("reviews", batch_id="b2").to_pylist()) == ["b2-r1", "b2-r2", "b2-r3"]
    assert len(lake.read("trajectories", batch_id="b1")) == 4  # other batches untouched

    # Serving moved to the newest unaffected checkpoint; the move and the retraction are audited.
    assert serving.serving_checkpoint(lake) == c1
    last = serving.serving_history(lake)[-1]
    assert (last["from_checkpoint"], last["to_checkpoint"], last["action"], last["actor"]) == (c3, c1, "retract", "alice")
    (row,) = audit.rows(lake, action="retraction")
    assert (row["actor"], row["subject"], row["from_state"], row["to_state"]) == ("alice", f"review {REVIEWED}", c3, c1)
    assert row["reason"] == "the reviewer withdrew it: wrong rubric"
    assert json.loads(row["detail"])["affected"] == {c2: "direct", c3: f"inherited from {c2}"}
    assert {r["subject"] for r in audit.rows(lake, action=audit.TAINTED)} == {c2, c3}
    assert [(r["action"], r["from_state"], r["to_state"]) for r in audit.rows(lake, action="retract")] == [("retract", c3, c1)]
    # A checkpoint trained on retracted data is never served again; c1's lineage still replays, c2's cannot.
    with pytest.raises(serving.ServingError, match="retracted"):
        serving.promote(lake, c2, actor="bob", reason="try")
    assert lineage.replay(lake, c1, cycles["tok"]) == cycles["seen"][0]
    with pytest.raises(lineage.LineageError, match="vacuumed"):
        lineage.replay(lake, c2, cycles["tok"])
    # The same id again: nothing left to retract.
    with pytest.raises(retraction.RetractionError, match="no review"):
        retraction.retract(lake, review=REVIEWED, reason="again", actor="alice")


def test_retracting_a_task_takes_its_rollouts_scores_reviews_and_trajectories(cycles, tmp_path):
    _, lake = copy_home(cycles["home"], tmp_path / "home")
    c1 = cycles["ids"][0]
    # The on-disk check sees rows in every file, partition values (batch_id is in the folder name) included.
    assert retraction.remaining_matches(lake, "trajectories", [{"batch_id": "b1", "rollout_id": "b1-r0"}]) == 1
    assert retraction.remaining_matches(lake, "trajectories", [{"batch_id": "b2", "rollout_id": "b1-r0"}]) == 0
    # Task t0 of every batch: all three checkpoints trained on it, so serving falls back to the base model.
    result = retraction.retract(lake, task="t0", reason="the task leaked a benchmark item", actor="bob")
    assert result.deleted == {"tasks": 3, "step_scores": 12, "step_labels": 0, "human_reviews": 1, "rollouts": 12, "reviews": 12,
                              "trajectories": 12}
    assert set(result.affected) == set(cycles["ids"]) and result.affected[c1] == "direct"
    assert serving.serving_checkpoint(lake) == "base"
    for name in ("tasks", "rollouts", "step_scores", "reviews", "trajectories"):
        assert lake.read(name).num_rows == 0 and retraction.remaining_matches(lake, name, [{"task_id": "t0"}, {"batch_id": "b1"}]) == 0
    with pytest.raises(retraction.RetractionError, match="exactly one"):
        retraction.retract(lake, task="t0", review="x", reason="r", actor="a")
    with pytest.raises(retraction.RetractionError, match="reason"):
        retraction.retract(lake, task="t9", reason=" ", actor="a")


def test_every_promotion_rollback_and_gate_decision_is_an_audit_row(cycles, tmp_path):
    c1, c2, c3 = cycles["ids"]
    _, lake = copy_home(cycles["home"], tmp_path / "home")
    # The trainer's three promotions.
    assert [(r["actor"], r["action"], r["from_state"], r["to_state"]) for r in audit.rows(lake)] == [
        ("trainer", "promote", "base", c1), ("trainer", "promote", c1, c2), ("trainer", "promote", c2, c3)]
    serving.rollback(lake, actor="carol", reason="c3 regressed in production")
    serving.promote(lake, c3, actor="dave", reason="fixed upstream")
    items = lambda cid, n: [{"checkpoint_id": cid, "benchmark": "arithmetic", "item_id": f"i{k}", "prompt": "", "completion": "",  # noqa: E731
                             "extracted_answer": "1", "reference": "1", "correct": k < n, "lenient_correct": k < n, "formatted": True,
                             "created_at": now_utc()} for k in range(40)]
    lake.replace_where("benchmark_items", {"checkpoint_id": c3, "benchmark": "arithmetic"}, items(c3, 30))
    lake.replace_where("benchmark_items", {"checkpoint_id": c2, "benchmark": "arithmetic"}, items(c2, 5))
    incumbent, decision = promotion.decide_promotion(lake, c2, "arithmetic")  # worse than what serves: rejected
    assert incumbent == c3 and not decision.promote
    rows = audit.rows(lake)[3:]
    assert [(r["actor"], r["action"], r["subject"], r["from_state"], r["to_state"]) for r in rows] == [
        ("carol", "rollback", c2, c3, c2), ("dave", "promote", c3, c2, c3), ("gate", "gate_decision", c2, c3, "reject")]
    assert rows[0]["reason"] == "c3 regressed in production" and decision.reason in rows[2]["reason"]
    assert json.loads(rows[2]["detail"])["n_paired"] == 40
    # A checkpoint a retraction tainted is rejected by the gate even when its benchmark says promote.
    retraction.retract(lake, review=REVIEWED, reason="withdrawn", actor="alice")  # taints c2 and c3; serving moves to c1
    lake.replace_where("benchmark_items", {"checkpoint_id": c1, "benchmark": "arithmetic"}, items(c1, 5))
    incumbent, decision = promotion.decide_promotion(lake, c3, "arithmetic")
    assert incumbent == c1 and not decision.promote and "retracted" in decision.reason and serving.serving_checkpoint(lake) == c1
    assert audit.rows(lake)[-1]["to_state"] == "reject"


def test_the_manifest_names_skills_and_optional_tables_when_other_features_add_them(home, tiny_model_dir):
    """Other features add a `skills` table and a `rollouts.skill_ids` column; the manifest records both."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    write_batch(lake, tok, "b1", "base")
    rollouts = lake.read("rollouts", batch_id="b1")
    skills = [["sk-1"], ["sk-1", "sk-2"], [], None]
    column = pa.array(skills, pa.list_(pa.string()))
    at = rollouts.schema.get_field_index("skill_ids")  # the rollouts schema has the column since skills landed
    rollouts = rollouts.set_column(at, "skill_ids", column) if at >= 0 else rollouts.append_column("skill_ids", column)
    write_deltalake(lake.uri("rollouts"), rollouts,
                    mode="overwrite", predicate="batch_id = 'b1'", schema_mode="merge", partition_by=["batch_id"])
    write_deltalake(f"{lake.root}/skills", pa.table({"skill_id": ["sk-1", "sk-2"], "text": ["a", "b"]}))
    write_deltalake(f"{lake.root}/skills", pa.table({"skill_id": ["sk-3"], "text": ["c"]}), mode="append")

    versions = lineage.table_versions(lake)
    assert versions == {"tasks": 0, "rollouts": 1, "step_scores": 0, "reviews": 0, "trajectories": 0, "skills": 1}
    fresh = lineage.order_trajectories(stage_training.untrained_trajectories(lake, "base", versions).to_pylist())
    samples, by_id = build_training_samples(lake, tok, fresh, versions)
    m = lineage.build_manifest(lake, checkpoint_id="ckpt-x", parent_id=None, policy_version="base", versions=versions, trajectories=fresh,
                               rollouts=by_id, samples=samples, config={}, base_model="tiny", model=str(tiny_model_dir))
    assert m["skills"] == ["sk-1", "sk-2"] and m["tables"]["skills"] == 1
    assert [r["review_key"] for r in m["hints"]] == ["b1/b1-r0/verifier", "b1/b1-r2/verifier"] and len(m["reviews"]) == 4
    kinds = [r["kind"] for r in lineage.lineage_rows(m)]
    assert {k: kinds.count(k) for k in set(kinds)} == {"manifest": 1, "table": 6, "trajectory": 4, "review": 4, "hint": 2, "skill": 2}
    assert m["samples_digest"] == lineage.samples_digest(samples) != lineage.samples_digest(samples[::-1])


def test_retracting_a_session_removes_its_turns_reviews_and_batch_rows_everywhere_on_disk(home):
    """A gateway session and a sessions batch built from it, written by hand (no model needed)."""
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    now = now_utc()
    said = "MY-ACCOUNT-NUMBER-IS-12345678 please forget it"
    lake.append("sessions", [{"session_id": "s1", "tenant": "acme", "turn_count": 2, "policy_versions": ["base"], "models": ["m"],
                              "first_turn_at": now, "last_turn_at": now, "metadata": "{}"},
                             {"session_id": "s2", "tenant": "acme", "turn_count": 1, "policy_versions": ["base"], "models": ["m"],
                              "first_turn_at": now, "last_turn_at": now, "metadata": "{}"}])
    lake.append("turns", [{"turn_id": f"{sid}-t{i}", "session_id": sid, "tenant": "acme", "turn_index": i,
                           "messages": json.dumps([{"role": "user", "content": said if sid == "s1" else "hello"}]), "created_at": now}
                          for sid, n in (("s1", 2), ("s2", 1)) for i in range(n)])
    live = [{"batch_id": "live", "rollout_id": sid, "manager": "live", "score": 1.0, "critique": f"{sid} was fine", "hint": "",
             "created_at": now, "review_id": f"rev-{sid}", "session_id": sid} for sid in ("s1", "s2")]
    lake.write_batch("reviews", "live", live)
    batch = "sessions-abc"
    lake.write_batch("tasks", batch, [{"batch_id": batch, "task_id": sid, "source": "live-sessions", "environment": "chat",
                                       "prompt": said if sid == "s1" else "hello", "reference": "", "metadata": "{}", "created_at": now}
                                      for sid in ("s1", "s2")])
    lake.write_batch("rollouts", batch, [{"batch_id": batch, "rollout_id": f"ro-{sid}", "task_id": sid, "group_index": 0,
                                          "prompt_text": said if sid == "s1" else "hello", "completion": "ok", "session_id": sid,
                                          "created_at": now} for sid in ("s1", "s2")])
    lake.write_batch("reviews", batch, [{**r, "batch_id": batch} for r in live])
    lake.write_batch("trajectories", batch, [{"batch_id": batch, "rollout_id": f"ro-{sid}", "task_id": sid, "group_index": 0,
                                              "kind": "multi_turn", "advantage": 0.0, "kept": True, "created_at": now} for sid in ("s1", "s2")])
    assert any(said[:30].encode() in p.read_bytes() for p in (Path(lake.root) / "turns" / "_delta_log").iterdir())  # stats hold it

    # The lineage of a sessions batch's trajectory: the reviews of its session (live copies in the batch).
    trajs = [r for r in lake.read("trajectories", batch_id=batch).to_pylist() if r["rollout_id"] == "ro-s1"]
    ros = {r["rollout_id"]: r for r in lake.read("rollouts", batch_id=batch).to_pylist()}
    used = lineage.used_reviews(lake, trajs, ros, lake.table("reviews").version())
    assert [(r["batch_id"], lineage.review_key(r)) for r in used] == [(batch, "rev-s1")]

    result = retraction.retract(lake, session="s1", reason="the customer asked to be forgotten", actor="privacy")
    assert result.deleted == {"sessions": 1, "turns": 2, "tasks": 1, "rollouts": 1, "reviews": 2, "trajectories": 1}
    assert result.affected == {} and result.serving_after == "base"
    leaks = [p for p in Path(lake.root).rglob("*") if p.is_file() and said[:30].encode() in p.read_bytes()]
    assert leaks == []
    # s2 is untouched, in every table.
    assert [r["session_id"] for r in lake.read("sessions").to_pylist()] == ["s2"]
    assert [r["turn_id"] for r in lake.read("turns").to_pylist()] == ["s2-t0"]
    assert sorted(r["review_id"] for r in lake.read("reviews").to_pylist()) == ["rev-s2", "rev-s2"]
    assert [r["rollout_id"] for r in lake.read("trajectories", batch_id=batch).to_pylist()] == ["ro-s2"]
    (row,) = audit.rows(lake, action="retraction")
    assert (row["actor"], row["subject"], row["reason"]) == ("privacy", "session s1", "the customer asked to be forgotten")
    # A live review: its row in `live` and its copy in the sessions batch go, with the session's trajectory.
    result = retraction.retract(lake, review="rev-s2", reason="posted by mistake", actor="privacy")
    assert result.deleted == {"reviews": 2, "trajectories": 1} and result.review_keys == ["rev-s2"]
    assert lake.read("reviews").num_rows == 0 and lake.read("trajectories").num_rows == 0 and lake.read("turns").num_rows == 1
