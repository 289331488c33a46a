"""An episode's verdict in words: why it failed, and the verifier's review of it.

The review an episode's verdict gives (score = the verdict's reward, a critique, a short generic hint by
failure type) is the same wherever the episode ran: an environment batch's reviews (``env_batches.py``,
``manager = 'verifier'``), an episode posted to the gateway (``envs/gateway_policy.py``: ``post_verdict``)
and an imported ATIF trajectory (``episodes.py``). So it lives with the environments.
"""

from __future__ import annotations

from typing import Any

from tentalis_pipelines.envs.base import Episode, end_kind

VERIFIER = "verifier"  # the reviewer (and manager) of a verdict's review

HINTS = {
    "passed": "",
    "hostile": "Stay inside the working directory: no writes elsewhere, no network access, no endless or forking processes.",
    "error": "",  # the environment or the policy failed, not the agent: nothing to advise
    "format": "Reply with exactly one ```bash code block holding one command in every turn.",
    "turn_limit": "Finish within the turn limit: one command per turn, then run submit ANSWER (or submit after editing files).",
    "wrong_answer": "Look at the files with a command first, then submit exactly the value the task asks for.",
    "wrong_tree": "Check the files with ls and cat after each change, and make every change the task asks for before submit.",
    "tests_fail": "Run python3 run_tests.py, read the line each failing test names, fix that line of the module, and run "
                  "the tests again before submit.",
}
# BFCL episodes (check kind "bfcl"): a reply without calls ends a user turn, so "format" means no call at all.
BFCL_HINTS = {
    **HINTS,
    "format": "Reply with a Python list of calls to the listed functions, like [cd(folder='docs'), ls()], with keyword arguments.",
    "turn_limit": "When the user's request is done, reply without calls to end the turn; do not repeat the same calls.",
    "wrong_calls": "Make every call the request needs, with the exact names and values the user gave, before ending the turn.",
}


def failure_type(*, passed: bool, end_reason: str, check_kind: str, format_errors: int, turns: int) -> str:
    """``passed``, or why the episode failed: ``hostile``, ``error``, ``format`` (no turn held a command),
    ``turn_limit`` (no submission), ``wrong_answer``, ``wrong_tree`` or ``tests_fail`` (submitted, the check
    failed)."""
    if passed:
        return "passed"
    kind = end_kind(end_reason)
    if kind in ("hostile", "error"):
        return kind
    if turns and format_errors >= turns:
        return "format"
    if kind == "turn_limit":
        return "turn_limit"
    if check_kind == "bfcl":
        return "wrong_calls"
    return {"tree": "wrong_tree", "tests": "tests_fail"}.get(check_kind, "wrong_answer")


# Failure types after which the verifier's hint also names the tools of the task's known solution.
TOOL_HINT_FAILURES = ("turn_limit", "wrong_answer", "wrong_tree")


def verdict_review(*, passed: bool, reward: float, detail: str, end_reason: str, check_kind: str, format_errors: int,
                   turns: int, max_turns: int, tools: list[str] | tuple[str, ...] = (),
                   family_hints: dict[str, str] | None = None) -> dict[str, Any]:
    """The verifier's verdict as a review: score = the verdict's reward, critique = how the episode ended
    and what the final check found, hint = :data:`HINTS` of the failure type ("" when it passed). When the
    agent ran out of turns or submitted the wrong result and the task's known solution names ``tools``
    (``terminal_tasks.solution_tools``), the hint names them too: the kind of command, never the command
    or the answer (a manager who knows how the task is done says which tool to reach for).
    ``family_hints`` (the task family's ``hints``) replace the generic hint of the failure types they name."""
    why = failure_type(passed=passed, end_reason=end_reason, check_kind=check_kind, format_errors=format_errors, turns=turns)
    critique = (f"{'passed' if passed else 'failed'} ({end_reason}) after {turns} of {max_turns} turns"
                f"{f', {format_errors} without a command' if format_errors else ''}: {detail or 'no detail'}")
    hints = BFCL_HINTS if check_kind == "bfcl" else HINTS
    hint = {**hints, **(family_hints or {})}[why]
    if tools and why in TOOL_HINT_FAILURES:
        hint = f"{hint} The tool{'s' if len(tools) > 1 else ''} for it: {', '.join(tools)}."
    return {"manager": VERIFIER, "score": float(reward), "critique": critique, "hint": hint, "failure": why}


def episode_review_fields(episode: Episode, check_kind: str) -> dict[str, Any]:
    fmt = sum(1 for t in episode.turns if t.action is None)
    return verdict_review(passed=episode.verdict.passed, reward=episode.verdict.reward, detail=episode.verdict.detail,
                          end_reason=episode.end_reason, check_kind=check_kind, format_errors=fmt, turns=episode.turns_used,
                          max_turns=episode.max_turns)
