"""``QuarantineGate`` from its contract, on a clock the test moves: a burst of ``per_minute`` rejects,
then one every ``60 / per_minute`` seconds, per tenant; 0 keeps none; the raw text clipped to exactly
``raw_chars`` with its full length said; bad settings refused with the setting's name."""

from __future__ import annotations

import re

import pytest

from tentalis_pipelines.gateway.quarantine import QuarantineGate


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_burst_of_per_minute_then_one_every_sixty_over_per_minute_seconds():
    clock = Clock()
    gate = QuarantineGate(per_minute=3, raw_chars=10, clock=clock)
    assert [gate.admit("acme") for _ in range(4)] == [True, True, True, False]
    assert gate.dropped == 1
    clock.now += 19.9  # a token takes 20 s to come back
    assert gate.admit("acme") is False and gate.dropped == 2
    clock.now += 0.1
    assert gate.admit("acme") is True
    assert gate.admit("acme") is False and gate.dropped == 3
    clock.now += 3600  # a long quiet spell refills the burst, never more
    assert [gate.admit("acme") for _ in range(4)] == [True, True, True, False]


def test_each_tenant_has_its_own_bucket_and_no_tenant_is_one_tenant():
    clock = Clock()
    gate = QuarantineGate(per_minute=1, clock=clock)
    assert gate.admit("acme") and gate.admit("beta")
    assert not gate.admit("acme") and not gate.admit("beta")
    assert gate.admit(None) and not gate.admit("")  # unauthenticated rejects share one bucket
    assert gate.dropped == 3


def test_a_rate_of_zero_keeps_no_reject_and_counts_each():
    gate = QuarantineGate(per_minute=0, clock=Clock())
    assert [gate.admit("acme"), gate.admit(None)] == [False, False] and gate.dropped == 2


def test_the_defaults():
    gate = QuarantineGate()
    assert (gate.per_minute, gate.raw_chars, gate.dropped) == (30, 8192, 0)
    assert all(gate.admit("t") for _ in range(30)) and not gate.admit("t")


@pytest.mark.parametrize("raw_chars, text, kept", [
    (5, "abcde", "abcde"),  # exactly the limit: whole
    (5, "abcdef", "abcde...[clipped: 6 characters in all, 5 kept]"),
    (0, "", ""),
    (0, "x", "...[clipped: 1 characters in all, 0 kept]"),
])
def test_the_raw_text_is_clipped_at_exactly_raw_chars(raw_chars, text, kept):
    assert QuarantineGate(raw_chars=raw_chars).clip(text) == kept


@pytest.mark.parametrize("kw, message", [
    ({"per_minute": -1}, "quarantine_per_minute must be an integer >= 0 (0 keeps no rejects); got -1"),
    ({"per_minute": True}, "quarantine_per_minute must be an integer >= 0 (0 keeps no rejects); got True"),
    ({"per_minute": 1.5}, "quarantine_per_minute must be an integer >= 0 (0 keeps no rejects); got 1.5"),
    ({"raw_chars": -1}, "quarantine_raw_chars must be an integer >= 0; got -1"),
    ({"raw_chars": False}, "quarantine_raw_chars must be an integer >= 0; got False"),
    ({"raw_chars": "8k"}, "quarantine_raw_chars must be an integer >= 0; got '8k'"),
])
def test_bad_settings_are_refused_by_name(kw, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        QuarantineGate(**kw)
