"""The decoder forward of Llama-family models in one plain loop: Hugging Face's ops, not its machinery.

A one-row forward of the int8 0.5B draft spends about a quarter of its time outside torch ops
(``torch.profiler``: 14.5 ms of ops in a 19 ms forward, Zen 5): per layer a dozen module calls,
each through ``nn.Module.__call__``, keyword plumbing and ``transformers``' decorators
(``deprecate_kwarg``, output capturing), the fused projections' slice bookkeeping
(``models/fusion.py``), the attention interface lookup. The draft runs several such forwards a
step, so :class:`LeanDecoder` runs the same layers as one loop over their parameters and
submodules, with the same torch ops in the same order:

    per layer:  x = rms(h) ; qkv = qkv_proj(x) ; q, k = rope(q, k) ; k, v = cache.update(k, v)
                h = h + o_proj(attention(q, k, v, mask))
                x = rms(h) ; g, u = gate_up_proj(x) ; h = h + down_proj(act(g) * u)
    then:       final norm

so its hidden states equal :meth:`HFTarget._decode`'s through Hugging Face bit for bit
(``tests/unit/models/test_lean.py`` compares them on prefills, chains, trees, batches and every hidden
layer, for Llama and Qwen2 with plain, fused, int8 and oneDNN linears). Measured on the Zen 5:
the int8 draft's one-row forward 20.2 -> 18.2 ms, the fp32 1.5B target's 126 -> 121 ms,
``draft-tree`` 3.2% faster end to end (``benchmarks/experiments/cpu-kernels/measure_lean.py``; RESULTS, *A lean
decoder forward*). A run's config records ``lean_forward``. Linears are called as modules (int8, oneDNN
and plain ``nn.Linear`` alike) and looked up at call time, so a later kernel swap still applies.

Which models: ``LlamaModel`` and ``Qwen2Model`` decoders (the catalog's families) with the
standard layer classes, a registered attention (``sdpa``, ours; not ``eager``), no
sliding-window layers;
:func:`lean_decoder` returns None for anything else (the adapter then keeps Hugging Face's
forward). Used on the CPU (``HFTarget(lean=None)``); a GPU forward is bound by kernel launches,
not Python, and replays CUDA graphs (``models/graphs.py``).

Example::

    lean = lean_decoder(model.get_decoder())     # None: not a supported model
    final, hidden = lean(ids, positions, mask, cache, layer=None)   # [B, n, H] each
"""

from __future__ import annotations

import os
from typing import Callable

import torch
from torch import nn

from specgraft.models.fusion import ProjectionSlice

__all__ = ["LeanDecoder", "lean_by_default", "lean_decoder", "unsupported_reason"]

#: decoder class name -> its layer class name (exactly these classes: a subclass may change the forward)
SUPPORTED = {"LlamaModel": "LlamaDecoderLayer", "Qwen2Model": "Qwen2DecoderLayer"}


def lean_by_default(device: torch.device | str) -> bool:
    """The lean forward on the CPU unless ``SPECGRAFT_LEAN=0``.

    >>> lean_by_default("cuda")
    False
    """
    return torch.device(device).type == "cpu" and os.environ.get("SPECGRAFT_LEAN", "1") != "0"


def unsupported_reason(decoder: nn.Module) -> str | None:
    """Why :class:`LeanDecoder` cannot run ``decoder`` (None: it can).

    >>> unsupported_reason(nn.Linear(2, 2))
    'Linear is not one of LlamaModel, Qwen2Model'
    """
    name = type(decoder).__name__
    if name not in SUPPORTED:
        return f"{name} is not one of {', '.join(SUPPORTED)}"
    config = decoder.config
    if any(type(layer).__name__ != SUPPORTED[name] for layer in decoder.layers):
        return f"{name} has layers of another class"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        return f"{name} has sliding-window layers"
    if len(decoder.layers) != config.num_hidden_layers:
        return f"{name} runs {config.num_hidden_layers} of its {len(decoder.layers)} layers"
    if getattr(config, "pretraining_tp", 1) != 1:
        return f"{name} has pretraining_tp {config.pretraining_tp}"
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if config._attn_implementation not in ALL_ATTENTION_FUNCTIONS:
        # "eager" is each model file's own function, not a registered one
        return f"{name} uses attention {config._attn_implementation!r}"
    return None


def lean_decoder(decoder: nn.Module) -> "LeanDecoder | None":
    """A :class:`LeanDecoder` over ``decoder``, or None when it is not supported."""
    return None if unsupported_reason(decoder) else LeanDecoder(decoder)


def _rms(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """``LlamaRMSNorm`` / ``Qwen2RMSNorm``'s forward, op for op."""
    dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + norm.variance_epsilon)
    return norm.weight * h.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _projections(module: nn.Module, names: tuple[str, ...], fused_name: str, x: torch.Tensor) -> list[torch.Tensor]:
    """The outputs of sibling linears ``names`` on ``x``: one call of the fused linear, sliced as
    :class:`ProjectionSlice` slices it, or each linear called."""
    first = getattr(module, names[0])
    if isinstance(first, ProjectionSlice):
        out = getattr(module, fused_name)(x)
        return [out[..., s.start : s.stop] for s in (getattr(module, n) for n in names)]
    return [getattr(module, n)(x) for n in names]


class LeanDecoder:
    """Hugging Face's decoder forward for Llama / Qwen2 as one loop (module docstring)."""

    def __init__(self, decoder: nn.Module):
        reason = unsupported_reason(decoder)
        if reason:
            raise ValueError(f"no lean forward for this model: {reason}")
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        self.decoder = decoder
        self.layers = list(decoder.layers)
        self.attention: Callable = ALL_ATTENTION_FUNCTIONS[decoder.config._attn_implementation]

    def __call__(
        self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache, layer: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``ids``, ``positions`` ``[B, n]``, ``mask`` ``[B, 1, n, kv_len]`` (additive), ``cache``
        the slot cache with its write set up: ``[B, n, H]`` final hidden states (after the final
        norm) and the hidden states of ``layer`` (Hugging Face's ``hidden_states[layer]``: the
        output of layer ``layer - 1``; the final ones when None)."""
        dec = self.decoder
        h = dec.embed_tokens(ids)
        cos, sin = dec.rotary_emb(h, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        b, n = ids.shape
        picked = None
        for i, block in enumerate(self.layers):
            if layer == i:
                picked = h
            attn, mlp = block.self_attn, block.mlp
            x = _rms(h, block.input_layernorm)
            q, k, v = _projections(attn, ("q_proj", "k_proj", "v_proj"), "qkv_proj", x)
            q = q.view(b, n, -1, attn.head_dim).transpose(1, 2)
            k = k.view(b, n, -1, attn.head_dim).transpose(1, 2)
            v = v.view(b, n, -1, attn.head_dim).transpose(1, 2)
            q = (q * cos) + (_rotate_half(q) * sin)
            k = (k * cos) + (_rotate_half(k) * sin)
            k, v = cache.layers[i].update(k, v)
            out, _ = self.attention(attn, q, k, v, mask, dropout=0.0, scaling=attn.scaling, sliding_window=None)
            h = h + attn.o_proj(out.reshape(b, n, -1).contiguous())
            x = _rms(h, block.post_attention_layernorm)
            gate, up = _projections(mlp, ("gate_proj", "up_proj"), "gate_up_proj", x)
            h = h + mlp.down_proj(mlp.act_fn(gate) * up)
        final = _rms(h, dec.norm)
        if layer is None or layer >= len(self.layers):
            return final, final
        return final, picked
