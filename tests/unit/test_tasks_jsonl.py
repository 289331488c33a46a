"""Task files in JSON Lines, from the contract: every shape a row may have, every way a row is refused (the
exact message, which names the field and what would be valid), the limits hit exactly, and bytes the
project's own writers never produce (invalid UTF-8, lone surrogates, CRLF, a NaN in metadata)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest

from tentalis_pipelines.tasks import jsonl
from tentalis_pipelines.tasks.jsonl import TaskRowError, check_unicode, load_jsonl_tasks, parse_task_record

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
GSM = "Natalia sold 48 clips in April.\n#### 1,234"


@pytest.mark.parametrize("record, expected", [
    ({"question": " How many? ", "answer": GSM},
     {"id": None, "prompt": "How many?", "reference": "1234", "environment": "math", "difficulty": None,
      "metadata": {"solution": GSM, "shape": "gsm8k"}}),
    ({"problem": "Simplify 2/4", "answer": " \\frac{1}{2} ", "solution": "divide", "subject": "Algebra", "level": 3,
      "unique_id": "test/algebra/1.json", "type": "ignored"},
     {"id": "test/algebra/1.json", "prompt": "Simplify 2/4", "reference": "\\frac{1}{2}", "environment": "math", "difficulty": 3,
      "metadata": {"solution": "divide", "subject": "Algebra", "level": 3, "unique_id": "test/algebra/1.json", "shape": "math"}}),
    ({"prompt": "Write f", "reference": "assert f() == 1", "id": 7, "environment": "code", "difficulty": 0,
      "metadata": {"origin": "mbpp", "n": [1, 2]}},
     {"id": "7", "prompt": "Write f", "reference": "assert f() == 1", "environment": "code", "difficulty": 0,
      "metadata": {"origin": "mbpp", "n": [1, 2], "shape": "generic"}}),
    ({"prompt": "p", "reference": 42, "task_id": "t-1", "environment": "chat", "difficulty": jsonl.INT32_MAX, "metadata": "not a dict"},
     {"id": "t-1", "prompt": "p", "reference": "42", "environment": "chat", "difficulty": jsonl.INT32_MAX,
      "metadata": {"shape": "generic"}}),
    ({"prompt": "p", "reference": 2.5, "id": "x" * jsonl.MAX_ID_CHARS},
     {"id": "x" * jsonl.MAX_ID_CHARS, "prompt": "p", "reference": "2.5", "environment": "math", "difficulty": None,
      "metadata": {"shape": "generic"}}),
    ({"prompt": "p", "reference": 0, "id": 0},  # zero is a value, not "unset"
     {"id": "0", "prompt": "p", "reference": "0", "environment": "math", "difficulty": None, "metadata": {"shape": "generic"}}),
    ({"problem": "p", "answer": "a", "unique_id": "u", "id": "wins"},  # id before task_id before unique_id
     {"id": "wins", "prompt": "p", "reference": "a", "environment": "math", "difficulty": None,
      "metadata": {"unique_id": "u", "shape": "math"}}),
    ({"prompt": "p", "reference": "r", "difficulty": 2, "level": 9},  # difficulty before level
     {"id": None, "prompt": "p", "reference": "r", "environment": "math", "difficulty": 2, "metadata": {"shape": "generic"}}),
])
def test_each_shape_becomes_these_task_fields(record, expected):
    assert parse_task_record(record) == expected


def test_a_reference_exactly_at_the_limit_is_kept():
    assert len(parse_task_record({"prompt": "p", "reference": "r" * jsonl.MAX_REFERENCE_CHARS})["reference"]) == jsonl.MAX_REFERENCE_CHARS


@pytest.mark.parametrize("record, message", [
    (["a", "list"], "expected a JSON object, got list"),
    ("text", "expected a JSON object, got str"),
    ({"prompt": "p"}, "generic row has 'prompt' but no 'reference' (the answer or tests)"),
    ({"prompt": "p", "reference": None}, "generic row has 'prompt' but no 'reference' (the answer or tests)"),
    ({"question": "q"}, "GSM8K row has 'question' but no string 'answer'"),
    ({"question": "q", "answer": 5}, "GSM8K row has 'question' but no string 'answer'"),
    ({"question": "q", "answer": "five"}, "GSM8K 'answer' must end with '#### <final answer>'"),
    ({"problem": "p"}, "MATH row has 'problem' but no 'answer'"),
    ({"task": "p", "answer": "a"}, "row needs 'prompt'+'reference', 'question'+'answer' (GSM8K) or 'problem'+'answer' (MATH)"),
    ({"prompt": "  ", "reference": "r"}, "the prompt/question/problem is empty or not a string"),
    ({"prompt": 5, "reference": "r"}, "the prompt/question/problem is empty or not a string"),
    ({"prompt": "p", "reference": True}, "the reference/answer must be text or a number, got True"),
    ({"prompt": "p", "reference": float("nan")}, "the reference/answer must be a finite number, got nan"),
    ({"prompt": "p", "reference": float("-inf")}, "the reference/answer must be a finite number, got -inf"),
    ({"prompt": "p", "reference": " \n"}, "the reference/answer is empty or not a string"),
    ({"prompt": "p", "reference": ["4"]}, "the reference/answer is empty or not a string"),
    ({"prompt": "p", "reference": "r" * (jsonl.MAX_REFERENCE_CHARS + 1)}, "the reference/answer is 100,001 characters (limit 100,000)"),
    ({"prompt": "p", "reference": "r", "difficulty": True}, "'difficulty' must be an integer, got True"),
    ({"prompt": "p", "reference": "r", "difficulty": 1.0}, "'difficulty' must be an integer, got 1.0"),
    ({"problem": "p", "answer": "a", "level": "Level 3"}, "'difficulty' must be an integer, got 'Level 3'"),
    ({"prompt": "p", "reference": "r", "difficulty": -1}, "'difficulty' must be between 0 and 2147483647, got -1"),
    ({"prompt": "p", "reference": "r", "difficulty": 2**31}, "'difficulty' must be between 0 and 2147483647, got 2147483648"),
    ({"prompt": "p", "reference": "r", "environment": "web"}, "'environment' must be math, code or chat, got 'web'"),
    ({"prompt": "p", "reference": "r", "environment": None}, "'environment' must be math, code or chat, got None"),
    ({"prompt": "p", "reference": "r", "id": True}, "'id' must be text or an integer, got True"),
    ({"prompt": "p", "reference": "r", "id": 1.5}, "'id' must be text or an integer, got 1.5"),
    ({"prompt": "p", "reference": "r", "id": " "}, "'id' must be 1 to 256 characters"),
    ({"prompt": "p", "reference": "r", "id": "x" * (jsonl.MAX_ID_CHARS + 1)}, "'id' must be 1 to 256 characters"),
])
def test_a_bad_row_is_refused_with_a_message_naming_the_field(record, message):
    with pytest.raises(TaskRowError, match=f"^{re.escape(message)}$"):
        parse_task_record(record)


def _nested(depth: int) -> list:
    root: list = []
    node = root
    for _ in range(depth):
        node.append([])
        node = node[0]
    return root


@pytest.mark.parametrize("record, message", [
    ({"prompt": "a\ud800b", "reference": "r"}, "holds an unpaired surrogate escape (\\ud800-\\udfff): not valid Unicode text"),
    (["\udfff"], "holds an unpaired surrogate escape (\\ud800-\\udfff): not valid Unicode text"),
    ({"k\udc80": 1}, "holds an unpaired surrogate escape (\\ud800-\\udfff): not valid Unicode text"),
    (_nested(100_000), "invalid JSON: nested too deeply"),
])
def test_check_unicode_refuses_what_no_utf8_column_can_store(record, message):
    with pytest.raises(TaskRowError, match=f"^{re.escape(message)}$"):
        check_unicode(record)


@pytest.mark.parametrize("record", [{"prompt": "é 中 😀", "reference": "ok"}, ["\ud7ff", "\ue000"], None, 1])
def test_check_unicode_passes_real_text(record):
    check_unicode(record)


def _load(tmp_path, data: bytes, **kw):
    f = tmp_path / "t.jsonl"
    f.write_bytes(data)
    return f, load_jsonl_tasks(f, "b1", NOW, **kw)


def _row(prompt="p", reference="r", **kw) -> bytes:
    return json.dumps({"prompt": prompt, "reference": reference, **kw}).encode()


def test_a_task_row_carries_every_column(tmp_path):
    f, out = _load(tmp_path, b"\n" + _row(id="a", metadata={"m": 1}, difficulty=4, environment="code") + b"\n  \n" + _row() + b"\n")
    assert out.rejects == []
    assert out.tasks == [
        {"batch_id": "b1", "task_id": "a", "source": str(f), "environment": "code", "prompt": "p", "reference": "r",
         "difficulty": 4, "metadata": '{"m": 1, "shape": "generic"}', "created_at": NOW},
        {"batch_id": "b1", "task_id": "b1-L00004", "source": str(f), "environment": "math", "prompt": "p", "reference": "r",
         "difficulty": None, "metadata": '{"shape": "generic"}', "created_at": NOW},
    ]
    out = load_jsonl_tasks(f, "b2", NOW, source="datasets/gsm8k")
    assert [t["source"] for t in out.tasks] == ["datasets/gsm8k"] * 2 and out.tasks[1]["task_id"] == "b2-L00004"


@pytest.mark.parametrize("bad", [b"\x80", b"\xff", b"\xc3", b"\xed\xa0\x80"])
def test_bytes_that_are_not_utf8_are_refused_by_line_with_the_fix(tmp_path, bad):
    f, out = _load(tmp_path, _row() + b"\n" + _row(prompt="x") + bad + b"\n" + _row(prompt="q") + b"\n")
    assert [t["prompt"] for t in out.tasks] == ["p", "q"]
    [rej] = out.rejects
    assert rej["line"] == 2 and rej["error"] == "not valid UTF-8: save the file as UTF-8"
    assert "\ufffd" in rej["raw"] and rej["raw"].encode("utf-8")  # kept as text a UTF-8 column stores
    assert rej == {**rej, "source": str(f), "batch_id": "b1", "stage": "tasks"}


def test_json_escapes_of_a_lone_surrogate_are_refused(tmp_path):
    _, out = _load(tmp_path, b'{"prompt": "a\\ud800", "reference": "r"}\n')
    assert [r["error"] for r in out.rejects] == ["holds an unpaired surrogate escape (\\ud800-\\udfff): not valid Unicode text"]


def test_crlf_and_a_lone_cr_keep_an_editors_line_numbers(tmp_path):
    _, out = _load(tmp_path, _row(id="a") + b"\r\n" + b'{"prompt": "p",\r "reference": "r", "id": "b"}\r\n' + b"{bad\r\n")
    assert [t["task_id"] for t in out.tasks] == ["a", "b"]
    assert [(r["line"], r["raw"]) for r in out.rejects] == [(3, "{bad")]
    assert out.rejects[0]["error"] == "invalid JSON: Expecting property name enclosed in double quotes at column 2"


def test_json_too_deep_or_an_integer_too_long_is_refused_not_raised(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    huge = b'{"prompt": "p", "reference": ' + b"9" * 5000 + b"}"
    _, out = _load(tmp_path, deep + b"\n" + huge + b"\n")
    assert [r["line"] for r in out.rejects] == [1, 2]
    assert out.rejects[0]["error"] == "invalid JSON: nested too deeply"
    assert out.rejects[1]["error"].startswith("invalid JSON: Exceeds the limit (4300 digits)")
    assert len(out.rejects[0]["raw"]) == 10_000  # the raw text kept is clipped


def test_the_prompt_limit_is_hit_exactly_and_the_tokenizer_runs_only_past_the_byte_bound(tmp_path):
    counted = []

    def tokens(text):
        counted.append(text)
        return len(text.split())

    data = _row(prompt="a" * 10) + b"\n" + _row(prompt="a" * 11) + b"\n" + _row(prompt="b " * 10) + b"\n"
    _, out = _load(tmp_path, data, max_prompt_tokens=10)  # bytes only: 10 passes, 11 does not
    assert [t["prompt"] for t in out.tasks] == ["a" * 10]
    assert [r["error"] for r in out.rejects] == [
        "the prompt is 11 tokens; the limit is 10 (shorten it, or raise max_prompt_tokens)",
        "the prompt is 19 tokens; the limit is 10 (shorten it, or raise max_prompt_tokens)"]
    _, out = _load(tmp_path, data, max_prompt_tokens=10, count_tokens=tokens)
    assert [t["prompt"] for t in out.tasks] == ["a" * 10, "a" * 11, ("b " * 10).strip()]
    assert counted == ["a" * 11, ("b " * 10).strip()]  # the 10-byte prompt never reached the tokenizer
    _, out = _load(tmp_path, _row(prompt="b " * 11) + b"\n", max_prompt_tokens=10, count_tokens=tokens)
    assert out.rejects[0]["error"] == "the prompt is 11 tokens; the limit is 10 (shorten it, or raise max_prompt_tokens)"
    _, out = _load(tmp_path, _row(prompt="é" * 1500) + b"\n")  # 3000 UTF-8 bytes: over the default 2048
    assert out.rejects[0]["error"] == "the prompt is 3,000 tokens; the limit is 2,048 (shorten it, or raise max_prompt_tokens)"


def test_nan_in_metadata_and_a_duplicate_id_are_refused(tmp_path):
    data = (b'{"prompt": "p", "reference": "r", "metadata": {"x": NaN}}\n' + _row(id=5) + b"\n" + _row(id="5") + b"\n"
            + b'{"problem": "p", "answer": "a", "solution": Infinity}\n')
    _, out = _load(tmp_path, data)
    assert [t["task_id"] for t in out.tasks] == ["5"]
    assert [(r["line"], r["error"]) for r in out.rejects] == [
        (1, "'metadata' holds NaN or infinity, which JSON cannot store"),
        (3, "duplicate task id '5' in this file"),
        (4, "'metadata' holds NaN or infinity, which JSON cannot store")]


def test_utf8_bytes_bound_tokens():
    assert jsonl.utf8_bytes_as_tokens("") == 0
    assert jsonl.utf8_bytes_as_tokens("aé😀") == 1 + 2 + 4
    assert jsonl.utf8_bytes_as_tokens("\udc80") == 1  # an undecodable byte counts as the one byte it was


def test_a_refused_line_is_kept_as_it_came_trailing_spaces_and_letters_included(tmp_path):
    """Only the line end ("\\n", then one "\\r") is taken off: the raw text in quarantine is the line itself."""
    _, out = _load(tmp_path, b"{bad \t\nnope XX\n{x\r\r\n")
    assert [r["raw"] for r in out.rejects] == ["{bad \t", "nope XX", "{x\r"]
