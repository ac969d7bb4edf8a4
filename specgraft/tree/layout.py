"""Derive everything a verify pass needs from ``parents`` alone: which rows each row sees, and depths.

Rows of a verify pass are ``[root, node 0, node 1, ...]``; row ``i + 1`` is node ``i``.
:func:`pending_ancestors` is what the adapter (``models/hf.py``) runs, on the device and
incrementally (rows added to rows already pending); :func:`tree_layout` is its plain twin, a
loop over the nodes, and ``tests/unit/tree/test_layout.py`` checks they agree.

Example, the 2x2 tree ``parents = [-1, -1, 0, 0]`` (two children of the root, node 0 has two
children)::

    >>> lay = tree_layout([-1, -1, 0, 0])
    >>> lay.depth.tolist()          # of rows: root, n0, n1, n2, n3
    [0, 1, 1, 2, 2]
    >>> lay.ancestor_mask.int().tolist()  # doctest: +NORMALIZE_WHITESPACE
    [[1, 0, 0, 0, 0],
     [1, 1, 0, 0, 0],
     [1, 0, 1, 0, 0],
     [1, 1, 0, 1, 0],
     [1, 1, 0, 0, 1]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass(frozen=True)
class TreeLayout:
    # [N + 1, N + 1] bool: row r may attend to column c (its ancestors and itself; root = row 0)
    ancestor_mask: torch.Tensor
    # [N + 1] long: distance from the root, 0 for the root (a row's position is length + depth)
    depth: torch.Tensor


def tree_layout(parents: Sequence[int]) -> TreeLayout:
    n = len(parents)
    # [N + 1, N + 1]
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[0, 0] = True
    # [N + 1]
    depth = torch.zeros(n + 1, dtype=torch.long)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i} has parent {p}; parents must come before children")
        row = i + 1
        mask[row] = mask[p + 1]
        mask[row, row] = True
        depth[row] = depth[p + 1] + 1
    return TreeLayout(ancestor_mask=mask, depth=depth)


def depth_from_mask(ancestor_mask: torch.Tensor) -> torch.Tensor:
    """EAGLE's identity: a row's depth is the number of ancestors it sees minus one."""
    return ancestor_mask.sum(dim=-1) - 1


def pending_ancestors(old: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """``[n, P + n]`` bool: which pending rows each new row sees (its ancestors and itself).

    ``old`` is ``[P, P]`` for the ``P`` rows already pending (closed: ancestors and self);
    ``parents[i]`` is the pending row (old ``0 .. P-1`` or new ``P .. P + i - 1``) that new row
    ``P + i`` hangs from, -1 for none. Computed on ``old``'s device by pointer doubling
    (``ceil(log2 n) + 1`` boolean products), so no host sync is needed. A verify pass is the
    case ``P = 0`` with the root's parent -1 and node ``i``'s ``parents[i] + 1``:

    >>> seen = pending_ancestors(torch.zeros(0, 0, dtype=torch.bool), torch.tensor([-1, 0, 0, 1, 1]))
    >>> seen.int().tolist() == tree_layout([-1, -1, 0, 0]).ancestor_mask.int().tolist()
    True
    >>> pending_ancestors(torch.ones(1, 1, dtype=torch.bool), torch.tensor([0, 1, -1])).int().tolist()
    [[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 1]]

    Batched: ``old`` ``[B, P, P]`` and ``parents`` ``[B, n]`` (the same ``P`` for every member)
    give ``[B, n, P + n]``, member ``b`` what ``pending_ancestors(old[b], parents[b])`` gives, in
    the same number of operations as one (a batch's tree inputs, ``HFTarget._tree_inputs``). A
    member with fewer rows pads its parents with -1: a padding row sees only itself, and no real
    row sees it.

    >>> pending_ancestors(torch.zeros(2, 0, 0, dtype=torch.bool), torch.tensor([[-1, 0], [-1, -1]])).int().tolist()
    [[[1, 0], [1, 1]], [[1, 0], [0, 1]]]
    """
    if old.dim() == 2:
        return pending_ancestors(old[None], parents[None])[0]
    b, p, n = old.shape[0], old.shape[1], parents.shape[-1]
    total = p + n
    # [B, T, T] reflexive relation: old rows closed, new rows link to self and parent
    rel = torch.zeros(b, total, total, dtype=torch.float32, device=old.device)
    rel[:, :p, :p] = old.float()
    new = torch.arange(p, total, device=old.device)
    rel[:, new, new] = 1.0
    # a row without a parent links to itself again (no boolean-mask indexing: that would sync)
    members = torch.arange(b, device=old.device)[:, None]
    rel[members, new[None], torch.where(parents >= 0, parents, new[None])] = 1.0
    for _ in range(math.ceil(math.log2(n)) + 1 if n > 1 else 1):
        rel[:, p:] = ((rel[:, p:] @ rel) > 0).float()
    return rel[:, p:] > 0


def host_ancestors(parents: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """``[n, n]`` bool ancestor sets (ancestors and self) and ``[n]`` depths of rows whose
    ``parents[i]`` is an earlier row or -1, on the host: what :func:`pending_ancestors` computes
    on the device for ``P = 0``, for a verify pass whose parents the engine holds as a list
    (``HFTarget._host_tree_inputs``: one copy to the device instead of a dozen small launches).

    >>> seen, depth = host_ancestors([-1, 0, 0, 1, 1])
    >>> seen.astype(int).tolist() == tree_layout([-1, -1, 0, 0]).ancestor_mask.int().tolist(), depth.tolist()
    (True, [0, 1, 1, 2, 2])
    """
    n = len(parents)
    seen = np.zeros((n, n), dtype=bool)
    depth = np.zeros(n, dtype=np.int64)
    for i, p in enumerate(parents):
        if p >= 0:
            if p >= i:
                raise ValueError(f"row {i}'s parent {p} is not an earlier row")
            seen[i, : p + 1] = seen[p, : p + 1]
            depth[i] = depth[p] + 1
        seen[i, i] = True
    return seen, depth
