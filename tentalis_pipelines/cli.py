"""`tentalis`: set up, run one learning cycle, look at the state, query the tables, open the UI."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tentalis_pipelines.settings import Paths

app = typer.Typer(add_completion=False, help="Tentalis: LLM agents that learn from their manager's reviews.")
console = Console()
err = Console(stderr=True)

DAGSTER_YAML = (Path(__file__).resolve().parent.parent / "dagster.yaml")
_DEFAULT_INSTANCE_YAML = "telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n"


def _paths(home: str | None) -> Paths:
    paths = Paths.from_env(home)
    try:
        paths.ensure()
        probe = paths.home / f".write-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        _fail(f"TENTALIS_HOME={paths.home} is not usable ({exc.strerror or exc}): point TENTALIS_HOME "
              "(or --home) at a folder this user can create and write")
    os.environ["TENTALIS_HOME"] = str(paths.home)
    os.environ.setdefault("DAGSTER_HOME", str(paths.dagster_home))
    instance_yaml = Path(os.environ["DAGSTER_HOME"]) / "dagster.yaml"
    if not instance_yaml.exists():
        instance_yaml.parent.mkdir(parents=True, exist_ok=True)
        text = DAGSTER_YAML.read_text() if DAGSTER_YAML.exists() else _DEFAULT_INSTANCE_YAML
        instance_yaml.write_text(text)
    return paths


HomeOpt = typer.Option(None, "--home", help="State folder (default: $TENTALIS_HOME or ./.tentalis).")

# Columns that hold ids other commands take (checkpoint, batch and run ids) are never cut with "…": rich
# shrinks the other columns first, and wraps an id only when nothing else can give way.
_ID_COLUMNS = {"checkpoint_id", "parent", "from", "to", "value", "batch_id", "rollout_id", "task_id", "run_id"}


def _add_column(table: Table, name: str, **kwargs) -> None:
    if name in _ID_COLUMNS:
        kwargs = {"no_wrap": True, **kwargs}
    table.add_column(name, **kwargs)


def _print_table(table: Table) -> None:
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


def _check_seed(seed: int) -> None:
    from tentalis_pipelines.tasks.batches import ReservedSeedError, check_training_seed

    try:
        check_training_seed(seed)
    except ReservedSeedError as exc:
        _fail(f"--seed: {exc}")


@app.command()
def init(home: str | None = HomeOpt, model: str = typer.Option("embedded", help="'embedded' or a local model folder.")):
    """Create the home folder and Dagster instance, and convert the embedded model once."""
    paths = _paths(home)
    from tentalis_pipelines.inference.models import resolve_model

    with console.status("Preparing the model (first time: converting the embedded GGUF to safetensors)..."):
        model_dir = resolve_model(model, paths.models)
    console.print(f"[green]ready[/]: home [bold]{paths.home}[/], model [bold]{model_dir}[/], inbox [bold]{paths.inbox}[/]")
    _reconcile(paths)
    from dagster import DagsterInstance

    from assets.partitions import checkpoint_ids

    with DagsterInstance.get() as instance:  # the base model's benchmark partitions exist from the start
        if not instance.has_dynamic_partition(checkpoint_ids.name, "base"):
            instance.add_dynamic_partitions(checkpoint_ids.name, ["base"])


def _cycle_resources(num_generations, max_new_tokens, gate_limit=None, trainer=None, backend=None) -> dict:
    """Run config for the resources: only the fields set here. model and base_url stay unset, so the
    policy resource reads them from $TENTALIS_MODEL / $OPENAI_BASE_URL."""
    policy = {"num_generations": num_generations, "max_new_tokens": max_new_tokens}
    if backend:
        policy["backend"] = backend
    out: dict = {"policy": {"config": policy}}
    if gate_limit:
        out["bench"] = {"config": {"limit": gate_limit}}
    if trainer:
        out["trainer"] = {"config": trainer}
    return out


def _check_policy_settings(backend: str | None = None) -> str:
    """Check, before any model loads, what the run will use: $TENTALIS_MODEL, the backend and its server.

    Fails in one line naming the setting and the fix; returns the backend.
    """
    backend = backend or os.environ.get("TENTALIS_BACKEND") or "transformers"
    if backend not in ("transformers", "openai", "vllm"):
        _fail(f"backend {backend!r} is unknown: use transformers, openai or vllm (--backend or TENTALIS_BACKEND)")
    spec = os.environ.get("TENTALIS_MODEL") or "embedded"
    if spec != "embedded" and not (Path(spec).expanduser() / "config.json").is_file():
        _fail(f"TENTALIS_MODEL={spec} is not a model: no config.json there. Set TENTALIS_MODEL to 'embedded' "
              "or a local Hugging Face model folder (these machines download nothing)")
    if backend == "openai":
        url = os.environ.get("OPENAI_BASE_URL", "")
        if not url.startswith(("http://", "https://")):
            _fail(f"backend openai needs OPENAI_BASE_URL=http(s)://host:port/v1 (got {url!r})")
    return backend


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)



def _execute_cycle(opts, label: str) -> dict:
    """One learning cycle as runs of the asset jobs on the instance (jobs/cycle.py), each shown as it ends."""
    from dagster import DagsterInstance

    from jobs.cycle import CycleFailed, run_cycle
    from jobs.run_health import reap_dead_runs
    from tentalis_pipelines.definitions import defs

    instance = DagsterInstance.get()
    for run_id in reap_dead_runs(instance):
        err.print(f"[yellow]run {run_id} was killed earlier: marked failed and its gpu slot freed[/]")
    status = console.status(f"{label}: registering the batch")

    def started(what: str) -> None:
        status.update(f"{label}: {what}")

    def finished(run) -> None:
        where = f" [dim]{run.partition}[/]" if run.partition else ""
        console.print(f"  [green]✓[/] {run.job}{where} [dim]{run.seconds:.0f} s, run {run.run_id}[/]")

    try:
        with status:
            return run_cycle(defs, instance, _paths(None), opts, on_run=finished, on_start=started)
    except CycleFailed as exc:
        _fail(str(exc), 1)
    except (ValueError, OSError) as exc:  # refused before any job ran (a bad seed, a full disk)
        _fail(str(exc), 1)


@app.command()
def run(
    home: str | None = HomeOpt,
    num_tasks: int = typer.Option(16, min=1, help="Tasks in the new batch."),
    seed: int | None = typer.Option(None, min=0, help="Generator seed (default: the next unused one; below 1,000,000)."),
    num_generations: int = typer.Option(4, min=1, help="Samples per task (G)."),
    max_new_tokens: int = typer.Option(128, min=1, help="Completion length limit."),
    train: bool = typer.Option(True, help="Train a checkpoint after the batch (and gate its promotion)."),
    backend: str | None = typer.Option(None, help="transformers | openai | vllm (default: $TENTALIS_BACKEND or transformers)."),
):
    """Run one learning cycle on the Dagster instance: a new batch through rollout_job, then train_job,
    benchmark_job and promotion_job (the gate), each a run of its own job."""
    from jobs.cycle import CycleOptions

    _paths(home)
    backend = _check_policy_settings(backend)
    if seed is not None:
        _check_seed(seed)
    t0 = time.time()
    opts = CycleOptions(num_tasks=num_tasks, seed=seed, train=train,
                        resources=_cycle_resources(num_generations, max_new_tokens, backend=backend))
    out = _execute_cycle(opts, "learning cycle")
    gate = out["decision"]
    console.print(f"[green]cycle finished[/] in {time.time() - t0:.0f} s ({out['cycle']})"
                  + (f"; gate: {gate['reason']}" if gate else ""))
    status(home=None)


batch_app = typer.Typer(help="Task batches (the task_batches partitions).")
app.add_typer(batch_app, name="batch")


@batch_app.command("new")
def batch_new(
    home: str | None = HomeOpt,
    num_tasks: int = typer.Option(16, min=1, help="Tasks in the new batch."),
    seed: int | None = typer.Option(None, min=0, help="Generator seed (default: the next unused one; below 1,000,000)."),
    levels: str = typer.Option("1,2", help="Difficulty levels, e.g. 1 or 1,2."),
):
    """Register a seeded arithmetic batch as a task_batches partition and print its id (for
    `dagster job execute -j rollout_job --tags '{"dagster/partition": "<id>"}'`)."""
    from dagster import DagsterInstance

    from jobs.cycle import register_batch

    paths = _paths(home)
    if seed is not None:
        _check_seed(seed)
    batch_id = register_batch(DagsterInstance.get(), paths, num_tasks=num_tasks, seed=seed, levels=tuple(_parse_levels(levels)))
    typer.echo(batch_id)


def _parse_levels(levels: str) -> list[int]:
    try:
        lv = [int(x) for x in levels.split(",") if x.strip()]
    except ValueError:
        lv = []
    if not lv or any(level not in (1, 2, 3, 4) for level in lv):
        _fail(f"--levels {levels!r}: give difficulty levels from 1 to 4, comma-separated (e.g. 1 or 1,2)")
    return lv


@app.command()
def learn(
    # Defaults are the measured recipe of the README's learning curve (8 tasks x 8 samples of level-1
    # arithmetic, DAPO with beta 0 at lr 2e-4): 12 cycles took 51 min on a 2-core CPU.
    cycles: int = typer.Option(12, min=1, help="Learning cycles to run now."),
    num_tasks: int = typer.Option(8, min=1, help="Tasks per cycle."),
    num_generations: int = typer.Option(8, min=2, help="Samples per task (G; a group needs two to compare)."),
    max_new_tokens: int = typer.Option(96, min=1, help="Completion length limit."),
    gate_limit: int | None = typer.Option(None, min=1, help="Held-out items per evaluation (default 64)."),
    levels: str = typer.Option("1", help="Difficulty levels of the training tasks, e.g. 1 or 1,2."),
    loss_type: str = typer.Option("dapo", help="grpo | dr_grpo | dapo | cispo | gspo."),
    learning_rate: float = typer.Option(2e-4, help="LoRA learning rate (> 0)."),
    beta: float = typer.Option(0.0, min=0.0, help="k3 KL coefficient; 0 skips the reference pass."),
    num_iterations: int = typer.Option(1, min=1, help="Updates per batch of rollouts (mu)."),
    dtype: str = typer.Option("auto", help="Training precision: auto (bf16 where native) | float32 | bfloat16."),
    seed: int | None = typer.Option(None, help="Trainer seed (LoRA init, shuffling); record runs per seed."),
    home: str | None = HomeOpt,
):
    """Run K learning cycles now; every checkpoint is evaluated on held-out tasks. Prints the learning curve."""
    paths = _paths(home)
    from jobs.cycle import CycleOptions
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.promotion import benchmark_history

    _check_policy_settings()
    lv = _parse_levels(levels)
    if not learning_rate > 0:
        _fail(f"--learning-rate {learning_rate}: must be above 0 (the recipe uses 2e-4)")
    if loss_type not in ("grpo", "dr_grpo", "dapo", "cispo", "gspo"):
        _fail(f"--loss-type {loss_type!r}: use grpo, dr_grpo, dapo, cispo or gspo")
    trainer = {"loss_type": loss_type, "learning_rate": learning_rate, "beta": beta, "num_iterations": num_iterations, "dtype": dtype}
    if seed is not None:
        trainer["seed"] = seed
    t0 = time.time()
    for k in range(1, cycles + 1):
        opts = CycleOptions(num_tasks=num_tasks, levels=tuple(lv), trigger="learn",
                            resources=_cycle_resources(num_generations, max_new_tokens, gate_limit, trainer))
        _execute_cycle(opts, f"cycle {k}/{cycles}")
    console.print(f"[green]{cycles} cycle(s)[/] in {time.time() - t0:.0f} s. Held-out learning curve:")
    console.print(benchmark_history(Lakehouse(paths.lakehouse), "arithmetic")["history"])


@app.command()
def status(home: str | None = HomeOpt):
    """Batches, trajectories, checkpoints, the last reward, what serves and the serving history."""
    paths = _paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.pipeline import summarize

    s = summarize(Lakehouse(paths.lakehouse))
    t = Table(title=f"Tentalis at {paths.home}")
    t.add_column("what")
    _add_column(t, "value", justify="right")
    for k in ("batches", "tasks", "rollouts", "trajectories", "quarantined"):
        t.add_row(k, str(s[k]))
    if s["last_batch"]:
        b, reward, acc = s["last_batch"]
        t.add_row("last batch", b)
        t.add_row("last reward (mean)", f"{reward:.3f}")
        t.add_row("last accuracy", f"{acc:.3f}")
    console.print(t)
    if s["checkpoints"]:
        c = Table(title="checkpoints")
        for col in ("checkpoint_id", "parent", "promoted", "trajectories", "loss", "reward_mean"):
            _add_column(c, col)
        for cid, parent, promoted, n, metrics, _ in s["checkpoints"]:
            m = json.loads(metrics)
            c.add_row(cid, parent or "base", "yes" if promoted else "no", str(n), f"{m.get('loss', 0):.4f}", f"{m.get('reward_mean', 0):.3f}")
        _print_table(c)
    _print_serving(Lakehouse(paths.lakehouse))


def _actor(actor: str | None) -> str:
    return actor or os.environ.get("USER") or "cli"


def _print_serving(lake) -> None:
    from tentalis_pipelines.training import checkpoints as ckpt
    from tentalis_pipelines.training.serving import serving_checkpoint, serving_history

    console.print(f"serving: [bold]{serving_checkpoint(lake)}[/]")
    history = serving_history(lake)
    if history:
        h = Table(title="serving history (newest last; the last row serves)")
        for col in ("seq", "from", "to", "action", "actor", "reason", "at"):
            _add_column(h, col)
        for r in history[-20:]:
            h.add_row(str(r["seq"]), r["from_checkpoint"], r["to_checkpoint"], r["action"], r["actor"], r["reason"],
                      f"{r['created_at']:%Y-%m-%d %H:%M:%S}")
        _print_table(h)
    for claim in ckpt.active_claims(lake):
        state = "training" if claim.alive() else "stale: `tentalis reconcile` settles it"
        console.print(f"training claim on {claim.policy_version}: {claim.holder()} ({state})")


def _reconcile(paths) -> dict:
    from dagster import DagsterInstance

    from jobs.run_health import reap_dead_runs
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training.checkpoints import reconcile as run_reconcile

    report = run_reconcile(Lakehouse(paths.lakehouse), paths)
    report["killed_runs_failed_and_slots_freed"] = reap_dead_runs(DagsterInstance.get())
    for key, items in report.items():
        if items:
            console.print(f"reconcile: {key.replace('_', ' ')}: {', '.join(items)}")
    return report


@app.command()
def promote(
    checkpoint_id: str = typer.Argument(..., help="The checkpoint to serve (or 'base')."),
    reason: str = typer.Option(..., "--reason", help="Why (kept in the serving history)."),
    actor: str | None = typer.Option(None, "--actor", help="Who (default: $USER, else 'cli')."),
    home: str | None = HomeOpt,
):
    """Serve CHECKPOINT_ID from the next rollout on (recorded in the `serving` table)."""
    paths = _paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training.serving import ServingError
    from tentalis_pipelines.training.serving import promote as do_promote

    try:
        row = do_promote(Lakehouse(paths.lakehouse), checkpoint_id, actor=_actor(actor), reason=reason)
    except ServingError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"serving [bold]{row['to_checkpoint']}[/] (was {row['from_checkpoint']}; seq {row['seq']})")


@app.command()
def rollback(
    reason: str = typer.Option(..., "--reason", help="Why (kept in the serving history)."),
    to: str | None = typer.Option(None, "--to", help="Checkpoint id or 'base' (default: what served before the current one)."),
    actor: str | None = typer.Option(None, "--actor", help="Who (default: $USER, else 'cli')."),
    home: str | None = HomeOpt,
):
    """Go back to what served before the current policy (or to --to); recorded in the `serving` table."""
    paths = _paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training.serving import ServingError
    from tentalis_pipelines.training.serving import rollback as do_rollback

    try:
        row = do_rollback(Lakehouse(paths.lakehouse), actor=_actor(actor), reason=reason, to=to)
    except ServingError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"serving [bold]{row['to_checkpoint']}[/] (rolled back from {row['from_checkpoint']}; seq {row['seq']})")


@app.command()
def reconcile(home: str | None = HomeOpt):
    """Settle what crashed training runs left: stale claims, unfinished promotions, orphan adapter folders
    and temporary folders of dead writers (every training run does this first, too)."""
    paths = _paths(home)
    report = _reconcile(paths)
    if not any(report.values()):
        console.print("nothing to reconcile")


@app.command()
def sql(
    query: str = typer.Argument(..., help="DuckDB SQL over the tables (tasks, rollouts, step_scores, reviews, trajectories, checkpoints, quarantine)."),
    format: str = typer.Option("table", "--format", "-f", help="table | json | csv"),
    home: str | None = HomeOpt,
):
    """Query the lakehouse with DuckDB SQL."""
    paths = _paths(home)
    import duckdb

    from tentalis_pipelines.lakehouse import Lakehouse

    if format not in ("table", "json", "csv"):
        err.print(f"[red]--format must be table, json or csv, not {format!r}[/]")
        raise typer.Exit(2)
    try:
        result = Lakehouse(paths.lakehouse).sql(query)
    except duckdb.Error as exc:
        err.print(f"[red]SQL error:[/] {exc}")
        raise typer.Exit(1) from None
    rows = result.to_pylist()
    if format == "json":
        sys.stdout.write(json.dumps(rows, default=str) + "\n")
    elif format == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=result.column_names, lineterminator="\n")  # Unix lines, for shell pipelines
        w.writeheader()
        w.writerows({k: csv_safe(v) for k, v in r.items()} for r in rows)
        sys.stdout.write(buf.getvalue())
    else:
        t = Table()
        for c in result.column_names:
            _add_column(t, c)
        for r in rows:
            t.add_row(*[str(v) for v in r.values()])
        _print_table(t)


@app.command()
def maintain(
    table: list[str] = typer.Option([], "--table", "-t", help="Table to maintain (repeatable; default: every table)."),
    compact: bool = typer.Option(True, help="Compact small files (rows unchanged)."),
    zorder: bool = typer.Option(False, help="Also Z-order the unpartitioned tables by their key columns (rewrites them)."),
    vacuum: bool = typer.Option(True, help="Delete files no version within the retention needs."),
    retention_hours: int | None = typer.Option(
        None, help="Vacuum retention (default: $TENTALIS_VACUUM_RETENTION_HOURS or 168). Time travel past it is lost."),
    allow_unsafe_retention: bool = typer.Option(
        False, help="Allow a retention below Delta's safe minimum (only when nothing else reads or writes the tables)."),
    checkpoint: bool = typer.Option(True, help="Write a log checkpoint so loading a table replays less."),
    format: str = typer.Option("table", "--format", "-f", help="table | json"),
    home: str | None = HomeOpt,
):
    """Compact, vacuum and checkpoint the Delta tables (what the weekly maintain_lakehouse_job does)."""
    paths = _paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse, LakehouseError, human_bytes

    if format not in ("table", "json"):
        err.print(f"[red]--format must be table or json, not {format!r}[/]")
        raise typer.Exit(2)
    try:
        reports = Lakehouse(paths.lakehouse).maintain_all(
            table or None, compact=compact, zorder=zorder, vacuum=vacuum, checkpoint=checkpoint,
            retention_hours=retention_hours, allow_unsafe_retention=allow_unsafe_retention,
        )
    except (LakehouseError, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if format == "json":
        sys.stdout.write(json.dumps(reports) + "\n")
        return
    t = Table(title=f"maintenance of {paths.lakehouse}")
    for col in ("table", "files", "rows", "bytes", "vacuumed", "checkpoint", "seconds"):
        t.add_column(col, justify="left" if col == "table" else "right")
    for r in reports:
        t.add_row(r["table"], f"{r['files_before']} → {r['files_after']}", f"{r['rows_after']}",
                  f"{human_bytes(r['bytes_before'])} → {human_bytes(r['bytes_after'])}", str(r["vacuumed_files"]),
                  f"v{r['checkpoint_version']}" if r["checkpoint_version"] is not None else "-", f"{r['seconds']:.2f}")
    console.print(t if reports else "no tables yet")


@app.command()
def bench(
    parts: str = typer.Option("rollout,dtype,grpo,lakehouse",
                              help="Which measurements: rollout, dtype (fp32 vs bf16), grpo (needs tentalis[bench]), lakehouse."),
    prompts: int = typer.Option(16, help="Prompts per rollout batch / GRPO update."),
    num_generations: int = typer.Option(8, help="Samples per prompt."),
    max_new_tokens: int = typer.Option(96, help="Completion length limit."),
    plain_prompts: int = typer.Option(4, help="Prompts the plain per-sample loop generates for (it is slow)."),
    updates: int = typer.Option(2, help="GRPO updates per trainer."),
    rows: int = typer.Option(1_000_000, help="Synthetic trajectory rows for the DuckDB aggregate."),
    out: Path | None = typer.Option(None, help="Write every figure as JSON here (default: $TENTALIS_HOME/bench/)."),
    home: str | None = HomeOpt,
):
    """Speed, measured side by side in one run: rollout tokens/s vs a plain generate loop, one GRPO update vs
    TRL's GRPOTrainer, a DuckDB aggregate over 1M trajectory rows, and batch 1 vs batch 20 writes."""
    import tempfile

    paths = _paths(home)
    from tentalis_pipelines.inference.models import resolve_model

    wanted = {x.strip() for x in parts.split(",") if x.strip()}
    unknown = wanted - {"rollout", "dtype", "grpo", "lakehouse"}
    if unknown:
        err.print(f"[red]unknown --parts {sorted(unknown)}[/]: choose from rollout, dtype, grpo, lakehouse")
        raise typer.Exit(2)
    model_dir = resolve_model("embedded", paths.models)
    report: dict = {"machine": {"cpus": os.cpu_count()}}
    rows_out: list[tuple[str, str, str, str]] = []
    if "rollout" in wanted:
        from tentalis_pipelines.benchmarking.rollout_bench import rollout_benchmark

        with console.status("rollouts: pipeline backend vs plain generate loop..."):
            r = rollout_benchmark(model_dir, prompts=prompts, num_generations=num_generations, max_new_tokens=max_new_tokens,
                                  plain_prompts=plain_prompts)
        report["rollout"] = r
        rows_out.append(("rollout tokens/s", f"{r['pipeline']['tokens_per_s']} vs {r['plain_loop']['tokens_per_s']} (plain loop)",
                         f"{r['speedup']}x", ">= 5x"))
    if "dtype" in wanted:
        from tentalis_pipelines.benchmarking.dtype_bench import dtype_benchmark

        with console.status("fp32 vs bf16: rollouts and one GRPO update, alternated..."):
            d = dtype_benchmark(model_dir, prompts=min(prompts, 8), num_generations=num_generations, max_new_tokens=max_new_tokens)
        report["dtype"] = d
        rows_out.append(("rollout tokens/s, bf16 vs fp32", f"{d['bfloat16']['tokens_per_s']} vs {d['float32']['tokens_per_s']}",
                         f"{d['bf16_over_fp32_tokens_per_s']}x", "> 1x where bf16 is native"))
        rows_out.append((f"GRPO update, {d['config']['update_rows']} rows (s), bf16 vs fp32",
                         f"{d['bfloat16']['update_s']} vs {d['float32']['update_s']}", f"{d['fp32_over_bf16_update_time']}x faster", ""))
    if "grpo" in wanted:
        from tentalis_pipelines.benchmarking.grpo_compare import (
            CompareConfig,
            run_tentalis,
            run_trl,
            summarize,
        )

        cfg = CompareConfig(updates=updates, prompts_per_update=prompts, num_generations=num_generations,
                            max_completion_length=max_new_tokens)
        with console.status("GRPO updates: Tentalis vs TRL GRPOTrainer..."):
            try:
                ours, theirs = run_tentalis(model_dir, cfg), run_trl(model_dir, cfg)
            except RuntimeError as exc:
                err.print(f"[red]error:[/] {exc}")
                raise typer.Exit(2) from None
        g = summarize(ours, theirs)
        report["grpo"] = {"config": cfg.__dict__, "summary": g, "tentalis": ours, "trl": theirs}
        rows_out.append(("GRPO update (s)", f"{g['tentalis_seconds_per_update']} vs {g['trl_seconds_per_update']} (TRL)",
                         f"{g['ratio']}x", "<= 0.8x"))
    if "lakehouse" in wanted:
        from tentalis_pipelines.benchmarking.lakehouse_bench import (
            aggregate_benchmark,
            batch_scaling_benchmark,
        )

        with tempfile.TemporaryDirectory(prefix="tentalis-bench-") as tmp, console.status("lakehouse: 1M-row aggregate, batch 1 vs 20..."):
            agg = aggregate_benchmark(Path(tmp) / "aggregate", rows=rows)
            scale = batch_scaling_benchmark(Path(tmp) / "scaling")
        report["aggregate"], report["batch_scaling"] = agg, scale
        rows_out.append((f"DuckDB aggregate, {rows:,} rows (s)", f"{agg['best_seconds']:.3f} (cold {agg['cold_seconds']:.3f})",
                         "", "< 2 s"))
        rows_out.append((f"batch {scale['batch_n']} vs batch 1 (s)", f"{scale['batch_n_seconds']:.3f} vs {scale['batch_1_seconds']:.3f}",
                         f"{scale['ratio']:.2f}x", "<= 1.3x"))
    t = Table(title="tentalis bench (one run, same inputs on both sides)")
    for col in ("measurement", "figures", "ratio", "target"):
        t.add_column(col)
    for row in rows_out:
        t.add_row(*row)
    console.print(t)
    dest = out or paths.home / "bench" / f"bench-{time.strftime('%Y%m%dT%H%M%S')}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(report, indent=2, default=str))
    console.print(f"all figures: {dest}")


@app.command("import-reviews")
def import_reviews(
    path: Path = typer.Argument(..., help="JSONL or CSV with rollout_id, score (0-1), critique, hint[, reviewer]."),
    home: str | None = HomeOpt,
):
    """Import human reviews keyed by rollout id (unknown ids are quarantined; re-importing changes nothing).
    Re-materialise the batch's `reviews` with manager=human to use them."""
    paths = _paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.pipeline import import_human_reviews

    try:
        out = import_human_reviews(Lakehouse(paths.lakehouse), path)
    except FileNotFoundError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    console.print(f"applied {out['applied']} review(s); quarantined {out['quarantined']} line(s)")


@app.command()
def benchmark(
    checkpoint: str = typer.Option("promoted", help="'base', 'promoted' or a checkpoint id."),
    tasks: str = typer.Option("arithmetic", help="arithmetic | gsm8k | math500 | humaneval | path/to/tasks.jsonl"),
    limit: int | None = typer.Option(None, help="Items to evaluate (a fixed seeded subset)."),
    seed: int = typer.Option(0, help="Seed of the subset."),
    format: str = typer.Option("table", "--format", "-f", help="table | json"),
    record: bool = typer.Option(True, help="Write benchmark_results and benchmark_items."),
    max_new_tokens: int | None = typer.Option(None, help="Answer length limit (default per benchmark)."),
    model: str | None = typer.Option(None, help="Base model (default: $TENTALIS_MODEL or embedded)."),
    home: str | None = HomeOpt,
):
    """Evaluate a checkpoint on a benchmark or any JSONL task file and print the result."""
    paths = _paths(home)
    from tentalis_pipelines.evaluation.benchmarks import BenchmarkDataMissing
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.pipeline import PolicySettings, benchmark_checkpoint

    if format not in ("table", "json"):
        err.print(f"[red]--format must be table or json, not {format!r}[/]")
        raise typer.Exit(2)
    policy = PolicySettings(model=model or os.environ.get("TENTALIS_MODEL", "embedded"))
    try:
        with console.status(f"evaluating {checkpoint} on {tasks}..."):
            _, s = benchmark_checkpoint(Lakehouse(paths.lakehouse), paths, policy, checkpoint, tasks, limit=limit, seed=seed, record=record,
                                        max_new_tokens=max_new_tokens)
    except (BenchmarkDataMissing, ValueError) as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    out = {"checkpoint": checkpoint, "benchmark": s.benchmark, "n": s.n, "accuracy": s.accuracy,
           "lenient_accuracy": s.lenient_accuracy, "format_rate": s.format_rate, "ci_low": s.ci_low,
           "ci_high": s.ci_high, "seconds": round(s.seconds, 2)}
    if format == "json":
        sys.stdout.write(json.dumps(out) + "\n")
        return
    t = Table(title=f"{s.benchmark} — {checkpoint}")
    for k in out:
        t.add_column(k)
    t.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in out.values()])
    console.print(t)


@app.command()
def ui(home: str | None = HomeOpt, port: int = typer.Option(3000, help="Web server port.")):
    """Start the Dagster UI and daemon (`dagster dev -w workspace.yaml`)."""
    _paths(home)
    root = Path(__file__).resolve().parent.parent
    workspace = root / "workspace.yaml"
    if not workspace.exists():
        err.print(f"[red]workspace.yaml not found at {workspace}[/]: run `tentalis ui` from a Tentalis checkout")
        raise typer.Exit(2)
    os.chdir(root)
    # The dagster next to this interpreter: `.venv/bin/tentalis ui` works without an activated venv.
    dagster = Path(sys.executable).parent / "dagster"
    os.execv(str(dagster), [str(dagster), "dev", "-w", str(workspace), "-p", str(port)])


# The gateway (tentalis_pipelines/gateway/commands.py): `tentalis serve`, `tentalis keys create|list`.
from tentalis_pipelines.gateway import commands as _gateway  # noqa: E402

app.command("serve")(_gateway.serve)
keys_app = typer.Typer(help="API keys of the gateway (bearer key -> tenant).")
keys_app.command("create")(_gateway.keys_create)
keys_app.command("list")(_gateway.keys_list)
app.add_typer(keys_app, name="keys")


if __name__ == "__main__":
    app()
