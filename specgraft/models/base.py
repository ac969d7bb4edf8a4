"""The interface the engine and the draft-model drafter need from a model: :class:`HFTarget`'s.

A model serves many sequences, one cache slot each. Rows fed to a slot are *pending* until
:meth:`TargetModel.commit` keeps a chain of them (the accepted path) or :meth:`discard` drops
them; masks, positions and the cache are the adapter's business.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch

from specgraft.types import DraftTree, PrefillOutput, PrefillRequest, RowsOutput


class TargetModel(Protocol):
    vocab_size: int
    max_positions: int
    device: torch.device

    def allocate(self) -> int:
        """A new, empty slot for one sequence."""

    def release(self, slot: int) -> None:
        """Free ``slot``."""

    def length(self, slot: int) -> int:
        """Committed rows of ``slot``."""

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows per slot (an optimisation: the cache also grows on demand)."""

    def prefill(self, slot: int, tokens: Sequence[int], request: PrefillRequest = PrefillRequest()) -> PrefillOutput:
        """Commit ``tokens`` to ``slot`` (causal attention); return what ``request`` asks for."""

    # optional: ``batched_prefill`` (bool) and ``prefill_batch(slots, token_lists)``, several
    # prompts prefilled in one forward (``SpecEngine.start_many`` uses them when present)

    def forward_rows(
        self,
        slot: int,
        tokens: Sequence[int] | torch.Tensor,
        parent_rows: Sequence[int] | torch.Tensor,
        output_hidden: bool = False,
        hidden_layer: int | None = None,
    ) -> RowsOutput:
        """Feed pending rows, each the child of an earlier pending row (-1: of the committed prefix)."""

    def forward_tree(
        self, slot: int, root: int, tree: DraftTree, output_hidden: bool = False, hidden_layer: int | None = None
    ) -> RowsOutput:
        """Score the root (row 0) and every tree node (row ``i + 1``) in one pass."""

    def forward_batch(
        self,
        slots: Sequence[int],
        tokens: Sequence[Sequence[int] | torch.Tensor],
        parent_rows: Sequence[Sequence[int] | torch.Tensor],
        output_hidden: bool = False,
        hidden_layer: int | None = None,
        logits_from: Sequence[int] | None = None,
    ) -> list[RowsOutput]:
        """:meth:`forward_rows` for several slots (distinct, any order) in one forward; slot
        ``b``'s outputs start at its row ``logits_from[b]`` (default 0: every row's)."""

    def commit(self, slot: int, keep_rows: Sequence[int]) -> None:
        """Keep the pending rows ``keep_rows`` (a chain from the first pending row), drop the rest."""

    def discard(self, slot: int) -> None:
        """Drop the pending rows of ``slot``."""
