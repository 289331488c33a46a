"""Register a checkpoint of one home in another home and serve it there: by default the gated manager
of the source (the one its manager_serving names), so a worker run reviews with it; with --role worker
the worker the source serves, so a harvest (`tentalis run --no-train`) samples a trained worker. Its
checkpoints row (the adapter stays where it was trained) and a promote. Lab code: the product moves
checkpoints between homes only by the lakehouse itself.

    python -m experiments.manager_rl.register --source /work/runs/mgr-exp --target /work/runs/mgr-trained-s0
    python -m experiments.manager_rl.register --role worker --source /work/runs/mgr14-trained-s0 --target /work/runs/mgr15-exp
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse
from tentalis_pipelines.training import serving

TABLES = {"manager": "manager_checkpoints", "worker": "checkpoints"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("--role", choices=sorted(TABLES), default="manager")
    ap.add_argument("--checkpoint", default=None, help="default: the checkpoint the source serves in this role")
    args = ap.parse_args()
    src = Lakehouse(args.source / "lakehouse")
    cid = args.checkpoint or serving.serving_checkpoint(src, args.role)
    if cid == serving.BASE:
        raise SystemExit(f"{args.source} serves the untrained {args.role}: nothing to register (did its gate reject the trained one?)")
    row = next(r for r in src.read(TABLES[args.role]).to_pylist() if r["checkpoint_id"] == cid)
    dst = Lakehouse(args.target / "lakehouse")
    dst.append(TABLES[args.role], [{**row, "parent_id": None, "promoted": False}])
    serving.promote(dst, cid, actor="experiment", reason=f"the {args.role} of {args.source}", role=args.role)
    print(f"{args.target} serves {args.role} {cid}")


if __name__ == "__main__":
    main()
