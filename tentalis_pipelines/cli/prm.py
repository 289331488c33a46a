"""`tentalis prm`: the trained process reward head (train a version, list them, evaluate one on ProcessBench)."""

from __future__ import annotations

import json
import sys

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import (
    MAX_COUNT,
    MAX_FOLDS,
    MAX_LAYERS,
    MAX_SEED,
    MAX_TOKENS,
    MAX_WIDTH,
    HomeOpt,
    add_column,
    app,
    console,
    fail,
    home_paths,
    print_table,
)

prm_app = typer.Typer(help="The PRM head: a step scorer trained from our own consensus labels (review.step_scorer = prm_head).")
app.add_typer(prm_app, name="prm")


@prm_app.command("train")
def prm_train(
    train_problems: int = typer.Option(600, "--train-problems", min=1, max=MAX_COUNT, help="GSM8K train problems labelled (seeded sample)."),
    features: str = typer.Option("hidden", "--features", help="What the head reads per step: hidden (block --layer's state; "
                                 "the only kind a learning run may use as its step scorer) | surprise (four log-prob statistics "
                                 "under the whole model: the better ProcessBench judge, gamed as a reward) | hidden+surprise."),
    layer: int = typer.Option(10, "--layer", min=0, max=MAX_LAYERS, help="The (deepest) trunk block whose output the head reads."),
    layers: str = typer.Option("", "--layers", help="Several blocks, comma-separated, concatenated (ending at --layer); empty: --layer alone."),
    pooling: str = typer.Option("mean", "--pooling", help="A step's feature: last (its last token) | mean (over its tokens) | last+mean."),
    center: bool = typer.Option(False, "--center/--no-center", help="Subtract the solution's mean step feature."),
    rule: str = typer.Option("threshold", "--rule", help="threshold | drop | argmin: how step scores become a first error."),
    renderings: str = typer.Option("pbstyle", "--renderings", help="Our steps as GSM8K writes them (plain), in ProcessBench's shape (pbstyle), or both."),
    weight_decay: float = typer.Option(1.0, "--weight-decay", help="L2 strength (AdamW). The defaults are the recipe chosen on held-out labels (experiments/prm_head)."),
    max_tokens: int = typer.Option(1024, "--max-tokens", min=1, max=MAX_TOKENS, help="A solution's tokens read (later steps unscored)."),
    hidden: int = typer.Option(0, "--hidden", min=0, max=MAX_WIDTH, help="0: a linear head; else one hidden layer of this width."),
    folds: int = typer.Option(5, "--folds", min=1, max=MAX_FOLDS, help="The threshold is chosen on out-of-fold scores of every labelled problem, this many heads "
                              "each trained without one fold; 1: on one held-out slice of 20% of the problems."),
    seed: int = typer.Option(0, "--seed", min=0, max=MAX_SEED),
    rollouts: bool = typer.Option(True, "--rollouts/--no-rollouts", help="Also label the lakehouse's own rollouts (calculator, verifier, MC)."),
    rollout_weight: float = typer.Option(10.0, "--rollout-weight", help="How much each step of those rollouts weighs in the loss "
                                         "(a GSM8K step weighs 1); they train as the policy wrote them and in the training rendering."),
    embeddings: bool = typer.Option(True, "--embeddings/--no-embeddings", help="The contamination guard's MiniLM tier (the slowest)."),
    model: str = typer.Option("embedded", "--model", help="The trunk: 'embedded' or a local model folder."),
    home: str | None = HomeOpt,
):
    """Label GSM8K train (consensus of provenance, calculator and verifier; the contamination guard refuses
    benchmark problems), train the head on the frozen trunk and store it as the next version under
    <home>/reviewers/prm_head with its lineage. Needs TENTALIS_DATA_DIR (gsm8k/train.jsonl)."""
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.reviewers.prm_head import HeadConfig
    from tentalis_pipelines.reviewers.prm_reviewer import TrainSettings, manifest_of, train_reviewer
    from tentalis_pipelines.settings import data_dir

    paths = home_paths(home)
    root = data_dir()
    if root is None or not (root / "gsm8k" / "train.jsonl").is_file():
        fail("tentalis prm train needs GSM8K train: export TENTALIS_DATA_DIR=<folder holding gsm8k/train.jsonl> "
             "(tentalis data fetch --only gsm8k)")
    lake = Lakehouse(paths.lakehouse) if rollouts else None
    try:
        read = tuple(int(x) for x in layers.split(",") if x.strip())
        config = HeadConfig(layer=layer, layers=read, pooling=pooling, features=features, center=center, rule=rule, hidden=hidden, seed=seed,
                            weight_decay=weight_decay, max_tokens=max_tokens)
        folder = train_reviewer(paths.home, resolve_model(model, paths.models), root, lake=lake, config=config,
                                settings=TrainSettings(train_problems=train_problems, folds=folds, seed=seed, use_embeddings=embeddings,
                                                       max_tokens=max_tokens, renderings=renderings, rollout_weight=rollout_weight))
    except (ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    m = manifest_of(folder)
    console.print(f"PRM head {folder.name} at {folder}: rule {m['config']['rule']}, threshold {m['threshold']:.3f}, held-out F1 {100 * m['held_out_f1']:.1f}, "
                  f"{m['lineage']['labels']['solutions']} labelled solutions ({m['lineage']['labels']['kinds'].get('rollout', 0)} of them "
                  f"the policy's rollouts, weight {m['settings']['rollout_weight']:g}), "
                  f"{len(m['lineage']['contamination']['refused'])} problem(s) refused by the contamination guard")


@prm_app.command("list")
def prm_list(format: str = typer.Option("table", "--format", "-f", help="table | json"), home: str | None = HomeOpt):
    """The stored PRM head versions, oldest first, with what they learned from."""
    from tentalis_pipelines.reviewers.prm_reviewer import manifest_of, reviewer_dir, versions

    paths = home_paths(home)
    rows = []
    for name in versions(paths.home):
        m = manifest_of(reviewer_dir(paths.home) / name)
        lab = m.get("lineage", {}).get("labels", {})
        rows.append({"version": name, "layer": m["config"]["layer"], "threshold": round(m["threshold"], 4),
                     "held_out_f1": round(100 * m.get("held_out_f1", 0.0), 1), "solutions": lab.get("solutions"),
                     "refused": len(m.get("lineage", {}).get("contamination", {}).get("refused", []))})
    if format == "json":
        sys.stdout.write(json.dumps(rows) + "\n")
        return
    if not rows:
        console.print(f"no PRM head under {reviewer_dir(paths.home)}: `tentalis prm train` trains one")
        return
    t = Table(title="PRM head versions")
    for col in rows[0]:
        add_column(t, col)
    for r in rows:
        t.add_row(*[str(v) for v in r.values()])
    print_table(t)


@prm_app.command("eval")
def prm_eval(
    split: str = typer.Option("gsm8k", "--split", help="ProcessBench split(s), comma-separated."),
    limit: int = typer.Option(0, "--limit", min=0, max=MAX_COUNT, help="Seeded sample per split (0: all items)."),
    version: str | None = typer.Option(None, "--version", help="Default: the newest."),
    model: str = typer.Option("embedded", "--model"),
    agreement: bool = typer.Option(True, "--agreement/--no-agreement",
                                   help="Write the results as judge_agreement rows (against ProcessBench's human labels and the verifier)."),
    rollouts: int = typer.Option(200, "--rollouts", min=0, max=MAX_COUNT, help="Agreement with the verifier on the newest N rollouts of the home's lakehouse (0: none)."),
    home: str | None = HomeOpt,
):
    """ProcessBench's official metric (accuracy on erroneous and on correct samples, F1) of a stored head,
    at its own decision rule (chosen on held-out training labels, never on ProcessBench); with
    ``--agreement`` the per-split results and the head's pass/fail agreement with the verifier on the
    home's rollouts land in ``judge_agreement`` (judge ``prm_head:<version>``)."""
    from tentalis_pipelines.evaluation.processbench import load_processbench, processbench_metrics
    from tentalis_pipelines.inference.models import resolve_model
    from tentalis_pipelines.lakehouse import Lakehouse, now_utc
    from tentalis_pipelines.reviewers.prm_agreement import processbench_row, store_rows, verifier_agreement
    from tentalis_pipelines.reviewers.prm_reviewer import PRMHeadNotTrained, PRMHeadScorer

    paths = home_paths(home)
    try:
        scorer = PRMHeadScorer(paths.home, resolve_model(model, paths.models), version=version)
    except PRMHeadNotTrained as exc:
        fail(str(exc))
    rule = scorer.checkpoint.rule
    t = Table(title=f"ProcessBench, PRM head {scorer.version} (rule {rule.kind}, threshold {rule.threshold:.3f})")
    for col in ("split", "n", "acc. erroneous", "acc. correct", "F1"):
        add_column(t, col)
    now, rows = now_utc(), []
    for name in [s.strip() for s in split.split(",") if s.strip()]:
        try:
            samples = load_processbench(name, limit=limit or None)
        except (FileNotFoundError, ValueError) as exc:
            fail(str(exc))
        scores = scorer.score([s.problem for s in samples], [list(s.steps) for s in samples])
        preds = [rule.predict(sc) for sc in scores]
        m = processbench_metrics([s.label for s in samples], preds)
        t.add_row(name, str(m.n), f"{100 * m.error_accuracy:.1f}", f"{100 * m.correct_accuracy:.1f}", f"{100 * m.f1:.1f}")
        rows.append(processbench_row(scorer.version, name, [s.label for s in samples], preds, now))
    print_table(t)
    if agreement:
        lake = Lakehouse(paths.lakehouse)
        if rollouts > 0:
            row = verifier_agreement(lake, scorer.version, scorer.score, rule.predict, now, limit=rollouts)
            if row is not None:
                rows.append(row)
                console.print(f"agreement with the verifier on {row['n']} rollouts: pass/fail {100 * row['pass_agreement']:.1f} %")
        store_rows(lake, rows)
        console.print(f"{len(rows)} judge_agreement row(s) written for judge prm_head:{scorer.version}")
