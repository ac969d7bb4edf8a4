"""The drafter interface: one small protocol, registered by name.

A drafter sees the committed context and proposes a :class:`~specgraft.types.Draft` rooted at
the root token (the last context token); after every verify pass it may learn from the
:class:`~specgraft.types.StepResult`. Drafters never verify and never touch the target's cache.
A feature-level drafter (an EAGLE-style head) sets ``needs_hidden = True`` and reads
``StepResult.hidden``.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Protocol, Sequence, runtime_checkable

import torch

from specgraft.types import Draft, StepResult


@runtime_checkable
class Drafter(Protocol):
    name: ClassVar[str]
    needs_hidden: ClassVar[bool]

    def begin(self, prompt: Sequence[int], prefill_topk: torch.Tensor | None) -> None:
        """Start a generation. ``prefill_topk`` ([len(prompt) - 1, k]) holds the target's top-k
        successors of every prompt token but the last, when ``prefill_topk_k() > 0``."""

    def prefill_topk_k(self) -> int:
        """How many successor ids per prompt position ``begin`` wants (0 = none)."""

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        """Candidates for the tokens after ``context[-1]`` (the root), at most ``budget`` nodes."""

    def observe(self, step: StepResult) -> None:
        """Learn from a verify pass (accepted and rejected nodes, target logits)."""


class NullDrafter:
    """Proposes nothing: the engine then runs plain autoregressive decoding (method ``ar``)."""

    name: ClassVar[str] = "ar"
    needs_hidden: ClassVar[bool] = False

    def begin(self, prompt: Sequence[int], prefill_topk: torch.Tensor | None) -> None:
        pass

    def prefill_topk_k(self) -> int:
        return 0

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        return Draft(source=self.name, tokens=[], parents=[])

    def observe(self, step: StepResult) -> None:
        pass


DrafterFactory = Callable[..., Drafter]
