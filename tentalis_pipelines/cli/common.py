"""What every `tentalis` command shares: the app, consoles, the home folder, one-line errors, tables."""

from __future__ import annotations

import os
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tentalis_pipelines.settings import Paths

app = typer.Typer(add_completion=False, help="Tentalis: LLM agents that learn from their manager's reviews.")
console = Console()
err = Console(stderr=True)

DAGSTER_YAML = (Path(__file__).resolve().parents[2] / "dagster.yaml")
_DEFAULT_INSTANCE_YAML = "telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n"


def home_paths(home: str | None) -> Paths:
    paths = Paths.from_env(home)
    try:
        paths.ensure()
        probe = paths.home / f".write-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        fail(f"TENTALIS_HOME={paths.home} is not usable ({exc.strerror or exc}): point TENTALIS_HOME "
              "(or --home) at a folder this user can create and write")
    os.environ["TENTALIS_HOME"] = str(paths.home)
    os.environ.setdefault("DAGSTER_HOME", str(paths.dagster_home))
    instance_yaml = Path(os.environ["DAGSTER_HOME"]) / "dagster.yaml"
    if not instance_yaml.exists():
        instance_yaml.parent.mkdir(parents=True, exist_ok=True)
        text = DAGSTER_YAML.read_text() if DAGSTER_YAML.exists() else _DEFAULT_INSTANCE_YAML
        instance_yaml.write_text(text)
    return paths


# The documented ranges of the CLI's whole-number options (each option's --help shows its range, and a
# value outside it is refused naming the option and the range): past these a value is a typo (1e20 for
# 20) or asks for more than one machine can do, and a port outside 1-65535 would listen somewhere else.
MAX_PORT = 65_535  # TCP ports are 1-65535 (0, "any free port", is not offered: the server could not be found)
MAX_TASKS = 100_000  # tasks in a batch or cycle, failures per update
MAX_SAMPLES = 1_024  # samples per task or hint, rows decoded together, skills per prompt
MAX_TOKENS = 131_072  # completion and solution token limits
MAX_TURNS = 1_000  # agent turns per episode
MAX_COUNT = 1_000_000_000  # other counts: cycles, updates, iterations, rows, messages, items, limits
MAX_SEED = 2**32 - 1  # seeds (numpy's range; a training batch's generator seed is also checked below 1,000,000)
MAX_HOURS = 876_000  # retention: a hundred years
MAX_LAYERS = 1_024  # a model's transformer blocks
MAX_WIDTH = 65_536  # a head's hidden width
MAX_FOLDS = 100  # cross-fitting folds
MAX_WORKERS = 256  # server worker processes

HomeOpt = typer.Option(None, "--home", help="State folder (default: $TENTALIS_HOME or ./.tentalis).")

# Columns that hold ids other commands take (checkpoint, batch and run ids) are never cut with "…": rich
# shrinks the other columns first, and wraps an id only when nothing else can give way.
_ID_COLUMNS = {"checkpoint_id", "parent", "from", "to", "value", "batch_id", "rollout_id", "task_id", "run_id"}


def add_column(table: Table, name: str, **kwargs) -> None:
    if name in _ID_COLUMNS:
        kwargs = {"no_wrap": True, **kwargs}
    table.add_column(name, **kwargs)


def print_table(table: Table) -> None:
    """Print at the table's natural width when the terminal is narrower: the terminal wraps the line,
    but no id is cut or split by a character rich would insert."""
    from rich.measure import Measurement

    needed = Measurement.get(console, console.options.update(max_width=100_000), table).maximum
    if needed <= console.width:
        console.print(table)
    else:  # rich caps print(width=) at the console's width: a wider console of its own
        Console(width=needed, force_terminal=console.is_terminal, no_color=console.no_color).print(table, crop=False)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        console.print(f"tentalis {version('tentalis')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Tentalis: LLM agents that learn from their manager's reviews."""


# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection, OWASP).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(value):
    """A text cell that a spreadsheet would run as a formula, prefixed with ``'`` so it stays text."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def check_seed(seed: int) -> None:
    from tentalis_pipelines.tasks.batches import ReservedSeedError, check_training_seed

    try:
        check_training_seed(seed)
    except ReservedSeedError as exc:
        fail(f"--seed: {exc}")


def check_policy_settings(backend: str | None = None) -> str:
    """Check, before any model loads, what the run will use: $TENTALIS_MODEL, the backend and its server.

    Fails in one line naming the setting and the fix; returns the backend.
    """
    backend = backend or os.environ.get("TENTALIS_BACKEND") or "transformers"
    if backend not in ("transformers", "openai", "vllm"):
        fail(f"backend {backend!r} is unknown: use transformers, openai or vllm (--backend or TENTALIS_BACKEND)")
    spec = os.environ.get("TENTALIS_MODEL") or "embedded"
    if spec != "embedded" and not (Path(spec).expanduser() / "config.json").is_file():
        fail(f"TENTALIS_MODEL={spec} is not a model: no config.json there. Set TENTALIS_MODEL to 'embedded' "
              "or a local Hugging Face model folder (these machines download nothing)")
    if backend == "openai":
        url = os.environ.get("OPENAI_BASE_URL", "")
        if not url.startswith(("http://", "https://")):
            fail(f"backend openai needs OPENAI_BASE_URL=http(s)://host:port/v1 (got {url!r})")
    return backend


def actor_name(actor: str | None) -> str:
    """Who did it: ``--actor``, else ``$USER``, else ``cli`` (kept in the serving history and the audit)."""
    return actor or os.environ.get("USER") or "cli"


def fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)



def parse_levels(levels: str, tasks: str = "arithmetic") -> list[int]:
    """``--levels`` for the task source: arithmetic 1-4, terminal 0-3 (level 0: the command is named), bfcl and swe 1-3,
    an installed environment family its ``levels``."""
    allowed = {"terminal": (0, 1, 2, 3), "bfcl": (1, 2, 3), "swe": (1, 2, 3)}.get(tasks, (1, 2, 3, 4))
    from tentalis_pipelines.tasks.families import installed_environment_families

    installed = installed_environment_families()
    if tasks in installed:  # an installed environment family: its own levels
        allowed = tuple(installed[tasks].levels) or allowed
    try:
        lv = [int(x) for x in levels.split(",") if x.strip()]
    except ValueError:
        lv = []
    if not lv or any(level not in allowed for level in lv):
        fail(f"--levels {levels!r}: give difficulty levels from {allowed[0]} to {allowed[-1]} for --tasks {tasks}, "
             "comma-separated (e.g. 1 or 1,2)")
    return lv
