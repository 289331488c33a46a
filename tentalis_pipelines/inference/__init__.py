"""Generation backends behind one interface, prompts, and model resolution."""

from tentalis_pipelines.inference.base import (
    BackendNotAvailable,
    Generation,
    GenerationBackend,
    SamplingParams,
)
from tentalis_pipelines.inference.factory import make_backend
from tentalis_pipelines.inference.models import EMBEDDED, ModelNotAvailable, resolve_model
from tentalis_pipelines.inference.prompts import render_prompt

__all__ = [
    "EMBEDDED",
    "BackendNotAvailable",
    "Generation",
    "GenerationBackend",
    "ModelNotAvailable",
    "SamplingParams",
    "make_backend",
    "render_prompt",
    "resolve_model",
]
