"""The answer of every retrieval structure to "what follows this key?".

Both the short-term trie and the long-term datastore return a :class:`Continuations`, so the
search that merges them (:mod:`specgraft.retrieval.search`) treats them alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Continuations"]


@dataclass(frozen=True)
class Continuations:
    """Tokens seen after the longest matched suffix of a key, most frequent first.

    The arrays may be shared with a structure's cache (and then read-only): copy before editing.

    Example: in the stream ``[1, 2, 3, 1, 2, 4, 1, 2, 3]`` the key ``[1, 2]`` is followed by
    ``3`` once and ``4`` once before the stream's end, so ``tokens = [3, 4]``,
    ``counts = [1, 1]`` (ties by token id) and ``matched = 2``.
    """

    tokens: np.ndarray
    """``# [n] int64``: continuation token ids, by count descending, ties by token id ascending."""
    counts: np.ndarray
    """``# [n] int64``: how often each token followed the matched key (for a datastore range
    larger than its sampling cap: the count in the evenly spaced sample scaled to the range)."""
    matched: int
    """Length of the suffix of the key that was matched (0: nothing matched, ``tokens`` empty)."""

    def __post_init__(self) -> None:
        assert self.tokens.shape == self.counts.shape, f"{self.tokens.shape} tokens vs {self.counts.shape} counts"
        assert (self.matched == 0) == (len(self.tokens) == 0), f"matched={self.matched} with {len(self.tokens)} tokens"

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def empty(cls) -> "Continuations":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), 0)

