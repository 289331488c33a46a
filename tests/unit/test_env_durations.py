"""The one reader of durations from environment variables (settings.env_seconds / env_hours) and the
settings built on it."""

from __future__ import annotations

import math

import pytest

from tentalis_pipelines import settings
from tentalis_pipelines.settings import env_hours, env_seconds

VAR = "TENTALIS_TEST_DURATION"


@pytest.mark.parametrize(("raw", "value"), [(None, 7.5), ("", 7.5), ("  ", 7.5), ("0", 0.0), ("10", 10.0), (" 0.5 ", 0.5),
                                            ("1e3", 1000.0), ("inf", math.inf)])
def test_seconds_read_and_defaulted(monkeypatch, raw, value):
    if raw is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, raw)
    assert env_seconds(VAR, 7.5) == value


@pytest.mark.parametrize(("raw", "message"), [
    ("ten", f"{VAR}='ten' is not a number of seconds"),
    ("nan", f"{VAR}='nan' is not a number of seconds"),
    ("-1", f"{VAR}='-1' must be 0 or more"),
    ("-inf", f"{VAR}='-inf' must be 0 or more"),
])
def test_bad_seconds_name_the_variable_and_the_value(monkeypatch, raw, message):
    monkeypatch.setenv(VAR, raw)
    with pytest.raises(ValueError) as exc:
        env_seconds(VAR, 1.0)
    assert str(exc.value) == message


def test_whole_hours(monkeypatch):
    monkeypatch.setenv(VAR, "12")
    assert env_hours(VAR, 1, whole=True) == 12 and isinstance(env_hours(VAR, 1, whole=True), int)
    monkeypatch.setenv(VAR, "1.5")
    assert env_hours(VAR, 1) == 1.5
    with pytest.raises(ValueError, match=rf"^{VAR}='1.5' is not a whole number of hours$"):
        env_hours(VAR, 1, whole=True)
    monkeypatch.setenv(VAR, "-2")
    with pytest.raises(ValueError, match=rf"^{VAR}='-2' must be 0 or more$"):
        env_hours(VAR, 1, whole=True)


@pytest.mark.parametrize(("reader", "name", "default"), [
    (settings.inbox_settle_seconds, "TENTALIS_INBOX_SETTLE_SECONDS", 10.0),
    (settings.session_settle_seconds, "TENTALIS_SESSION_SETTLE_SECONDS", 60.0),
    (settings.session_review_wait_seconds, "TENTALIS_SESSION_REVIEW_WAIT_SECONDS", 3600.0),
    (settings.vacuum_retention_hours, "TENTALIS_VACUUM_RETENTION_HOURS", 168),
])
def test_the_settings_read_their_variable(monkeypatch, reader, name, default):
    monkeypatch.delenv(name, raising=False)
    assert reader() == default
    monkeypatch.setenv(name, "5")
    assert reader() == 5
    monkeypatch.setenv(name, "soon")
    with pytest.raises(ValueError, match=rf"^{name}='soon' is not a (whole )?number of"):
        reader()
