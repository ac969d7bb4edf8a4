"""Static, unbalanced rank-path templates (Token Recycling; Graft Appendix A.1, Table 7).

A template node is a path of successor ranks ``[r1, ..., rd]``: its token is
``M[token(parent), rd]`` for a ``[vocab, k]`` successor matrix ``M``. Higher ranks get more
children and a deeper chain. Graft's Table 7 gives only the number of nodes per depth; which
rank paths fill a depth is our choice, made greedily by a prior acceptance score: a path scores
``prod(w[r] for r in path)`` with ``w[r] = 1 / (r + 1) ** 1.5`` (rank 0 clearly first, a long
flat tail, as acceptance by rank behaves), and depth ``d`` takes its ``counts[d]`` best children
of the nodes kept at depth ``d - 1``. The rank-0 chain therefore always reaches the full depth.

Example with ``k = 3`` and ``counts = [3, 2, 1]``::

    >>> t = rank_template([3, 2, 1], k=3)
    >>> t.rank_paths
    [(0,), (1,), (2,), (0, 0), (0, 1), (0, 0, 0)]
    >>> t.parents
    [-1, -1, -1, 0, 0, 3]
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

#: Graft Table 7, "full envelope": nodes per depth, 80 in all, depth 9.
FULL_ENVELOPE = (8, 16, 14, 11, 8, 7, 6, 5, 5)
#: Graft Table 7 stage templates (retrieved nodes per depth) for pruning at d0 / d1 / d5.
STAGE_TEMPLATES = {
    "d0": (8, 10, 8, 6, 5, 4, 4, 4, 3),
    "d1": (6, 7, 5, 4, 4, 3, 3, 2, 2),
    "d5": (4, 3, 3, 2, 2, 2, 2, 1, 1),
}


@dataclass(frozen=True)
class RankTemplate:
    rank_paths: list[tuple[int, ...]]
    # [N] parent node index (-1 = root)
    parents: list[int]
    # [N] successor rank of each node under its parent
    ranks: np.ndarray
    # node indices grouped by depth (depth 1 first); parents always lie in the previous group
    levels: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.rank_paths)

    def depth_counts(self) -> list[int]:
        return [len(level) for level in self.levels]


def _weight(rank: int) -> float:
    return 1.0 / (rank + 1) ** 1.5


def rank_template(counts: tuple[int, ...] | list[int], k: int = 8) -> RankTemplate:
    """Build a template with ``counts[d]`` nodes at depth ``d + 1`` from successor ranks ``< k``."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    paths: list[tuple[int, ...]] = []
    scores: list[float] = []
    parents: list[int] = []
    levels: list[np.ndarray] = []
    frontier = [-1]  # node indices of the previous depth (-1 = root)
    for count in counts:
        cands = []
        for p in frontier:
            base = scores[p] if p >= 0 else 1.0
            prefix = paths[p] if p >= 0 else ()
            for r in range(k):
                cands.append((-base * _weight(r), prefix + (r,), p))
        chosen = heapq.nsmallest(min(count, len(cands)), cands)
        # keep BFS order stable: by parent, then rank
        chosen.sort(key=lambda c: (c[2], c[1][-1]))
        level = []
        for neg, path, p in chosen:
            level.append(len(paths))
            paths.append(path)
            scores.append(-neg)
            parents.append(p)
        if not level:
            break
        levels.append(np.array(level, dtype=np.int64))
        frontier = level
    ranks = np.array([p[-1] for p in paths], dtype=np.int64)
    return RankTemplate(rank_paths=paths, parents=parents, ranks=ranks, levels=levels)


def scale_counts(counts: tuple[int, ...], budget: int) -> list[int]:
    """Scale per-depth counts to ``budget`` nodes, keeping the depth profile.

    Every depth keeps at least one node while the budget allows, so the rank-0 chain stays
    deep; the remaining slots go to depths in proportion to ``counts`` (largest remainder).

    >>> scale_counts(FULL_ENVELOPE, 20)
    [2, 3, 3, 2, 2, 2, 2, 2, 2]
    """
    total = sum(counts)
    if budget >= total:
        return list(counts)
    depth = min(len(counts), budget)
    base = [1] * depth
    spare = budget - depth
    weights = np.array([c - 1 for c in counts[:depth]], dtype=float)
    if spare > 0 and weights.sum() > 0:
        raw = weights / weights.sum() * spare
        extra = np.floor(raw).astype(int)
        order = np.argsort(-(raw - extra), kind="stable")
        for i in order[: spare - int(extra.sum())]:
            extra[i] += 1
        base = [b + int(e) for b, e in zip(base, extra, strict=True)]
    return base
