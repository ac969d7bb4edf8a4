"""Commit a verify pass: keep the KV rows of the accepted path, contiguous, and drop the rest.

After a verify pass over ``[root, node 0, ..., node N-1]`` each attention layer of a
``transformers`` ``DynamicCache`` holds ``past_len + N + 1`` rows along the sequence axis
(``keys: [B, heads, past_len + N + 1, head_dim]``). Committing ``keep_rows`` (indices into the
verify pass, row 0 = root, row i + 1 = node i) leaves ``past_len + len(keep_rows)`` rows.

Example: ``past_len = 3``, the pass had rows ``[root, n0, n1, n2]`` and the path node 1 ->
node 2 was accepted: ``keep_rows = [0, 2, 3]`` leaves cache rows
``[0, 1, 2, 3 (root), 5 (n1), 6 (n2)]``, renumbered ``0..5``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


def _check_layers(cache: DynamicCache) -> None:
    for i, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            raise ValueError(
                f"cache layer {i} is a {type(layer).__name__}; tree speculation needs full-attention "
                "DynamicLayer caches (sliding-window, quantized and linear-attention layers cannot drop "
                "rejected rows)"
            )


@torch.inference_mode()
def commit_cache(cache: DynamicCache, past_len: int, keep_rows: Sequence[int]) -> None:
    """Keep rows ``past_len + keep_rows`` after the first ``past_len`` rows, in place.

    Fast path: when the kept rows are already ``0..m-1`` (a chain accepted from its start, the
    common case) this is a crop; otherwise the kept rows are copied down into place, then cropped.
    """
    _check_layers(cache)
    m = len(keep_rows)
    assert m >= 1 and keep_rows[0] == 0, f"the root row must be kept first, got {list(keep_rows)}"
    contiguous = all(r == i for i, r in enumerate(keep_rows))
    if not contiguous:
        # [m] absolute source rows; their targets past_len..past_len+m-1 never exceed them, and
        # index_select materialises the source before the copy, so overlap is safe.
        src = torch.tensor(keep_rows, dtype=torch.long, device=cache.layers[0].keys.device) + past_len
    for layer in cache.layers:
        if not contiguous:
            layer.keys[..., past_len : past_len + m, :] = layer.keys.index_select(-2, src)
            layer.values[..., past_len : past_len + m, :] = layer.values.index_select(-2, src)
        layer.keys = layer.keys[..., : past_len + m, :]
        layer.values = layer.values[..., : past_len + m, :]


@torch.inference_mode()
def commit_cache_reference(cache: DynamicCache, past_len: int, keep_rows: Sequence[int]) -> None:
    """Slow twin of :func:`commit_cache`: rebuild every layer by concatenating kept rows."""
    _check_layers(cache)
    for layer in cache.layers:
        prefix_k, prefix_v = layer.keys[..., :past_len, :], layer.values[..., :past_len, :]
        rows_k = [layer.keys[..., past_len + r : past_len + r + 1, :] for r in keep_rows]
        rows_v = [layer.values[..., past_len + r : past_len + r + 1, :] for r in keep_rows]
        layer.keys = torch.cat([prefix_k, *rows_k], dim=-2).clone()
        layer.values = torch.cat([prefix_v, *rows_v], dim=-2).clone()
