"""A GGUF draft model requantized for llama.cpp's fastest kernels (``--draft-quant`` on the
llama.cpp backend).

A draft model's numbers never reach the output (the target verifies every drafted token), so
its quantization only moves how many tokens are accepted and what a draft forward costs. What a
forward costs depends on the quantization type far more than on the bytes: the catalog's
Qwen2.5-Coder-0.5B Q4_K_M keeps most of its matrices in Q5_0 and its output matrix in Q8_0
(its width, 896, is not a multiple of the 256 that k-quants need), and llama.cpp has no fast
kernel for Q5_0. The same model requantized to Q4_0 decodes 2.9x faster on two cores of an
AVX-512 CPU with AMX (``llama-bench`` tg32: 88 against 30 tokens/s; the 1.5B target's step
then costs 5.5 draft forwards instead of 2) and 2.0x faster on the same CPU without AMX (43
against 22), and ``draft-tree`` over it accepted 4.38 tokens a step instead of 4.71 and ran
1.12x plain decoding instead of 0.79x on eight prompts (``benchmarks/experiments/llamacpp/NOTES.md``,
*A draft model in Q4_0*). Q8_0 is faster than Q5_0 with AMX only (45 tokens/s; 22 without).

Names (``GraftOptions.draft_quant`` / ``--draft-quant`` on the llama.cpp backend):

- ``auto``: ``q4_0``, unless the GGUF's file type is already Q4_0 (then as it is).
- ``none``: the GGUF as it is.
- ``q4_0`` / ``q8_0``: every matrix (the token embeddings and the output matrix included)
  requantized to that type with ``llama_model_quantize`` (a few seconds, once: the file is
  kept under the cache directory's ``requantized/``, named by the source file, its size and
  modification time). Requantizing from an already quantized file adds a second rounding;
  ``q8_0`` keeps nearly all of the source's precision at twice ``q4_0``'s bytes.

Example::

    path = draft_gguf("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "auto")   # ...requantized/...q4_0-<key>.gguf
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from pathlib import Path

from specgraft.models.catalog import cache_root
from specgraft.models.gguf_header import gguf_value
from specgraft.models.llamacpp_lib import import_llama_cpp

#: ``--draft-quant`` values the llama.cpp backend takes.
GGUF_DRAFT_QUANTS = ("auto", "none", "q4_0", "q8_0")
#: Where requantized files go; None: ``<cache>/requantized`` (the tests point it at a temporary folder).
REQUANTIZED_DIR: Path | None = None
#: The requantizing types: ``(llama_ftype, ggml_type)`` (llama.h's LLAMA_FTYPE_MOSTLY_*, ggml.h's GGML_TYPE_*).
_TYPES = {"q4_0": (2, 2), "q8_0": (7, 8)}


def resolve_gguf_draft_quant(quant: str, source: str | os.PathLike[str]) -> str:
    """``quant`` with ``auto`` resolved for the GGUF file ``source``: ``q4_0``, or ``none`` when
    the file's type is already Q4_0. ``ValueError`` for a name the llama.cpp backend does not
    take (the torch backend's ``int8``, ``bf16``, ``fp16``).

    >>> resolve_gguf_draft_quant("q8_0", "any.gguf"), resolve_gguf_draft_quant("none", "any.gguf")
    ('q8_0', 'none')
    >>> resolve_gguf_draft_quant("int8", "any.gguf")
    Traceback (most recent call last):
    ValueError: draft quantization 'int8' is the torch backend's; the llama.cpp backend takes auto, none, q4_0, q8_0
    """
    if quant not in GGUF_DRAFT_QUANTS:
        raise ValueError(f"draft quantization {quant!r} is the torch backend's; the llama.cpp backend takes {', '.join(GGUF_DRAFT_QUANTS)}")
    if quant != "auto":
        return quant
    return "none" if gguf_file_type(source) == _TYPES["q4_0"][0] else "q4_0"


def gguf_file_type(path: str | os.PathLike[str]) -> int | None:
    """The GGUF's ``general.file_type`` (a llama_ftype: 2 = Q4_0, 15 = Q4_K_M, ...), None without one."""
    value = gguf_value(path, "general.file_type")
    return None if value is None else int(value)


def draft_gguf(source: str | os.PathLike[str], quant: str, cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """The GGUF file a draft model with ``--draft-quant quant`` loads: ``source`` itself for
    ``none`` (and ``auto`` on a Q4_0 file), else its requantized copy (made on first use)."""
    source = Path(source)
    resolved = resolve_gguf_draft_quant(quant, source)
    return source if resolved == "none" else requantized_gguf(source, resolved, cache_dir, progress)


def requantized_gguf(source: Path, quant: str, cache_dir: str | os.PathLike[str] | None = None, progress: bool = True) -> Path:
    """``source`` with every matrix in ``quant`` (``q4_0`` or ``q8_0``), written once under
    ``<cache>/requantized/`` and reused while the source file is unchanged; ``RuntimeError``
    when llama.cpp cannot quantize it."""
    ftype, ggml_type = _TYPES[quant]
    stat = source.stat()
    key = hashlib.sha1(f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    folder = REQUANTIZED_DIR if REQUANTIZED_DIR is not None else cache_root(cache_dir) / "requantized"
    out = folder / f"{source.stem}.{quant}-{key}.gguf"
    if out.is_file():
        return out
    llama = import_llama_cpp()  # llama.cpp logs a line per tensor: errors only
    if progress:
        print(f"requantizing draft model {source.name} to {quant.upper()} for llama.cpp's faster kernels (once) ...", file=sys.stderr, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + f".{os.getpid()}.partial")
    params = llama.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.output_tensor_type = ggml_type
    params.token_embedding_type = ggml_type
    params.nthread = os.cpu_count() or 1
    try:
        if llama.llama_model_quantize(os.fsencode(source), os.fsencode(partial), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama.cpp could not requantize {source} to {quant}")
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    if progress:
        print(f"  wrote {out} ({out.stat().st_size / 2**20:.0f} MiB)", file=sys.stderr, flush=True)
    return out
