"""The stages of the learning loop, one module per stage, as plain functions over the lakehouse.

``tentalis_pipelines.pipeline`` re-exports them: the one import the assets use.
"""
