"""READER's SearchPath (Algorithm 3): one deep retrieval path from the trie and the datastores.

At each level the key is the last ``key_len`` tokens of the context plus the path so far; the
trie and every datastore answer with their continuations of the key's longest matched suffix; the
answers are merged, the top token is appended, and the search goes on until ``depth`` tokens or
until nothing matches.

Merging (``merge=``):

* ``"longest"`` (default): only the sources whose matched key is the longest take part; their
  counts are summed per token. A longer match is more specific evidence: with a plain sum a
  datastore's thousands of occurrences of a one-token key outvote the trie's two occurrences of
  the eight-token key that the current output is repeating. On held-out responses (see
  ``benchmarks/README.md``, "Retrieval datastores") it accepts more tokens per path than ``"sum"``.
* ``"sum"``: the paper's ``RankByFrequency(A ∪ B)``: counts summed per token over every source
  whatever its matched length.

Ties rank the smaller token id first, so a path is a pure function of its inputs.

Example: the trie saw ``1 2 3 4`` and ``1 2 3 5``, a datastore saw ``3 5`` once more::

    >>> from specgraft.retrieval.trie import TokenTrie
    >>> from specgraft.retrieval.datastore import Datastore
    >>> trie = TokenTrie(max_depth=4)
    >>> trie.extend([1, 2, 3, 4, 9, 1, 2, 3, 5, 9, 1, 2])
    >>> ds = Datastore.from_documents([[3, 5, 7]])
    >>> p = search_path([9, 1, 2], depth=4, trie=trie, datastores=[ds], key_len=3)
    >>> p.tokens, p.sources, p.matched     # after [1, 2, 3] the trie's 4 and 5 tie: smaller id
    ((3, 4, 9, 1), ('trie', 'trie', 'trie', 'trie'), (3, 3, 3, 3))
    >>> p.shares
    (1.0, 0.5, 1.0, 1.0)
    >>> # summed, the datastore's [3] -> 5 breaks the tie the trie's longer key left
    >>> search_path([9, 1, 2], depth=4, trie=trie, datastores=[ds], key_len=3, merge="sum").tokens[:2]
    (3, 5)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from specgraft.retrieval.continuations import Continuations

__all__ = ["ContinuationSource", "SearchPath", "search_path"]

MERGE_RULES = ("longest", "sum")


class ContinuationSource(Protocol):
    def next_tokens(self, key: Sequence[int]) -> Continuations: ...


@dataclass(frozen=True)
class SearchPath:
    """A retrieved chain of draft tokens, with where each came from and how sure it was."""

    tokens: tuple[int, ...]
    """The path ``t_1 .. t_k``, ``k <= depth``."""
    sources: tuple[str, ...]
    """Per token: ``"trie"`` or ``"datastore"``, the source that counted it most (the trie on a tie)."""
    shares: tuple[float, ...]
    """Per token: its merged count / all merged counts at its level, in (0, 1]; drafters use it
    as an estimate of the token's acceptance given its parent."""
    matched: tuple[int, ...]
    """Per token: the length of the key suffix its level was answered from."""

    def __len__(self) -> int:
        return len(self.tokens)


def search_path(
    context_suffix: Sequence[int],
    depth: int,
    trie: ContinuationSource | None = None,
    datastores: Sequence[ContinuationSource] = (),
    key_len: int = 8,
    merge: Literal["longest", "sum"] = "longest",
) -> SearchPath:
    """Algorithm 3: extend ``context_suffix`` greedily by the top merged continuation, ``depth``
    times at most. Works with the trie only (``datastores=()``) or datastores only (``trie=None``)."""
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    if key_len < 1:
        raise ValueError(f"key_len must be >= 1, got {key_len}")
    if merge not in MERGE_RULES:
        raise ValueError(f"merge must be one of {', '.join(MERGE_RULES)}, got {merge!r}")
    sources: list[tuple[str, ContinuationSource]] = [("trie", trie)] if trie is not None else []
    sources += [("datastore", ds) for ds in datastores]
    context = [int(t) for t in list(context_suffix)[-key_len:]]
    tokens: list[int] = []
    names: list[str] = []
    shares: list[float] = []
    matched: list[int] = []
    for _ in range(depth):
        key = context[-key_len:]
        answers = [(name, c) for name, src in sources if len(c := src.next_tokens(key))]
        if not answers:
            break
        longest = max(c.matched for _, c in answers)
        if merge == "longest":
            answers = [(name, c) for name, c in answers if c.matched == longest]
        token, name, share = _top(answers)
        tokens.append(token)
        names.append(name)
        shares.append(share)
        matched.append(longest)
        context.append(token)
    return SearchPath(tuple(tokens), tuple(names), tuple(shares), tuple(matched))


def _top(answers: list[tuple[str, Continuations]]) -> tuple[int, str, float]:
    """The top token of the summed counts (smaller id on a tie), the source that counted it most
    (the first on a tie), and its share of the summed counts."""
    if len(answers) == 1:
        name, c = answers[0]
        return int(c.tokens[0]), name, float(c.counts[0] / c.counts.sum())
    tokens, inverse = np.unique(np.concatenate([c.tokens for _, c in answers]), return_inverse=True)
    totals = np.bincount(inverse, weights=np.concatenate([c.counts for _, c in answers]).astype(np.float64))
    best = int(np.argmax(totals))  # first maximum: the smallest token id among equal totals
    token = int(tokens[best])
    per_source = [int(c.counts[c.tokens == token].sum()) for _, c in answers]
    name = answers[int(np.argmax(per_source))][0]
    return token, name, float(totals[best] / totals.sum())
