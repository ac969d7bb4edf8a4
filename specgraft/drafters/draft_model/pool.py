"""The drafted pool and how a step's tree is cut from it: :class:`ModelDraft`, the budget's best
nodes (:func:`keep_count`, :func:`trim`), and the copy guess that feeds extension forwards a chain
copied from the context (:func:`copy_guess`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from specgraft.drafters.pld import find_matches
from specgraft.tree.paths import best_first, cost_aware_subset
from specgraft.types import Draft
from specgraft.drafters.draft_model.config import COPY_MAX_NGRAM, DraftTreeConfig




def copy_guess(seq: np.ndarray, length: int, min_ngram: int = 2, max_ngram: int = COPY_MAX_NGRAM) -> list[int]:
    """Up to ``length`` tokens that followed the most recent earlier occurrence of ``seq``'s last
    ``n`` tokens, for the longest ``n`` from ``max_ngram`` down to ``min_ngram`` that occurs
    (``[]`` when none does): prompt lookup's guess, which a copy-ahead extension feeds to the
    draft model.

    >>> copy_guess(np.array([5, 1, 2, 3, 4, 9, 1, 2, 7, 8, 1, 2]), 3)
    [7, 8, 1]
    >>> copy_guess(np.array([5, 1, 2, 3, 4, 9, 1, 2, 7, 8, 4, 1, 2]), 3), copy_guess(np.array([1, 2, 3, 2]), 3)
    ([7, 8, 4], [])
    >>> copy_guess(np.array([1, 2, 3, 2]), 3, min_ngram=1)
    [3, 2]
    """
    if length <= 0:
        return []
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        found = find_matches(seq, n)
        if len(found):
            start = int(found[0]) + n
            return seq[start : start + length].tolist()
    return []


@dataclass
class ModelDraft(Draft):
    """A draft-model tree plus what Graft's composer needs to know about how drafting went."""

    stage: int | None = None
    """Index of the checkpoint whose gate failed (drafting stopped there); None = not pruned."""
    confidences: list[float] = field(default_factory=list)
    """``c_d`` of each checkpoint evaluated, in checkpoint order."""
    layer_sizes: list[int] = field(default_factory=list)
    """Nodes per depth before trimming to the budget (nodes are stored layer after layer)."""
    checkpoints: tuple[int, ...] = ()
    """The drafter's checkpoint depths (``stage`` indexes them)."""


def keep_count(draft: ModelDraft, budget: int, config: DraftTreeConfig) -> int:
    """How many nodes of ``draft`` a ``budget`` keeps (:func:`trim` keeps them): the budget, or,
    with ``config.tree_budget`` below it, ``tree_budget`` plus the confident nodes past it (path
    probability at least ``extend_min``), at most ``budget``; then, with ``config.row_cost``, the
    best-first prefix of those that maximises expected tokens per unit of cost
    (:func:`~specgraft.tree.paths.cost_aware_subset` with acceptance ``exp(S)``). Sampled drafts
    (no scores) keep ``tree_budget``: a count that never depends on the drawn values.

    >>> d = ModelDraft(source="draft", tokens=[5, 6, 7, 8], parents=[-1, 0, 1, -1], scores=[-0.1, -0.2, -0.5, -3.0])
    >>> [keep_count(d, b, DraftTreeConfig(tree_budget=2, extend_min=0.3)) for b in (1, 2, 3, 16)]
    [1, 2, 3, 3]
    >>> keep_count(d, 16, DraftTreeConfig()), keep_count(d, 16, DraftTreeConfig(tree_budget=2, extend_min=0.95))
    (16, 2)
    >>> [keep_count(d, 16, DraftTreeConfig(row_cost=r)) for r in (0.0, 0.05, 0.5)]
    [4, 3, 2]
    """
    n = budget
    tree = config.tree_budget
    if tree is not None and budget > tree:
        if draft.scores is None:
            return tree
        floor = math.log(config.extend_min) if config.extend_min > 0 else float("-inf")
        confident = sum(1 for s in draft.scores if s >= floor)
        n = min(budget, max(tree, confident))
    if config.row_cost is None or draft.scores is None:
        return n
    probs = [math.exp(s) for s in draft.scores]
    return len(cost_aware_subset(draft.parents, probs, min(n, len(probs)), config.row_cost))


def trim(draft: ModelDraft, n: int) -> ModelDraft:
    """Keep ``n`` nodes: the best by path score, or, for sampled drafts (no scores), the first ``n``.

    The second rule cuts every children list to a prefix whose length does not depend on the
    children's own values, which rejection sampling needs (module docstring).
    """
    if len(draft) <= n:
        return draft
    if draft.scores is None:
        return draft.subset(range(max(n, 0)))
    return draft.subset(best_first(draft.parents, draft.scores, n))


