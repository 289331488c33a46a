"""`tentalis skills`: the skill library (lessons distilled from failed reviews) and its decisions."""

from __future__ import annotations

import typer
from rich.table import Table

from tentalis_pipelines.cli.common import MAX_COUNT, HomeOpt, app, console, home_paths


def print_skills(lake, decisions: int = 10) -> None:
    """The skills, most supported first, and the latest verification decisions."""
    from tentalis_pipelines.stages.skills import read_skills

    rows = sorted(read_skills(lake), key=lambda r: (r["status"] != "verified", -r["support"]))
    if not rows:
        console.print("no skills yet: run `tentalis learn --skills`")
        return
    t = Table(title="skills")
    for c in ("skill_id", "status", "support", "gain", "95% CI", "measured on", "text"):
        t.add_column(c)
    for r in rows:
        ci = f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]" if r["ci_low"] is not None else ""
        t.add_row(r["skill_id"], r["status"], str(r["support"]), f"{r['gain']:+.3f}" if r["gain"] is not None else "", ci,
                  r["measured_on"] or "", r["text"])
    console.print(t)
    if lake.exists("skill_decisions") and decisions:
        d = sorted(lake.read("skill_decisions").to_pylist(), key=lambda r: r["decided_at"])[-decisions:]
        t = Table(title="latest skill decisions")
        for c in ("decided_at", "skill_id", "kind", "from", "to", "seconds", "rule"):
            t.add_column(c)
        for r in d:
            t.add_row(str(r["decided_at"])[:19], r["skill_id"], r["kind"], r["from_status"], r["to_status"], f"{r['seconds']:.0f}", r["rule"])
        console.print(t)


@app.command()
def skills(decisions: int = typer.Option(10, min=0, max=MAX_COUNT, help="Latest verification decisions to show."), home: str | None = HomeOpt):
    """List the skills distilled from failed reviews (status, support, measured gain) and the latest decisions."""
    from tentalis_pipelines.lakehouse import Lakehouse

    print_skills(Lakehouse(home_paths(home).lakehouse), decisions)
