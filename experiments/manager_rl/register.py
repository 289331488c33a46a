"""Register the gated manager of one home (the one its manager_serving names) in another home and serve it
there, so a worker run reviews with it: its manager_checkpoints row (the adapter stays where it was
trained) and a promote --role manager. Lab code: the product moves checkpoints between homes only by the
lakehouse itself.

    python -m experiments.manager_rl.register --source /work/runs/mgr-exp --target /work/runs/mgr-trained-s0
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.training import serving


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--checkpoint", default=None, help="default: the manager the source serves")
    args = ap.parse_args()
    src = Lakehouse(args.source / "lakehouse")
    cid = args.checkpoint or serving.serving_checkpoint(src, "manager")
    if cid == serving.BASE:
        raise SystemExit(f"{args.source} serves the untrained manager: nothing to register (did its gate reject the trained one?)")
    row = next(r for r in src.read("manager_checkpoints").to_pylist() if r["checkpoint_id"] == cid)
    dst = Lakehouse(args.target / "lakehouse")
    dst.append("manager_checkpoints", [{**row, "parent_id": None, "promoted": False}])
    serving.promote(dst, cid, actor="experiment", reason=f"the gated manager of {args.source}", role="manager")
    print(f"{args.target} reviews with manager {cid}")


if __name__ == "__main__":
    main()
