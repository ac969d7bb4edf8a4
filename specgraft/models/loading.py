"""Loading models: a Hugging Face causal LM onto its device with the attention, fused projections
and CPU kernels the engine needs (:func:`load_causal_lm`, the target's loader), and draft models
once per (path, dtype, numerics, device), checked against the target's tokenizer.

The target is loaded by :func:`specgraft.models.loading.load_causal_lm` (``SpecDecoder`` does it); a
draft model goes through the same loader and kernels, in the numerics ``quant`` asks for
(``models/quant.py``: int8, bf16, fp16 or the load dtype), and is kept in a weak cache so that
every decoder made with ``with_method`` (and the benchmark's Hugging Face assisted peer)
shares one copy of its weights while it is in use.
"""

from __future__ import annotations

import ctypes
import gc
import inspect
import sys
import weakref
from typing import TYPE_CHECKING

import torch

from specgraft.models.attention import PACKED_SDPA, attention_implementation
from specgraft.models.device import parse_dtype
from specgraft.models.fusion import fuse_by_default, fuse_projections
from specgraft.models.kernels import use_onednn_linears
from specgraft.models.quant import INT8_QUANTS, draft_load_dtype, quantize_int8_dynamic, resolve_draft_quant
from specgraft.models.resolve import load_errors, resolve_model

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

#: Attention implementations that apply a 4-D additive mask as given (FlashAttention-2/3 read
#: it as a padding mask, flex attention needs a BlockMask, paged kernels ignore it).
TREE_MASK_ATTENTION = ("sdpa", PACKED_SDPA, "eager")


def load_causal_lm(
    name_or_path: str,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "cpu",
    fast_kernels: bool = True,
    fuse: bool | None = None,
) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` straight onto ``device`` (``device_map``), with the
    ``sdpa`` attention the tree mask needs (on CPU its GQA packed rather than copied,
    ``models/attention.py``), + the q/k/v and gate/up projections fused (``models/fusion.py``;
    ``fuse``: default ``fast_kernels``, on any device) and, on CPU,
    oneDNN linears (``models/kernels.py``)."""
    # here, not at the top: transformers' model classes take ~2.5 s to import, which a process on
    # the llama.cpp backend never needs (tests/unit/test_imports.py)
    from transformers import AutoModelForCausalLM

    device = torch.device(device)
    model = AutoModelForCausalLM.from_pretrained(
        name_or_path, dtype=parse_dtype(dtype, device), device_map=str(device), attn_implementation=attention_implementation(device)
    ).eval()
    if fuse_by_default(fuse, device, fast_kernels):
        fuse_projections(model)
    if fast_kernels and device.type == "cpu":
        use_onednn_linears(model)
    release_freed_memory()
    return model


def release_freed_memory() -> bool:
    """Hand the heap memory that loading freed back to the OS (glibc's ``malloc_trim(0)``).

    Loading reads bf16 checkpoints into fp32 tensors and repacks the linears (and the int8 draft
    quantizes them); glibc keeps the freed staging buffers in the process's heap, so the resident
    size stays well above what the models hold. Measured on the Zen 3 (1.5B fp32 target through
    ``SpecDecoder.from_pretrained`` + the int8 0.5B draft): 10.2 GiB resident after loading, 8.2 GiB
    after the trim, the same after a generation. Returns False where there is no glibc (nothing
    done), e.g. ``release_freed_memory()`` -> True on Linux.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # musl and other libcs
        return False
    gc.collect()
    trim(0)
    return True


def check_tree_attention(model: PreTrainedModel) -> None:
    """``ValueError`` naming the model unless its attention takes the 4-D tree mask as given and
    every layer caches full attention (a sliding-window, chunked or linear-attention layer
    cannot keep exactly the accepted rows of a tree)."""
    config = model.config.get_text_config(decoder=True)
    name = getattr(model.config, "_name_or_path", "") or type(model).__name__
    impl = getattr(config, "_attn_implementation", None) or getattr(model.config, "_attn_implementation", None)
    if impl not in TREE_MASK_ATTENTION:
        raise ValueError(
            f"model {name!r} uses attention implementation {impl!r}, which does not apply a tree mask as given; "
            f"load it with attn_implementation='sdpa' (or 'eager')"
        )
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        layer_types = get_layer_types_and_kwargs(config)[0]
    except (ImportError, AttributeError):
        layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise ValueError(
            f"model {name!r} has {', '.join(other)} layers; tree speculation needs full attention in every layer "
            "(sliding-window, chunked and linear-attention caches cannot drop rejected rows)"
        )
    for attr in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, attr, None) not in (None, 1.0):
            raise ValueError(f"model {name!r}: models with {attr} are not supported yet")


def cache_kwarg(decoder: torch.nn.Module) -> str:
    """The name under which ``decoder.forward`` takes its KV cache: ``cache`` from the
    transformers release that renamed it (5.24 accepts both and warns that ``past_key_values``
    goes in 5.40), ``past_key_values`` before. ``inspect.signature`` follows the deprecation
    wrapper's ``__wrapped__`` to the real parameters.

    >>> class Old(torch.nn.Module):
    ...     def forward(self, input_ids=None, past_key_values=None): ...
    >>> cache_kwarg(Old())
    'past_key_values'
    """
    return "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"



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
    same loader and CPU kernels as the target (:func:`specgraft.models.loading.load_causal_lm`).

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
