"""`tentalis demos oracle|model|import|list` and `tentalis warmstart`: demonstrations and the warm start."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from tentalis_pipelines.cli.common import (
    MAX_COUNT,
    MAX_SAMPLES,
    MAX_SEED,
    MAX_TASKS,
    MAX_TOKENS,
    MAX_TURNS,
    HomeOpt,
    app,
    check_policy_settings,
    check_seed,
    console,
    fail,
    home_paths,
    parse_levels,
)
from tentalis_pipelines.cli.cycle import HoldOutKindOpt, parse_hold_out_kinds, terminal_kinds

demos_app = typer.Typer(help="Demonstrations: verified action sequences that solve training tasks (the warm start's data).")
app.add_typer(demos_app, name="demos")


def _lake(home):
    from tentalis_pipelines.lakehouse import Lakehouse

    return Lakehouse(home_paths(home).lakehouse)


@demos_app.command("oracle")
def oracle(batch: str = typer.Option(..., "--batch", help="An environment batch whose tasks are materialised."),
           home: str | None = HomeOpt):
    """The oracle's demonstration of every task of the batch (its scripted solution), replayed in the real
    environment; those that pass land as `oracle` demonstrations."""
    from tentalis_pipelines import demonstrations as demos

    lake = _lake(home)
    try:
        rows, summary = demos.oracle_demonstrations(lake, batch)
        demos.write_demonstrations(lake, rows, sources={(batch, demos.ORACLE)})
    except ValueError as exc:
        fail(str(exc))
    console.print(f"{summary['verified']} oracle demonstration(s) verified and landed, {summary['failed']} failed"
                  + (f": {summary['failures']}" if summary["failures"] else ""))


@demos_app.command("model")
def model(batch: str = typer.Option(..., "--batch", help="An environment batch whose tasks are materialised."),
          served_model: str = typer.Option(..., "--model", help="The model to request from $OPENAI_BASE_URL (a stronger one)."),
          tokenizer: str = typer.Option(..., "--tokenizer", help="A local model folder whose chat template renders the prompts."),
          attempts: int = typer.Option(1, min=1, max=MAX_SAMPLES, help="Episodes per task until one passes."),
          max_new_tokens: int = typer.Option(256, min=1, max=MAX_TOKENS, help="Tokens per turn."),
          temperature: float = typer.Option(0.0, min=0.0, help="Sampling temperature of the stronger model."),
          home: str | None = HomeOpt):
    """Episodes of a stronger model served by an OpenAI-compatible server ($OPENAI_BASE_URL, key in
    $OPENAI_API_KEY); each passing one, written in the action format and replayed, lands as `openai:<model>`."""
    check_policy_settings("openai")
    from tentalis_pipelines import demonstrations as demos
    from tentalis_pipelines.inference.openai_backend import OpenAIBackend

    if not (Path(tokenizer) / "config.json").is_file() and not (Path(tokenizer) / "tokenizer_config.json").is_file():
        fail(f"--tokenizer {tokenizer}: not a model folder (no tokenizer_config.json)")
    lake = _lake(home)
    backend = OpenAIBackend(tokenizer, served_model=served_model, model_name=served_model, logprobs=False)
    try:
        rows, summary = demos.model_demonstrations(lake, batch, backend, attempts=attempts, max_new_tokens=max_new_tokens,
                                                   temperature=temperature)
        demos.write_demonstrations(lake, rows, sources={(batch, summary["source"])})
    except ValueError as exc:
        fail(str(exc))
    console.print(f"{summary['episodes']} episode(s), {summary['passed']} passed, {summary['verified']} verified on replay and landed "
                  f"as {summary['source']}")


@demos_app.command("import")
def import_(path: Path = typer.Argument(..., help="JSONL: one {batch_id, task_id, actions} object per line (docs/training.md)."),
            verify: bool = typer.Option(True, help="Replay each demonstration in its environment (only verified ones are trained on)."),
            home: str | None = HomeOpt):
    """Import a person's demonstrations. Each line is checked and replayed; a bad line goes to quarantine
    with `<file>:<line>:` and the reason, the others land as `human:<file name>`."""
    from tentalis_pipelines import demonstrations as demos

    try:
        out = demos.import_demonstrations(_lake(home), path, verify=verify)
    except FileNotFoundError as exc:
        fail(str(exc))
    console.print(f"imported {out['imported']} demonstration(s) as {out['source']}; {out['quarantined']} line(s) quarantined")
    for e in out["errors"]:
        console.print(f"  [yellow]{e}[/]", highlight=False)


@demos_app.command("list")
def list_(batch: str | None = typer.Option(None, "--batch", help="Only this batch's."), home: str | None = HomeOpt):
    """The demonstrations: batch, task, source, turns, verified."""
    from rich.table import Table

    from tentalis_pipelines import demonstrations as demos

    rows = demos.read_demonstrations(_lake(home), batches=[batch] if batch else None, verified_only=False)
    if not rows:
        console.print("no demonstrations yet: `tentalis demos oracle --batch ID` or `tentalis warmstart`")
        return
    t = Table(title="demonstrations")
    for c in ("demonstration_id", "batch_id", "task_id", "source", "turns", "verified"):
        t.add_column(c, no_wrap=c.endswith("_id"))
    for r in rows:
        t.add_row(r["demonstration_id"], r["batch_id"], r["task_id"], r["source"], str(len(r["actions"])), str(r["verified"]))
    console.print(t)


@app.command()
def warmstart(
    tasks: str = typer.Option("terminal", help="terminal | bfcl | swe: the environment whose training tasks are demonstrated."),
    levels: str = typer.Option("1", help="Levels of the batch, e.g. 1 or 1,2."),
    num_tasks: int = typer.Option(16, min=1, max=MAX_TASKS, help="Tasks (one oracle demonstration each)."),
    seed: int | None = typer.Option(None, min=0, max=MAX_SEED, help="Generator seed (default: the next unused one)."),
    max_turns: int = typer.Option(8, min=1, max=MAX_TURNS, help="The episodes' turn limit (BFCL: replies with calls per user turn)."),
    epochs: int = typer.Option(3, min=1, max=MAX_COUNT, help="Passes over the demonstrations."),
    learning_rate: float = typer.Option(1e-4, min=0.0, help="AdamW learning rate of the LoRA parameters."),
    gate: bool = typer.Option(True, help="Benchmark the checkpoint on the held-out split and run the promotion gate."),
    hold_out_kind: str | None = HoldOutKindOpt,
    run_seed: int = typer.Option(0, min=0, max=MAX_SEED, help="The trainer's seed: the LoRA's initialisation and the shuffling of "
                                 "the demonstrations (as `learn --seed`)."),
    home: str | None = HomeOpt,
):
    """Warm-start the serving policy on demonstrations: a new batch's tasks, the oracle's verified
    demonstrations of them, a LoRA checkpoint trained on the demonstrated turns only (algorithm
    sft_warm_start), then its held-out benchmark and the promotion gate, like an RL checkpoint."""
    if tasks not in ("terminal", "bfcl", "swe"):
        fail(f"--tasks {tasks!r}: a warm start demonstrates environment tasks: terminal, bfcl or swe")
    if not learning_rate > 0:
        fail(f"--learning-rate {learning_rate!r}: must be positive")
    if seed is not None:
        check_seed(seed)
    check_policy_settings("transformers")
    lv = tuple(parse_levels(levels, tasks))
    held_kinds = parse_hold_out_kinds(hold_out_kind, tasks, lv)
    paths = home_paths(home)
    from dagster import DagsterInstance

    from jobs.runner import CycleFailed
    from jobs.warm_start import WarmStartOptions, run_warm_start
    from tentalis_pipelines.cli.cycle import held_out_benchmark
    from tentalis_pipelines.definitions import defs

    held_out = held_out_benchmark(tasks, lv)
    kind_sets = [f"terminal-l{lv_}-{kind}" for kind in held_kinds for lv_ in lv if kind in terminal_kinds(lv_)]
    opts = WarmStartOptions(task_source=tasks, num_tasks=num_tasks, seed=seed, levels=lv, max_turns=max_turns, epochs=epochs,
                            learning_rate=learning_rate, gate=gate, exclude_families=held_kinds, run_seed=run_seed,
                            resources={"benchmark": {"config": {"benchmarks": [held_out, *kind_sets], "gate_benchmark": held_out}}})
    t0 = time.time()
    try:
        out = run_warm_start(defs, DagsterInstance.get(), paths, opts,
                             on_run=lambda r: console.print(f"  [green]✓[/] {r.job}{f' [dim]{r.partition}[/]' if r.partition else ''} "
                                                            f"[dim]{r.seconds:.0f} s[/]"))
    except (CycleFailed, ValueError, RuntimeError) as exc:
        fail(str(exc), 1)
    gate_note = f"; gate: {out['decision']['reason']}" if out["decision"] else ""
    console.print(f"[green]warm start[/] {out['checkpoint_id']} on the demonstrations of {out['batch_id']} in {time.time() - t0:.0f} s"
                  + gate_note)
