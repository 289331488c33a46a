"""`python -m tentalis_pipelines.cli` = `tentalis`."""

from tentalis_pipelines.cli import app

app()
