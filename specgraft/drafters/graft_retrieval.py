"""Graft's retrieval source (source ``retrieval``): the root-centred envelope from a successor matrix.

Token Recycling's matrix and updates (prefill rows, every verified node's top-k), proposing the
whole root-centred envelope of the step's :class:`~specgraft.composers.graft.BudgetPlan` (given
through :class:`EnvelopePlan`, so drafters import no composer); the
:class:`~specgraft.composers.graft.GraftComposer` takes the part the pruning stage needs and
decides the verification rule from every part some stage would offer.

Example, ``budget = 8``: the plan's envelope (a rank template, ``tree/templates.py``) is
filled at the root token from the sequence's matrix; nodes under an unknown row are dropped,
and ``template_nodes`` records which envelope node each kept node is::

    env = retrieval.propose(state, context, 8)
    env.template_nodes     # e.g. [0, 1, 2, 4]: node 3's row was unknown
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Protocol, Sequence

import numpy as np

from specgraft.drafters.base import Learning
from specgraft.drafters.recycling import RecyclingConfig, RecyclingDrafter, RecyclingState, SuccessorMatrix
from specgraft.tree.templates import RankTemplate
from specgraft.types import Draft, reindex


class EnvelopePlan(Protocol):
    """What retrieval needs of Graft's budget plan (``composers.graft.StagePlanner`` is one)."""

    @property
    def k(self) -> int:
        """Successors per token the templates use."""

    def envelope(self, budget: int) -> RankTemplate:
        """The root-centred envelope template of ``budget``."""


@dataclass
class EnvelopeDraft(Draft):
    """The filled retrieval envelope; ``template_nodes[i]`` is node ``i``'s envelope template node."""

    PER_NODE: ClassVar[tuple[str, ...]] = (*Draft.PER_NODE, "template_nodes")

    template_nodes: list[int] = field(default_factory=list)
    budget: int = 0
    """The budget whose plan's envelope this is (the composer must use the same)."""
    matrix: SuccessorMatrix | None = field(default=None, repr=False)
    """The sequence's successor matrix (``graft-tail`` fills its template from it)."""


class GraftRetrieval(RecyclingDrafter):
    """Token Recycling's matrix proposing the whole envelope of the step's budget plan.

    The envelope can hold more than ``budget`` nodes: it is only meant for ``GraftComposer``.
    """

    name: ClassVar[str] = "retrieval"

    def __init__(
        self, vocab_size: int, planner: EnvelopePlan, matrix: SuccessorMatrix | None = None, learning: Learning = Learning.REQUEST
    ):
        super().__init__(vocab_size, RecyclingConfig(k=planner.k), matrix, learning)
        self.planner = planner

    def propose(self, state: RecyclingState, context: Sequence[int], budget: int) -> EnvelopeDraft:
        envelope = self.planner.envelope(budget)
        toks = state.matrix.fill(int(context[-1]), envelope)
        keep = np.flatnonzero(toks >= 0).tolist()
        return EnvelopeDraft(
            source=self.name,
            tokens=toks[keep].tolist(),
            parents=reindex(envelope.parents, keep),
            template_nodes=keep,
            budget=budget,
            matrix=state.matrix,
        )
