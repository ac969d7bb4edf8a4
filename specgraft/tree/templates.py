"""Static, unbalanced rank-path templates (Token Recycling; Graft Appendix A.1, Table 7).

A template node is a path of successor ranks ``[r1, ..., rd]``: its token is
``M[token(parent), rd]`` for a ``[vocab, k]`` successor matrix ``M``. Higher ranks get more
children and a deeper chain. Graft's Table 7 gives only the number of nodes per depth; which
rank paths fill a depth is our choice, made greedily by a prior acceptance score: a path scores
``prod(w[r] for r in path)`` with ``w[r] = 1 / (r + 1) ** 1.5`` (rank 0 clearly first, a long
flat tail, as acceptance by rank behaves), and depth ``d`` takes its ``counts[d]`` best children
of the nodes kept at depth ``d - 1``. The rank-0 chain therefore always reaches the full depth.

Below its full size a template is scaled to a budget ``B`` by keeping its ``B`` most promising
nodes (:func:`scale_template`): a node's prior acceptance is ``prod(RANK_RATES[r])`` over its
path (measured rates), so a rank-0 chain grows while its next node beats the next sibling, and
a small budget gets the tree that is expected to accept the most tokens (a rank-0 chain of 8
nodes would spend most of its rows on tokens that are almost never reached).

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
from typing import Sequence

import numpy as np

from specgraft.types import reindex

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


#: Prior rate at which the rank-``r`` successor is the target's next token given its parent was.
#: Measured with Qwen2.5-Coder-1.5B on held-out Spec-Bench and HumanEval prompts (positions whose
#: row was filled, 511 in all): rank 0 / 1 / 2 / 3 were right 45% / 7.7% / 4.5% / 3.3% of the time,
#: ranks 4-7 about 1% each.
RANK_RATES = (0.45, 0.08, 0.045, 0.033, 0.01, 0.01, 0.01, 0.01)


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


def node_priors(template: RankTemplate, rates: tuple[float, ...] = RANK_RATES) -> np.ndarray:
    """``[N]`` prior acceptance of every node: ``prod(rates[r])`` over its rank path (ranks past
    the table take its last rate).

    >>> node_priors(rank_template([2, 1], k=2), rates=(0.5, 0.1)).round(3).tolist()
    [0.5, 0.1, 0.25]
    """
    return np.array([float(np.prod([rates[min(r, len(rates) - 1)] for r in path])) for path in template.rank_paths])


def scale_template(counts: tuple[int, ...] | list[int], budget: int, k: int = 8, rates: tuple[float, ...] = RANK_RATES) -> RankTemplate:
    """The ``budget`` nodes of ``rank_template(counts, k)`` with the highest prior acceptance.

    A child's prior is below its parent's, so the kept nodes always form a tree (ties go to the
    shallower, then the earlier node). At ``budget >= sum(counts)`` the template is whole.

    >>> t = scale_template(FULL_ENVELOPE, 4)
    >>> t.rank_paths, t.parents
    ([(0,), (1,), (0, 0), (0, 0, 0)], [-1, -1, 0, 2])
    >>> scale_template(FULL_ENVELOPE, 8).depth_counts()
    [3, 3, 1, 1]
    """
    if any(not 0.0 < r <= 1.0 for r in rates):
        raise ValueError(f"rank rates must lie in (0, 1], got {rates}")
    full = rank_template(counts, k)
    if budget >= len(full):
        return full
    if budget <= 0:
        return rank_template([], k)
    prior = node_priors(full, rates)
    order = sorted(range(len(full)), key=lambda i: (-prior[i], len(full.rank_paths[i]), i))
    keep = sorted(order[:budget], key=lambda i: (len(full.rank_paths[i]), i))
    return subtemplate(full, keep)


def subtemplate(template: RankTemplate, keep: list[int]) -> RankTemplate:
    """The nodes ``keep`` of ``template`` (closed under parents, in depth order), reindexed."""
    paths = [template.rank_paths[i] for i in keep]
    parents = reindex(template.parents, keep)
    depth = max((len(p) for p in paths), default=0)
    levels = [np.array([i for i, p in enumerate(paths) if len(p) == d], dtype=np.int64) for d in range(1, depth + 1)]
    ranks = np.array([p[-1] for p in paths], dtype=np.int64)
    return RankTemplate(rank_paths=paths, parents=parents, ranks=ranks, levels=levels)


def union_template(templates: Sequence[RankTemplate]) -> tuple[RankTemplate, list[np.ndarray]]:
    """One template holding every rank path of ``templates``, and where each template's nodes sit in it.

    >>> u, where = union_template([rank_template([2], k=2), rank_template([1, 1], k=2)])
    >>> u.rank_paths, [w.tolist() for w in where]
    ([(0,), (1,), (0, 0)], [[0, 1], [0, 2]])
    """
    paths = sorted({p for t in templates for p in t.rank_paths}, key=lambda p: (len(p), p))
    pos = {p: i for i, p in enumerate(paths)}
    parents = [pos[p[:-1]] if len(p) > 1 else -1 for p in paths]
    depth = max((len(p) for p in paths), default=0)
    levels = [np.array([i for i, p in enumerate(paths) if len(p) == d], dtype=np.int64) for d in range(1, depth + 1)]
    ranks = np.array([p[-1] for p in paths], dtype=np.int64)
    union = RankTemplate(rank_paths=paths, parents=parents, ranks=ranks, levels=levels)
    return union, [np.array([pos[p] for p in t.rank_paths], dtype=np.int64) for t in templates]
