"""Human reviews: unknown rollout ids are quarantined, the rest applied; re-importing changes nothing."""

import json
from datetime import datetime, timezone

from typer.testing import CliRunner

from tentalis_pipelines.cli import app
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.policy import PolicySettings
from tentalis_pipelines.settings import Paths
from tentalis_pipelines.stages.reviews import build_reviews
from tentalis_pipelines.stages.step_labels import build_step_labels
from tentalis_pipelines.stages.step_scores import build_step_scores
from tentalis_pipelines.stages.trajectories import build_trajectories

NOW = datetime.now(timezone.utc)


def _seed(lake: Lakehouse):
    lake.write_batch("tasks", "b1", [{"batch_id": "b1", "task_id": "t0", "source": "s", "environment": "math", "prompt": "2+3?",
                                      "reference": "5", "difficulty": 1, "metadata": "{}", "created_at": NOW}])
    lake.write_batch("rollouts", "b1", [
        {"batch_id": "b1", "rollout_id": f"r{i}", "task_id": "t0", "group_index": i, "policy_version": "base", "backend": "x",
         "model": "m", "prompt_text": "p", "completion": c, "steps": [c], "answer": a, "parse_mode": "tagged", "prompt_tokens": 1,
         "completion_tokens": 1, "completion_token_ids": [1], "sampling_logprobs": None, "finish_reason": "stop",
         "temperature": 0.8, "seconds": 0.1, "created_at": NOW}
        for i, (c, a) in enumerate([("<step>2 + 3 = 5</step><answer>5</answer>", "5"), ("<step>2 + 3 = 6</step><answer>6</answer>", "6")])
    ])
    build_step_scores(lake, "b1")


def test_import_quarantines_unknown_ids_and_is_idempotent(home, tmp_path):
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    _seed(lake)
    f = tmp_path / "reviews.jsonl"
    f.write_text("\n".join([
        json.dumps({"rollout_id": "r0", "score": 0.9, "critique": "Clear and right.", "hint": ""}),
        json.dumps({"rollout_id": "r-unknown", "score": 0.2, "critique": "?", "hint": ""}),
        json.dumps({"rollout_id": "r1", "score": 0.1, "critique": "2 + 3 is 5, not 6.", "hint": "Recheck the sum.", "reviewer": "ana"}),
        json.dumps({"rollout_id": "r1", "score": 7, "critique": "bad score"}),
    ]) + "\n")
    runner = CliRunner()
    out = runner.invoke(app, ["import-reviews", str(f)])
    assert out.exit_code == 0, out.output
    assert "applied 2" in out.output and "quarantined 2" in out.output
    q = lake.read("quarantine").to_pylist()
    assert sorted(r["line"] for r in q) == [2, 4] and all(r["stage"] == "human_reviews" for r in q)
    assert "unknown rollout_id" in next(r["error"] for r in q if r["line"] == 2)
    snapshot = sorted((r["rollout_id"], r["score"], str(r["imported_at"])) for r in lake.read("human_reviews").to_pylist())
    versions = lake.table("human_reviews").version()

    again = runner.invoke(app, ["import-reviews", str(f)])
    assert again.exit_code == 0
    assert lake.count("quarantine") == 2
    assert sorted((r["rollout_id"], r["score"], str(r["imported_at"])) for r in lake.read("human_reviews").to_pylist()) == snapshot
    assert lake.table("human_reviews").version() <= versions + 1  # a no-op merge at most

    res = build_reviews(lake, "b1", manager="human")
    reviews = {r["rollout_id"]: r for r in lake.read("reviews").to_pylist()}
    assert res.rows == 2 and reviews["r1"]["manager"] == "human" and reviews["r1"]["hint"] == "Recheck the sum."
    assert reviews["r0"]["score"] == 0.9


def test_missing_file_is_a_clear_error(home, tmp_path):
    out = CliRunner().invoke(app, ["import-reviews", str(tmp_path / "nope.jsonl")])
    assert out.exit_code == 2 and "does not exist" in " ".join(out.output.split())


def test_process_mode_trajectories_carry_per_step_advantages(home):
    lake = Lakehouse(Paths.from_env(home).ensure().lakehouse)
    _seed(lake)
    build_reviews(lake, "b1")
    build_trajectories(lake, "b1", advantage_mode="process")
    rows = {r["rollout_id"]: r for r in lake.read("trajectories").to_pylist()}
    assert rows["r0"]["advantage_mode"] == "process"
    # r0's only step is right (1.0), r1's is wrong (0.0): normalised across the group, opposite signs
    assert rows["r0"]["step_advantages"][0] > 0 > rows["r1"]["step_advantages"][0]
    out = lake.sql("select rollout_id, outcome_reward, process_reward, manager_score, reward_weights from trajectories order by 1")
    assert out.num_rows == 2 and "manager" in out.to_pylist()[0]["reward_weights"]


class _ScriptedPolicy:
    """Continuations with known answers, to check the Math-Shepherd label arithmetic."""

    name, model_name, tokenizer = "scripted", "scripted", None

    def generate(self, prompts, params):
        from tentalis_pipelines.inference.base import Generation

        # After a wrong step ("= 6") continuations mostly stay wrong; after a right one they finish right.
        return [[Generation("<answer>6</answer>" if ("= 6" in p and j < 3) else "<answer>5</answer>", [1], "stop", 1, 0.0)
                 for j in range(params.num_generations)] for p in prompts]


def test_monte_carlo_step_labels(home):
    paths = Paths.from_env(home).ensure()
    lake = Lakehouse(paths.lakehouse)
    _seed(lake)
    res = build_step_labels(lake, paths, "b1", PolicySettings(), k=4, backend=_ScriptedPolicy())
    labels = {r["rollout_id"]: r["label"] for r in lake.read("step_labels").to_pylist()}
    assert res.rows == 2 and labels == {"r0": 1.0, "r1": 0.25}
    build_step_labels(lake, paths, "b1", PolicySettings(), k=4, backend=_ScriptedPolicy())
    assert lake.count("step_labels") == 2


def _import_and_check(home, path, *, applied: dict[str, float], bad_lines: dict[int, str]):
    """Only the valid rows reach human_reviews, each bad one is quarantined with its reason, nothing else changes."""
    from table_hashes import assert_unchanged, table_hashes

    lake = Lakehouse(Paths.from_env(home).lakehouse)
    before = table_hashes(Paths.from_env(home).lakehouse)
    out = CliRunner().invoke(app, ["import-reviews", str(path)])
    assert out.exit_code == 0 and "Traceback" not in out.output, out.output
    assert {r["rollout_id"]: r["score"] for r in lake.read("human_reviews").to_pylist()} == applied
    q = {r["line"]: r["error"] for r in lake.read("quarantine").to_pylist() if r["stage"] == "human_reviews"}
    assert set(q) == set(bad_lines), q
    for line, needle in bad_lines.items():
        assert needle in q[line], (line, q[line])
    assert all(ch < "\udc80" or ch > "\udcff" for r in lake.read("quarantine").to_pylist() for ch in r["raw"])
    assert_unchanged(Paths.from_env(home).lakehouse, before, allow={"quarantine", "human_reviews"})
    return lake


def test_hostile_jsonl_reviews_are_quarantined_line_by_line(home, tmp_path):
    """bool scores, 20 MB critiques, unknown fields and invalid UTF-8 each cost only their own line."""
    _seed(Lakehouse(Paths.from_env(home).ensure().lakehouse))
    f = tmp_path / "reviews.jsonl"
    lines = [
        json.dumps({"rollout_id": "r0", "score": True, "critique": "bool is not a number"}).encode(),
        json.dumps({"rollout_id": "r0", "score": 0.5, "critique": "x" * 20_000_000}).encode(),
        json.dumps({"rollout_id": "r0", "score": 0.5, "api_key": "sk-live"}).encode(),
        b'{"rollout_id": "r0", "score": 0.5, "critique": "caf\xe9"}',  # latin-1, not UTF-8
        json.dumps({"rollout_id": "r0", "score": 0.5, "critique": ["not", "text"]}).encode(),
        json.dumps({"rollout_id": "r1", "score": 0.25, "critique": "fine"}).encode(),
    ]
    f.write_bytes(b"\n".join(lines) + b"\n")
    _import_and_check(home, f, applied={"r1": 0.25}, bad_lines={
        1: "'score' must be a number", 2: "the limit is 8,000", 3: "unknown field(s) ['api_key']",
        4: "not valid UTF-8", 5: "'critique' must be text"})


def test_hostile_csv_reviews_are_quarantined_row_by_row(home, tmp_path):
    _seed(Lakehouse(Paths.from_env(home).ensure().lakehouse))
    f = tmp_path / "reviews.csv"
    f.write_bytes(b"rollout_id,score,critique\n"
                  b"r0,true,bool text\n"
                  b"r0,0.5,ok,EXTRA\n"
                  b"r0,0.5,caf\xe9\n"
                  b"r1,0.75,fine\n")
    _import_and_check(home, f, applied={"r1": 0.75}, bad_lines={
        2: "'score' must be a number", 3: "beyond the header", 4: "not valid UTF-8"})
    g = tmp_path / "extra.csv"
    g.write_text("rollout_id,score,notes\nr0,0.5,private\n")
    lake = Lakehouse(Paths.from_env(home).lakehouse)
    CliRunner().invoke(app, ["import-reviews", str(g)])
    assert "unknown column(s) ['notes']" in next(r["error"] for r in lake.read("quarantine").to_pylist() if r["source"] == str(g))
