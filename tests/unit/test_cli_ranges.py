"""The CLI's numeric options (issue 73): a port outside 1-65535 is refused instead of listening somewhere
else, and every whole-number option has a documented range that a typo like 1e20 falls outside of, with
an error naming the option and the range. Each refusal happens before the command does anything."""

from __future__ import annotations

import typing

import pytest
import typer
from typer.testing import CliRunner

from tentalis_pipelines.cli import app, common

runner = CliRunner()


def _whole_number_options():
    """(command path, option) of every option of the CLI whose value is a whole number."""
    out = []

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                walk(sub, [*path, name])
            return
        for p in cmd.params:
            ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
            if ann is int or (int in typing.get_args(ann) and float not in typing.get_args(ann)):
                out.append((" ".join(path), p))

    walk(typer.main.get_command(app), [])
    return out


def test_every_whole_number_option_has_a_documented_range():
    options = _whole_number_options()
    assert len(options) > 40  # the walk found the CLI's options
    unbounded = [f"{cmd} {p.opts[0]}" for cmd, p in options if p.min is None or p.max is None]
    assert not unbounded, f"options without a documented range: {unbounded}"
    ports = [(cmd, p.min, p.max) for cmd, p in options if p.name == "port"]
    assert sorted(ports) == [("reward-server", 1, 65535), ("serve", 1, 65535), ("ui", 1, 65535)]


@pytest.mark.parametrize("command", [["reward-server"], ["serve"], ["ui"]])
@pytest.mark.parametrize("port", ["99999", "65536", "0", "-1"])
def test_a_port_outside_1_to_65535_is_refused(command, port):
    r = runner.invoke(app, [*command, "--port", port])
    assert r.exit_code == 2, r.output
    assert "--port" in r.output and ("65535" in r.output or "greater than or equal to 1" in r.output), r.output


@pytest.mark.parametrize("value", ["100000000000000000000", "100001", "0", "1e20", "16.5"])
def test_batch_new_refuses_a_task_count_outside_its_range(value, tmp_path):
    r = runner.invoke(app, ["batch", "new", "--home", str(tmp_path / "home"), "--num-tasks", value])
    assert r.exit_code == 2, r.output
    assert "--num-tasks" in r.output, r.output
    assert not (tmp_path / "home").exists()  # refused before the home was created


@pytest.mark.parametrize(("args", "option"), [
    (["run", "--num-generations", "5000"], "--num-generations"),
    (["learn", "--cycles", str(common.MAX_COUNT + 1)], "--cycles"),
    (["learn", "--max-new-tokens", str(common.MAX_TOKENS + 1)], "--max-new-tokens"),
    (["learn", "--seed", "-1"], "--seed"),
    (["run", "--max-turns", str(common.MAX_TURNS + 1)], "--max-turns"),
    (["reward-server", "--workers", "0"], "--workers"),
    (["reward-server", "--sample-timeout", "0"], "--sample-timeout"),
])
def test_other_numeric_options_are_refused_past_their_range(args, option):
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and option in r.output, r.output


def test_the_range_boundaries_themselves_are_accepted(tmp_path):
    # Each command gets past option parsing and fails on a later check, doing nothing.
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    for port in ("1", "65535"):  # the home check fails after the port was read
        r = runner.invoke(app, ["ui", "--port", port, "--home", str(blocked / "home")])
        assert "is not usable" in r.output and "--port" not in r.output, r.output
    r = runner.invoke(app, ["batch", "new", "--num-tasks", str(common.MAX_TASKS), "--home", str(tmp_path / "h"), "--tasks", "bogus"])
    assert "--tasks 'bogus'" in r.output and "--num-tasks" not in r.output, r.output
