"""Print the newest checkpoint of a Tentalis home: the manager's (``manager_checkpoints``) or the worker's
(``checkpoints``), by ``created_at``; ``base`` when the home has none. The lab scripts read it to promote,
register or evaluate what an update or a cycle just wrote.

Usage: python -m experiments.manager_rl.newest /work/runs/mgr14-exp --role manager
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tentalis_pipelines.lakehouse import Lakehouse

TABLES = {"manager": "manager_checkpoints", "worker": "checkpoints"}


def newest(home: Path, role: str) -> str:
    """The newest checkpoint id of ``role`` in ``home``, or ``base``."""
    lake = Lakehouse(home / "lakehouse")
    table = TABLES[role]
    rows = lake.read(table, columns=["checkpoint_id", "created_at"]).to_pylist() if lake.exists(table) else []
    return max(rows, key=lambda r: r["created_at"])["checkpoint_id"] if rows else "base"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("home", type=Path)
    ap.add_argument("--role", choices=sorted(TABLES), default="manager")
    args = ap.parse_args()
    print(newest(args.home, args.role))


if __name__ == "__main__":
    main()
