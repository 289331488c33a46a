"""The gateway agent's translation between the environment and OpenAI's tool-call shape (a fake client:
no server; the real `tentalis serve` run is tests/test_gateway_agent.py)."""

from __future__ import annotations

import json

import pytest

from tentalis_pipelines.envs.gateway_policy import NOT_RUN, TOOLS, GatewayPolicy, action_text


def call(name, args, cid="c1"):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


@pytest.mark.parametrize("content,calls,expected", [
    (None, [call("bash", {"command": " wc -l notes.txt "})], "```bash\nwc -l notes.txt\n```"),
    (None, [call("submit", {"answer": " 42 "})], "```bash\nsubmit 42\n```"),
    ("done", [call("submit", {})], "```bash\nsubmit\n```"),
    ("```bash\nls\n```", [], "```bash\nls\n```"),  # no tool call: the text, which the environment parses
    ("hm", [call("python", {"code": "1"})], "hm"),  # an unknown tool: the text (a format error downstream)
    ("x", [call("bash", {})], "x"),  # bash without a command
    (None, [call("bash", {"command": "ls"}), call("bash", {"command": "rm -rf x"}, "c2")], "```bash\nls\n```"),  # the first runs
])
def test_a_reply_becomes_the_environments_action(content, calls, expected):
    assert action_text(content, calls) == expected


def completion(content, calls, token_ids, logprobs):
    # Imported here, not at the top: the openai package costs about 0.4 s of CPU to import, and every
    # xdist worker collects every file of the unit tier, so a module-level import is paid by every worker.
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m", "prompt_token_ids": [1, 2, 3],
        "choices": [{"index": 0, "finish_reason": "tool_calls" if calls else "stop", "token_ids": token_ids,
                     "message": {"role": "assistant", "content": content, "tool_calls": calls or None},
                     "logprobs": {"content": [{"token": "t", "logprob": lp, "bytes": [116], "top_logprobs": []} for lp in logprobs]}}]})


class FakeClient:
    def __init__(self, replies):
        self.replies, self.requests = list(replies), []
        self.chat = self
        self.completions = self

    def create(self, **kwargs):
        self.requests.append(kwargs)
        return self.replies.pop(0)


def test_the_conversation_goes_out_with_tool_calls_and_tool_results_and_tokens_come_back():
    client = FakeClient([completion(None, [call("bash", {"command": "ls"}, "call_a"), call("bash", {"command": "pwd"}, "call_b")],
                                    [7, 8], [-0.5, -0.25]),
                         completion("```bash\nsubmit 3\n```", [], [9], [-1.0]),
                         completion("???", [], [4], [-2.0])])
    policy = GatewayPolicy(client, "m", session_id="s-1", max_tokens=8, temperature=0.5, seed=3)
    # As the runner shows them: role and content only (a demonstration's reply looks like any other).
    env_msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "demo q"}, {"role": "assistant", "content": "demo a"},
                {"role": "user", "content": "count"}]
    out = policy(env_msgs)
    assert out.text == "```bash\nls\n```" and out.token_ids == [7, 8] and out.logprobs == [-0.5, -0.25]
    assert out.prompt_token_ids == [1, 2, 3] and out.finish_reason == "tool_calls"
    first = client.requests[0]
    assert first["tools"] == TOOLS and first["logprobs"] is True and first["extra_body"] == {"return_token_ids": True}
    assert first["extra_headers"] == {"X-Session-Id": "s-1"} and (first["max_tokens"], first["temperature"], first["seed"]) == (8, 0.5, 3)
    assert first["messages"] == env_msgs
    env_msgs += [{"role": "assistant", "content": out.text}, {"role": "user", "content": "a.txt\n[exit code 0]"}]
    out2 = policy(env_msgs)
    assert out2.text == "```bash\nsubmit 3\n```" and out2.finish_reason == "stop"
    second = client.requests[1]["messages"]
    # The reply as the gateway returned it (both calls), a result for each call: the observation answers the first.
    assert second[4]["role"] == "assistant" and second[4]["content"] is None
    assert [c["id"] for c in second[4]["tool_calls"]] == ["call_a", "call_b"]
    assert second[5:] == [{"role": "tool", "tool_call_id": "call_b", "content": NOT_RUN},
                          {"role": "tool", "tool_call_id": "call_a", "content": "a.txt\n[exit code 0]"}]
    env_msgs += [{"role": "assistant", "content": out2.text}, {"role": "user", "content": "format error"}]
    policy(env_msgs)
    third = client.requests[2]["messages"]
    # A reply without a tool call goes back as its text; what the environment said after it is a user message.
    assert third[-2:] == [{"role": "assistant", "content": "```bash\nsubmit 3\n```"}, {"role": "user", "content": "format error"}]
    assert third[2] == {"role": "assistant", "content": "demo a"}  # the demonstration stays as it was
    with pytest.raises(ValueError, match="one GatewayPolicy per episode"):
        policy.openai_messages(env_msgs[:4] + [{"role": "assistant", "content": "not mine"}, *env_msgs[5:]])
