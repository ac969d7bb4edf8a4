"""Loading draft models: once per (path, dtype, numerics, device), checked against the target's
tokenizer.

The target is loaded by :func:`specgraft.models.hf.load_causal_lm` (``SpecDecoder`` does it); a
draft model goes through the same loader and kernels, in the numerics ``quant`` asks for
(``models/quant.py``: int8, bf16, fp16 or the load dtype), and is kept in a weak cache so that
every decoder made with ``with_method`` (and the benchmark's Hugging Face assisted peer)
shares one copy of its weights while it is in use.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn
    from transformers import PreTrainedTokenizerBase


# Loaded draft models by (path, dtype, numerics, device, fused), alive while a drafter uses them.
_loaded_models: "weakref.WeakValueDictionary[tuple[str, str, str, str, bool], nn.Module]" = weakref.WeakValueDictionary()


def load_draft_model(
    name: str,
    dtype: str = "auto",
    device: "str | torch.device" = "cpu",
    progress: bool = True,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    quant: str = "none",
    fuse: bool | None = None,
) -> nn.Module:
    """Load (or reuse, while loaded) a draft model by catalog name, directory or hub id, with the
    same loader and CPU kernels as the target (:func:`specgraft.models.hf.load_causal_lm`).

    ``quant`` (``auto``, ``none``, ``int8``, ``int8-tensor``, ``bf16``, ``fp16``:
    :mod:`specgraft.models.quant`) picks the draft's numerics; ``none`` keeps ``dtype``. ``int8``
    (and ``int8-tensor``) loads in float32 with plain
    linears, quantizes them, then applies the oneDNN swap to whatever stayed fp32 (nothing in
    the catalog models), so quantized linears are never repacked in fp32. The q/k/v and gate/up
    projections are fused first (``models/fusion.py``; int8 outputs bit-identical to the unfused
    ones): ``fuse`` None fuses (any device), True or False decide.

    With ``target_tokenizer``, the draft model's tokenizer must have the same vocabulary
    (``ValueError`` otherwise): equal vocabulary sizes alone would let two tokenizers that
    number their tokens differently pass. Without it, only the sizes are compared (when the
    drafter is built). A model that cannot be pulled or loaded raises
    :class:`~specgraft.models.resolve.ModelLoadError` naming it.
    """
    from transformers import AutoConfig

    from specgraft.models.fusion import fuse_by_default
    from specgraft.models.hf import load_causal_lm, parse_dtype, release_freed_memory
    from specgraft.models.kernels import use_onednn_linears
    from specgraft.models.quant import INT8_QUANTS, draft_load_dtype, quantize_int8_dynamic, resolve_draft_quant
    from specgraft.models.resolve import load_errors, resolve_model

    quant = resolve_draft_quant(quant, device)
    resolved = parse_dtype(draft_load_dtype(quant, dtype), device)
    path = resolve_model(name, progress=progress)
    with load_errors(name, "draft model"):
        AutoConfig.from_pretrained(path)  # cheap: "not a model" before the tokenizer check says something vaguer
    if target_tokenizer is not None:
        check_same_vocabulary(name, path, target_tokenizer)
    fuse = fuse_by_default(fuse, device)  # before int8 quantization, whatever fast_kernels below
    key = (str(path), str(resolved), quant, str(device), fuse)
    model = _loaded_models.get(key)
    if model is None:
        with load_errors(name, "draft model"):
            model = load_causal_lm(path, resolved, device, fast_kernels=quant not in INT8_QUANTS, fuse=fuse)
        if quant in INT8_QUANTS:
            quantize_int8_dynamic(model, row_groups=quant == "int8")
            use_onednn_linears(model)
            release_freed_memory()  # the fp32 weights the int8 ones replaced
        _loaded_models[key] = model
    return model


def check_same_vocabulary(name: str, path: str, target_tokenizer: PreTrainedTokenizerBase) -> None:
    """``ValueError`` unless the tokenizer stored at ``path`` (draft model ``name``) maps every
    token to the same id as ``target_tokenizer``."""
    from transformers import AutoTokenizer

    try:
        draft_tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"draft model {name!r} has no tokenizer to compare with the target's ({e})") from e
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise ValueError(f"draft model {name!r} has a different vocabulary from the target's; it must use the target's tokenizer")
