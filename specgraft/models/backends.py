"""Which backend runs a model, and the GGUF file the llama.cpp backend reads (no torch import).

Two backends run the target (and a draft model):

- ``hf``: Hugging Face transformers on torch (``models/hf.py``), in float32 on a CPU (exact: every
  method equals plain decoding token for token) or bfloat16 on a GPU. Loads catalog names, model
  directories and hub ids; a catalog model is its GGUF dequantized once into safetensors.
- ``llamacpp``: llama.cpp through llama-cpp-python (``models/llamacpp.py``), reading the GGUF with
  its own quantized kernels: several times faster than float32 torch on a CPU. Exact against its
  own plain decoding only in strict mode; otherwise near-tied tokens can flip between batch shapes
  (``--compare`` measures the agreement). Loads ``.gguf`` files and catalog names (their GGUF).

``auto`` picks ``llamacpp`` for a ``.gguf`` file, ``hf`` otherwise: a catalog name keeps the
exact float32 path unless ``--backend llamacpp`` asks for speed, so a package installed on the
side never changes what a command outputs.

>>> resolve_backend("auto", "model.Q4_K_M.gguf"), resolve_backend("auto", "smollm2-135m-instruct")
('llamacpp', 'hf')
"""

from __future__ import annotations

import os
from pathlib import Path

from specgraft.models.catalog import load_catalog
from specgraft.models.pull import pull_gguf

BACKENDS = ("auto", "hf", "llamacpp")


def is_gguf_file(name_or_path: str | os.PathLike[str]) -> bool:
    """Whether a model argument names a ``.gguf`` file (whether or not it exists yet).

    >>> is_gguf_file("~/models/x.gguf"), is_gguf_file("Qwen/Qwen2.5-0.5B")
    (True, False)
    """
    return os.fspath(name_or_path).lower().endswith(".gguf")


def resolve_backend(backend: str, model: str | os.PathLike[str]) -> str:
    """``hf`` or ``llamacpp`` for ``backend`` (one of :data:`BACKENDS`) and the model argument."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "llamacpp" if is_gguf_file(model) else "hf"
    return backend


def gguf_path(name_or_path: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """The GGUF file of a model argument: a ``.gguf`` path itself; a catalog name's GGUF in its
    pulled directory (pulled, or its GGUF assembled again, on first use: ``pull_gguf``); a
    directory holding exactly one ``.gguf``. ``ValueError`` otherwise (a hub id, a directory of
    safetensors)."""
    text = os.fspath(name_or_path)
    path = Path(text).expanduser()
    if is_gguf_file(text):
        if not path.is_file():
            raise ValueError(f"no GGUF file at {text!r}")
        return path
    if text in load_catalog():
        return pull_gguf(text, cache_dir=cache_dir, progress=progress)
    if path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        if found:
            raise ValueError(f"{text!r} holds {len(found)} GGUF files; name one: {', '.join(p.name for p in found)}")
    raise ValueError(f"the llama.cpp backend reads GGUF models: a .gguf file, a catalog name or a directory with one .gguf; {text!r} is none")


def tokenizer_source(gguf: Path) -> tuple[str, str | None]:
    """Where a GGUF model's Hugging Face tokenizer loads from: ``(directory, None)`` when a
    ``tokenizer.json`` sits beside the file (a pulled catalog model), else ``(directory,
    gguf file name)``, which transformers reads the vocabulary and chat template out of."""
    if (gguf.parent / "tokenizer.json").is_file() or (gguf.parent / "tokenizer_config.json").is_file():
        return str(gguf.parent), None
    return str(gguf.parent), gguf.name
