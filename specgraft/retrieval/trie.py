"""Short-term retrieval: a trie of the n-grams of one growing token stream (READER 4.2).

The stream is the prompt, then every accepted token. After ``extend`` the trie holds every n-gram
(n <= ``max_depth``) of the stream, each node counting how often its n-gram occurred, so a node's
children rank what followed its n-gram by frequency.

Example (``max_depth=3``, stream ``[1, 2, 3, 1, 2, 4, 1, 2]``)::

    >>> trie = TokenTrie(max_depth=3)
    >>> trie.extend([1, 2, 3, 1, 2, 4, 1, 2])
    >>> c = trie.next_tokens([7, 1, 2])   # [7, 1, 2] is capped to [1, 2]: 2 tokens at depth 3
    >>> c.tokens.tolist(), c.counts.tolist(), c.matched
    ([3, 4], [1, 1], 2)
    >>> trie.next_tokens([9, 4]).tokens.tolist()   # [9, 4] never occurred: back off to [4]
    [1]
    >>> trie.next_tokens([9]).matched              # nothing to back off to
    0
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specgraft.retrieval.continuations import Continuations

__all__ = ["TokenTrie", "ngram_continuations"]


class TokenTrie:
    """A trie over one token stream; ``extend`` costs O(len(tokens) * max_depth), never a rebuild.

    ``next_tokens(key)`` answers from the longest suffix of ``key`` (at most ``max_depth - 1``
    tokens) that has a continuation in the stream: while the key has none, its first token is
    dropped (READER 4.2). A key never backs off to the empty key (that would rank every token of
    the stream by unigram frequency, which is no evidence about what follows).

    Nodes are integers: ``children[node]`` maps a token to the child node (None until the node
    has one) and ``counts[node]`` is how often the node's n-gram occurred. Dicts of ints are
    not tracked by Python's cyclic garbage collector, so a trie of millions of nodes does not
    slow every later allocation down, as one object per node would.
    """

    def __init__(self, max_depth: int) -> None:
        if max_depth < 2:
            raise ValueError(f"max_depth must be >= 2 (a key token and its continuation), got {max_depth}")
        self.max_depth = max_depth
        self.children: list[dict[int, int] | None] = [None]
        self.counts: list[int] = [0]
        self.stream: list[int] = []
        # nodes of the suffixes of the stream of length 0 .. max_depth - 1, by length: a new token
        # extends each of them by one
        self._active: list[int] = [0]
        self._ranked: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        """A node's children as ``(tokens, counts)`` ranked, cached until one of their counts changes."""

    def __len__(self) -> int:
        """Tokens in the stream."""
        return len(self.stream)

    @property
    def num_nodes(self) -> int:
        """Distinct n-grams (n <= max_depth) of the stream, plus the root."""
        return len(self.counts)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append ``tokens`` to the stream and insert every n-gram that ends at a new position."""
        if isinstance(tokens, np.ndarray):
            tokens = tokens.tolist()
        keep = self.max_depth - 1
        children, counts, ranked = self.children, self.counts, self._ranked
        active = self._active
        for t in tokens:
            t = int(t)
            grown = [0]
            for node in active:
                kids = children[node]
                if kids is None:
                    kids = children[node] = {}
                child = kids.get(t)
                if child is None:
                    child = kids[t] = len(counts)
                    children.append(None)
                    counts.append(0)
                counts[child] += 1
                grown.append(child)
                if ranked:
                    ranked.pop(node, None)
            # the child of the longest suffix is a max_depth-gram: it has no room for a continuation
            active = grown[: keep + 1]
        self.stream += [int(t) for t in tokens]
        self._active = active

    def _node(self, key: Sequence[int]) -> int | None:
        node = 0
        for t in key:
            kids = self.children[node]
            node = kids.get(t) if kids else None
            if node is None:
                return None
        return node

    def next_tokens(self, key: Sequence[int]) -> Continuations:
        """Continuations of the longest suffix of ``key`` (capped to ``max_depth - 1`` tokens) that
        was followed by some token in the stream; empty (``matched == 0``) when none was."""
        if isinstance(key, np.ndarray):
            key = key.tolist()
        key = list(key[len(key) - min(len(key), self.max_depth - 1) :])
        for start in range(len(key)):
            node = self._node(key[start:])
            if node is not None and self.children[node]:
                r = self._ranked.get(node)
                if r is None:
                    r = self._ranked[node] = self._rank(node)
                return Continuations(r[0], r[1], len(key) - start)
        return Continuations.empty()

    def _rank(self, node: int) -> tuple[np.ndarray, np.ndarray]:
        kids = self.children[node]
        assert kids, f"node {node} has no children"
        pairs = sorted(((-self.counts[c], t) for t, c in kids.items()))
        tokens = np.fromiter((t for _, t in pairs), np.int64, len(pairs))
        counts = np.fromiter((-n for n, _ in pairs), np.int64, len(pairs))
        tokens.flags.writeable = counts.flags.writeable = False  # cached: callers must not edit them
        return tokens, counts


def ngram_continuations(stream: Sequence[int], key: Sequence[int], max_key: int) -> Continuations:
    """The slow, obviously correct twin of :meth:`TokenTrie.next_tokens` (and of the datastore's,
    with documents joined by a separator that is never a key token): scan every position.

    >>> ngram_continuations([1, 2, 3, 1, 2, 4], [5, 1, 2], max_key=8).tokens.tolist()
    [3, 4]
    """
    stream = [int(t) for t in stream]
    key = [int(t) for t in key][-max_key:] if max_key > 0 else []
    for start in range(len(key)):
        k = key[start:]
        counts: dict[int, int] = {}
        for i in range(len(stream) - len(k)):
            if stream[i : i + len(k)] == k and stream[i + len(k)] >= 0:
                counts[stream[i + len(k)]] = counts.get(stream[i + len(k)], 0) + 1
        if counts:
            pairs = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            return Continuations(
                np.array([t for t, _ in pairs], np.int64), np.array([c for _, c in pairs], np.int64), len(k)
            )
    return Continuations.empty()
