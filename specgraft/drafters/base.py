"""The drafter interface: one small protocol, shared state on the drafter, per-sequence state apart.

A drafter sees the committed context and proposes a :class:`~specgraft.types.Draft` rooted at
the root token (the last context token); after every verify pass it may learn from the
:class:`~specgraft.types.StepResult`. Drafters never verify and never touch the target's cache.

**State.** A drafter object holds only what all sequences share and read: weights, a draft
model's adapter, a warmed-up successor matrix, prior copy rates. Everything that belongs to
one sequence (its context, the draft model's cache slot, a PTD pool, what it learned) lives
in the state object that :meth:`Drafter.begin` returns for that sequence; the engine keeps
it in its per-sequence :class:`~specgraft.engine.SequenceState` and passes it back to
``propose``/``observe``, and :meth:`Drafter.end` frees it. So one drafter can serve many
sequences at once (batched serving) and one user's text never reaches another's drafts.

**What is learned across requests** is an explicit choice (:class:`Learning`): by default
(``Learning.REQUEST``) a request starts from the shared state and nothing it learns flows
back; ``Learning.SHARED`` writes what each request learns into the shared state, so later
requests start from it (Token Recycling's matrix and PLD's copy rates keep improving, as in
their papers' single-user setting; the successor matrix then carries token transitions of one
request into the drafts of the next, so use it only where all requests come from one party).

A feature-level drafter (an EAGLE-style head) sets ``needs_hidden = True`` and reads
``StepResult.hidden``; one that wants the target's view of the prompt asks for it in
:meth:`Drafter.prefill_request` (top-k successors, hidden states). A drafter that can do
without it (its drafts get worse, never wrong) sets ``prefill_optional = True``: a batch that
decodes plainly then starts its sequences without it (``SpecEngine.start(speculative=False)``)
and ``begin`` gets a :class:`~specgraft.types.PrefillOutput` without those fields.

A drafter whose prefill request a forward can serve (hidden states, no top-k) and which can
propose its first tree without it sets ``deferred_prefill = True``: a short prompt then rides
in the first step's forward (``SpecEngine.start``), ``begin`` gets ``PrefillOutput(deferred=True)``
and the first ``observe`` gets the prompt's outputs as ``StepResult.prefill`` (AdaPLD: its
first tree anchors lexically at the most recent match, without reranking or branches).
"""

from __future__ import annotations

import enum
from typing import Any, ClassVar, Protocol, Sequence, runtime_checkable

from specgraft.config import GenerationConfig
from specgraft.types import Draft, PrefillOutput, PrefillRequest, StepResult


class Learning(str, enum.Enum):
    """Whether what a request learns (copy rates, successor rows) is kept for later requests."""

    REQUEST = "request"
    """Every request starts from the shared state; what it learns is dropped at its end (default)."""
    SHARED = "shared"
    """What a request learns is written to the shared state and seen by later requests (opt-in)."""


@runtime_checkable
class Drafter(Protocol):
    name: ClassVar[str]
    needs_hidden: ClassVar[bool]
    """Whether :meth:`observe` reads the target's hidden states (``StepResult.hidden``)."""
    hidden_layer: int | None
    """Which layer's hidden states it reads (None: the final layer's, after the final norm)."""
    prefill_optional: ClassVar[bool]
    """Its prefill request is optional work (Token Recycling's prompt top-k): a sequence expected
    to decode plainly starts without it (``SpecEngine.start(speculative=False)``)."""
    deferred_prefill: ClassVar[bool]
    """It can take the hidden states it asked of the prefill with the first step's forward, so a
    short prompt may ride in that forward (``SpecEngine.start``'s fused start)."""

    def prefill_request(self) -> PrefillRequest:
        """What :meth:`begin` wants from the target's prefill of the prompt."""

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> Any:
        """Start a sequence; return its state. ``prefill`` covers every prompt token but the last
        (the first root), as :meth:`prefill_request` asked; ``config`` is the generation's (its
        sampling config shapes sampled drafts)."""

    def propose(self, state: Any, context: Sequence[int], budget: int) -> Draft:
        """Candidates for the tokens after ``context[-1]`` (the root), at most ``budget`` nodes."""

    def propose_batch(self, states: Sequence[Any], contexts: Sequence[Sequence[int]], budgets: Sequence[int]) -> list[Draft]:
        """:meth:`propose` for several sequences, each draft the one it would get alone (a draft
        model drafts them all in one forward per layer)."""

    def pending_prefill(self, state: Any, context: Sequence[int]) -> int:
        """Tokens the next proposal would prefill apart before drafting (a draft model's catch-up:
        the prompt at its first proposal, or a long backlog); 0 for drafters without that cost."""

    def catch_up(self, state: Any) -> tuple[int, float]:
        """Tokens and seconds the last proposal spent on such a catch-up prefill: the engine
        counts them as the sequence's prefill, not as drafting."""

    def observe(self, state: Any, step: StepResult) -> None:
        """Learn from a verify pass (accepted and rejected nodes, target logits)."""

    def end(self, state: Any) -> None:
        """The sequence is over: free what its state holds (a cache slot), keep what is shared."""


class StatelessDrafter:
    """Defaults for drafters with nothing to ask of the prefill, nothing to free, no batched
    drafting and no catch-up prefill."""

    needs_hidden: ClassVar[bool] = False
    hidden_layer: int | None = None
    prefill_optional: ClassVar[bool] = False
    deferred_prefill: ClassVar[bool] = False

    def prefill_request(self) -> PrefillRequest:
        return PrefillRequest()

    def propose_batch(self, states: Sequence[Any], contexts: Sequence[Sequence[int]], budgets: Sequence[int]) -> list[Draft]:
        return [self.propose(s, c, n) for s, c, n in zip(states, contexts, budgets, strict=True)]  # type: ignore[attr-defined]

    def pending_prefill(self, state: Any, context: Sequence[int]) -> int:
        return 0

    def catch_up(self, state: Any) -> tuple[int, float]:
        return 0, 0.0

    def end(self, state: Any) -> None:
        pass


def propose_all(drafter: Drafter, states: Sequence[Any], contexts: Sequence[Sequence[int]], budgets: Sequence[int]) -> list[Draft]:
    """``drafter.propose`` for one sequence, ``propose_batch`` for several (a draft model drafts
    for all of them in one forward per layer). Each sequence's draft is the one it would get alone."""
    if len(states) > 1:
        return list(drafter.propose_batch(states, contexts, budgets))
    return [drafter.propose(s, c, n) for s, c, n in zip(states, contexts, budgets, strict=True)]
