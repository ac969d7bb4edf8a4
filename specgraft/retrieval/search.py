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

__all__ = ["ContinuationSource", "SearchPath", "SearchTree", "search_path", "search_tree"]

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
    min_match: int = 1,
) -> SearchPath:
    """Algorithm 3: extend ``context_suffix`` greedily by the top merged continuation, ``depth``
    times at most. Works with the trie only (``datastores=()``) or datastores only (``trie=None``).
    ``min_match``: the path stops at the first level whose longest matched key is shorter (the
    pruning Theorem 1 implies: a token retrieved on a one-token key is rarely accepted and costs
    a verified row like any other)."""
    _check(depth, key_len, merge, min_match)
    sources = _sources(trie, datastores)
    context = [int(t) for t in list(context_suffix)[-key_len:]]
    tokens: list[int] = []
    names: list[str] = []
    shares: list[float] = []
    matched: list[int] = []
    for _ in range(depth):
        answers, longest = _answers(sources, context[-key_len:], merge)
        if not answers or longest < min_match:
            break
        token, name, share = _top(answers)
        tokens.append(token)
        names.append(name)
        shares.append(share)
        matched.append(longest)
        context.append(token)
    return SearchPath(tuple(tokens), tuple(names), tuple(shares), tuple(matched))


@dataclass(frozen=True)
class SearchTree:
    """A retrieved tree of draft tokens (retrieval-only READER): nodes best-first, parents first."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    """Per node: the index of its parent, -1 for a child of the root."""
    sources: tuple[str, ...]
    """Per node: ``"trie"`` or ``"datastore"``, as in :class:`SearchPath`."""
    scores: tuple[float, ...]
    """Per node: the product of the shares down its path, the estimate of its acceptance."""
    matched: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.tokens)

    def path(self, node: int) -> tuple[int, ...]:
        """The token path from the root down to ``node``."""
        out: list[int] = []
        while node >= 0:
            out.append(self.tokens[node])
            node = self.parents[node]
        return tuple(out[::-1])


def search_tree(
    context_suffix: Sequence[int],
    nodes: int,
    depth: int,
    trie: ContinuationSource | None = None,
    datastores: Sequence[ContinuationSource] = (),
    key_len: int = 8,
    merge: Literal["longest", "sum"] = "longest",
    min_match: int = 1,
    width: int = 4,
) -> SearchTree:
    """The ``nodes`` retrieved tokens most likely to be accepted, as a tree at most ``depth`` deep.

    READER's retrieval-only configuration ("Search + datastore") drafts a tree extracted from the
    trie, successors "sorted by continuation frequency so that high-frequency successors are
    explored first", within a maximum depth and token budget (section 4.2). The paper extracts
    depth-first; here the extraction is best-first on the estimate it already has, the product
    of the merged shares down a node's path, which for a given budget keeps the nodes of highest
    estimated acceptance (Theorem 1: drop the nodes with the largest cost per accepted token).
    Each node's continuations are those of the context followed by its path, merged from the trie
    and the datastores as :func:`search_path` merges them; at most ``width`` children per node;
    a level answered on a key shorter than ``min_match`` is not expanded. The first path of the
    tree is :func:`search_path`'s whenever the top child stays best.

    >>> from specgraft.retrieval.trie import TokenTrie
    >>> trie = TokenTrie(max_depth=4)
    >>> trie.extend([1, 2, 3, 4, 9, 1, 2, 3, 5, 9, 1, 2])
    >>> t = search_tree([9, 1, 2], nodes=5, depth=4, trie=trie, key_len=3)
    >>> [t.path(i) for i in range(len(t))]
    [(3,), (3, 4), (3, 5), (3, 4, 9), (3, 5, 9)]
    >>> t.scores
    (1.0, 0.5, 0.5, 0.5, 0.5)
    """
    import heapq

    _check(depth, key_len, merge, min_match)
    if nodes < 0 or width < 1:
        raise ValueError(f"nodes must be >= 0 and width >= 1, got {nodes} and {width}")
    sources = _sources(trie, datastores)
    context = [int(t) for t in list(context_suffix)[-key_len:]]
    tokens: list[int] = []
    parents: list[int] = []
    names: list[str] = []
    scores: list[float] = []
    matched: list[int] = []
    paths: list[list[int]] = []
    # (-score, order of entry, parent, token, source, matched): a heap of the frontier
    frontier: list[tuple[float, int, int, int, str, int]] = []
    entered = 0

    def expand(parent: int, score: float, path: list[int]) -> None:
        nonlocal entered
        if len(path) >= depth:
            return
        answers, longest = _answers(sources, (context + path)[-key_len:], merge)
        if not answers or longest < min_match:
            return
        for token, name, share in _ranked(answers, width):
            heapq.heappush(frontier, (-score * share, entered, parent, token, name, longest))
            entered += 1

    expand(-1, 1.0, [])
    while frontier and len(tokens) < nodes:
        neg, _, parent, token, name, level_match = heapq.heappop(frontier)
        path = (paths[parent] if parent >= 0 else []) + [token]
        tokens.append(token)
        parents.append(parent)
        names.append(name)
        scores.append(-neg)
        matched.append(level_match)
        paths.append(path)
        expand(len(tokens) - 1, -neg, path)
    return SearchTree(tuple(tokens), tuple(parents), tuple(names), tuple(scores), tuple(matched))


def _check(depth: int, key_len: int, merge: str, min_match: int) -> None:
    if depth < 0:
        raise ValueError(f"depth must be >= 0, got {depth}")
    if key_len < 1:
        raise ValueError(f"key_len must be >= 1, got {key_len}")
    if merge not in MERGE_RULES:
        raise ValueError(f"merge must be one of {', '.join(MERGE_RULES)}, got {merge!r}")
    if min_match < 1:
        raise ValueError(f"min_match must be >= 1, got {min_match}")


def _sources(trie: ContinuationSource | None, datastores: Sequence[ContinuationSource]) -> list[tuple[str, ContinuationSource]]:
    sources: list[tuple[str, ContinuationSource]] = [("trie", trie)] if trie is not None else []
    return sources + [("datastore", ds) for ds in datastores]


def _answers(sources: list[tuple[str, ContinuationSource]], key: Sequence[int], merge: str) -> tuple[list[tuple[str, Continuations]], int]:
    """Every source's continuations of ``key`` (those with the longest match under ``"longest"``),
    and that longest matched length (0: nothing matched)."""
    answers = [(name, c) for name, src in sources if len(c := src.next_tokens(key))]
    if not answers:
        return [], 0
    longest = max(c.matched for _, c in answers)
    if merge == "longest":
        answers = [(name, c) for name, c in answers if c.matched == longest]
    return answers, longest


def _ranked(answers: list[tuple[str, Continuations]], limit: int) -> list[tuple[int, str, float]]:
    """The first ``limit`` tokens of the summed counts (count descending, the smaller id on a
    tie), each with the source that counted it most (the first on a tie) and its share of the
    summed counts."""
    if len(answers) == 1:  # one source's continuations are already in this order (Continuations)
        name, c = answers[0]
        whole = c.counts.sum()
        return [(int(t), name, float(n / whole)) for t, n in zip(c.tokens[:limit], c.counts[:limit])]
    tokens, inverse = np.unique(np.concatenate([c.tokens for _, c in answers]), return_inverse=True)
    totals = np.bincount(inverse, weights=np.concatenate([c.counts for _, c in answers]).astype(np.float64))
    order = np.argsort(-totals, kind="stable")  # np.unique sorted the ids: ties keep the smaller first
    whole = totals.sum()
    out = []
    for i in order[:limit]:
        token = int(tokens[i])
        per_source = [int(c.counts[c.tokens == token].sum()) for _, c in answers]
        out.append((token, answers[int(np.argmax(per_source))][0], float(totals[i] / whole)))
    return out


def _top(answers: list[tuple[str, Continuations]]) -> tuple[int, str, float]:
    """The first of :func:`_ranked`."""
    return _ranked(answers, 1)[0]
