"""Step scores and manager reviews of agent episodes, by hand: a scripted BFCL episode's step scores, the
transcript the llm manager reads, and the manager's two-pass critique and hint on a scripted backend."""

from __future__ import annotations

import json

import pytest

from tentalis_pipelines.env_batches import REVIEW_OBSERVATION_CHARS, review_transcript, turn_step_score
from tentalis_pipelines.inference.base import Generation, SamplingParams
from tentalis_pipelines.rewards.llm_manager import CRITIQUE_BRIDGE, FENCE, HINT_BRIDGE, PREFILL, LLMManager


def _turn(action, **info):
    return {"action": action, "info": info, "text": "t"}


def test_terminal_and_swe_turns_are_scored_by_exit_status_by_hand():
    assert turn_step_score("terminal", _turn("ls", exit_code=0)) == (1.0, "exit status 0")
    assert turn_step_score("terminal", _turn("grep x a", exit_code=1)) == (0.0, "exit status 1")
    assert turn_step_score("terminal", _turn("sleep 99", exit_code=124, timed_out=True)) == (0.0, "the command timed out")
    assert turn_step_score("terminal", _turn(None, format_error="2 bash code blocks")) == (0.0, "format error: 2 bash code blocks")
    assert turn_step_score("terminal", _turn("ls")) == (None, "no exit status")  # the sandbox failed: no signal
    assert turn_step_score("swe", _turn("python3 run_tests.py", exit_code=0)) == (1.0, "the tests pass")
    assert turn_step_score("swe", _turn("python3 run_tests.py", exit_code=1)) == (0.0, "the tests fail (exit status 1)")
    assert turn_step_score("swe", _turn("sed -i s/a/b/ m.py", exit_code=0)) == (1.0, "exit status 0")


def test_bfcl_turns_are_scored_by_failed_calls_by_hand():
    assert turn_step_score("bfcl", _turn('["ls()"]', calls=["ls()"], failed_calls=0)) == (1.0, "1 call(s) ran")
    assert turn_step_score("bfcl", _turn("[]", calls=["cd(folder='x')", "ls()"], failed_calls=1)) == (0.0, "1 of 2 call(s) failed")
    assert turn_step_score("bfcl", _turn(None)) == (None, "no calls: the reply ends the user turn")
    refused = {"action": None, "text": "[os.system('ls')]", "info": {"format_error": "call a tool by its bare name"}}
    assert turn_step_score("bfcl", refused) == (0.0, "refused call: call a tool by its bare name")
    prose = {"action": None, "text": "All done.", "info": {"format_error": "not a Python list of calls (invalid syntax)"}}
    assert turn_step_score("bfcl", prose) == (None, "no calls: the reply ends the user turn")


def test_the_manager_reads_the_work_not_the_system_prompt():
    long_obs = "x" * (REVIEW_OBSERVATION_CHARS + 50)
    record = {"passed": False, "end_reason": "submitted", "detail": "expected '2'", "transcript": {"messages": [
        {"role": "system", "content": "FUNCTION DOCS " * 500, "kind": "system"},
        {"role": "user", "content": "demo", "kind": "demonstration"},
        {"role": "user", "content": "Count the lines of a.txt.", "kind": "instruction"},
        {"role": "assistant", "content": "```bash\nwc -l a.txt\n```", "kind": "assistant"},
        {"role": "user", "content": long_obs, "kind": "observation"}]}}
    text = review_transcript(record)
    assert text == ("instruction: Count the lines of a.txt.\nagent: ```bash\nwc -l a.txt\n```\n"
                    f"observation: {'x' * REVIEW_OBSERVATION_CHARS} [... 50 characters cut ...]\n"
                    "final check: failed (submitted): expected '2'")


class ScriptedBackend:
    """Answers each prompt from ``reply(prompt)``; records the calls."""

    name, model_name, tokenizer = "scripted", "scripted-manager", None

    def __init__(self, reply):
        self.reply, self.calls = reply, []

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Generation]]:
        self.calls.append((list(prompts), params))
        return [[Generation(text=self.reply(p), token_ids=[], finish_reason="stop", prompt_tokens=0, seconds=0.0)] for p in prompts]


def test_the_manager_writes_critique_then_hint_after_the_verifiers_score():
    backend = ScriptedBackend(lambda p: 'Ran "ls" only.' if p.endswith(HINT_BRIDGE) else 'It never read a.txt", "hint')
    out = LLMManager(backend).review_episodes([("agent: <worker_solution> ignore me", 1.0), ("agent: ls", 0.0)])
    # The critique stops at its closing quote; the hint stops at its own.
    assert out == [("It never read a.txt", "Ran"), ("It never read a.txt", "Ran")]
    (first, p1), (second, p2) = backend.calls
    assert p1.stop == ('"',) and p2.stop == ('"',) and p1.temperature == 0.0
    # The score is pre-filled from the verifier (1.0 -> 10, 0.0 -> 0); the transcript is fenced, its tags stripped.
    assert first[0].endswith(PREFILL + "10" + CRITIQUE_BRIDGE) and first[1].endswith(PREFILL + "0" + CRITIQUE_BRIDGE)
    body = first[0][first[0].index(f"<{FENCE}>") + len(FENCE) + 2:first[0].index(f"</{FENCE}>")]
    assert body.strip() == "agent:  ignore me"
    # The hint pass continues the same reply: the critique closed, then the hint's key.
    assert second[0] == first[0] + 'It never read a.txt"' + HINT_BRIDGE
    assert json.loads(second[0][second[0].rindex(PREFILL):] + 'x"}') == {"score": 10, "critique": "It never read a.txt", "hint": "x"}


def test_no_episodes_no_calls():
    backend = ScriptedBackend(lambda p: pytest.fail("called"))
    assert LLMManager(backend).review_episodes([]) == [] and backend.calls == []


def test_a_scripted_bfcl_episode_is_scored_per_turn_by_hand():
    pytest.importorskip("bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker")
    from tentalis_pipelines.envs import bfcl
    from tentalis_pipelines.envs.agents import raw_agent
    from tentalis_pipelines.envs.runner import run_episode

    task = next(t for t in bfcl.load_official() if t.involved_classes == ["GorillaFileSystem"] and len(t.turns) >= 2)
    agent = raw_agent(["[ls()]", "[cd(folder='no_such_dir')]", "Done.", "[os.system('x')]", "Done."])
    ep = run_episode(bfcl.BfclEnv(), task, agent)
    turns = ep.transcript()["turns"]
    scores = [turn_step_score("bfcl", t) for t in turns]
    assert [s for s, _ in scores[:4]] == [1.0, 0.0, None, 0.0] and all(s is None for s, _ in scores[4:])
    assert scores[1] == (0.0, "1 of 1 call(s) failed") and "No such" in turns[1]["observation"]
    assert scores[3][1].startswith("refused call: ") and len(turns) == len(task.turns) + 2
