"""Derive everything a verify pass needs from ``parents`` alone.

Rows of a verify pass are ``[root, node 0, node 1, ...]``; row ``i + 1`` is node ``i``.

Example, the 2x2 tree ``parents = [-1, -1, 0, 0]`` (two children of the root, node 0 has two
children)::

    >>> lay = tree_layout([-1, -1, 0, 0])
    >>> lay.depth.tolist()          # of rows: root, n0, n1, n2, n3
    [0, 1, 1, 2, 2]
    >>> lay.ancestor_mask.int().tolist()
    [[1, 0, 0, 0, 0],
     [1, 1, 0, 0, 0],
     [1, 0, 1, 0, 0],
     [1, 1, 0, 1, 0],
     [1, 1, 0, 0, 1]]
    >>> lay.paths                   # root-to-leaf node indices
    [[1], [0, 2], [0, 3]]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class TreeLayout:
    # [N + 1, N + 1] bool: row r may attend to column c (its ancestors and itself; root = row 0)
    ancestor_mask: torch.Tensor
    # [N + 1] long: distance from the root, 0 for the root
    depth: torch.Tensor
    # root-to-leaf node index lists (node indices, root excluded), in node order of their leaves
    paths: list[list[int]]

    def position_ids(self, past_len: int) -> torch.Tensor:
        """[N + 1] absolute positions: the root sits at ``past_len``, a node at ``past_len + depth``."""
        return self.depth + past_len


def tree_layout(parents: Sequence[int]) -> TreeLayout:
    n = len(parents)
    # [N + 1, N + 1]
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[0, 0] = True
    # [N + 1]
    depth = torch.zeros(n + 1, dtype=torch.long)
    is_leaf = [True] * n
    for i, p in enumerate(parents):
        assert -1 <= p < i, f"node {i} has parent {p}; parents must come before children"
        row = i + 1
        mask[row] = mask[p + 1]
        mask[row, row] = True
        depth[row] = depth[p + 1] + 1
        if p >= 0:
            is_leaf[p] = False
    paths = []
    for leaf in range(n):
        if is_leaf[leaf]:
            path = []
            node = leaf
            while node >= 0:
                path.append(node)
                node = parents[node]
            paths.append(path[::-1])
    return TreeLayout(ancestor_mask=mask, depth=depth, paths=paths)


def depth_from_mask(ancestor_mask: torch.Tensor) -> torch.Tensor:
    """EAGLE's identity: a row's depth is the number of ancestors it sees minus one."""
    return ancestor_mask.sum(dim=1) - 1
