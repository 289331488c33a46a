"""`tentalis`: set up, run learning cycles, look at the state, query the tables, open the UI.

One module per concern; importing them registers their commands on :data:`app`, in ``--help`` order.
"""
# isort: skip_file

from tentalis_pipelines.cli.common import app, csv_safe
from tentalis_pipelines.cli import cycle  # noqa: F401  init, run, batch, learn
from tentalis_pipelines.cli import serving  # noqa: F401  status, promote, rollback, reconcile
from tentalis_pipelines.cli import lineage  # noqa: F401  lineage, retract, audit
from tentalis_pipelines.cli import tables  # noqa: F401  sql, maintain, import-reviews
from tentalis_pipelines.cli import evaluate  # noqa: F401  benchmark, bench
from tentalis_pipelines.cli import agents  # noqa: F401  serve, keys, ingest-nats
from tentalis_pipelines.cli import ui  # noqa: F401  ui
from tentalis_pipelines.cli import contamination  # noqa: F401  contamination
from tentalis_pipelines.cli import data  # noqa: F401  data fetch, data status
from tentalis_pipelines.cli import rescore  # noqa: F401  rescore, agreement
from tentalis_pipelines.cli import skills  # noqa: F401  skills
from tentalis_pipelines.cli import episodes  # noqa: F401  episodes export, episodes import
from tentalis_pipelines.cli import openrlhf  # noqa: F401  reward-server, openrlhf export, openrlhf import
from tentalis_pipelines.cli import manager  # noqa: F401  manager train, evaluate, gate, status
from tentalis_pipelines.cli import prm  # noqa: F401  prm train, prm list, prm eval
from tentalis_pipelines.cli import demos  # noqa: F401  demos oracle|model|import|list, warmstart

__all__ = ["app", "csv_safe"]
