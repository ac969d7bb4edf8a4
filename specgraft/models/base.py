"""The interface the engine needs from a target model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from specgraft.types import DraftTree


@dataclass
class TreeOutput:
    """Result of one verify pass over ``[root, node 0, ..., node N-1]``."""

    # [N + 1, V] float32
    logits: torch.Tensor
    # [N + 1, H] or None: final-layer hidden states (after the final norm), when asked for
    hidden: torch.Tensor | None = None


class TargetModel(Protocol):
    vocab_size: int
    max_positions: int
    past_len: int

    def reset(self) -> None:
        """Forget the cached sequence."""

    def prefill(self, tokens: Sequence[int], topk: int = 0) -> torch.Tensor | None:
        """Cache ``tokens``; return [len(tokens), topk] successor ids when ``topk > 0``."""

    def forward_tree(self, root: int, tree: DraftTree, output_hidden: bool = False) -> TreeOutput:
        """Score the root and every tree node in one pass; their KV rows are appended."""

    def commit(self, keep_rows: Sequence[int]) -> None:
        """Keep the KV rows of ``keep_rows`` (0 = root) of the last pass, drop the others."""
