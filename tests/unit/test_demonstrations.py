"""Demonstrations: the warm start's sample and mask against a hand computation, the import format's
errors (file and line, quarantine), and the contamination guard that keeps held-out tasks out."""

from __future__ import annotations

import json

import pytest

from tentalis_pipelines import demonstrations as demos
from tentalis_pipelines.contamination import held_out_reason
from tentalis_pipelines.lakehouse import Lakehouse, now_utc
from tentalis_pipelines.tasks.batches import (
    terminal_held_out_tasks,
    terminal_task_rows,
    terminal_training_tasks,
)
from tentalis_pipelines.training.warm_start import demonstration_samples

ACTION_1 = "```bash\nwc -l < notes.txt\n```"
ACTION_2 = "```bash\nsubmit 3\n```"
CONVERSATION = [
    {"role": "system", "content": "You are a shell agent.", "kind": "system"},
    {"role": "user", "content": "How many lines has notes.txt?", "kind": "instruction"},
    {"role": "assistant", "content": ACTION_1, "kind": "assistant"},
    {"role": "user", "content": "3", "kind": "observation"},
    {"role": "assistant", "content": ACTION_2, "kind": "assistant"},
]


@pytest.fixture(scope="module")
def tok(smol_tokenizer):
    return smol_tokenizer  # the tiny model's tokenizer is this one


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def test_the_sample_masks_everything_but_the_demonstrated_turns_by_hand(tok):
    """SmolLM2's ChatML by hand: the prompt is the system and user turns with the assistant header; the
    completion is turn 1 + <|im_end|>, then the observation in its template (masked), then turn 2 + <|im_end|>."""
    (sample,) = demonstration_samples(tok, CONVERSATION, "demo-x")
    prompt = ("<|im_start|>system\nYou are a shell agent.<|im_end|>\n<|im_start|>user\nHow many lines has notes.txt?<|im_end|>\n"
              "<|im_start|>assistant\n")
    assert sample.prompt_ids == _ids(tok, prompt)
    eot = [tok.convert_tokens_to_ids("<|im_end|>")]
    turn1, turn2 = _ids(tok, ACTION_1) + eot, _ids(tok, ACTION_2) + eot
    gap = _ids(tok, "\n<|im_start|>user\n3<|im_end|>\n<|im_start|>assistant\n")
    assert sample.completion_ids == turn1 + gap + turn2
    assert sample.loss_mask == [1] * len(turn1) + [0] * len(gap) + [1] * len(turn2)
    assert sample.advantage == 1.0 and sample.temperature == 1.0
    trained = [t for t, m in zip(sample.completion_ids, sample.loss_mask) if m]
    assert tok.decode(trained) == ACTION_1 + "<|im_end|>" + ACTION_2 + "<|im_end|>"


def test_a_demonstration_in_the_prompt_is_context_not_a_trained_turn(tok):
    """An assistant message of kind 'demonstration' (a worked example in the prompt) is never trained on."""
    shown = [CONVERSATION[0], {"role": "user", "content": "example", "kind": "demonstration"},
             {"role": "assistant", "content": "```bash\nls\n```", "kind": "demonstration"}, *CONVERSATION[1:3]]
    (sample,) = demonstration_samples(tok, shown)
    assert "```bash\nls\n```" in tok.decode(sample.prompt_ids)
    assert sample.completion_ids == _ids(tok, ACTION_1) + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert all(sample.loss_mask)


# --------------------------------------------------------------------------- import
def _lake_with_task(tmp_path):
    lake = Lakehouse(tmp_path / "lake")
    task = terminal_training_tasks(3, 1, (1,))[0]
    lake.write_batch("tasks", "b1", terminal_task_rows("b1", [task], now_utc()))
    return lake, task


def test_import_names_file_and_line_of_every_bad_line_and_quarantines_it(tmp_path):
    lake, task = _lake_with_task(tmp_path)
    held = terminal_held_out_tasks((1,))[0].task_id
    good = {"batch_id": "b1", "task_id": task.task_id, "actions": ["```bash\nls\n```", "```bash\nsubmit 3\n```"]}
    lines = [
        "{not json",                                                     # 1
        "",                                                              # 2 blank: skipped
        "[1, 2]",                                                        # 3 not an object
        json.dumps({**good, "score": 1}),                                # 4 unknown field
        json.dumps({"batch_id": "b1", "task_id": task.task_id}),         # 5 no actions
        json.dumps({**good, "actions": []}),                             # 6 empty actions
        json.dumps({**good, "task_id": held}),                           # 7 a held-out task
        json.dumps({**good, "task_id": "terminal-s3-l1-9999-nope"}),     # 8 unknown task
        json.dumps(good),                                                # 9 good
        json.dumps(good),                                                # 10 the same again
        json.dumps({**good, "actions": ["ok", "  "]}),                   # 11 a blank action
    ]
    path = tmp_path / "demos.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = demos.import_demonstrations(lake, path, verify=False)
    assert out["imported"] == 1 and out["quarantined"] == 9
    bad = sorted(lake.read("quarantine").to_pylist(), key=lambda r: r["line"])
    assert [r["line"] for r in bad] == [1, 3, 4, 5, 6, 7, 8, 10, 11]
    for r in bad:
        assert r["error"].startswith(f"{path.resolve()}:{r['line']}: ") and r["stage"] == "demonstrations"
        assert r["source"] == str(path.resolve()) and r["raw"] == lines[r["line"] - 1]
    errors = {r["line"]: r["error"] for r in bad}
    assert "not JSON" in errors[1] and "JSON object" in errors[3] and "unknown field(s) ['score']" in errors[4]
    assert "missing field(s) ['actions']" in errors[5] and "non-empty list" in errors[6]
    assert "held out" in errors[7] and "unknown task" in errors[8] and "twice" in errors[10] and "actions[1]" in errors[11]
    (row,) = lake.read("demonstrations").to_pylist()
    assert row["source"] == "human:demos.jsonl" and row["source_line"] == 9 and row["actions"] == good["actions"]
    assert row["verified"] is False  # not replayed: the warm start never trains on it
    assert demos.read_demonstrations(lake) == []
    # Importing the same file again replaces its rows: nothing doubles.
    demos.import_demonstrations(lake, path, verify=False)
    assert lake.read("demonstrations").num_rows == 1 and lake.read("quarantine").num_rows == 9


@pytest.mark.parametrize("actions, ok", [(["a"] * demos.MAX_ACTIONS, True), (["a"] * (demos.MAX_ACTIONS + 1), False),
                                         (["a", 3], False), ("a", False), (["a"], True)])
def test_validate_line_bounds_the_actions(actions, ok):
    rec = {"batch_id": "b", "task_id": "t", "actions": actions}
    if ok:
        assert demos.validate_line(rec)["actions"] == actions
    else:
        with pytest.raises(ValueError):
            demos.validate_line(rec)


def test_validate_line_refuses_blank_ids():
    for key in ("batch_id", "task_id"):
        with pytest.raises(ValueError, match=key):
            demos.validate_line({"batch_id": "b", "task_id": "t", "actions": ["a"], key: " "})


# --------------------------------------------------------------------------- the contamination guard
def test_a_held_out_task_id_in_demonstrations_is_refused_and_flagged(tmp_path):
    lake, task = _lake_with_task(tmp_path)
    held = terminal_held_out_tasks((1,))[0]
    # A demonstration row names only its task's id and fingerprint: the id alone is enough to refuse it.
    assert "held-out task id" in held_out_reason({"task_id": held.task_id})
    assert held_out_reason({"task_id": task.task_id}) is None
    # The same held-out task under another id is caught by what it is (its fingerprint).
    renamed = {**held.task_row(), "task_id": "terminal-s3-l1-0001-renamed"}
    assert "same task as held-out" in held_out_reason({"task_id": renamed["task_id"],
                                                      "task_fingerprint": demos.task_fingerprint(renamed)})
    assert held_out_reason({"task_id": "x", "metadata": json.dumps({"split": "test"})}) == "its split is test"
    row = {"demonstration_id": "demo-1", "batch_id": "b1", "task_id": held.task_id, "environment": "terminal", "source": "oracle",
           "source_line": None, "actions": ["```bash\nls\n```"], "verified": True, "verify_detail": "passed", "messages": "[]",
           "task_fingerprint": demos.task_fingerprint(held.task_row()), "created_at": now_utc()}
    with pytest.raises(ValueError, match="refused"):
        demos.write_demonstrations(lake, [row])
    assert not lake.exists("demonstrations")
    # A row that got in another way (written to the table directly, its task in the batch) fails the asset's check.
    lake.write_batch("tasks", "b1", terminal_task_rows("b1", [task, held], now_utc()))
    lake.replace_where("demonstrations", {"batch_id": "b1", "source": "oracle"}, [row], partition_by=["batch_id"])
    passed, description, meta = demos.check_demonstrations(lake, "b1")
    assert not passed and meta["held_out"] == 1 and meta["unknown_tasks"] == 0 and held.task_id in description


def test_the_check_passes_on_clean_demonstrations(tmp_path):
    lake, task = _lake_with_task(tmp_path)
    row = {"demonstration_id": "demo-2", "batch_id": "b1", "task_id": task.task_id, "environment": "terminal", "source": "oracle",
           "source_line": None, "actions": ["```bash\nls\n```"], "verified": True, "verify_detail": "passed", "messages": "[]",
           "task_fingerprint": demos.task_fingerprint(task.task_row()), "created_at": now_utc()}
    demos.write_demonstrations(lake, [row])
    passed, _, meta = demos.check_demonstrations(lake, "b1")
    assert passed and meta == {"demonstrations": 1, "verified": 1, "held_out": 0, "unknown_tasks": 0, "without_messages": 0}


def test_the_warm_start_refuses_a_held_out_demonstration_that_got_into_the_table(tmp_path):
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.settings import Paths
    from tentalis_pipelines.stages.warm_start import train_warm_start
    from tentalis_pipelines.training.trainer import GRPOConfig
    from tentalis_pipelines.training.warm_start import WarmStartConfig

    paths = Paths.from_env(str(tmp_path / "home")).ensure()
    lake = Lakehouse(paths.lakehouse)
    held = terminal_held_out_tasks((1,))[0]
    row = {"demonstration_id": "demo-3", "batch_id": "b1", "task_id": held.task_id, "environment": "terminal", "source": "oracle",
           "source_line": None, "actions": ["```bash\nls\n```"], "verified": True, "verify_detail": "passed", "messages": "[]",
           "task_fingerprint": demos.task_fingerprint(held.task_row()), "created_at": now_utc()}
    lake.replace_where("demonstrations", {"batch_id": "b1", "source": "oracle"}, [row], partition_by=["batch_id"])
    with pytest.raises(ValueError, match="refused: 1 demonstration"):  # before any model loads
        train_warm_start(lake, paths, PolicySettings(), GRPOConfig(), WarmStartConfig())
    with pytest.raises(ValueError, match="no verified demonstrations in batches"):
        train_warm_start(lake, paths, PolicySettings(), GRPOConfig(), WarmStartConfig(), batches=["other"])


# --------------------------------------------------------------------------- the commands
def test_the_commands_refuse_bad_input_in_one_line(home, tmp_path):
    from typer.testing import CliRunner

    from tentalis_pipelines.cli import app

    runner = CliRunner()
    out = runner.invoke(app, ["warmstart", "--tasks", "arithmetic"])
    assert out.exit_code == 2 and "a warm start demonstrates environment tasks" in out.output
    out = runner.invoke(app, ["warmstart", "--tasks", "terminal", "--seed", "1000000"])
    assert out.exit_code == 2 and "reserved" in out.output
    out = runner.invoke(app, ["demos", "import", str(tmp_path / "nope.jsonl")])
    assert out.exit_code == 2 and "does not exist" in out.output
    path = tmp_path / "d.jsonl"
    path.write_text("{oops\n")
    out = runner.invoke(app, ["demos", "import", str(path), "--no-verify"])
    assert out.exit_code == 0 and "1 line(s) quarantined" in out.output and f"{path}:1:" in out.output.replace("\n", "")
    out = runner.invoke(app, ["demos", "list"])
    assert out.exit_code == 0 and "no demonstrations yet" in out.output


def test_a_training_task_sharing_only_its_request_with_a_held_out_one_is_not_held_out():
    """BFCL repeats a request ('Create a directory backup') over other initial states: the same prompt is not
    the same task. A training task is held out only when its prompt, check and initial state all match."""
    from tentalis_pipelines.tasks.batches import bfcl_held_out_tasks, bfcl_task_rows, bfcl_training_tasks

    row = bfcl_task_rows("b", bfcl_training_tasks(2, 1, (1,)), now_utc())[0]
    held = {t.task_row()["prompt"]: t for t in bfcl_held_out_tasks((1,))}
    assert row["prompt"] in held  # the same words as a held-out task ...
    assert held_out_reason(row) is None  # ... over another state: a task of its own
    same = {**held[row["prompt"]].task_row(), "task_id": "bfcl_s2_l1_9999_mkdir"}
    same["metadata"] = json.dumps({**json.loads(same["metadata"]), "split": "train"})  # renamed and relabelled
    assert "same task as held-out" in held_out_reason(same)


def test_a_later_turn_extends_the_context_instead_of_re_rendering_it(tok):
    """A turn that opens with blank lines: re-rendered, '\\n' of the assistant header and its '\\n\\n' merge
    into one token, so the re-rendered conversation no longer starts with the ids the policy saw and sampled.
    Extending the context (as ChatPolicy does) keeps one segment, the first turn's ids as they were."""
    msgs = [*CONVERSATION[:2], {"role": "assistant", "content": "\n\nls", "kind": "assistant"}, CONVERSATION[3], CONVERSATION[4]]
    (sample,) = demonstration_samples(tok, msgs)
    eot = [tok.convert_tokens_to_ids("<|im_end|>")]
    first = _ids(tok, "\n\nls") + eot
    assert sample.completion_ids[:len(first)] == first and sample.loss_mask[:len(first)] == [1] * len(first)
