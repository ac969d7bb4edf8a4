"""Token paths, best paths and best-first subsets of trees given as ``parents`` lists (``-1`` = child of the root)."""

from __future__ import annotations

import heapq
from typing import Sequence

from specgraft.config import check_step_costs


def token_paths(tokens: Sequence[int], parents: Sequence[int]) -> list[tuple[int, ...]]:
    """The token path from the root to every node.

    >>> token_paths([5, 9, 6], [-1, 0, -1])
    [(5,), (5, 9), (6,)]
    """
    paths: list[tuple[int, ...]] = []
    for tok, p in zip(tokens, parents, strict=True):
        paths.append((paths[p] if p >= 0 else ()) + (int(tok),))
    return paths


def best_path(parents: Sequence[int], scores: Sequence[float] | None) -> list[int]:
    """Nodes from the root to a leaf, taking the best-scoring child each time (ties and
    ``scores=None``: the first child).

    >>> best_path([-1, -1, 0, 0], [0.5, 0.2, 0.1, 0.3])
    [0, 3]
    """
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    path: list[int] = []
    node = -1
    while children[node + 1]:
        kids = children[node + 1]
        node = max(kids, key=lambda c: (scores[c], -c)) if scores is not None else kids[0]
        path.append(node)
    return path


def best_first(parents: Sequence[int], scores: Sequence[float], n: int) -> list[int]:
    """Indices of the ``n`` best nodes by score, admitting a node only after its parent (ascending).

    >>> best_first([-1, -1, 0, 1], [-0.5, -1.2, -0.7, -1.3], 3)
    [0, 1, 2]
    """
    return sorted(best_first_order(parents, scores, n))


def best_first_order(parents: Sequence[int], scores: Sequence[float], n: int) -> list[int]:
    """:func:`best_first` in admission order: ``best_first(..., m)`` is the first ``m`` of it.

    >>> best_first_order([-1, -1, 0, 1], [-0.5, -1.2, -0.7, -1.3], 4)
    [0, 2, 1, 3]
    """
    children: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    heap = [(-scores[i], i) for i in children[0]]
    heapq.heapify(heap)
    kept: list[int] = []
    while heap and len(kept) < n:
        _, i = heapq.heappop(heap)
        kept.append(i)
        for c in children[i + 1]:
            heapq.heappush(heap, (-scores[c], c))
    return kept


def cost_aware_subset(
    parents: Sequence[int], probs: Sequence[float], n: int, row_cost: float, step_costs: Sequence[float] | None = None
) -> list[int]:
    """The best-first prefix of at most ``n`` nodes that maximises expected tokens per unit of cost.

    ``probs`` are estimated acceptance probabilities (a child's never above its parent's), so
    a step that verifies the first ``k`` nodes of the best-first order yields
    ``1 + sum(probs)`` tokens on average (the bonus token included), and costs
    ``1 + row_cost * k`` one-row steps when each verified row costs ``row_cost`` of one
    (:meth:`specgraft.budget.costs.CostTable.row_cost` fits it from measured forwards).
    A node pays only while its ``p`` beats ``row_cost`` times the tokens per cost reached so
    far, so a fixed probability cut (``min_prob``) becomes one that follows the device: with
    the 1.5B target on the 2-core CPU (``row_cost`` 0.067) nodes under ~0.07-0.2 are dropped (the
    cut rises with the tokens per cost the tree already promises), on a device whose extra rows
    are nearly free almost nothing is. Returns indices ascending, like :func:`best_first`.

    Three chained nodes ``0.9, 0.45, 0.1``: at ``row_cost = 0.1`` the third does not pay
    (``2.35 / 1.2 = 1.96`` before it, ``2.45 / 1.3 = 1.88`` with it); free rows keep it.

    >>> cost_aware_subset([-1, 0, 1], [0.9, 0.45, 0.1], 8, 0.1)
    [0, 1]
    >>> cost_aware_subset([-1, 0, 1], [0.9, 0.45, 0.1], 8, 0.0)
    [0, 1, 2]

    ``step_costs`` replaces the line by measured costs where they are not one
    (:meth:`specgraft.budget.costs.CostTable.step_costs`): ``step_costs[r - 1]`` is what a
    forward of ``r`` rows costs, in one-row forwards (extended along its last two entries). On
    llama.cpp's quantized CPU kernels (2 rows 1.38, 4 rows 1.42, 3 rows 1.60) one uncertain node
    does not pay where the line says it does, and three nodes cost what one does:

    >>> curve = (1.0, 1.38, 1.60, 1.42, 1.88)
    >>> cost_aware_subset([-1], [0.3], 8, 0.12), cost_aware_subset([-1], [0.3], 8, 0.12, curve)
    ([0], [])
    >>> cost_aware_subset([-1, 0, 1], [0.5, 0.3, 0.2], 8, 0.12, curve)
    [0, 1, 2]
    """
    if not row_cost >= 0.0:
        raise ValueError(f"row_cost must be >= 0, got {row_cost}")
    check_step_costs(step_costs)
    order = best_first_order(parents, probs, n)
    best_k, best, tokens = 0, 1.0, 1.0
    for k, i in enumerate(order, start=1):
        tokens += probs[i]
        value = tokens / (1.0 + row_cost * k if step_costs is None else _rows_cost(step_costs, k + 1))
        if value > best:
            best_k, best = k, value
    return sorted(order[:best_k])


def _rows_cost(step_costs: Sequence[float], rows: int) -> float:
    """``step_costs[rows - 1]`` relative to ``step_costs[0]``, extended along its last two entries.

    >>> _rows_cost((2.0, 3.0), 1), _rows_cost((2.0, 3.0), 4)
    (1.0, 2.5)
    """
    last = len(step_costs)
    cost = step_costs[rows - 1] if rows <= last else step_costs[-1] + (step_costs[-1] - step_costs[-2]) * (rows - last)
    return cost / step_costs[0]
