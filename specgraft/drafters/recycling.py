"""Token Recycling: a ``[vocab, k]`` successor matrix refreshed from the target's own logits.

Row ``M[t]`` holds the ``k`` most likely next tokens the target predicted the last time it
processed token ``t`` (in any context). After every verify pass, the row of every verified
node's token, accepted or rejected, is replaced by the top-k of the target's logits at that
node; the prefill fills rows for the prompt. Drafting fills a static unbalanced rank template
(``tree/templates.py``: Graft Table 7's full envelope, or its ``budget`` nodes of highest
prior acceptance below 80 nodes) rooted at the root
token, one gather per depth. Graft reuses this matrix as its retrieval source.

Example with ``k = 2`` after observing that the target follows 7 with (5, 3) and 5 with (9, 1)::

    M[7] = [5, 3];  M[5] = [9, 1]
    template rank paths (0,), (1,), (0, 0)  ->  tokens [5, 3, 9], parents [-1, -1, 0]

Rows never filled are ``-1``; template nodes hanging from such a row are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Sequence

import numpy as np
import torch

from specgraft.tree.templates import FULL_ENVELOPE, RankTemplate, scale_template
from specgraft.types import Draft, StepResult


@dataclass(frozen=True)
class RecyclingConfig:
    k: int = 8
    """Successors kept per token (columns of the matrix)."""
    envelope: tuple[int, ...] = FULL_ENVELOPE
    """Nodes per depth of the full template (Graft Table 7); below 80 nodes its ``budget`` most
    promising nodes are used (``tree/templates.py``, :func:`scale_template`)."""

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not self.envelope or min(self.envelope) < 1:
            raise ValueError(f"envelope needs >= 1 node per depth, got {self.envelope}")


class SuccessorMatrix:
    """The ``[vocab, k]`` table of top-k successor ids, with save/load to ``.npz``."""

    def __init__(self, vocab_size: int, k: int = 8):
        self.k = k
        # [V, k] int64; -1 = unknown
        self.table = np.full((vocab_size, k), -1, dtype=np.int64)

    @property
    def vocab_size(self) -> int:
        return self.table.shape[0]

    def update_rows(self, tokens: np.ndarray | Sequence[int], topk_ids: np.ndarray) -> None:
        """``M[tokens[i]] = topk_ids[i]``; for repeated tokens the last row wins."""
        self.table[np.asarray(tokens, dtype=np.int64)] = topk_ids[:, : self.k]

    def update_from_logits(self, tokens: Sequence[int], logits: torch.Tensor) -> None:
        # [len(tokens), k]
        top = logits.topk(self.k, dim=-1).indices.cpu().numpy()
        self.update_rows(tokens, top)

    def fill_template(self, root: int, template: RankTemplate) -> tuple[list[int], list[int]]:
        """Tokens and parents of the template instantiated at ``root``, invalid nodes dropped."""
        n = len(template)
        # [N] tokens, -1 = invalid (unknown row or invalid parent)
        toks = np.full(n, -1, dtype=np.int64)
        par = np.asarray(template.parents, dtype=np.int64)
        for depth, level in enumerate(template.levels):
            if depth == 0:
                parent_tok = np.full(len(level), root, dtype=np.int64)
            else:
                parent_tok = toks[par[level]]
            valid = parent_tok >= 0
            out = np.full(len(level), -1, dtype=np.int64)
            out[valid] = self.table[parent_tok[valid], template.ranks[level][valid]]
            toks[level] = out
        keep = np.flatnonzero(toks >= 0)
        new_index = np.full(n, -1, dtype=np.int64)
        new_index[keep] = np.arange(len(keep))
        parents = [int(new_index[par[i]]) if par[i] >= 0 else -1 for i in keep]
        return toks[keep].tolist(), parents

    def save(self, path: str | Path) -> None:
        np.savez_compressed(path, table=self.table, k=self.k)

    @classmethod
    def load(cls, path: str | Path, vocab_size: int | None = None) -> "SuccessorMatrix":
        path = Path(path)
        if not path.exists():
            raise ValueError(f"successor matrix file {str(path)!r} does not exist")
        with np.load(path) as data:
            table = data["table"]
            k = int(data["k"])
        if vocab_size is not None and table.shape[0] != vocab_size:
            raise ValueError(
                f"successor matrix {str(path)!r} has {table.shape[0]} rows but the model's vocabulary is {vocab_size}"
            )
        m = cls(table.shape[0], k)
        m.table = table.astype(np.int64)
        return m


class RecyclingDrafter:
    """Token Recycling drafter (source ``recycling``).

    The matrix persists across generations of one drafter (that is the point: it keeps
    learning), and ``warm_up`` / ``SuccessorMatrix.load`` can fill it before serving.
    """

    name: ClassVar[str] = "recycling"
    needs_hidden: ClassVar[bool] = False

    def __init__(self, vocab_size: int, config: RecyclingConfig = RecyclingConfig(), matrix: SuccessorMatrix | None = None):
        self.config = config
        self.matrix = matrix if matrix is not None else SuccessorMatrix(vocab_size, config.k)
        if self.matrix.k != config.k:
            raise ValueError(f"matrix has k={self.matrix.k} but the config asks for k={config.k}")
        self._templates: dict[int, RankTemplate] = {}

    def template(self, budget: int) -> RankTemplate:
        if budget not in self._templates:
            self._templates[budget] = scale_template(self.config.envelope, budget, self.config.k)
        return self._templates[budget]

    def prefill_topk_k(self) -> int:
        return self.config.k

    def begin(self, prompt: Sequence[int], prefill_topk: torch.Tensor | None) -> None:
        if prefill_topk is not None and len(prefill_topk):
            self.matrix.update_rows(list(prompt[: len(prefill_topk)]), prefill_topk.numpy())

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        tokens, parents = self.matrix.fill_template(int(context[-1]), self.template(budget))
        return Draft(source=self.name, tokens=tokens, parents=parents)

    def observe(self, step: StepResult) -> None:
        self.matrix.update_from_logits([step.root_token, *step.tree.tokens], step.logits)
