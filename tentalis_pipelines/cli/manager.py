"""`tentalis manager train | evaluate | gate | status`: the manager that learns (training/manager_rl.py)."""

from __future__ import annotations

import json
import os

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import (
    MAX_COUNT,
    MAX_SAMPLES,
    MAX_SEED,
    MAX_TASKS,
    MAX_TOKENS,
    HomeOpt,
    add_column,
    app,
    console,
    fail,
    home_paths,
    print_table,
)

manager_app = typer.Typer(help="The manager that learns: GRPO on its reviews, rewarded by what its hints do for the worker.",
                          no_args_is_help=True)
app.add_typer(manager_app, name="manager")

RewardOpt = typer.Option("rescue", help="rescue (the worker's success with the hint) | dense (RLT's log-prob gain of the answer).")
SeedOpt = typer.Option(0, min=0, max=MAX_SEED, help="Sampling and LoRA seed.")
SplitSeedOpt = typer.Option(0, min=0, max=MAX_SEED, help="The held-out split's key (manager.split_seed): keep it fixed in a home, so every update "
                            "and evaluation sees the same split whatever its --seed.")
AcceptedPerTaskOpt = typer.Option(1, min=1, max=MAX_SAMPLES, help="Accepted rollouts taken per task (a worker that succeeds on few tasks gives "
                                  "the score more accepted answers this way).")
HintPrefixOpt = typer.Option("", help="The words every hint starts with, pre-filled (review.hint_prefix; serve the manager with "
                             "the prefix it was trained with).")


def _settings(worker_temperature: float, max_new_tokens: int, seed: int, **manager):
    from tentalis_pipelines.policy import PolicySettings
    from tentalis_pipelines.training.manager_rl import ManagerRLConfig

    policy = PolicySettings(model=os.environ.get("TENTALIS_MODEL", "embedded"), temperature=worker_temperature,
                            max_new_tokens=max_new_tokens, seed=seed)
    try:
        return policy, ManagerRLConfig(seed=seed, **manager)
    except ValueError as exc:
        fail(str(exc))


def accepted_shortfall(metrics: dict, success_share: float) -> str | None:
    """What to tell the user when an update reviewed fewer accepted rollouts than ``--success-share`` asked
    for (each is reviewed for its score alone, so a shortfall trains the score mostly on failures), else None."""
    got, wanted = metrics.get("accepted", 0), metrics.get("accepted_wanted", 0)
    if got >= wanted:
        return None
    return (f"only {got} fresh accepted rollouts on the training side for the {wanted} that --success-share {success_share} "
            "asks for: the score is trained mostly on failures and may learn to score everything low; run more task batches "
            "(`tentalis run --no-train`) before the next update")


@manager_app.command("train")
def train(
    updates: int = typer.Option(1, min=1, max=MAX_COUNT, help="GRPO updates (each its own checkpoint, chained from the last)."),
    part: str = typer.Option("review", help="review: one adapter writes the whole review (GRPO or best-of-n) | score: the "
                             "manager's own score adapter, taught the verifier's scores on --failures failures and as many "
                             "accepted answers; the adapter that writes the critique and the hint is kept as it is."),
    failures: int = typer.Option(32, min=1, max=MAX_TASKS, help="Failed rollouts per update."),
    num_generations: int = typer.Option(4, min=2, max=MAX_SAMPLES, help="Reviews sampled per failure (the group)."),
    rescue_samples: int = typer.Option(4, min=1, max=MAX_SAMPLES, help="Worker samples per hint."),
    accuracy_weight: float = typer.Option(0.5, min=0.0, help="Weight of |score - verifier score| against the hint's value."),
    reward: str = RewardOpt,
    credit: str = typer.Option("fields", help="fields: the score's advantage trains the score's tokens, the hint value's the "
                               "critique and hint | review: the summed reward trains every token."),
    success_share: float = typer.Option(0.25, min=0.0, help="Accepted rollouts per failure, reviewed for their score alone."),
    accepted_per_task: int = AcceptedPerTaskOpt,
    update: str = typer.Option("grpo", help="grpo: group-relative advantages | best_of_n: rejection-sampling fine-tuning on "
                               "each failure's best hint (above --best-min-value) and on class-balanced accurate scores."),
    score_targets: str = typer.Option("sampled", help="best_of_n: what teaches the score: sampled (the sampled score nearest "
                                      "the verifier's) | verifier (the verifier's score itself, as many failures as accepted answers)."),
    hint_proposals: str = typer.Option("none", help="best_of_n: none | verifier (the verifier's hint for each failure is "
                                       "offered beside the sampled reviews and trained when the reward ranks it first; needs "
                                       "--hint-prefix '')."),
    best_min_value: float = typer.Option(0.5, help="best_of_n: a hint is trained on only when its value exceeds this "
                                         "(0.5: a positive dense gain)."),
    num_iterations: int = typer.Option(1, min=1, max=MAX_COUNT, help="Passes over an update's sampled reviews."),
    per_step_rows: int = typer.Option(0, min=0, max=MAX_COUNT, help="Trained rows per optimizer step (0: all in one step)."),
    learning_rate: float = typer.Option(1e-4, min=0.0, help="LoRA learning rate."),
    manager_temperature: float = typer.Option(1.0, min=0.05, help="The manager's sampling temperature for its training reviews "
                                              "(a cooler manager samples more of its likelier hints: with a hint prefix, more plans)."),
    temperature: float = typer.Option(0.8, help="The worker's sampling temperature when it is rescued."),
    max_new_tokens: int = typer.Option(96, min=1, max=MAX_TOKENS, help="The worker's completion length."),
    manager_model: str = typer.Option("embedded", help="The manager's base model (review.judge_model)."),
    hint_prefix: str = HintPrefixOpt,
    seed: int = SeedOpt,
    split_seed: int = SplitSeedOpt,
    home: str | None = HomeOpt,
):
    """Train the serving manager on failed rollouts of the lakehouse's task batches; each update writes a
    `manager_checkpoints` row (not promoted: `tentalis manager evaluate` then `gate`, or `tentalis promote --role manager`)."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.stages.manager_training import train_manager, train_manager_score
    from tentalis_pipelines.training import serving

    paths = home_paths(home)
    lake = Lakehouse(paths.lakehouse)
    policy, config = _settings(temperature, max_new_tokens, seed, max_failures=failures, num_generations=num_generations,
                               rescue_samples=rescue_samples, accuracy_weight=accuracy_weight, reward=reward, learning_rate=learning_rate,
                               credit=credit, success_share=success_share, hint_prefix=hint_prefix, temperature=manager_temperature,
                               update=update, best_min_value=best_min_value, num_iterations=num_iterations,
                               per_step_rows=per_step_rows, accepted_per_task=accepted_per_task,
                               score_targets=score_targets, split_seed=split_seed, part=part, hint_proposals=hint_proposals)
    for u in range(updates):
        try:
            if config.part == "score":
                row = train_manager_score(lake, paths, policy, config, manager_model=manager_model)
            else:
                row = train_manager(lake, paths, policy, config, manager_model=manager_model)
        except ValueError as exc:
            fail(str(exc))
        m = json.loads(row["metrics"])
        if config.part == "score":
            console.print(f"update {u + 1}/{updates}: manager checkpoint [bold]{row['checkpoint_id']}[/] (parent "
                          f"{row['parent_id'] or 'base'}): its score adapter taught {m['failures']} failures' and {m['accepted']} "
                          f"accepted answers' verifier scores (loss {m['loss']}); the review adapter is the parent's")
        else:
            console.print(f"update {u + 1}/{updates}: manager checkpoint [bold]{row['checkpoint_id']}[/] (parent {row['parent_id'] or 'base'}): "
                          f"reward {m['reward_mean']:+.3f}, usable hints {m['usable_hint_share']:.0%}, rescue {m['rescue_rate']}, "
                          f"score error {m['score_error']:.3f}"
                          + (f", demonstrations {m['hint_demonstrations']} hints and {m['score_demonstrations']} scores"
                             if m.get("update") == "best_of_n" else "")
                          + (f" ({m['proposal_demonstrations']} of the hints the {m['hint_proposals']}'s, of "
                             f"{m['proposals_offered']} it proposed)" if m.get("hint_proposals", "none") != "none" else ""))
        if config.part != "score" and (short := accepted_shortfall(m, success_share)) is not None:
            console.print(f"[yellow]warning[/]: {short}")
        if u + 1 < updates:  # chain: the next update samples from this one
            serving.promote(lake, row["checkpoint_id"], actor="manager-train", reason=f"chained update {u + 1} of {updates}",
                            role="manager")


@manager_app.command("evaluate")
def evaluate(
    checkpoint: str = typer.Option("base", help="A manager checkpoint id, or 'base' (the untrained manager)."),
    limit: int | None = typer.Option(None, min=1, max=MAX_COUNT, help="Held-out failures to use (default: all)."),
    eval_rescue_samples: int = typer.Option(8, min=1, max=MAX_SAMPLES, help="Worker samples per hint."),
    eval_accepted: int = typer.Option(60, min=0, max=MAX_COUNT, help="Held-out accepted answers reviewed for the score alone (the gate "
                                      "needs --min-accepted of them)."),
    accepted_per_task: int = AcceptedPerTaskOpt,
    temperature: float = typer.Option(0.8, help="The worker's sampling temperature."),
    max_new_tokens: int = typer.Option(96, min=1, max=MAX_TOKENS, help="The worker's completion length."),
    manager_model: str = typer.Option("embedded", help="The manager's base model."),
    hint_prefix: str = HintPrefixOpt,
    seed: int = SeedOpt,
    split_seed: int = SplitSeedOpt,
    home: str | None = HomeOpt,
):
    """One greedy review per held-out failure and what its hint does for the serving worker (`manager_evals`)."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.stages.manager_training import evaluate_manager

    paths = home_paths(home)
    policy, config = _settings(temperature, max_new_tokens, seed, eval_rescue_samples=eval_rescue_samples, hint_prefix=hint_prefix,
                               eval_accepted=eval_accepted, accepted_per_task=accepted_per_task, split_seed=split_seed)
    try:
        rows = evaluate_manager(Lakehouse(paths.lakehouse), paths, policy, config, checkpoint, manager_model=manager_model, limit=limit)
    except ValueError as exc:
        fail(str(exc))
    from tentalis_pipelines.training.manager_rl import balanced_score_error

    failed = [r for r in rows if not r["worker_correct"]]
    k = sum(r["rescue_k"] for r in failed)
    used = sum(r["hint_decision"] == "used" for r in failed)
    console.print(f"{checkpoint}: {len(failed)} held-out failures and {len(rows) - len(failed)} accepted answers; usable hints "
                  f"{used}/{len(failed)}, rescued {sum(r['rescued'] for r in failed)}/{k} worker samples, mean rescue per failure "
                  f"{sum(r['rescued'] / r['rescue_k'] if r['rescue_k'] else 0 for r in failed) / max(1, len(failed)):.3f}, "
                  f"class-balanced score error "
                  f"{balanced_score_error([(r['score'], r['verifier_score'], r['worker_correct']) for r in rows]):.3f}")


@manager_app.command("gate")
def gate(
    checkpoint: str = typer.Argument(..., help="The candidate manager checkpoint."),
    margin: float = typer.Option(0.0, min=0.0, help="Rejected when the rescue difference's interval lies below -margin."),
    score_tolerance: float = typer.Option(0.05, min=0.0, help="Rejected when its score error exceeds the incumbent's by more."),
    min_accepted: int = typer.Option(40, min=0, max=MAX_COUNT, help="Accepted answers both managers must have reviewed before the gate "
                                     "decides (0: decide anyway, the score's discrimination unchecked)."),
    home: str | None = HomeOpt,
):
    """Compare a candidate manager with the serving one on the same held-out failures; a pass promotes it."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.promotion import GateNotReady
    from tentalis_pipelines.stages.manager_training import decide_manager_gate
    from tentalis_pipelines.training.manager_rl import ManagerRLConfig

    paths = home_paths(home)
    try:
        incumbent, d, err_c, err_i = decide_manager_gate(Lakehouse(paths.lakehouse), checkpoint,
                                                         ManagerRLConfig(gate_margin=margin, score_tolerance=score_tolerance,
                                                                         gate_min_accepted=min_accepted))
    except (GateNotReady, ValueError) as exc:
        fail(str(exc))
    console.print(f"{checkpoint} vs {incumbent}: {d.reason}; score error {err_c:.3f} vs {err_i:.3f}")


def _metric(metrics: dict, key: str, fmt: str) -> str:
    """One cell of ``manager status``: the metric formatted, or "-" where this kind of update does not record it."""
    value = metrics.get(key)
    return "-" if value is None else fmt.format(value)


@manager_app.command("status")
def status(home: str | None = HomeOpt):
    """The manager's checkpoints, what reviews now, and its serving history."""
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.training import serving

    lake = Lakehouse(home_paths(home).lakehouse)
    console.print(f"the manager that reviews: [bold]{serving.serving_checkpoint(lake, 'manager')}[/]")
    if lake.exists("manager_checkpoints"):
        t = Table(title="manager checkpoints")
        for c in ("checkpoint_id", "parent", "part", "rollouts", "reward", "usable hints", "rescue", "score error", "loss", "created"):
            add_column(t, c)
        for r in sorted(lake.read("manager_checkpoints").to_pylist(), key=lambda r: r["created_at"]):
            m = json.loads(r["metrics"])
            # A score update (`--part score`) trains on the verifier's scores alone: it has no reward, hints or
            # score error of its own, so those cells show "-" (they raised a KeyError before).
            t.add_row(r["checkpoint_id"], r["parent_id"] or "base", m.get("part", "review"), str(r["trajectory_count"]),
                      _metric(m, "reward_mean", "{:+.3f}"), _metric(m, "usable_hint_share", "{:.0%}"),
                      _metric(m, "rescue_rate", "{:.3f}"), _metric(m, "score_error", "{:.3f}"), _metric(m, "loss", "{:.3f}"),
                      str(r["created_at"])[:19])
        print_table(t)
    for r in serving.serving_history(lake, "manager"):
        console.print(f"seq {r['seq']}: {r['from_checkpoint']} -> {r['to_checkpoint']} ({r['action']} by {r['actor']}: {r['reason']})")
