"""Rebuild the mini-SWE catalogue: run the tests on every candidate bug in the sandbox, keep the ones that
break a test, write ``tentalis_pipelines/envs/swe_catalogue.json``.

    python tools/swe_catalogue.py [--check]

``--check`` writes nothing and exits 1 when the committed catalogue differs from a fresh build.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path

from tentalis_pipelines.envs.swe import build_catalogue

PATH = Path(__file__).resolve().parents[1] / "tentalis_pipelines" / "envs" / "swe_catalogue.json"


def main(argv: list[str]) -> int:
    t0 = time.perf_counter()
    catalogue = build_catalogue()
    text = json.dumps(catalogue, indent=1, sort_keys=True) + "\n"
    bugs = catalogue["bugs"]
    print(f"{len(bugs)} bugs in {time.perf_counter() - t0:.1f} s; by level and split:",
          dict(sorted(Counter((b["level"], b["split"]) for b in bugs).items())))
    print("by kind:", dict(Counter(b["site"].split(":")[0] for b in bugs).most_common()))
    if "--check" in argv:
        same = PATH.exists() and PATH.read_text() == text
        print("the committed catalogue is", "up to date" if same else "STALE")
        return 0 if same else 1
    PATH.write_text(text)
    print(f"wrote {PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
