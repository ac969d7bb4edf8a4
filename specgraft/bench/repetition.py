"""READER's self-repetition metric (READER paper, section 4.1): the retrieval ceiling of a task.

The paper's definition, for a tokenized input (prompt) and a pre-generated response:

1. Place a pointer at the start of the response.
2. Find the longest substring beginning at the pointer that also appears in the input or in the
   already-processed prefix of the response.
3. If no continuation is found (length zero), advance the pointer by one token; otherwise
   advance it by the continuation length.

The metric is the number of response tokens divided by the number of pointer advances. The
paper states that it equals the mean acceptance length of speculative decoding with an infinite
tree indexing all previously seen history, so it bounds what retrieval from prompt + history
(PLD, suffix trees, tries) can reach on that output. We compute it from plain decoding (``ar``)
outputs, with the exact token ids the target was given (chat template included; for a second
turn the input holds the first turn and the model's own first answer).

Read literally as the paper words it, a match must lie wholly inside the input or wholly inside
the processed prefix ``response[:pointer]``: it never spans the input/response boundary and
never overlaps the pointer. A step that finds a match of length L counts L tokens and no extra
bonus token, which is what the paper's table reports; the engine's MAT counts the bonus token,
so the ceiling is a conservative bound per advance. A task's value is the ratio of sums over its
outputs (total response tokens / total advances), like its MAT.

Worked example: input ``[1, 2, 3, 4]``, response ``[1, 2, 3, 5, 1, 2, 3, 5]``.

- pointer 0: ``[1, 2, 3]`` is in the input (``[1, 2, 3, 5]`` is not) -> advance 3
- pointer 3: ``5`` is neither in the input nor in the prefix ``[1, 2, 3]`` -> advance 1
- pointer 4: ``[1, 2, 3, 5]`` is in the prefix ``[1, 2, 3, 5]`` -> advance 4; done

8 tokens / 3 advances = 2.67. READER's Table 1 also reports the metric "with datastore": a
match may then also lie in an external corpus (its datastore of 100 other responses), which
``stores`` adds (any object with ``key_range``, e.g. :class:`~specgraft.retrieval.Datastore`)::

    >>> self_repetition([1, 2, 3, 4], [1, 2, 3, 5, 1, 2, 3, 5])
    SelfRepetition(response_tokens=8, advances=3)
    >>> round(self_repetition([1, 2, 3, 4], [1, 2, 3, 5, 1, 2, 3, 5]).value, 2)
    2.67
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class SelfRepetition:
    """Counts behind the metric, kept so outputs can be pooled per task (ratio of sums)."""

    response_tokens: int
    advances: int

    @property
    def value(self) -> float:
        """Response tokens per pointer advance (0 for an empty response)."""
        return self.response_tokens / self.advances if self.advances else 0.0

    @staticmethod
    def pool(parts: Iterable["SelfRepetition"]) -> "SelfRepetition":
        """Sum the counts of several outputs.

        >>> SelfRepetition.pool([SelfRepetition(8, 3), SelfRepetition(4, 1)]).value
        3.0
        """
        parts = list(parts)
        return SelfRepetition(sum(p.response_tokens for p in parts), sum(p.advances for p in parts))


def longest_match(pattern: Sequence[int], text: Sequence[int]) -> int:
    """Length of the longest prefix of ``pattern`` that occurs anywhere wholly inside ``text``.

    >>> longest_match([1, 2, 3, 9], [0, 1, 2, 1, 2, 3])
    3
    >>> longest_match([7], [1, 2])
    0
    """
    if not pattern:
        return 0
    # start positions still matching after k tokens; narrows as k grows
    alive = [j for j, tok in enumerate(text) if tok == pattern[0]]
    k = 0
    while alive:
        k += 1
        if k == len(pattern):
            return k
        alive = [j for j in alive if j + k < len(text) and text[j + k] == pattern[k]]
    return k


def store_match(pattern: Sequence[int], store, cap: int = 256) -> int:
    """Length of the longest prefix of ``pattern`` (at most ``cap`` tokens) that occurs in
    ``store`` followed by a token (``store.key_range(key)`` is a non-empty range): galloping, then
    bisection, since every prefix of an occurring key occurs.

    >>> from specgraft.retrieval import Datastore
    >>> store = Datastore.from_documents([[1, 2, 3, 4]])
    >>> store_match([2, 3, 9], store), store_match([2, 3, 4], store), store_match([7], store)
    (2, 2, 0)
    """
    def occurs(m: int) -> bool:
        lo, hi = store.key_range(pattern[:m])
        return lo < hi

    n = min(len(pattern), cap)
    good, bad = 0, n + 1  # longest length known to occur, shortest known not to
    m = 1
    while good + 1 < bad:
        if occurs(m):
            good = m
            m = 2 * m if 2 * m < bad else (m + bad) >> 1
        else:
            bad = m
            m = (good + bad) >> 1
    return good


def self_repetition(prompt: Sequence[int], response: Sequence[int], stores: Sequence = ()) -> SelfRepetition:
    """READER's self-repetition counts for one output (see the module docstring); with ``stores``,
    matches may also lie in those datastores ("W/ DS" in READER's Table 1).

    >>> from specgraft.retrieval import Datastore
    >>> self_repetition([1, 2], [3, 4, 5, 6], stores=[Datastore.from_documents([[3, 4, 5, 9]])])
    SelfRepetition(response_tokens=4, advances=2)
    """
    prompt, response = list(prompt), list(response)
    pointer = advances = 0
    while pointer < len(response):
        rest = response[pointer:]
        length = max(longest_match(rest, prompt), longest_match(rest, response[:pointer]), *(store_match(rest, s) for s in stores))
        pointer += max(length, 1)
        advances += 1
    return SelfRepetition(response_tokens=len(response), advances=advances)
