"""The interface the engine and the draft-model drafter need from a model: what
:class:`~specgraft.models.hf.HFTarget` and :class:`~specgraft.models.llamacpp.LlamaCppTarget` offer.

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
    name: str
    prefill_chunk: int
    """Rows per prefill forward (``SpecEngine.fused_head`` fuses a long prompt's last partial chunk)."""
    fill_outputs: bool
    """Whether ``forward_batch(fill_outputs=True)`` returns a fused start's prompt rows' hidden states."""
    batched_prefill: bool
    """Whether :meth:`prefill_batch` prefills several prompts in one forward (a GPU) or not."""
    cost_device: str
    """What its cost tables are filed under (``budget.costs.table_name``)."""
    threads: int
    """CPU threads its forwards run on."""
    dear_rows: bool
    """Whether each verified row past the first costs so much of a step (llama.cpp's quantized
    kernels: 2 rows 1.4x one, 16 rows 3.1x on a 2-core CPU) that prompt lookup should cut its
    trees by the cost table's measured cost of each row count by default
    (``MethodOptions.step_costs``)."""

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

    def prefill_batch(self, slots: Sequence[int], token_lists: Sequence[Sequence[int]]) -> None:
        """:meth:`prefill` of each list into its slot in one forward per chunk (used when
        :attr:`batched_prefill`; ``SpecEngine.start_many``)."""

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
        fill_outputs: bool = False,
    ) -> list[RowsOutput]:
        """:meth:`forward_rows` for several slots (distinct, any order) in one forward; slot
        ``b``'s outputs start at its row ``logits_from[b]`` (default 0: every row's);
        ``fill_outputs``: also the hidden states of the rows before it (:attr:`fill_outputs`)."""

    def commit(self, slot: int, keep_rows: Sequence[int]) -> None:
        """Keep the pending rows ``keep_rows`` (a chain from the first pending row), drop the rest."""

    def discard(self, slot: int) -> None:
        """Drop the pending rows of ``slot``."""


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a timer read after it measures the work, not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
