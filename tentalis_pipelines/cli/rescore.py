"""`tentalis rescore`: reward versions of the stored rollouts (diff first, activation explicit), and
`tentalis agreement`: how the automatic reviewers agree with the human managers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import (
    HomeOpt,
    actor_name,
    add_column,
    app,
    console,
    fail,
    home_paths,
    print_table,
)


@app.command()
def rescore(
    version: str | None = typer.Option(None, "--version", help="Name of the new reward version (e.g. v1)."),
    weights: str = typer.Option("", "--weights", help='JSON weight overrides: \'{"manager": 1.0}\' or \'{"math": {"format": 0}}\'.'),
    manager: str = typer.Option("stored", "--manager", help="stored (keep the reviews' scores) | verifier | llm (review.judge_model)."),
    step_scorer: str = typer.Option("stored", "--step-scorer", help="stored | calculator | judge | prm_head."),
    rubric: Path | None = typer.Option(None, "--rubric", help="A text file: the llm manager's rubric for this version."),
    rubric_name: str | None = typer.Option(None, "--rubric-name", help="The rubric's name in judge_agreement (default: the file's stem)."),
    judge_model: str | None = typer.Option(None, "--judge-model", help="Model of the llm manager / judge (default: the review resource's)."),
    batch: list[str] = typer.Option([], "--batch", "-b", help="Batch to re-score (repeatable; default: every single-turn batch)."),
    keep_human: bool = typer.Option(True, help="Rollouts a human reviewed keep the human's score."),
    activate: str | None = typer.Option(None, "--activate", help="Make this version the one trajectories and training use."),
    reason: str = typer.Option("", "--reason", help="Why (recorded with the activation)."),
    actor: str | None = typer.Option(None, "--actor", help="Who (default: $USER, else 'cli')."),
    list_versions: bool = typer.Option(False, "--list", help="List the reward versions, the active one and the activations."),
    format: str = typer.Option("table", "--format", "-f", help="table | json"),
    home: str | None = HomeOpt,
):
    """Re-score the stored rollouts into a new reward version and show its diff against the active one
    (runs `rescore_job`), or activate a version (`--activate V --reason ...`), or list them (`--list`)."""
    paths = home_paths(home)
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.rewards.rescore import RescoreSpec
    from tentalis_pipelines.rewards.scoring import parse_weight_overrides
    from tentalis_pipelines.stages.rescore import activate_reward_version

    if format not in ("table", "json"):
        fail(f"--format must be table or json, not {format!r}")
    lake = Lakehouse(paths.lakehouse)
    if sum(x is not None and x is not False for x in (version, activate, list_versions or None)) != 1:
        fail("give exactly one of --version NAME (re-score), --activate NAME (switch training to it) or --list")
    if list_versions:
        return _list(lake, format)
    if activate is not None:
        try:
            row = activate_reward_version(lake, activate, actor=actor_name(actor), reason=reason)
        except ValueError as exc:
            fail(str(exc))
        if format == "json":
            sys.stdout.write(json.dumps(row, default=str) + "\n")
        else:
            console.print(f"reward version [bold]{row['to_version']}[/] is active (was {row['from_version']}): "
                          f"{row['rows']} trajectories of {len(row['batches'])} batch(es) rewritten; recorded as activation {row['seq']}")
        return
    rubric_text = None
    if rubric is not None:
        if not rubric.is_file():
            fail(f"rubric file {rubric} does not exist: give a text file with the llm manager's rubric")
        try:
            rubric_text = rubric.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            fail(f"rubric file {rubric} is not valid UTF-8: save it as UTF-8 text")
    try:
        spec = RescoreSpec(version=version, weights=parse_weight_overrides(weights, source="--weights"), manager=manager, step_scorer=step_scorer,
                           rubric=rubric_text, rubric_name=rubric_name or (rubric.stem if rubric else "default"))
    except ValueError as exc:
        fail(str(exc))
    if spec.weights_only and not spec.weights:
        fail("nothing to change: give --weights, --manager verifier|llm or --step-scorer calculator|judge")
    summary = _run_rescore_job(spec, batch, judge_model, actor_name(actor))
    if format == "json":
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
        return
    _print_diff(lake, summary)


def _run_rescore_job(spec, batches: list[str], judge_model: str | None, actor: str) -> dict:
    """Materialise `reward_versions` through `rescore_job` on the instance (the UI shows the run and the
    diff), then read the version's summary back."""
    from dagster import DagsterInstance

    from jobs.runner import CycleFailed, run_job
    from tentalis_pipelines.definitions import defs
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.settings import Paths

    config = {"version": spec.version, "weights": json.dumps(spec.weights), "manager": spec.manager, "step_scorer": spec.step_scorer,
              "rubric": spec.rubric or "", "rubric_name": spec.rubric_name, "batches": list(batches), "keep_human": spec.keep_human,
              "created_by": actor}
    run_config: dict = {"ops": {"reward_versions": {"config": config}}}
    if judge_model:
        run_config["resources"] = {"review": {"config": {"judge_model": judge_model}}}
    with DagsterInstance.get() as instance, console.status(f"re-scoring into {spec.version} (rescore_job)"):
        try:
            run = run_job(defs, instance, "rescore_job", run_config=run_config, tags={"tentalis/trigger": "cli"})
        except CycleFailed as exc:
            fail(str(exc), 1)
    lake = Lakehouse(Paths.from_env().lakehouse)
    row = next(r for r in lake.read("reward_version_defs").to_pylist() if r["reward_version"] == spec.version)
    return {"reward_version": spec.version, "base_version": row["base_version"], "run_id": run.run_id,
            "definition": json.loads(row["definition"]), **json.loads(row["summary"])}


def _print_diff(lake, summary: dict) -> None:
    from tentalis_pipelines.stages.rescore import read_version

    v, base = summary["reward_version"], summary["base_version"]
    console.print(f"reward version [bold]{v}[/] against the active [bold]{base}[/] ({summary['n']} rollouts, run {summary['run_id']}):")
    console.print(f"  rewards changed {summary['changed']}, mean Δ {summary['mean_delta']:+.4f}, mean |Δ| {summary['mean_abs_delta']:.4f}, "
                  f"max |Δ| {summary['max_abs_delta']:.4f}")
    rho = summary["reward_spearman"]
    console.print(f"  rank changes within groups {summary['rank_changes']}, advantage sign flips {summary['sign_flips']}, "
                  f"kept {summary['kept_before']} → {summary['kept_after']}, Spearman(old, new) {'n/a' if rho is None else f'{rho:.3f}'}")
    rows = sorted(read_version(lake, v), key=lambda r: -abs(r["reward_delta"]))[:10]
    t = Table(title="most changed rollouts")
    for c in ("rollout_id", "batch_id", "base_reward", "reward", "delta", "rank", "advantage"):
        add_column(t, c, justify="left" if c in ("rollout_id", "batch_id") else "right")
    for r in rows:
        t.add_row(r["rollout_id"], r["batch_id"], f"{r['base_reward']:.3f}", f"{r['reward']:.3f}", f"{r['reward_delta']:+.3f}",
                  f"{r['base_rank']} → {r['rank']}", f"{r['base_advantage']:+.3f} → {r['advantage']:+.3f}")
    print_table(t)
    console.print(f"training still uses [bold]{base}[/]; to switch: tentalis rescore --activate {v} --reason \"…\"")


def _list(lake, format: str) -> None:
    from tentalis_pipelines.stages.rescore import active_reward_version, reward_activations

    active = active_reward_version(lake)
    defs = lake.read("reward_version_defs").to_pylist() if lake.exists("reward_version_defs") else []
    versions = [{"reward_version": d["reward_version"], "active": d["reward_version"] == active, "base_version": d["base_version"],
                 "n": d["n"], "created_by": d["created_by"], "created_at": d["created_at"], "definition": json.loads(d["definition"]),
                 "summary": json.loads(d["summary"] or "{}")} for d in sorted(defs, key=lambda d: d["created_at"])]
    log = reward_activations(lake)
    if format == "json":
        sys.stdout.write(json.dumps({"active": active, "versions": versions, "activations": log}, default=str) + "\n")
        return
    console.print(f"active reward version: [bold]{active}[/]")
    t = Table(title="reward versions")
    for c in ("reward_version", "active", "base", "n", "changed", "sign_flips", "definition", "created_by"):
        add_column(t, c)
    for v in versions:
        d = {k: x for k, x in v["definition"].items() if x not in (None, {}, "stored") and k != "rubric"}
        t.add_row(v["reward_version"], "✓" if v["active"] else "", str(v["base_version"] or ""), str(v["n"]),
                  str(v["summary"].get("changed", "")), str(v["summary"].get("sign_flips", "")), json.dumps(d), v["created_by"])
    print_table(t)
    if log:
        h = Table(title="activations")
        for c in ("seq", "from", "to", "actor", "reason", "rows", "at"):
            add_column(h, c)
        for r in log:
            h.add_row(str(r["seq"]), r["from_version"], r["to_version"], r["actor"], r["reason"], str(r["rows"]), str(r["created_at"])[:19])
        print_table(h)


@app.command()
def agreement(
    window: str = typer.Option("batch", "--window", help="batch | day (UTC) of the judge's scores."),
    format: str = typer.Option("table", "--format", "-f", help="table | json"),
    home: str | None = HomeOpt,
):
    """Judge-versus-manager agreement (runs `judge_agreement_job`, default drift thresholds) and prints it."""
    paths = home_paths(home)
    from dagster import DagsterInstance

    from jobs.runner import CycleFailed, run_job
    from tentalis_pipelines.definitions import defs
    from tentalis_pipelines.lakehouse import Lakehouse

    if window not in ("batch", "day") or format not in ("table", "json"):
        fail("--window must be batch or day, --format table or json")
    with DagsterInstance.get() as instance:
        try:
            run = run_job(defs, instance, "judge_agreement_job", run_config={"ops": {"judge_agreement": {"config": {"window": window}}}},
                          tags={"tentalis/trigger": "cli"})
        except CycleFailed as exc:
            fail(str(exc), 1)
        checks = [e for e in instance.all_logs(run.run_id) if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
    lake = Lakehouse(paths.lakehouse)
    rows = lake.read("judge_agreement").to_pylist() if lake.exists("judge_agreement") else []
    rows.sort(key=lambda r: (r["judge"], r["rubric"], r["window_kind"] == "all", r["window_start"]))
    verdict = checks[-1].dagster_event.asset_check_evaluation_data if checks else None
    if format == "json":
        sys.stdout.write(json.dumps({"rows": rows, "drift_check_passed": getattr(verdict, "passed", None),
                                     "drift": getattr(verdict, "description", None)}, default=str) + "\n")
        return
    t = Table(title=f"judge vs human managers (per {window})")
    for c in ("judge", "rubric", "window_id", "n", "mean_abs_diff", "spearman", "pass_agreement"):
        add_column(t, c)
    for r in rows:
        t.add_row(r["judge"], r["rubric"], r["window_id"], str(r["n"]), f"{r['mean_abs_diff']:.3f}",
                  "n/a" if r["spearman"] is None else f"{r['spearman']:.3f}", f"{r['pass_agreement']:.3f}")
    if rows:
        print_table(t)
    else:
        console.print("no rollout is scored by both a judge and a human manager yet")
    if verdict is not None:
        console.print(("[green]no judge drifts[/]: " if verdict.passed else "[yellow]drift[/]: ") + (verdict.description or ""))
