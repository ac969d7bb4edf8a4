"""Prompt lookup (PLD) as a tree: copy what followed earlier occurrences of the trailing n-gram.

Over the committed context (prompt + output so far), find earlier positions where the last
``n`` tokens occurred, for ``n`` from ``max_ngram`` down to ``min_ngram``, and copy up to
``max_copy`` tokens that followed each. Unlike a single-chain PLD, every distinct continuation
becomes a branch, so when earlier matches continue differently both are verified. Nodes are
scored by how many matches support them, weighted by the match length ``n`` (longer matches are
more reliable) and slightly by recency, and the best ``budget`` nodes are kept.

Example with ``context = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]``, ``max_ngram = 2``: the tail
``[1, 2]`` occurs at positions 0 and 4; they continue ``[3, 9, 1, ...]`` and ``[4, 7, 1, ...]``,
so the draft has two branches, ``3 -> 9 -> 1 ...`` and ``4 -> 7 -> 1 ...``, the more recent
(``4``) scored first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np
import torch

from specgraft.types import Draft, StepResult


@dataclass(frozen=True)
class PLDConfig:
    max_ngram: int = 3
    """Longest trailing n-gram to look up."""
    min_ngram: int = 1
    """Shortest trailing n-gram to fall back to."""
    max_copy: int = 10
    """Tokens copied after a match (HF's prompt_lookup_num_tokens is 10 too)."""
    max_matches: int = 8
    """Earlier matches used as branches, most recent first."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.max_copy < 1 or self.max_matches < 1:
            raise ValueError("max_copy and max_matches must be >= 1")


def find_matches(context: np.ndarray, n: int) -> np.ndarray:
    """Start indices ``i`` (most recent first) with ``context[i:i+n] == context[-n:]``, ``i + n < len``.

    >>> find_matches(np.array([1, 2, 3, 1, 2]), 2).tolist()
    [0]
    """
    length = len(context)
    if length <= n:
        return np.empty(0, dtype=np.int64)
    tail = context[-n:]
    # candidate starts 0 .. length - n - 1 (the tail itself is excluded)
    ok = context[: length - n] == tail[0]
    for j in range(1, n):
        ok &= context[j : length - n + j] == tail[j]
    return np.flatnonzero(ok)[::-1]


class PLDDrafter:
    """Tree prompt-lookup drafter (source ``pld``)."""

    name: ClassVar[str] = "pld"
    needs_hidden: ClassVar[bool] = False

    def __init__(self, config: PLDConfig = PLDConfig()):
        self.config = config
        self._context = np.empty(0, dtype=np.int64)

    def prefill_topk_k(self) -> int:
        return 0

    def begin(self, prompt: Sequence[int], prefill_topk: torch.Tensor | None) -> None:
        self._context = np.asarray(prompt, dtype=np.int64)

    def _sync(self, context: Sequence[int]) -> np.ndarray:
        # the engine's context only grows by appending; convert only the new tail
        if len(context) < len(self._context) or (len(self._context) and context[len(self._context) - 1] != self._context[-1]):
            self._context = np.asarray(context, dtype=np.int64)
        elif len(context) > len(self._context):
            self._context = np.concatenate([self._context, np.asarray(context[len(self._context):], dtype=np.int64)])
        return self._context

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        ctx = self._sync(context)
        cfg = self.config
        length = len(ctx)
        starts: list[tuple[int, int]] = []  # (end of match, n)
        seen: set[int] = set()
        for n in range(cfg.max_ngram, cfg.min_ngram - 1, -1):
            for i in find_matches(ctx, n)[: cfg.max_matches]:
                end = int(i) + n
                if end not in seen:
                    seen.add(end)
                    starts.append((end, n))
            if len(starts) >= cfg.max_matches:
                break
        if not starts:
            return Draft(source=self.name, tokens=[], parents=[])
        # trie of continuations: (parent node, token) -> node
        index: dict[tuple[int, int], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        for rank, (end, n) in enumerate(starts[: cfg.max_matches]):
            weight = n + 1e-3 * (cfg.max_matches - rank)
            parent = -1
            for tok in ctx[end : min(end + cfg.max_copy, length)].tolist():
                key = (parent, tok)
                node = index.get(key)
                if node is None:
                    node = len(tokens)
                    index[key] = node
                    tokens.append(tok)
                    parents.append(parent)
                    scores.append(0.0)
                scores[node] += weight
                parent = node
        # a child never outscores its parent (its support is a subset), so best-first by score
        # in merge_drafts admits the best-supported branches first
        return Draft(source=self.name, tokens=tokens, parents=parents, scores=scores)

    def observe(self, step: StepResult) -> None:
        pass
