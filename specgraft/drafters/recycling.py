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

from specgraft.config import GenerationConfig
from specgraft.drafters.base import Learning, StatelessDrafter
from specgraft.tree.templates import FULL_ENVELOPE, RankTemplate, rank_template, scale_template  # noqa: F401  (rank_template: the doctests')
from specgraft.types import Draft, PrefillOutput, PrefillRequest, StepResult, reindex


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

    def fill(self, root: int, template: RankTemplate) -> np.ndarray:
        """``[T]`` token of every template node at ``root``, one gather per depth; ``-1`` where the
        parent's row is unknown or the parent itself is ``-1`` (node ``i`` stays template node ``i``).

        >>> m = SuccessorMatrix(4, k=2); m.table[3] = [1, 2]
        >>> m.fill(3, rank_template([2, 1], k=2)).tolist()
        [1, 2, -1]
        """
        toks = np.full(len(template), -1, dtype=np.int64)
        par = np.asarray(template.parents, dtype=np.int64)
        for depth, level in enumerate(template.levels):
            parent_tok = np.full(len(level), root, dtype=np.int64) if depth == 0 else toks[par[level]]
            valid = parent_tok >= 0
            out = np.full(len(level), -1, dtype=np.int64)
            out[valid] = self.table[parent_tok[valid], template.ranks[level][valid]]
            toks[level] = out
        return toks

    def fill_template(self, root: int, template: RankTemplate) -> tuple[list[int], list[int]]:
        """Tokens and parents of the template instantiated at ``root``, invalid nodes dropped
        (a node under an invalid one is invalid too, so what is left is a tree)."""
        toks = self.fill(root, template)
        keep = np.flatnonzero(toks >= 0).tolist()
        return toks[keep].tolist(), reindex(template.parents, keep)

    def copy(self) -> "SuccessorMatrix":
        other = SuccessorMatrix.__new__(SuccessorMatrix)
        other.k, other.table = self.k, self.table.copy()
        return other

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


@dataclass
class RecyclingState:
    """One sequence's successor matrix: a copy of the shared one (``Learning.REQUEST``) or the
    shared one itself (``Learning.SHARED``)."""

    matrix: SuccessorMatrix


class RecyclingDrafter(StatelessDrafter):
    """Token Recycling drafter (source ``recycling``).

    ``matrix`` (or an empty one) is the shared state: ``warm_up`` / ``SuccessorMatrix.load`` fill
    it before serving. By default every request drafts from its own copy, refreshed from its
    prompt and its verify passes (the paper's "keeps learning" within the request) and dropped
    at its end, so no request's text reaches another's drafts; ``learning=Learning.SHARED``
    keeps updating the shared matrix instead (one user, or a corpus of one party).
    """

    name: ClassVar[str] = "recycling"
    # the prompt's top-k rows only seed the matrix; a plainly decoding batch skips them
    prefill_optional: ClassVar[bool] = True

    def __init__(
        self,
        vocab_size: int,
        config: RecyclingConfig = RecyclingConfig(),
        matrix: SuccessorMatrix | None = None,
        learning: Learning = Learning.REQUEST,
    ):
        self.config = config
        self.learning = Learning(learning)
        self.matrix = matrix if matrix is not None else SuccessorMatrix(vocab_size, config.k)
        if self.matrix.k != config.k:
            raise ValueError(f"matrix has k={self.matrix.k} but the config asks for k={config.k}")
        self._templates: dict[int, RankTemplate] = {}

    def template(self, budget: int) -> RankTemplate:
        if budget not in self._templates:
            self._templates[budget] = scale_template(self.config.envelope, budget, self.config.k)
        return self._templates[budget]

    def prefill_request(self) -> PrefillRequest:
        return PrefillRequest(topk=self.config.k)

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> RecyclingState:
        matrix = self.matrix if self.learning is Learning.SHARED else self.matrix.copy()
        if prefill.topk is not None and len(prefill.topk):
            matrix.update_rows(list(prompt[: len(prefill.topk)]), prefill.topk.numpy())
        return RecyclingState(matrix)

    def propose(self, state: RecyclingState, context: Sequence[int], budget: int) -> Draft:
        tokens, parents = state.matrix.fill_template(int(context[-1]), self.template(budget))
        return Draft(source=self.name, tokens=tokens, parents=parents)

    def observe(self, state: RecyclingState, step: StepResult) -> None:
        state.matrix.update_from_logits([step.root_token, *step.tree.tokens], step.logits)
