"""Guided resampling for agent episodes (training/episode_guide.py, envs/guided.py, env_batches): where the
hint goes, what the student is trained on, the guided ratio per assistant turn, expert prefixes and their
annealing, the hint leak refusal, which groups are rescued, and the format reward.

Episodes here are hand-built: a small real environment (:class:`CountEnv`), a scripted policy that returns
token ids and log-probs, and a character-level chat tokenizer whose rendering of a conversation extends
the rendering of its beginning (as ChatML does), so each position below can be computed by hand."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone

import pytest
import torch

from tentalis_pipelines import env_batches
from tentalis_pipelines.envs.base import Environment, Observation, StepResult, Verdict
from tentalis_pipelines.envs.guided import GuidedEnv, demonstration
from tentalis_pipelines.envs.runner import PolicyOutput, episode_to_turns, model_messages, run_episode
from tentalis_pipelines.envs.terminal_tasks import TerminalTask
from tentalis_pipelines.evaluation.benchmarks import BenchItem, ItemResult, summarize
from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.training import episode_guide, guide, multiturn
from tentalis_pipelines.training.losses import per_token_loss
from tentalis_pipelines.training.trainer import GRPOConfig, TrainSample, guided_behaviour_logps

NOW = datetime(2026, 12, 7, tzinfo=timezone.utc)
ROLE = {"system": 1, "user": 2, "assistant": 3}
END = 4
TAG = re.compile(r"<\|(system|user|assistant|end)\|>")


class CharTokenizer:
    """A chat tokenizer by hand: ``<|role|>`` -> 1/2/3, ``<|end|>`` -> 4, each character -> its code + 10."""

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False):
        text = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        return text + ("<|assistant|>" if add_generation_prompt else "")

    def __call__(self, text, add_special_tokens=False):
        ids, pos = [], 0
        for m in TAG.finditer(text):
            ids += [ord(c) + 10 for c in text[pos:m.start()]]
            ids.append(END if m.group(1) == "end" else ROLE[m.group(1)])
            pos = m.end()
        return {"input_ids": ids + [ord(c) + 10 for c in text[pos:]]}

    def render(self, messages):
        return self(self.apply_chat_template(model_messages(messages)))["input_ids"]


def chars(text):
    return [ord(c) + 10 for c in text]


class ScriptedTokens:
    """Replies with ``texts`` in turn; each turn's tokens are its characters and ``<|end|>``, its
    log-probs ``turn_logps[turn]`` on every token, its prompt the tokenizer's rendering."""

    def __init__(self, texts, turn_logps, tok):
        self.texts, self.turn_logps, self.tok, self.calls = list(texts), list(turn_logps), tok, 0

    def __call__(self, messages):
        i = self.calls
        self.calls += 1
        text = self.texts[min(i, len(self.texts) - 1)]
        ids = chars(text) + [END]
        return PolicyOutput(text, ids, [self.turn_logps[min(i, len(self.turn_logps) - 1)]] * len(ids), self.tok.render(messages))


class CountEnv(Environment):
    """Commands are the whole reply; ``submit X`` ends the episode (passed when X is the task's answer);
    any other command is echoed back as ``ran: <command>``."""

    name = "count"
    max_turns = 6

    def reset(self, task):
        self.task, self.ran, self.turn, self.answer = task, [], 0, None
        return Observation([{"role": "system", "content": "S", "kind": "system"},
                            {"role": "user", "content": task["instruction"], "kind": "instruction"}])

    def step(self, action):
        self.turn += 1
        self.ran.append(action)
        if action.startswith("submit "):
            self.answer = action[len("submit "):]
            return StepResult(Observation([]), 0.0, True, {"command": action, "end_reason": "submitted", "answer": self.answer})
        done = self.turn >= self.max_turns
        return StepResult(Observation([{"role": "user", "content": f"ran: {action}", "kind": "observation"}]), 0.0, done,
                          {"command": action, **({"end_reason": "turn_limit"} if done else {})})

    def verify(self):
        ok = self.answer == self.task["expected"]
        return Verdict(ok, 1.0 if ok else 0.0, "")


TASK = {"task_id": "t0", "instruction": "Count", "expected": "3", "split": "train"}


def _episode(env, texts, logps, tok, sid="g-1"):
    ep = run_episode(env, TASK, ScriptedTokens(texts, logps, tok))
    segs = multiturn.build_segments(sid, episode_to_turns(ep, session_id=sid, temperature=0.7))
    return ep, segs


# --------------------------------------------------------------------------- where the hint goes
def test_the_hint_goes_after_the_instruction_only():
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Count"}, {"role": "assistant", "content": "a"},
            {"role": "user", "content": "obs"}]
    out = episode_guide.hinted_messages(msgs, "use wc", within=2)
    assert out[1]["content"] == "Count\n\nManager's hint: use wc"
    assert [m["content"] for m in out[2:]] == ["a", "obs"] and msgs[1]["content"] == "Count"  # a copy; later observations untouched
    assert episode_guide.hinted_messages(msgs, "h")[3]["content"] == "obs\n\nManager's hint: h"  # without `within`: the last user message
    with pytest.raises(ValueError, match="no user message"):
        episode_guide.hinted_messages([{"role": "system", "content": "S"}], "h")


def test_the_student_is_trained_on_the_unhinted_conversation_with_the_hinted_log_probs():
    tok = CharTokenizer()
    texts, logps = ["ls", "cat", "submit 3"], [-0.1, -0.2, -0.5]
    env = GuidedEnv(CountEnv(), hint="use wc")
    ep, segs = _episode(env, texts, logps, tok)
    assert ep.passed and len(segs) == 1
    seg = segs[0]
    hint_ids = chars("\n\nManager's hint: use wc")
    # The policy saw the hint: right after "Count", before the instruction's <|end|>.
    assert seg.prompt_ids == [1, *chars("S"), END, 2, *chars("Count"), *hint_ids, END, 3]
    spans = [{"turn_id": s.turn_id, "turn_index": s.turn_index, "start": s.start, "end": s.end} for s in seg.spans]
    plain = episode_guide.render_prompt_ids(tok, env.plain_messages)
    sample = episode_guide.guided_sample(plain, seg.completion_ids, spans, {f"g-1-{t.index}": t.logprobs for t in ep.turns})
    # The student's sample is exactly the episode the same replies make without the hint.
    _, plain_segs = _episode(CountEnv(), texts, logps, tok, sid="r-1")
    assert sample["prompt_token_ids"] == plain_segs[0].prompt_ids == [1, *chars("S"), END, 2, *chars("Count"), END, 3]
    assert sample["completion_token_ids"] == plain_segs[0].completion_ids
    # Positions by hand: "ls<end>" [0, 3), "<user>ran: ls<end><assistant>" [3, 13), "cat<end>" [13, 17),
    # "<user>ran: cat<end><assistant>" [17, 28), "submit 3<end>" [28, 37).
    assert [(s["start"], s["end"]) for s in spans] == [(0, 3), (13, 17), (28, 37)]
    assert sample["assistant_mask"] == [1] * 3 + [0] * 10 + [1] * 4 + [0] * 11 + [1] * 9
    assert sample["behaviour_logprobs"] == [-0.1] * 3 + [None] * 10 + [-0.2] * 4 + [None] * 11 + [-0.5] * 9
    assert not _contains(sample["prompt_token_ids"], hint_ids) and not _contains(sample["completion_token_ids"], hint_ids)


def _contains(seq, sub):
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_the_guided_ratio_is_taken_per_assistant_token_against_the_hinted_behaviour_policy():
    """Three turns sampled with the hint at log-probs -0.1, -0.2, -0.9 per token; the student, without the
    hint, gives them -0.05, -0.3, -0.1 (its recomputation). Per token r = exp(student - behaviour):
    exp(0.05) = 1.0513, exp(-0.1) = 0.9048, exp(0.8) = 2.2255, the last clipped at 1 + 0.2 for A > 0."""
    tok = CharTokenizer()
    env = GuidedEnv(CountEnv(), hint="use wc")
    ep, segs = _episode(env, ["ls", "cat", "submit 3"], [-0.1, -0.2, -0.9], tok)
    seg = segs[0]
    spans = [{"turn_id": s.turn_id, "turn_index": s.turn_index, "start": s.start, "end": s.end} for s in seg.spans]
    sample = episode_guide.guided_sample(episode_guide.render_prompt_ids(tok, env.plain_messages), seg.completion_ids, spans,
                                         {f"g-1-{t.index}": t.logprobs for t in ep.turns})
    a = 0.5
    ts = TrainSample(sample["prompt_token_ids"], sample["completion_token_ids"], a, token_advantages=[a] * 37,
                     old_logps=sample["behaviour_logprobs"], temperature=0.7, loss_mask=sample["assistant_mask"], guided=True)
    rows, behaviour = guided_behaviour_logps([ts], 40, "cpu")  # right-padded to 40
    assert rows.tolist() == [[True]]
    assert behaviour[0].tolist() == pytest.approx([-0.1] * 3 + [0.0] * 10 + [-0.2] * 4 + [0.0] * 11 + [-0.9] * 9 + [0.0] * 3)
    student = torch.tensor([[-0.05] * 3 + [-7.0] * 10 + [-0.3] * 4 + [-7.0] * 11 + [-0.1] * 9 + [0.0] * 3])
    mask = torch.tensor([sample["assistant_mask"] + [0] * 3], dtype=torch.float32)
    old = torch.where(rows, behaviour, student)  # as the trainer does for a guided row
    parts = per_token_loss("grpo", student, old, torch.full((1, 40), a), mask, epsilon=0.2)
    r = parts.ratio[0]
    assert r[0:3].tolist() == pytest.approx([math.exp(0.05)] * 3, rel=1e-5)
    assert r[13:17].tolist() == pytest.approx([math.exp(-0.1)] * 4, rel=1e-5)
    assert r[28:37].tolist() == pytest.approx([math.exp(0.8)] * 9, rel=1e-5)
    loss = parts.per_token[0]
    assert loss[0:3].tolist() == pytest.approx([-math.exp(0.05) * a] * 3, rel=1e-5)
    assert loss[13:17].tolist() == pytest.approx([-math.exp(-0.1) * a] * 4, rel=1e-5)
    assert loss[28:37].tolist() == pytest.approx([-1.2 * a] * 9, rel=1e-5)  # truncated at 1 + epsilon
    assert bool(parts.clipped[0, 28]) and not bool(parts.clipped[0, 0])
    assert float((loss * mask[0]).sum()) == pytest.approx(-a * (3 * math.exp(0.05) + 4 * math.exp(-0.1) + 9 * 1.2), rel=1e-5)


def test_a_turn_without_its_sampled_log_probs_cannot_be_a_guided_sample():
    spans = [{"turn_id": "a", "start": 0, "end": 2}, {"turn_id": "b", "start": 3, "end": 4}]
    assert episode_guide.behaviour_logps(5, spans, {"a": [-1.0, -2.0], "b": [-3.0]}) == [-1.0, -2.0, None, -3.0, None]
    with pytest.raises(ValueError, match="turn 'b' has 0 sampled log-probs for its 1 tokens"):
        episode_guide.behaviour_logps(5, spans, {"a": [-1.0, -2.0], "b": None})
    with pytest.raises(ValueError, match="has 1 sampled log-probs for its 2 tokens"):
        episode_guide.behaviour_logps(5, spans, {"a": [-1.0], "b": [-3.0]})
    with pytest.raises(ValueError, match="outside the 3 completion tokens"):
        episode_guide.guided_sample([1], [5, 6, 7], [{"turn_id": "a", "start": 2, "end": 4}], {"a": [0.0, 0.0]})


# --------------------------------------------------------------------------- expert prefixes
def test_an_expert_prefix_is_context_and_only_the_policys_turns_are_trained():
    tok = CharTokenizer()
    env = GuidedEnv(CountEnv(), prefix=["ls", "cat"])
    ep, segs = _episode(env, ["submit 3"], [-0.4], tok)
    assert ep.passed and env.env.ran == ["ls", "cat", "submit 3"]  # the prefix ran in the environment first
    assert ep.turns_used == 1 and [t.text for t in ep.turns] == ["submit 3"]  # the prefix's turns are not the policy's
    seg = segs[0]
    # The demonstrated turns and their observations are all in the prompt (never trained on) ...
    assert seg.prompt_ids == [1, *chars("S"), END, 2, *chars("Count"), END, 3, *chars("ls"), END, 2, *chars("ran: ls"), END,
                              3, *chars("cat"), END, 2, *chars("ran: cat"), END, 3]
    assert episode_guide.render_prompt_ids(tok, env.plain_messages) == seg.prompt_ids  # no hint: the prompt is kept as it was
    spans = [{"turn_id": s.turn_id, "turn_index": s.turn_index, "start": s.start, "end": s.end} for s in seg.spans]
    sample = episode_guide.guided_sample(seg.prompt_ids, seg.completion_ids, spans, {"g-1-0": ep.turns[0].logprobs})
    # ... and the completion is the policy's one turn: every token of it trained, nothing else.
    assert sample["completion_token_ids"] == chars("submit 3") + [END] and sample["assistant_mask"] == [1] * 9
    assert [m.get("kind") for m in ep.messages][:6] == ["system", "instruction", "prefix", "observation", "prefix", "observation"]


def test_hint_and_prefix_together_leave_the_prefix_in_the_students_prompt_and_the_hint_out():
    tok = CharTokenizer()
    env = GuidedEnv(CountEnv(), hint="count the lines", prefix=["ls"])
    ep, segs = _episode(env, ["wc", "submit 3"], [-0.3, -0.6], tok)
    seg = segs[0]
    plain = episode_guide.render_prompt_ids(tok, env.plain_messages)
    assert plain == [1, *chars("S"), END, 2, *chars("Count"), END, 3, *chars("ls"), END, 2, *chars("ran: ls"), END, 3]
    assert seg.prompt_ids == [1, *chars("S"), END, 2, *chars("Count\n\nManager's hint: count the lines"), END, 3, *chars("ls"), END, 2,
                              *chars("ran: ls"), END, 3]
    spans = [{"turn_id": s.turn_id, "turn_index": s.turn_index, "start": s.start, "end": s.end} for s in seg.spans]
    sample = episode_guide.guided_sample(plain, seg.completion_ids, spans, {f"g-1-{t.index}": t.logprobs for t in ep.turns})
    # "wc<end>" [0, 3), "<user>ran: wc<end><assistant>" [3, 13), "submit 3<end>" [13, 22)
    assert sample["assistant_mask"] == [1] * 3 + [0] * 10 + [1] * 9


def test_a_prefix_that_ends_the_episode_is_refused():
    ep = run_episode(GuidedEnv(CountEnv(), prefix=["submit 3"]), TASK, ScriptedTokens(["x"], [-1.0], CharTokenizer()))
    assert ep.end_reason.startswith("error: reset failed") and "expert prefix ended the episode" in ep.end_reason and not ep.passed


@pytest.mark.parametrize(("demo_len", "success", "expected"), [
    (4, 0.0, 2),      # frac 0.5: ceil(0.5 * 4) = 2
    (3, 0.0, 2),      # ceil(1.5) = 2
    (2, 0.0, 1),      # ceil(1.0) = 1: the submission is the policy's
    (4, 0.25, 1),     # frac 0.5 * (1 - 0.25 / 0.5) = 0.25: ceil(1.0) = 1, not 2 by a floating-point hair
    (5, 0.1, 2),      # frac 0.5 * 0.8 = 0.4: ceil(2.0) = 2
    (5, 0.49, 1),     # frac 0.01: ceil(0.05) = 1
    (5, 0.5, 0),      # at the threshold: none
    (5, 0.9, 0),      # above it: none
    (1, 0.0, 0),      # a one-turn demonstration is the answer itself
    (0, 0.0, 0),
])
def test_the_prefix_anneals_with_the_levels_success_by_hand(demo_len, success, expected):
    assert episode_guide.prefix_turns(demo_len, success, max_fraction=0.5, threshold=0.5) == expected


def test_the_prefix_fraction_by_hand_and_its_limits():
    assert episode_guide.prefix_fraction(0.0, max_fraction=1.0, threshold=0.8) == 1.0
    assert episode_guide.prefix_fraction(0.4, max_fraction=1.0, threshold=0.8) == pytest.approx(0.5)
    assert episode_guide.prefix_fraction(0.8, max_fraction=1.0, threshold=0.8) == 0.0
    # A full fraction still leaves the last turn to the policy.
    assert episode_guide.prefix_turns(4, 0.0, max_fraction=1.0, threshold=0.8) == 3
    assert episode_guide.prefix_turns(4, 0.0, max_fraction=0.0, threshold=0.8) == 0
    for bad in ({"success_rate": 1.5}, {"success_rate": -0.1}):
        with pytest.raises(ValueError, match="success_rate"):
            episode_guide.prefix_fraction(max_fraction=0.5, threshold=0.5, **bad)
    with pytest.raises(ValueError, match="guide_prefix_threshold"):
        episode_guide.prefix_fraction(0.0, max_fraction=0.5, threshold=0.0)
    with pytest.raises(ValueError, match="guide_rescue"):
        GRPOConfig(guide_rescue="demo")
    with pytest.raises(ValueError, match="guide_prefix_max_fraction"):
        GRPOConfig(guide_prefix_max_fraction=1.5)


def test_a_demonstration_is_the_oracle_in_the_models_action_format():
    task = TerminalTask("x", 1, "count_lines", "How many lines?", {"a.txt": "1\n2\n"}, {"kind": "answer", "expected": "2"},
                        ["wc -l < a.txt", "submit 2"])
    assert demonstration(task) == ("oracle:terminal", ["```bash\nwc -l < a.txt\n```", "```bash\nsubmit 2\n```"])


# --------------------------------------------------------------------------- held out, leaks
def test_a_held_out_task_never_gets_a_hint_or_a_prefix():
    held = {**TASK, "split": "test"}
    for env in (GuidedEnv(CountEnv(), hint="use wc"), GuidedEnv(CountEnv(), prefix=["ls"])):
        with pytest.raises(episode_guide.HeldOutTask, match="held out"):
            env.reset(held)
    GuidedEnv(CountEnv()).reset(held)  # without help it is an ordinary episode
    with pytest.raises(episode_guide.HeldOutTask):
        episode_guide.check_trainable(TerminalTask("x", 1, "f", "i", {}, {"kind": "answer", "expected": "1"}, ["submit 1"], split="test"))
    assert episode_guide.task_split({"metadata": json.dumps({"split": "test"})}) == "test"
    assert episode_guide.task_split({"metadata": "{}"}) == "train"


def test_a_hint_that_contains_a_terminal_tasks_expected_output_is_refused():
    row = {"reference": json.dumps({"kind": "answer", "expected": "Lisbon"})}
    refs = episode_guide.hint_references(row)
    assert refs == ["Lisbon"]
    reviews = [{"rollout_id": "r0", "group_index": 0, "manager": "llm", "hint": "Run grep on cities.txt and submit Lisbon"},
               {"rollout_id": "r1", "group_index": 1, "manager": "llm", "hint": "Run grep on cities.txt and submit Lisbon"},
               {"rollout_id": "r2", "group_index": 2, "manager": "llm", "hint": "Use grep to find the line that names the city"}]
    hint, _ = guide.choose_hint("t", "base", reviews, refs)
    assert hint.hint == "Use grep to find the line that names the city" and hint.votes == 1  # the leaking majority is refused
    none, why = guide.choose_hint("t", "base", reviews[:2], refs)
    assert none is None and "leaks_answer: 2" in why
    # A numeric expected output is refused as a number; naming the tool is fine.
    num = episode_guide.hint_references({"reference": json.dumps({"kind": "answer", "expected": "42\n"})})
    assert guide.choose_hint("t", "base", [{**reviews[0], "hint": "The count is 42, submit it"}], num)[0] is None
    assert guide.choose_hint("t", "base", [{**reviews[0], "hint": "Count the lines with wc -l, then submit"}], num)[0] is not None
    tree = {"reference": json.dumps({"kind": "tree", "rules": [{"path": "a.cfg", "file": "port=8080\n"}, {"path": "b", "absent": True}]})}
    assert episode_guide.hint_references(tree) == ["port=8080"]
    two = episode_guide.hint_references({"reference": json.dumps({"kind": "tree", "rules": [{"path": "a.cfg", "file": "port=8080"},
                                                                                           {"path": "b.cfg", "file": "mode=fast"}]})})
    assert two == ["port=8080", "mode=fast"]
    # Every expected output is screened, not only one of them.
    assert guide.choose_hint("t", "base", [{**reviews[0], "hint": "Write port=8080 into a.cfg with echo"}], two)[0] is None
    assert guide.choose_hint("t", "base", [{**reviews[0], "hint": "Write mode=fast into b.cfg with echo"}], two)[0] is None
    assert episode_guide.hint_references({"reference": "[]"}) == [] and episode_guide.hint_references({"reference": "not json"}) == []


# --------------------------------------------------------------------------- which groups, the format reward
def _terminal_row(task_id, split="train", level=1, expected="3"):
    task = TerminalTask(task_id, level, "count_lines", "How many lines are in a.txt?", {"a.txt": "1\n2\n3\n"},
                        {"kind": "answer", "expected": expected}, ["wc -l < a.txt", f"submit {expected}"], split=split)
    return task.task_row()


def _episode_rollout(bid, task_id, g, passed, *, turns=2, format_errors=0, level=1):
    eid = env_batches.episode_id(bid, task_id, "base", g)
    return {"batch_id": bid, "rollout_id": eid, "task_id": task_id, "group_index": g, "policy_version": "base", "backend": "transformers",
            "model": "m", "prompt_text": "", "completion": "", "steps": [], "answer": None, "parse_mode": "episode:submitted",
            "prompt_tokens": 2, "completion_tokens": 4, "completion_token_ids": [5, 6, 7, 8], "sampling_logprobs": None,
            "finish_reason": "stop", "temperature": 0.8, "seconds": 0.0, "created_at": NOW, "session_id": eid,
            "prompt_token_ids": [1, 2], "assistant_mask": [1, 1, 0, 1],
            "turn_spans": [{"turn_id": f"{eid}-0", "turn_index": 0, "start": 0, "end": 2}, {"turn_id": f"{eid}-1", "turn_index": 1, "start": 3, "end": 4}],
            "episode": json.dumps({"environment": "terminal", "end_reason": "submitted", "passed": passed, "reward": float(passed), "detail": "",
                                   "turns": turns, "max_turns": 4, "format_errors": format_errors, "check_kind": "answer", "level": level})}


def _lake(tmp_path, groups, *, hint="Count the lines of the file with wc -l and submit the number", splits=None, level=1):
    """A batch whose task ``t<i>`` has episodes passing as ``groups[i]`` says, each reviewed with ``hint``."""
    lake = Lakehouse(tmp_path / "lake")
    bid = "terminal-s1-n2-l1"
    lake.write_batch("tasks", bid, [{**_terminal_row(f"t{i}", (splits or {}).get(f"t{i}", "train"), level), "batch_id": bid}
                                    for i in range(len(groups))])
    rollouts = [_episode_rollout(bid, f"t{i}", g, ok, level=level) for i, oks in enumerate(groups) for g, ok in enumerate(oks)]
    lake.write_batch("rollouts", bid, rollouts)
    lake.write_batch("reviews", bid, [{"batch_id": bid, "rollout_id": r["rollout_id"], "manager": "verifier",
                                       "score": float(json.loads(r["episode"])["passed"]), "critique": "",
                                       "hint": "" if json.loads(r["episode"])["passed"] else hint, "created_at": NOW,
                                       "session_id": r["session_id"]} for r in rollouts])
    return lake, bid


def test_only_all_fail_groups_of_training_tasks_are_resampled(tmp_path):
    lake, bid = _lake(tmp_path, [[False, False], [True, False], [False, False]], splits={"t2": "test"})
    plans, skipped, failed, success = env_batches.plan_guided_episodes(lake, bid, GRPOConfig(guide=True))
    assert failed == [("t0", "base"), ("t2", "base")]  # t1 has a success: never resampled
    assert [p["task"].task_id for p in plans] == ["t0"]  # t2 is held out
    assert skipped == {"held-out task: never given a hint or a prefix": 1}
    p = plans[0]
    assert (p["kind"], p["in_context"], p["k"], p["prefix"]) == ("hint", "Count the lines of the file with wc -l and submit the number", 0, [])
    assert success == {1: pytest.approx(1 / 6)}


def test_the_rescue_choice_decides_hint_prefix_or_both(tmp_path):
    lake, bid = _lake(tmp_path, [[False, False]])
    (p,), _, _, _ = env_batches.plan_guided_episodes(lake, bid, GRPOConfig(guide=True, guide_rescue="prefix"))
    assert (p["kind"], p["in_context"], p["k"], p["source"]) == ("prefix", "", 1, "oracle:terminal")
    assert p["prefix"] == ["```bash\nwc -l < a.txt\n```"] and p["rescue_id"].startswith("prefix-")
    (b,), _, _, _ = env_batches.plan_guided_episodes(lake, bid, GRPOConfig(guide=True, guide_rescue="both"))
    assert b["kind"] == "both" and b["k"] == 1 and b["in_context"] and b["rescue_id"].startswith("both-")
    (a,), _, _, _ = env_batches.plan_guided_episodes(lake, bid, GRPOConfig(guide=True, guide_with_hint=False))
    assert a["kind"] == "resample" and a["in_context"] == "" and a["hint"] is not None  # the ablation: the same groups, no words


def _demo_row(bid, task_id, did, actions, *, verified=True, at=NOW):
    return {"demonstration_id": did, "batch_id": bid, "task_id": task_id, "environment": "terminal", "source": "human:demos.jsonl",
            "source_line": 1, "actions": actions, "verified": verified, "verify_detail": "", "messages": "[]",
            "task_fingerprint": "f", "created_at": at}


def test_a_prefix_comes_from_the_newest_verified_demonstration_row_before_the_oracle(tmp_path):
    from datetime import timedelta

    lake, bid = _lake(tmp_path, [[False, False], [False, False]])
    person = ["```bash\ncat a.txt | wc -l\n```", "```bash\nsubmit 3\n```"]
    from tentalis_pipelines.demonstrations import write_demonstrations

    write_demonstrations(lake, [
        _demo_row(bid, "t0", "d-old", ["```bash\nhead a.txt\n```", "```bash\nsubmit 3\n```"], at=NOW - timedelta(hours=1)),
        _demo_row(bid, "t0", "d-new", person),
        _demo_row(bid, "t0", "d-newest-unverified", ["```bash\nls\n```", "```bash\nsubmit 9\n```"], verified=False,
                  at=NOW + timedelta(hours=1)),
        _demo_row(bid, "t1", "d-empty", [], at=NOW + timedelta(hours=1)),  # no actions: never a prefix
    ])
    assert env_batches.verified_demonstrations(lake, bid) == {"t0": ("human:demos.jsonl#d-new", person)}
    p0, p1 = env_batches.plan_guided_episodes(lake, bid, GRPOConfig(guide=True, guide_rescue="prefix"))[0]
    assert (p0["source"], p0["prefix"]) == ("human:demos.jsonl#d-new", person[:1])
    assert (p1["source"], p1["prefix"]) == ("oracle:terminal", ["```bash\nwc -l < a.txt\n```"])  # t1: the scripted oracle
    assert p0["rescue_id"] != env_batches.plan_guided_episodes(_lake(tmp_path / "b", [[False, False]])[0], bid,
                                                               GRPOConfig(guide=True, guide_rescue="prefix"))[0][0]["rescue_id"]


def test_no_demonstrations_table_means_the_oracle(tmp_path):
    lake, bid = _lake(tmp_path, [[False, False]])
    assert env_batches.verified_demonstrations(lake, bid) == {}


def test_the_prefix_leaves_the_policy_a_turn_of_the_turn_limit(tmp_path):
    lake, bid = _lake(tmp_path, [[False, False]])
    row = lake.read("tasks", batch_id=bid).to_pylist()[0]
    for limit, k in ((1, 0), (2, 1)):
        meta = {**json.loads(row["metadata"]), "max_turns": limit}
        lake.write_batch("tasks", bid, [{**row, "metadata": json.dumps(meta)}])
        plans, skipped, _, _ = env_batches.plan_guided_episodes(lake, bid, GRPOConfig(guide=True, guide_rescue="prefix",
                                                                                         guide_prefix_max_fraction=1.0))
        assert [p["k"] for p in plans] == ([k] if k else [])


def test_a_leaking_hint_is_not_used_and_a_prefix_annealed_to_zero_rescues_nothing(tmp_path):
    lake, bid = _lake(tmp_path, [[False, False]], hint="Run wc -l on a.txt, the answer is 3")
    plans, skipped, _, _ = env_batches.plan_guided_episodes(lake, bid, GRPOConfig(guide=True))
    assert plans == [] and "leaks_answer: 2" in next(iter(skipped))
    # With a prefix the same group is rescued by the demonstration alone (the leaking hint stays out).
    (p,), _, _, _ = env_batches.plan_guided_episodes(lake, bid, GRPOConfig(guide=True, guide_rescue="both"))
    assert (p["kind"], p["in_context"], p["k"]) == ("prefix", "", 1)
    # Level success at the threshold: k = 0; with no usable hint either, nothing to resample with.
    lake2, bid2 = _lake(tmp_path / "b", [[False, False], [True, True]], hint="")
    plans, skipped, _, _ = env_batches.plan_guided_episodes(lake2, bid2, GRPOConfig(guide=True, guide_rescue="both", guide_prefix_threshold=0.5))
    assert plans == [] and skipped == {"no usable hint and the prefix annealed to 0 turns": 1}  # level success 0.5 >= 0.5


def test_guided_successes_join_their_group_and_the_format_reward_is_its_own_component(tmp_path):
    lake, bid = _lake(tmp_path, [[False, False]])
    eps = lake.read("rollouts", batch_id=bid).to_pylist()
    # The second episode had a turn without a command: format 1/2.
    lake.write_batch("rollouts", bid, [eps[0], {**eps[1], "episode": json.dumps({**json.loads(eps[1]["episode"]), "format_errors": 1})}])
    gid = guide.guided_rollout_id(bid, "t0", "base", "hint-x", 0)
    guided_ok = {"batch_id": bid, "rollout_id": gid, "task_id": "t0", "group_index": 0, "policy_version": "base", "hint_id": "hint-x",
                 "hint_source": "verifier", "hint": "h", "correct": True, "manager_score": 1.0, "format_score": 1.0, "created_at": NOW,
                 "prompt_token_ids": [1, 2], "completion_token_ids": [5, 6, 7], "assistant_mask": [1, 0, 1],
                 "behaviour_logprobs": [-0.1, None, -0.2], "temperature": 0.8, "rescue": "hint", "prefix_turns": 0,
                 "turn_spans": [{"turn_id": f"{gid}-0", "turn_index": 0, "start": 0, "end": 1}, {"turn_id": f"{gid}-1", "turn_index": 1, "start": 2, "end": 3}],
                 "session_id": gid, "episode": json.dumps({"passed": True, "reward": 1.0})}
    failed = {**guided_ok, "rollout_id": "g-failed", "session_id": "g-failed", "group_index": 1, "correct": False, "manager_score": 0.0,
              "episode": json.dumps({"passed": False})}
    lake.write_batch("guided_rollouts", bid, [guided_ok, failed])
    n, meta = env_batches.build_environment_trajectories(lake, bid, format_weight=0.2)
    assert n == 3 and meta["guided_rows"] == 1 and meta["groups_with_signal"] == 1  # the failed guided episode does not join
    tr = {r["rollout_id"]: r for r in lake.read("trajectories", batch_id=bid).to_pylist()}
    g = tr[gid]
    assert g["guide_hint_id"] == "hint-x" and g["outcome_reward"] == 1.0 and g["loss_mask"] == [1, 0, 1]
    assert g["reward"] == pytest.approx(1.0 + 0.2 * 1.0)
    e0, e1 = tr[eps[0]["rollout_id"]], tr[eps[1]["rollout_id"]]
    assert (e0["format_reward"], e1["format_reward"]) == (1.0, 0.5) and e0["outcome_reward"] == e1["outcome_reward"] == 0.0
    assert (e0["reward"], e1["reward"]) == (pytest.approx(0.2), pytest.approx(0.1)) and e0["guide_hint_id"] is None
    assert json.loads(g["reward_weights"]) == {"format": 0.2, "manager": 1.0, "outcome": 0.0, "process": 0.0}
    # The guided success is above its group's mean, both failures below.
    assert g["advantage"] > 0 > e0["advantage"] > e1["advantage"]


def test_a_perfectly_formatted_policy_that_solves_nothing_scores_zero_at_the_gate(tmp_path):
    lake, bid = _lake(tmp_path, [[False, False]])
    env_batches.build_environment_trajectories(lake, bid, format_weight=1.0)
    rows = lake.read("trajectories", batch_id=bid).to_pylist()
    assert all(r["format_reward"] == 1.0 and r["reward"] == 1.0 and r["outcome_reward"] == 0.0 for r in rows)
    # The gate and the benchmarks read the episodes' verdicts: every turn well formed, no success -> accuracy 0.
    items = [BenchItem(f"i{k}", "p", "", "terminal", {"level": 1}) for k in range(3)]
    summary = summarize("terminal", [ItemResult(it, "```bash\nls\n```", None, False, False, True) for it in items], 1.0)
    assert summary.accuracy == 0.0 and summary.lenient_accuracy == 0.0 and summary.format_rate == 1.0


def test_an_environment_batch_hands_guided_rollouts_and_the_format_weight_to_env_batches(tmp_path, monkeypatch):
    from tentalis_pipelines.stages.guided_rollouts import build_guided_rollouts
    from tentalis_pipelines.stages.trajectories import build_trajectories

    lake, bid = _lake(tmp_path, [[False, False]])
    calls = []
    monkeypatch.setattr(env_batches, "build_environment_trajectories", lambda *a, **kw: calls.append(("trajectories", kw)) or (0, {}))
    monkeypatch.setattr(env_batches, "build_environment_guided_rollouts", lambda *a, **kw: calls.append(("guided", a[-2:])) or (0, {}))
    build_trajectories(lake, bid, episode_format_weight=0.3)
    assert calls[-1][0] == "trajectories" and calls[-1][1]["format_weight"] == 0.3
    config = GRPOConfig(guide=True, guide_rescue="prefix")
    build_guided_rollouts(lake, None, bid, None, config)
    assert calls[-1] == ("guided", (config, None))
    # guide off: nothing is resampled, whatever the batch.
    assert build_guided_rollouts(lake, None, bid, None, GRPOConfig()).rows == 0 and len(calls) == 2


def test_the_stage_refuses_a_plan_that_holds_a_held_out_task(tmp_path, monkeypatch):
    lake, bid = _lake(tmp_path, [[False, False]], splits={"t0": "test"})
    row = lake.read("tasks", batch_id=bid).to_pylist()[0]
    task = TerminalTask.from_task_row(row)
    plan = {"row": row, "task": task, "version": "base", "hint": None, "in_context": "h", "k": 0, "prefix": [], "source": "",
            "kind": "hint", "rescue_id": "x"}
    monkeypatch.setattr(env_batches, "plan_guided_episodes", lambda *a: ([plan], {}, [("t0", "base")], {1: 0.0}))
    with pytest.raises(episode_guide.HeldOutTask, match="'t0' is held out"):
        env_batches.build_environment_guided_rollouts(lake, None, bid, None, GRPOConfig(guide=True))


def test_a_guided_sample_refuses_an_empty_or_reversed_span():
    for start, end in ((2, 2), (3, 2), (-1, 1), (0, 5)):
        with pytest.raises(ValueError, match=f"turn span {start}:{end} lies outside the 4 completion tokens"):
            episode_guide.guided_sample([1], [5, 6, 7, 8], [{"turn_id": "t", "turn_index": 0, "start": start, "end": end}],
                                        {"t": [-0.1] * max(end - start, 0)})


def test_the_hint_goes_after_the_last_user_message_among_the_first_within_whatever_its_position():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}, {"role": "assistant", "content": "a"},
            {"role": "user", "content": "obs"}, {"role": "assistant", "content": "b"}]
    # the last user message is one before the end of the window (index 3 of 5): a step of -2 would miss it
    out = episode_guide.hinted_messages(msgs, "use wc")
    assert out[3]["content"].endswith("use wc") and out[1]["content"] == "task"
    # within 3: the window ends before the observation, so the task gets it
    out = episode_guide.hinted_messages(msgs, "use wc", within=3)
    assert out[1]["content"].endswith("use wc") and out[3]["content"] == "obs"
    with pytest.raises(ValueError, match=r"^the episode's first observation has no user message to put the manager's hint after$"):
        episode_guide.hinted_messages(msgs[:1], "use wc")


def test_a_turn_without_all_its_log_probs_is_named_with_the_reason():
    spans = [{"turn_id": "t0", "turn_index": 0, "start": 0, "end": 3}]
    with pytest.raises(ValueError, match=r"turn 't0' has 2 sampled log-probs for its 3 tokens: a guided episode needs the sampler's "
                                         r"log-prob of every assistant token"):
        episode_guide.behaviour_logps(3, spans, {"t0": [-0.1, -0.2]})


class StrictBosTokenizer(CharTokenizer):
    """As a Llama-style tokenizer does: a BOS (id 9) in front unless told ``add_special_tokens=False``,
    ids (not text) from the template unless told ``tokenize=False``, no generation prompt unless asked."""

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=True):
        text = super().apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
        return super().__call__(text)["input_ids"] if tokenize else text

    def __call__(self, text, add_special_tokens=True):
        if not isinstance(text, str):
            raise TypeError("text must be a string")
        ids = super().__call__(text)["input_ids"]
        return {"input_ids": ([9] if add_special_tokens is not False else []) + ids}


def test_the_students_prompt_asks_for_the_generation_prompt_as_text_and_adds_no_special_token():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    assert episode_guide.render_prompt_ids(StrictBosTokenizer(), msgs) == [1, *chars("s"), END, 2, *chars("go"), END, 3]
