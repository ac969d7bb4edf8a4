"""Grouped-query attention over several query rows without copying the KV cache (CPU).

Our forwards pass an explicit 4-D mask (a tree, or a prompt chunk after committed rows), and
Hugging Face's ``sdpa`` attention then meets grouped-query attention (GQA: ``H`` query heads
sharing ``H_kv`` key/value heads, ``n_rep = H / H_kv``) by ``repeat_kv``: every key and value
head is copied ``n_rep`` times before :func:`torch.nn.functional.scaled_dot_product_attention`,
i.e. the whole cache of every layer is copied at every forward of more than one row (one row is
already packed by ``transformers``, ``pack_gqa``). For the 0.5B draft (14 query heads over 2
key/value heads) at ~600 cached tokens that is ~4.5 MB a layer, 109 MB a forward, and the kernel
then reads each key/value head seven times.

:func:`packed_gqa_sdpa` does what ``pack_gqa`` does for one row, for any number: the ``n_rep``
query heads of a group become ``n_rep * q`` query rows of their key/value head, the mask
(shared by the heads) is tiled ``n_rep`` times along its rows, and the output is unpacked. Each
output row is the same softmax-weighted sum over the same keys and values, so the function is
``sdpa``'s (``tests/unit/models/test_attention.py`` compares them); the kernel may sum in another order for
another number of query rows, so values can differ by a rounding: the fp32 1.5B target's logits
were equal bit for bit at 8 and 16 rows over 600 cached tokens, the int8 draft's differed by
3.8e-6 at 2 rows (its drafts can change; outputs never do, the target verifies). Shapes::

    query [b, H, q, d] -> [b, H_kv, n_rep * q, d]    (row r * q + i: query head g * n_rep + r, row i)
    mask  [b, 1, q, kv] -> [b, 1, n_rep * q, kv]
    out   [b, H_kv, n_rep * q, d] -> [b, H, q, d] -> [b, q, H, d]

Worked example, ``H = 4``, ``H_kv = 2``, two rows ``x, y``: heads 0 and 1 read key/value head 0,
so the packed query of head 0 is ``[h0 x, h0 y, h1 x, h1 y]`` against one copy of its keys, with
mask rows ``[m_x, m_y, m_x, m_y]``.

Measured (Zen 3, 2 threads, ``benchmarks/RESULTS.md``, *Grouped-query attention without the
copies*): a forward of the int8 0.5B draft at ~600 cached tokens 11-12% cheaper at 2 rows and
6-24% at 8 (two runs); ``draft-tree`` on four held-out summarization and rag prompts drafted 14-22%
less (12.3 s instead of 14.3 s, 14.6 s instead of 18.6 s), ~3% of the whole generation, every
output unchanged. Used on the CPU only
(:func:`attention_implementation`): on an H100 the bf16 1.5B and 0.5B forwards are bound by
launching kernels (20-24 ms for 1 to 64 rows) and packed rows came out 0-7% slower, so a GPU
keeps ``sdpa`` (``tests/lossless/test_cuda.py`` checks the function there all the same).

Anything else (one row, no mask, a per-head mask, a position bias, no GQA) goes to ``sdpa`` as is.
The implementation is registered with ``transformers`` as :data:`PACKED_SDPA` (attention and mask
interfaces), so a model loaded with it also runs Hugging Face's own ``generate`` the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

PACKED_SDPA = "specgraft_sdpa"
"""The name the packed attention is registered under (``attn_implementation``)."""


def packed_gqa_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``transformers``' ``sdpa_attention_forward`` with multi-row GQA packed instead of copied
    (module docstring). ``query`` ``[b, H, q, d]``, ``key``/``value`` ``[b, H_kv, kv, d]``,
    ``attention_mask`` ``[b, 1, q, kv]`` (additive or boolean); returns ``([b, q, H, d], None)``."""
    n_rep = getattr(module, "num_key_value_groups", 1)
    b, heads, q, d = query.shape
    if (
        n_rep > 1 and q > 1 and attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[1] == 1
        and kwargs.get("position_bias") is None and kwargs.get("softcap") is None and key.shape[1] * n_rep == heads
    ):
        packed = query.reshape(b, heads // n_rep, n_rep * q, d)
        mask = attention_mask.expand(b, 1, q, attention_mask.shape[-1]).repeat(1, 1, n_rep, 1)
        out = F.scaled_dot_product_attention(packed, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)
        return out.reshape(b, heads, q, value.shape[-1]).transpose(1, 2).contiguous(), None
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs)


def register_packed_sdpa() -> str:
    """Register :func:`packed_gqa_sdpa` with ``transformers`` (attention and, as ``sdpa``'s, mask
    function) under :data:`PACKED_SDPA`; idempotent. Returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if PACKED_SDPA not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(PACKED_SDPA, packed_gqa_sdpa)
        AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)
    return PACKED_SDPA


def attention_implementation(device: torch.device) -> str:
    """The attention our loaders give a model on ``device``: :data:`PACKED_SDPA` on the CPU
    (registered on the way), ``sdpa`` elsewhere.

    >>> attention_implementation(torch.device("cuda")), attention_implementation(torch.device("cpu"))
    ('sdpa', 'specgraft_sdpa')
    """
    return register_packed_sdpa() if device.type == "cpu" else "sdpa"
