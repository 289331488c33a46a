"""`tentalis init`, `run`, `batch new`, `learn`: set up, and learning cycles as runs of the asset jobs."""

from __future__ import annotations

import time

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
    err,
    fail,
    home_paths,
    parse_levels,
)
from tentalis_pipelines.cli.progress import PROGRESS_HELP

TemperatureOpt = typer.Option(None, help="Sampling temperature of the rollouts, written into the batch's manifest (default: the task "
                              "family's recipe: terminal 0.4, else the policy resource's 0.8).")
ProgressOpt = typer.Option(None, "--progress", help="How progress is shown: " + PROGRESS_HELP)


@app.command()
def init(home: str | None = HomeOpt, model: str = typer.Option("embedded", help="'embedded' or a local model folder.")):
    """Create the home folder and Dagster instance, and convert the embedded model once."""
    paths = home_paths(home)
    from tentalis_pipelines.inference.models import resolve_model

    with console.status("Preparing the model (first time: converting the embedded GGUF to safetensors)..."):
        model_dir = resolve_model(model, paths.models)
    console.print(f"[green]ready[/]: home [bold]{paths.home}[/], model [bold]{model_dir}[/], inbox [bold]{paths.inbox}[/]")
    from tentalis_pipelines.cli.serving import reconcile_home

    reconcile_home(paths)
    from dagster import DagsterInstance

    from assets.partitions import checkpoint_ids

    with DagsterInstance.get() as instance:  # the base model's benchmark partitions exist from the start
        if not instance.has_dynamic_partition(checkpoint_ids.name, "base"):
            instance.add_dynamic_partitions(checkpoint_ids.name, ["base"])


def _cycle_resources(num_generations, max_new_tokens, gate_limit=None, trainer=None, backend=None, sampling_seed=None,
                     skills_top_k=None, temperature=None) -> dict:
    """Run config for the resources: only the fields set here. model and base_url stay unset, so the
    policy resource reads them from $TENTALIS_MODEL / $OPENAI_BASE_URL."""
    policy = {"num_generations": num_generations, "max_new_tokens": max_new_tokens}
    if temperature is not None:
        policy["temperature"] = temperature
    if sampling_seed is not None:
        policy["seed"] = sampling_seed
    if skills_top_k:
        policy["skills_top_k"] = skills_top_k
    if backend:
        policy["backend"] = backend
    out: dict = {"policy": {"config": policy}}
    if gate_limit:
        out["benchmark"] = {"config": {"limit": gate_limit}}
    if trainer:
        out["trainer"] = {"config": trainer}
    return out


def _execute_cycle(opts, label: str) -> dict:
    """One learning cycle as runs of the asset jobs on the instance (jobs/runner.py), its progress told to the
    command's reporter (``cli/progress.py``: a line per stage, job and cycle, or a live bar) as it happens."""
    from dagster import DagsterInstance

    from jobs.run_health import reap_dead_runs
    from jobs.runner import CycleFailed, run_cycle, step_error
    from tentalis_pipelines.cli import progress
    from tentalis_pipelines.definitions import defs

    instance = DagsterInstance.get()
    for run_id in reap_dead_runs(instance):
        err.print(f"[yellow]run {run_id} was killed earlier: marked failed and its gpu slot freed[/]")
    report = progress.current()
    feed = progress.JobEvents(report, steps_of=lambda job: len(defs.resolve_job_def(job).nodes), error_of=step_error)
    report.cycle_started(label)
    try:
        out = run_cycle(defs, instance, home_paths(None), opts, on_run=feed.finished, on_start=feed.about_to_run,
                        on_note=report.note, on_event=feed.event)
    except CycleFailed as exc:
        report.cycle_failed()
        fail(str(exc), 1)
    except (ValueError, OSError) as exc:  # refused before any job ran (a bad seed, a full disk)
        report.cycle_failed()
        fail(str(exc), 1)
    except BaseException:  # interrupted: the bar's line is ended, not left half drawn
        report.close()
        raise
    report.cycle_finished()
    return out


def start_progress(option: str | None) -> None:
    """The command's progress reporter (``--progress``, else $TENTALIS_PROGRESS, else auto), or one clear line."""
    from tentalis_pipelines.cli import progress

    try:
        progress.start(option)
    except ValueError as exc:
        fail(str(exc))


@app.command()
def run(
    home: str | None = HomeOpt,
    num_tasks: int = typer.Option(16, min=1, max=MAX_TASKS, help="Tasks in the new batch."),
    seed: int | None = typer.Option(None, min=0, max=MAX_SEED, help="Generator seed (default: the next unused one; below 1,000,000)."),
    num_generations: int = typer.Option(4, min=1, max=MAX_SAMPLES, help="Samples per task (G)."),
    max_new_tokens: int = typer.Option(128, min=1, max=MAX_TOKENS, help="Completion length limit."),
    train: bool = typer.Option(True, help="Train a checkpoint after the batch (and gate its promotion)."),
    backend: str | None = typer.Option(None, help="transformers | openai | vllm (default: $TENTALIS_BACKEND or transformers)."),
    tasks: str = typer.Option("arithmetic", help="arithmetic (seeded word problems) | terminal (agent episodes in the sandbox: "
                              "the terminal generator's training split; transformers backend) | bfcl (tool-calling episodes on BFCL's "
                              "simulators: generated tasks, levels 1-3) | swe (bug-fixing episodes on the mini-SWE catalogue's training split)."),
    levels: str = typer.Option("1,2", help="Difficulty levels of the new batch, e.g. 1 or 1,2 (terminal: 0-3; 0 names the command)."),
    max_turns: int | None = typer.Option(None, min=1, max=MAX_TURNS, help="--tasks terminal: the episodes' turn limit (default: 4 on level 0 alone, else 8); "
                                         "--tasks bfcl: replies with calls per user turn (default 8)."),
    temperature: float | None = TemperatureOpt,
    progress: str | None = ProgressOpt,
):
    """Run one learning cycle on the Dagster instance: a new batch through rollout_job, then train_job,
    benchmark_job and promotion_job (the gate), each a run of its own job."""
    from jobs.runner import CycleOptions

    home_paths(home)
    backend = check_policy_settings(backend)
    if seed is not None:
        check_seed(seed)
    start_progress(progress)
    t0 = time.time()
    lv = tuple(source_levels(tasks, levels))
    opts = CycleOptions(num_tasks=num_tasks, seed=seed, train=train, levels=lv, task_source=tasks, max_turns=max_turns,
                        recipe={"temperature": check_temperature(temperature)},
                        resources=_cycle_resources(num_generations, max_new_tokens, backend=backend))
    out = _execute_cycle(opts, "cycle 1/1")
    gate = out["decision"]
    console.print(f"[green]cycle finished[/] in {time.time() - t0:.0f} s ({out['cycle']})"
                  + (f"; gate: {gate['reason']}" if gate else ""))
    from tentalis_pipelines.cli.serving import status

    status(home=None)


SEEDED_SOURCES = ("arithmetic", "terminal", "bfcl", "swe")


def seeded_sources() -> tuple[str, ...]:
    """The seeded task sources: the built-in ones and every environment family of an installed package."""
    from tentalis_pipelines.tasks.families import installed_environment_families

    return (*SEEDED_SOURCES, *installed_environment_families())


def installed_family(tasks: str) -> bool:
    """Whether ``--tasks`` names an environment family of an installed package (``tasks/families``)."""
    from tentalis_pipelines.tasks.families import installed_environment_families

    return tasks in installed_environment_families()


def check_temperature(temperature: float | None) -> float | None:
    """``--temperature`` as given (None: the family's recipe decides, ``tasks/families``), refused
    outside (0, 2]. The value goes into the batch's manifest, not the policy resource's run config."""
    if temperature is not None and not 0.0 < temperature <= 2.0:
        fail(f"--temperature {temperature!r}: choose a value in (0, 2]; GRPO needs samples that differ, so not 0")
    return temperature


def report_task_file(path: str):
    """A bring-your-own terminal task file (``tasks/terminal_file.py``), read and validated: every bad
    line printed as ``<file>:<line>: <problem>; fix: <how>`` (it is quarantined, the good lines run);
    refused when the file is missing, empty, not a terminal task file, or has no good line."""
    from rich.markup import escape

    from tentalis_pipelines.tasks.terminal_file import (
        TerminalFileError,
        is_terminal_task_file,
        read_terminal_file,
    )

    try:
        parsed = read_terminal_file(path)
    except (TerminalFileError, OSError) as exc:
        fail(f"--tasks: {exc}")
    if not parsed.tasks and not is_terminal_task_file(path):
        fail(f"--tasks {path}: not a terminal task file (no line has an \"instruction\"); math and code task files go into "
             "the inbox, see docs/tasks.md")
    for line in parsed.errors():
        err.print(f"[yellow]{escape(line)}[/] [dim](quarantined; the good lines run)[/]", soft_wrap=True)  # a path is never broken
    if not parsed.tasks:
        fail(f"--tasks {path}: no line is a usable task (each is listed above with its fix)")
    return parsed


def held_out_benchmark(tasks: str, levels: tuple[int, ...]) -> str:
    """The benchmark a learning run is evaluated and gated on: the task source's own held-out split;
    for terminal tasks of one level, that level's partition (``terminal-l0`` ...). A terminal task file
    is gated on the terminal benchmark of its levels (levels outside 0-3: the whole benchmark)."""
    from tentalis_pipelines.tasks.batches import is_task_file_source

    if is_task_file_source(tasks):
        tasks, levels = "terminal", tuple(lv for lv in levels if lv in (0, 1, 2, 3)) or (0, 1)
    if installed_family(tasks):  # an installed environment family: its held-out split, named after it
        return tasks
    if tasks == "terminal" and len(set(levels)) == 1:
        return f"terminal-l{levels[0]}"
    return tasks


def check_seeded_source(tasks: str) -> None:
    if tasks not in seeded_sources():
        fail(f"--tasks {tasks!r}: choose {' or '.join(seeded_sources())}, or a terminal task file (path/to/tasks.jsonl)")


def source_levels(tasks: str, levels: str) -> list[int]:
    """The levels of a batch of ``--tasks``: a task file's training lines' own levels (the file is
    validated and its bad lines reported), else ``--levels`` checked for the family."""
    from tentalis_pipelines.tasks.batches import is_task_file_source

    if is_task_file_source(tasks):
        train = report_task_file(tasks).train
        if not train:
            fail(f"--tasks {tasks}: every good line is marked heldout; mark some \"split\": \"train\" to learn from")
        return sorted({t.level for t in train})
    check_seeded_source(tasks)
    return parse_levels(levels, tasks)


batch_app = typer.Typer(help="Task batches (the task_batches partitions).")
app.add_typer(batch_app, name="batch")


@batch_app.command("new")
def batch_new(
    home: str | None = HomeOpt,
    num_tasks: int = typer.Option(16, min=1, max=MAX_TASKS, help="Tasks in the new batch."),
    seed: int | None = typer.Option(None, min=0, max=MAX_SEED, help="Generator seed (default: the next unused one; below 1,000,000)."),
    levels: str = typer.Option("1,2", help="Difficulty levels, e.g. 1 or 1,2 (terminal: 0-3; 0 names the command)."),
    tasks: str = typer.Option("arithmetic", help="arithmetic (seeded word problems) | terminal (agent episodes in the sandbox) | bfcl "
                       "(tool-calling episodes on BFCL's simulators) | swe (bug-fixing episodes in the sandbox)."),
    max_turns: int | None = typer.Option(None, min=1, max=MAX_TURNS, help="--tasks terminal: the episodes' turn limit (default: 4 on level 0 alone, else 8); "
                                         "--tasks bfcl: replies with calls per user turn (default 8)."),
    temperature: float | None = TemperatureOpt,
    max_new_tokens: int | None = typer.Option(None, min=1, max=MAX_TOKENS, help="Completion length limit, written into the batch's manifest "
                                              "(default: the family's recipe: terminal 128 per turn, else the policy resource's)."),
):
    """Register a seeded arithmetic (or terminal) batch as a task_batches partition and print its id (for
    `dagster job execute -j rollout_job --tags '{"dagster/partition": "<id>"}'`)."""
    from dagster import DagsterInstance

    from jobs.runner import register_batch

    paths = home_paths(home)
    if seed is not None:
        check_seed(seed)
    try:
        lv = tuple(source_levels(tasks, levels))
        batch_id = register_batch(DagsterInstance.get(), paths, num_tasks=num_tasks, seed=seed, levels=lv, task_source=tasks,
                                  max_turns=max_turns, recipe={"temperature": check_temperature(temperature),
                                                               "max_new_tokens": max_new_tokens})
    except (ValueError, OSError) as exc:
        fail(str(exc))
    typer.echo(batch_id)


# How reviews reach the policy: the weights of the RL advantage and of the hinted OPD signal per token.
METHODS = {"rl": {"w_rl": 1.0, "w_opd": 0.0}, "opd": {"w_rl": 0.0, "w_opd": 1.0}, "combine": {"w_rl": 1.0, "w_opd": 1.0},
           "guide": {"w_rl": 1.0, "w_opd": 0.0, "guide": True},
           # the ablation of guide: all-fail groups resampled without the hint (more samples, no words)
           "resample": {"w_rl": 1.0, "w_opd": 0.0, "guide": True, "guide_with_hint": False}}


HoldOutKindOpt = typer.Option(None, help="--tasks terminal: task kinds never trained on, comma-separated (e.g. last_line); each "
                              "is evaluated alone at every checkpoint (benchmark terminal-l<level>-<kind>) to measure transfer.")


def terminal_kinds(level: int) -> tuple[str, ...]:
    from tentalis_pipelines.envs.terminal_tasks import FAMILIES

    return tuple(FAMILIES.get(level, {}))


def parse_hold_out_kinds(value: str | None, tasks: str, levels: tuple[int, ...]) -> tuple[str, ...]:
    """``--hold-out-kind``'s kinds, checked against the terminal levels (a clear error otherwise)."""
    if value is None or not value.strip():
        return ()
    if tasks != "terminal":
        fail(f"--hold-out-kind: holds terminal task kinds out of training; --tasks {tasks} has none")
    from tentalis_pipelines.tasks.batches import check_excluded_families

    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    try:
        return check_excluded_families(levels, kinds)
    except ValueError as exc:
        fail(str(exc))


@app.command()
def learn(
    # The measured recipe of the README's learning curve: 8 tasks x 8 samples of level-1 arithmetic;
    # the trainer settings default to the `trainer` resource's, i.e. GRPOConfig's (DAPO, beta 0, lr 2e-4).
    cycles: int = typer.Option(12, min=1, max=MAX_COUNT, help="Learning cycles to run now."),
    num_tasks: int = typer.Option(8, min=1, max=MAX_TASKS, help="Tasks per cycle."),
    num_generations: int = typer.Option(8, min=2, max=MAX_SAMPLES, help="Samples per task (G; a group needs two to compare)."),
    max_new_tokens: int | None = typer.Option(None, min=1, max=MAX_TOKENS, help="Completion length limit (terminal: per turn; default: "
                                              "arithmetic 96, terminal 128)."),
    gate_limit: int | None = typer.Option(None, min=1, max=MAX_COUNT, help="Held-out items per evaluation (default 64)."),
    levels: str | None = typer.Option(None, help="Difficulty levels of the training tasks, e.g. 1 or 1,2 (terminal: 0-3; 0 names the "
                                      "command); default 1, and for --tasks terminal the curriculum's choice."),
    curriculum: bool | None = typer.Option(None, "--curriculum/--no-curriculum", help="--tasks terminal: draw each batch's levels by "
                                           "the policy's recent success per level (most where it succeeds 20-80%, some always on the "
                                           "lowest level not yet at 80%; climbs as levels are mastered), from --levels or all of 0-3; "
                                           "default on when --levels is not given."),
    loss_type: str | None = typer.Option(None, help="grpo | dr_grpo | dapo | cispo | gspo (default: the trainer resource's, dapo)."),
    learning_rate: float | None = typer.Option(None, help="LoRA learning rate (> 0; default: the trainer resource's, 2e-4)."),
    beta: float | None = typer.Option(None, min=0.0, help="k3 KL coefficient; 0 skips the reference pass (default: the trainer resource's, 0)."),
    num_iterations: int | None = typer.Option(None, min=1, max=MAX_COUNT, help="Updates per batch of rollouts (mu; default 1)."),
    dtype: str | None = typer.Option(None, help="Training precision: auto (bf16 where native) | float32 | bfloat16."),
    seed: int | None = typer.Option(None, min=0, max=MAX_SEED, help="Run seed: the trainer's (LoRA init, shuffling) and the sampler's; record runs per seed."),
    tasks: str = typer.Option("arithmetic", help="arithmetic (seeded level-N problems, held-out: the arithmetic benchmark) | gsm8k "
                              "(slices of $TENTALIS_DATA_DIR/gsm8k/train.jsonl; held-out and gate: GSM8K test) | terminal "
                              "(agent episodes on the terminal generator's training split; held-out and gate: the terminal benchmark) | bfcl "
                              "(generated tool-calling tasks; held-out and gate: BFCL's multi_turn_base through its checker) | swe "
                              "(bug-fixing episodes on the mini-SWE training split; held-out and gate: the swe benchmark) | an installed "
                              "environment family's name (its seeded tasks; held-out and gate: its benchmark, docs/families.md)."),
    max_turns: int | None = typer.Option(None, min=1, max=MAX_TURNS, help="--tasks terminal: the episodes' turn limit (default: 4 on level 0 alone, else 8); "
                                         "--tasks bfcl: replies with calls per user turn (default 8)."),
    temperature: float | None = TemperatureOpt,
    method: str = typer.Option("rl", help="rl (the RL advantage) | opd (hinted on-policy distillation only) | combine (both, "
                               "OpenClaw-RL's w_rl = w_opd = 1) | guide (RL, plus groups where every sample failed resampled with "
                               "the manager's hint and trained on the hinted successes without it) | resample (guide's ablation: the same "
                               "resampling without the hint); sets the trainer's w_rl, w_opd and guide."),
    skills: bool = typer.Option(False, "--skills/--no-skills", help="Skills from failures: distil each batch's failed reviews into "
                                "skills, verify them on held-out items, and inject the verified ones into prompts and evaluations."),
    skills_top_k: int = typer.Option(3, min=1, max=MAX_SAMPLES, help="With --skills: verified skills per prompt (most similar first)."),
    manager: str | None = typer.Option(None, help="Who reviews: verifier | llm (the serving manager: the judge model with the "
                                       "adapter promoted by `tentalis promote --role manager`, else untrained); default: the review resource's."),
    step_scorer: str | None = typer.Option(None, help="What scores each step: calculator | judge | prm_head (the newest head of "
                                           "`tentalis prm train`); default: the review resource's, calculator."),
    hint_prefix: str | None = typer.Option(None, help="With --manager llm: the words every hint starts with, pre-filled (the "
                                           "prefix the serving manager was trained with); default: the review resource's, none."),
    advantage_mode: str | None = typer.Option(None, help="outcome | process (adds the step scores' process advantage to the outcome's); "
                                              "default: the trainer resource's, outcome."),
    reward_weights: str | None = typer.Option(None, help='JSON weights of the reward components, e.g. \'{"manager": 0}\' (the others keep '
                                              "their defaults); default: the review resource's (review.reward_weights)."),
    scale_rewards: str | None = typer.Option(None, help="group (divide by the group's std, outcome and step rewards alike) | none "
                                             "(only centre them, Dr. GRPO); default: none for dr_grpo, else group."),
    guide_answer_format: str | None = typer.Option(None, help="With --method guide: lenient (every hinted success the verifier "
                                                   "accepts joins its group) | tagged (only those with the answer in <answer> tags, "
                                                   "the held-out benchmark's format); default: the trainer resource's, lenient."),
    guide_rescue: str | None = typer.Option(None, help="With --method guide on terminal, bfcl or swe: how an all-fail group of "
                                            "episodes is resampled: hint (the manager's hint after the instruction) | prefix (the "
                                            "first k turns of the task's scripted demonstration, k annealed by the level's success) "
                                            "| both; default: the trainer resource's, hint."),
    hold_out_kind: str | None = HoldOutKindOpt,
    progress: str | None = ProgressOpt,
    home: str | None = HomeOpt,
):
    """Run K learning cycles now; every checkpoint is evaluated on held-out tasks. Prints the learning curve."""
    paths = home_paths(home)
    from assets.resources import TrainerResource
    from jobs.runner import CycleOptions
    from tentalis_pipelines.lakehouse import Lakehouse
    from tentalis_pipelines.promotion import benchmark_history
    from tentalis_pipelines.tasks.families import get_family, installed_environment_families

    check_policy_settings()
    from tentalis_pipelines.tasks.batches import is_task_file_source

    task_file = is_task_file_source(tasks)
    if curriculum is None:  # the curriculum picks terminal levels unless they are given
        curriculum = tasks == "terminal" and levels is None
    if curriculum and tasks != "terminal":
        fail(f"--curriculum: draws terminal levels; --tasks {tasks} takes --levels")
    default_levels = "0,1,2,3" if curriculum else ",".join(map(str, get_family(tasks).levels)) if installed_family(tasks) else "1"
    lv = source_levels(tasks, levels or "1") if task_file else parse_levels(levels or default_levels, tasks)
    held_kinds = parse_hold_out_kinds(hold_out_kind, tasks, tuple(lv))
    if method not in METHODS:
        fail(f"--method {method!r}: choose one of {', '.join(METHODS)}")
    options = {"loss_type": loss_type, "learning_rate": learning_rate, "beta": beta, "num_iterations": num_iterations,
               "dtype": dtype, "seed": seed, "advantage_mode": advantage_mode, "scale_rewards": scale_rewards,
               "guide_answer_format": guide_answer_format, "guide_rescue": guide_rescue, **METHODS[method]}
    trainer = {k: v for k, v in options.items() if v is not None}
    try:  # validated once, by GRPOConfig, before any model loads
        TrainerResource(**trainer).config()
    except ValueError as exc:  # GRPOConfig's messages start with the field's name
        name = str(exc).split()[0]
        flag = f"--{name.replace('_', '-')} {trainer[name]!r}" if name in trainer else "trainer setting"
        fail(f"{flag}: {exc}")
    learnable = ("arithmetic", "gsm8k", "terminal", "bfcl", "swe", *installed_environment_families())
    if tasks not in learnable and not task_file:
        fail(f"--tasks {tasks!r}: choose {', '.join(learnable)}, or a terminal task file (path/to/tasks.jsonl)")
    if manager not in (None, "verifier", "llm"):
        fail(f"--manager {manager!r}: choose verifier or llm")
    if step_scorer not in (None, "calculator", "judge", "prm_head"):
        fail(f"--step-scorer {step_scorer!r}: choose calculator, judge or prm_head")
    if hint_prefix:
        from tentalis_pipelines.rewards.llm_manager import check_hint_prefix

        try:
            check_hint_prefix(hint_prefix)
        except ValueError as exc:
            fail(f"--hint-prefix: {exc}")
    if reward_weights is not None:
        from tentalis_pipelines.rewards.scoring import parse_weights

        try:
            parse_weights(reward_weights, source="--reward-weights")
        except ValueError as exc:
            fail(str(exc))
    if step_scorer == "prm_head":
        from tentalis_pipelines.reviewers.prm_reviewer import PRMHeadNotTrained, step_scorer_version

        try:  # before any cycle starts
            step_scorer_version(paths.home)
        except PRMHeadNotTrained as exc:
            fail(f"--step-scorer prm_head: {exc}")
    if (tasks in ("terminal", "bfcl", "swe") or task_file or installed_family(tasks)) and skills:
        fail(f"--skills: not built for --tasks {tasks} yet")
    from tentalis_pipelines.tasks.families import get_family

    # The family's recipe goes into each batch's manifest (tasks/families); the flags override it there.
    recipe = {"temperature": check_temperature(temperature), "max_new_tokens": max_new_tokens}
    max_new_tokens = max_new_tokens or get_family("terminal" if task_file else tasks).recipe(tuple(lv)).max_new_tokens or 96
    # A curriculum run's levels change batch by batch: it is gated on the whole terminal benchmark.
    gated_levels = (0, 1, 2, 3) if curriculum else tuple(lv)
    start_progress(progress)
    t0 = time.time()
    for k in range(1, cycles + 1):
        resources = _cycle_resources(num_generations, max_new_tokens, gate_limit, trainer, sampling_seed=seed,
                                     skills_top_k=skills_top_k if skills else None)
        if manager is not None:
            resources.setdefault("review", {"config": {}})["config"]["manager"] = manager
        if step_scorer is not None:
            resources.setdefault("review", {"config": {}})["config"]["step_scorer"] = step_scorer
        if reward_weights is not None:
            resources.setdefault("review", {"config": {}})["config"]["reward_weights"] = reward_weights
        if hint_prefix is not None:
            resources.setdefault("review", {"config": {}})["config"]["hint_prefix"] = hint_prefix
        if tasks != "arithmetic":  # held out and gated on the dataset's own test split (terminal: the levels trained)
            held_out = held_out_benchmark(tasks, gated_levels)
            # a kind held out of training is also evaluated alone at every checkpoint (never gated on)
            kind_sets = [f"terminal-l{lv_}-{kind}" for kind in held_kinds for lv_ in lv if kind in terminal_kinds(lv_)]
            resources.setdefault("benchmark", {"config": {}})["config"].update({"benchmarks": [held_out, *kind_sets], "gate_benchmark": held_out})
        # Skills are verified on the task family they come from, at the rollouts' completion length.
        skills_config = {"validation_source": tasks, "max_new_tokens": max_new_tokens} if skills else {}
        opts = CycleOptions(num_tasks=num_tasks, levels=tuple(lv), trigger="learn", task_source=tasks, skills=skills, resources=resources,
                            skills_config=skills_config, max_turns=max_turns, recipe=recipe, curriculum=curriculum,
                            exclude_families=held_kinds)
        _execute_cycle(opts, f"cycle {k}/{cycles}")
    console.print(f"[green]{cycles} cycle(s)[/] in {time.time() - t0:.0f} s. Held-out learning curve:")
    console.print(benchmark_history(Lakehouse(paths.lakehouse), held_out_benchmark(tasks, gated_levels))["history"])
    if skills:
        from tentalis_pipelines.cli.skills import print_skills

        print_skills(Lakehouse(paths.lakehouse))
