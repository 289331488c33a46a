"""Speed, side by side in one run: ``make bench`` (= ``python -m bench``). The lab, not the product.

Rollout tokens/s against a plain generate loop, fp32 against bf16, one GRPO update against TRL's
GRPOTrainer, the lakehouse figures and (on request) the gateway. Every figure is written as JSON with the
host CPU, so figures from different hosts are never compared.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from tentalis_pipelines.hardware import host_cpu
from tentalis_pipelines.settings import Paths

console = Console()
err = Console(stderr=True)


def main(
    parts: str = typer.Option("rollout,dtype,grpo,lakehouse",
                              help="Which measurements: rollout, dtype (fp32 vs bf16), grpo (needs tentalis[bench]), lakehouse, "
                                   "gateway (tentalis serve vs the same backend in-process; not in the default), episodes (a level-0 terminal "
                                   "cycle's episode decoding, the decoder before issue 74 vs today's; not in the default)."),
    prompts: int = typer.Option(16, help="Prompts per rollout batch / GRPO update."),
    num_generations: int = typer.Option(8, help="Samples per prompt."),
    max_new_tokens: int = typer.Option(96, help="Completion length limit."),
    plain_prompts: int = typer.Option(4, help="Prompts the plain per-sample loop generates for (it is slow)."),
    rollout_dtype: str = typer.Option("float32", help="Rollout part: the precision both decoders run in (float32, bfloat16, auto)."),
    rollout_repeats: int = typer.Option(1, help="Rollout part: alternate the decoder and HF's generate this many times, keep each one's fastest."),
    updates: int = typer.Option(2, help="GRPO updates per trainer."),
    rows: int = typer.Option(1_000_000, help="Synthetic trajectory rows for the DuckDB aggregate."),
    gateway_requests: int = typer.Option(32, help="Gateway part: sequential chat calls per side for the latency percentiles."),
    gateway_sessions: int = typer.Option(32, help="Gateway part: concurrent sessions for turns/s landed."),
    gateway_turns: int = typer.Option(2, help="Gateway part: turns per concurrent session."),
    gateway_max_tokens: int = typer.Option(16, help="Gateway part: max_tokens per chat call (temperature 0)."),
    episode_tasks: int = typer.Option(8, help="Episodes part: level-0 training tasks (x num_generations sampled episodes each)."),
    episode_turns: int = typer.Option(4, help="Episodes part: turn limit per episode."),
    episode_held_out: int = typer.Option(8, help="Episodes part: held-out level-0 tasks decoded greedily on both sides."),
    out: Path | None = typer.Option(None, help="Write every figure as JSON here (default: $TENTALIS_HOME/bench/)."),
    home: str | None = typer.Option(None, envvar="TENTALIS_HOME", help="Where the converted model lives (default ./.tentalis)."),
):
    """Speed, measured side by side in one run: rollout tokens/s vs a plain generate loop, one GRPO update vs
    TRL's GRPOTrainer, a DuckDB aggregate over 1M trajectory rows, and batch 1 vs batch 20 writes."""
    import tempfile

    paths = Paths.from_env(home)
    from tentalis_pipelines.inference.models import resolve_model

    wanted = {x.strip() for x in parts.split(",") if x.strip()}
    unknown = wanted - {"rollout", "dtype", "grpo", "lakehouse", "gateway", "episodes"}
    if unknown:
        err.print(f"[red]unknown --parts {sorted(unknown)}[/]: choose from rollout, dtype, grpo, lakehouse, gateway, episodes")
        raise typer.Exit(2)
    model_dir = resolve_model("embedded", paths.models)
    report: dict = {"machine": host_cpu()}
    rows_out: list[tuple[str, str, str, str]] = []
    if "rollout" in wanted:
        from bench.rollout_bench import rollout_benchmark

        with console.status("rollouts: pipeline backend vs HF batched generate and a plain generate loop..."):
            r = rollout_benchmark(model_dir, prompts=prompts, num_generations=num_generations, max_new_tokens=max_new_tokens,
                                  plain_prompts=plain_prompts, dtype=rollout_dtype, repeats=rollout_repeats)
        report["rollout"] = r
        rows_out.append((f"rollout tokens/s, {prompts} x {num_generations}, {r['config']['dtype']}",
                         f"{r['pipeline']['tokens_per_s']} vs {r['hf_batched_generate']['tokens_per_s']} (HF batched generate)",
                         f"{r['speedup_vs_hf_batched']}x", ">= 3x (aim 5x)"))
        if "plain_loop" in r:
            rows_out.append(("rollout tokens/s vs a plain per-sample loop", f"{r['pipeline']['tokens_per_s']} vs {r['plain_loop']['tokens_per_s']}",
                             f"{r['speedup']}x", ">= 5x"))
    if "dtype" in wanted:
        from bench.dtype_bench import dtype_benchmark

        with console.status("fp32 vs bf16: rollouts and one GRPO update, alternated..."):
            d = dtype_benchmark(model_dir, prompts=min(prompts, 8), num_generations=num_generations, max_new_tokens=max_new_tokens)
        report["dtype"] = d
        rows_out.append(("rollout tokens/s, bf16 vs fp32", f"{d['bfloat16']['tokens_per_s']} vs {d['float32']['tokens_per_s']}",
                         f"{d['bf16_over_fp32_tokens_per_s']}x", "> 1x where bf16 is native"))
        rows_out.append((f"GRPO update, {d['config']['update_rows']} rows (s), bf16 vs fp32",
                         f"{d['bfloat16']['update_s']} vs {d['float32']['update_s']}", f"{d['fp32_over_bf16_update_time']}x faster", ""))
    if "grpo" in wanted:
        from bench.grpo_compare import (
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
        from bench.lakehouse_bench import (
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
    if "gateway" in wanted:
        from bench.gateway_bench import gateway_benchmark

        with console.status("gateway: tentalis serve vs the same backend in-process, then concurrent sessions..."):
            gwr = gateway_benchmark(model_dir, requests=gateway_requests, sessions=gateway_sessions,
                                    turns_per_session=gateway_turns, max_tokens=gateway_max_tokens)
        report["gateway"] = gwr
        lat, thr = gwr["latency"], gwr["throughput"]
        rows_out.append((f"gateway added latency, {gateway_requests} sequential chat calls, {gateway_max_tokens} tokens (ms)",
                         f"{lat['added_p50_ms']:+} p50 / {lat['added_p99_ms']:+} p99, {lat['added_paired_median_ms']:+} paired median (gateway {lat['gateway']['p50_ms']} / "
                         f"{lat['gateway']['p99_ms']} vs direct {lat['direct']['p50_ms']} / {lat['direct']['p99_ms']})", "", ""))
        rows_out.append((f"gateway turns/s landed, {gateway_sessions} sessions x {gateway_turns} turns",
                         f"{thr['landed_turns_per_s']} landed ({thr['turns_landed']}/{thr['turns_sent']} in Delta after "
                         f"{thr['landed_seconds']} s), {thr['acknowledged_turns_per_s']} acknowledged", "", ""))
        if "batching" in gwr:
            b = gwr["batching"]
            rows_out.append((f"gateway turns/s, continuous batching vs one call at a time, {gateway_sessions} sessions",
                             f"{b['turns_per_s_batched']} vs {b['turns_per_s_one_at_a_time']}", f"{b['turns_per_s_ratio']}x", ">= 4x"))
            rows_out.append(("gateway single-call p50 (ms), batched vs one at a time",
                             f"{b['single_call_p50_ms_batched']} vs {b['single_call_p50_ms_one_at_a_time']}", f"{b['single_call_p50_ratio']}x",
                             "<= 1.1x"))
    if "episodes" in wanted:
        from bench.episode_bench import episode_benchmark

        with console.status("episodes: a level-0 terminal cycle's decoding, the decoder before issue 74 vs today's..."):
            e = episode_benchmark(model_dir, tasks=episode_tasks, episodes=num_generations, turns=episode_turns,
                                  max_new_tokens=max_new_tokens, held_out=episode_held_out, dtype=rollout_dtype)
        report["episodes"] = e
        rows_out.append((f"episode decoding (s), {episode_tasks} x {num_generations} x {episode_turns} turns, new vs old",
                         f"{e['new']['sampled_seconds']} vs {e['old']['sampled_seconds']}", f"{e['sampled_wall_ratio_new_over_old']}x",
                         "<= 0.5x"))
        rows_out.append(("episode decoding peak RSS (GB), new vs old", f"{e['peak_rss_gb']['new']} vs {e['peak_rss_gb']['old']}", "",
                         "<= 3 GB"))
        rows_out.append((f"greedy held-out episodes identical ({episode_held_out})", str(e["held_out_identical"]), "", "True"))
    cpu = report["machine"]
    t = Table(title=f"make bench (one run, same inputs on both sides) on {cpu['model']}, {cpu['cpus']} CPUs, "
                    f"flags {' '.join(cpu['flags']) or 'none'}")
    for col in ("measurement", "figures", "ratio", "target"):
        t.add_column(col)
    for row in rows_out:
        t.add_row(*row)
    console.print(t)
    dest = out or paths.home / "bench" / f"bench-{time.strftime('%Y%m%dT%H%M%S')}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(report, indent=2, default=str))
    console.print(f"all figures: {dest}")




if __name__ == "__main__":
    typer.run(main)
