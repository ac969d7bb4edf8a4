"""Budget policies: what each sequence of a batch verifies at each step.

The batch engine (:mod:`specgraft.batch.engine`) asks its policy for a :class:`StepPlan` every
step and reports what the step did back to it (:class:`BudgetPolicy`). :class:`FixedBudget` lets
every sequence verify its own budget (single-sequence behaviour); the adaptive policy that
chooses each batch size's budget from measured costs and acceptance is
:class:`~specgraft.budget.adaptive.AdaptiveBudget`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


@dataclass(frozen=True)
class StepPlan:
    """What one batched step verifies: a cap on every sequence's budget, and optionally one
    sequence that drafts while the rest decode plainly (a *probe*: warm-up or exploration).

    >>> StepPlan(cap=0, probe=8, split=True).probe
    8
    """

    cap: int | None
    """Every sequence's budget cap (0: plain decoding; None: each sequence's own budget)."""
    probe: int = 0
    """> 0 (with ``cap == 0``): one sequence drafts with this budget this step."""
    split: bool = False
    """Run the probing sequence in a forward of its own (cheaper than padding the whole batch to
    its tree when the cost table says so: ``BudgetPolicy.split_pays``)."""


class BudgetPolicy(Protocol):
    def plan(self, batch_size: int, budgets: Sequence[int], keys: Sequence[str] | None = None) -> StepPlan:
        """This step's plan for a batch whose sequences have ``budgets`` of their own (``keys``:
        the sequences' request ids, for a policy that tracks sequences apart)."""

    def speculating(self, batch_size: int, budget: int) -> bool:
        """Whether a sequence (own ``budget``) joining a batch of ``batch_size`` is expected to
        draft; if not it starts without its drafters' optional prefill work
        (``SpecEngine.start(speculative=False)``)."""

    def observe(self, batch_size: int, budget: int, tree_nodes: int, accepted: Sequence[int], draft_s: float, key: str | None = None) -> None:
        """One sequence's step: the budget its drafters had, the nodes they proposed, tree
        indices of the accepted nodes, the drafting time (``key``: the sequence's request id)."""

    def release(self, key: str) -> None:
        """The sequence ``key`` has left the batch."""

    def observe_forward(self, batch_size: int, rows: int, seconds: float) -> None:
        """One target forward of ``batch_size`` sequences x ``rows`` rows took ``seconds``."""

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        """A drafter prefilled ``tokens`` it had not cached (a draft model's catch-up) in ``seconds``."""

    def observe_step(self, batch_size: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A whole batched step: the batch emitted ``tokens`` in ``seconds`` of drafting, target
        forwards and verification (admissions and catch-ups left out); ``drafted`` when any of
        its sequences drafted."""

    def observe_optional_prefill(self, tokens: int, seconds: float) -> None:
        """A sequence started speculatively paid ``seconds`` for its drafters' optional prefill
        work over its ``tokens`` prompt tokens (Token Recycling's prompt top-k)."""

    def prefill_pays(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        """Whether a sequence joining a batch of ``batch_size`` that is expected to draft
        (:meth:`speculating`) should pay its drafters' optional prefill work over ``tokens``
        prompt tokens, with ``remaining`` tokens to generate; if not it starts plainly."""

    def pays_back(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        """Whether a sequence with ``remaining`` tokens to generate should draft at ``budget``
        although its drafters must first prefill ``tokens`` they have not cached."""

    def split_pays(self, batch_size: int, drafting: int, budget: int) -> bool:
        """Whether a step in which only ``drafting`` of ``batch_size`` sequences draft (at
        ``budget``) is cheaper as two forwards, those sequences apart from the plain ones,
        than as one forward padding every sequence to their trees."""


class FixedBudget:
    """Every sequence verifies its own budget (no cost model): single-sequence behaviour."""

    def plan(self, batch_size: int, budgets: Sequence[int], keys: Sequence[str] | None = None) -> StepPlan:
        return StepPlan(cap=None)

    def speculating(self, batch_size: int, budget: int) -> bool:
        return True

    def observe(self, batch_size: int, budget: int, tree_nodes: int, accepted: Sequence[int], draft_s: float, key: str | None = None) -> None:
        pass

    def release(self, key: str) -> None:
        pass

    def observe_forward(self, batch_size: int, rows: int, seconds: float) -> None:
        pass

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        pass

    def observe_step(self, batch_size: int, drafted: bool, tokens: int, seconds: float) -> None:
        pass

    def observe_optional_prefill(self, tokens: int, seconds: float) -> None:
        pass

    def prefill_pays(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        return True

    def pays_back(self, batch_size: int, budget: int, tokens: int, remaining: int) -> bool:
        return True

    def split_pays(self, batch_size: int, drafting: int, budget: int) -> bool:
        return False


class TunedBudget(FixedBudget):
    """Each batch size's budget from a table tuned offline (``specgraft tune --batch-size``: the
    paper's shape per batch size), as a cap on every sequence's own budget; 0 = plain decoding.
    A batch size the table lacks takes the budget of the largest tuned size below it (the
    smallest tuned size for one below them all). Nothing is learned online: the adaptive policy
    (:class:`~specgraft.budget.adaptive.AdaptiveBudget`) is the one that does.

    >>> policy = TunedBudget({1: 12, 4: 3, 8: 0})
    >>> [policy.plan(b, [16] * b).cap for b in (1, 2, 4, 6, 8, 16)]
    [12, 12, 3, 3, 0, 0]
    >>> policy.speculating(8, 16), policy.speculating(2, 16)
    (False, True)
    """

    def __init__(self, budgets: dict[int, int]):
        if not budgets or any(b < 1 or n < 0 for b, n in budgets.items()):
            raise ValueError(f"a tuned budget table needs batch sizes >= 1 and budgets >= 0, got {budgets}")
        self.budgets = dict(sorted(budgets.items()))

    def cap(self, batch_size: int) -> int:
        below = [b for b in self.budgets if b <= batch_size]
        return self.budgets[below[-1] if below else next(iter(self.budgets))]

    def plan(self, batch_size: int, budgets: Sequence[int], keys: Sequence[str] | None = None) -> StepPlan:
        return StepPlan(cap=self.cap(batch_size))

    def speculating(self, batch_size: int, budget: int) -> bool:
        return self.cap(batch_size) > 0 and budget > 0

    def __repr__(self) -> str:
        return f"TunedBudget({self.budgets})"
