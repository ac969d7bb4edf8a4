"""Prompt lookup (PLD) as a tree: copy what followed earlier occurrences of the trailing n-gram.

Over the committed context (prompt + output so far), find earlier positions where the last
``n`` tokens occurred, for ``n`` from ``max_ngram`` down to ``min_ngram``, and copy up to
``max_copy`` tokens that followed each. Unlike a single-chain PLD, every distinct continuation
becomes a branch, so when earlier matches continue differently both are verified.

Which nodes are worth a row of the verify pass? A copy after a long match is usually right far
into the copy, one after a short match rarely past its first token (measured with
Qwen2.5-Coder-1.5B on held-out Spec-Bench and HumanEval prompts: after a 3-gram match the first
copied token was right 82% of the time and each later one ~85% of the time given the one before
it, ten tokens deep; after a 1- or 2-gram match the first copied token was right 31% / 45% of
the time, and later ones, given their parent was right, 40-90% but on few samples). So each
node gets an **estimated acceptance probability**::

    p(node) = p(parent) * share(node) * q(n, depth)

where ``share`` is the node's part of the matches continuing from its parent (each weighted by
how far back it agrees with the context, so branches compete on support and the copy of a
quoted passage beats an earlier repeat of a phrase), ``n`` the longest n-gram behind it, and ``q(n, 1)`` /
``q(n, >1)`` the rate at which a first / a later copied token is right given its parent was.
The ``q`` start from the priors below and are learned online from every verify pass (counts per
``(n, first|later)``, ``prior_strength`` pseudo-observations of the prior), over all proposed
nodes whose parent lay on the accepted path, verified or not (their outcome is known from the
target's tokens). At most ``budget`` nodes are proposed, best-first by ``p``; those with
``p < min_prob`` are not proposed at all (a row of the verify pass costs 5-15% of a decode step on the 2-core CPU), so the
``budget`` is an upper bound: long copies run deep when they keep being right, weak matches cost
one row or none. ``min_prob=0`` and flat priors give plain best-first PLD.

Example with ``context = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]``, ``max_ngram = 2``: the tail
``[1, 2]`` occurs at positions 0 and 4; they continue ``[3, 9, 1, ...]`` and ``[4, 7, 1, ...]``,
so the trie has two branches, ``3 -> 9 -> 1 ...`` and ``4 -> 7 -> 1 ...``, each with about half
the support at the root (the more recent match, ``4``, a hair more). With the prior ``q(2, 1) =
0.3`` both first tokens get ``p = 0.15`` and are proposed; the second tokens (``0.15 * 0.6 =
0.09``) fall below ``min_prob = 0.1`` until the rates learned from verify passes lift them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Sequence

import numpy as np

from specgraft.config import GenerationConfig, check_step_costs
from specgraft.drafters.base import Learning, StatelessDrafter
from specgraft.tree.paths import best_first, cost_aware_subset
from specgraft.types import Draft, PrefillOutput, StepResult, reindex


@dataclass(frozen=True)
class PLDConfig:
    max_ngram: int = 3
    """Longest trailing n-gram to look up."""
    min_ngram: int = 1
    """Shortest trailing n-gram to fall back to."""
    max_copy: int = 16
    """Tokens copied after a match (HF's prompt_lookup_num_tokens default is 10)."""
    max_matches: int = 8
    """Earlier matches used as branches, most recent first."""
    max_extend: int = 32
    """How far back a match's agreement with the context is measured (its weight; 0 = just n)."""
    min_prob: float = 0.1
    """Nodes whose estimated acceptance probability is below this are not proposed."""
    row_cost: float | None = None
    """Cost of one more verified row as a fraction of a one-row step (``CostTable.row_cost``);
    when set, the best-first nodes that pass ``min_prob`` are cut where expected tokens per
    unit of cost peaks (:func:`~specgraft.tree.paths.cost_aware_subset`). None: ``min_prob`` and
    ``budget`` alone."""
    step_costs: tuple[float, ...] | None = None
    """Measured cost of verifying 1, 2, 3, ... rows in one-row forwards (``CostTable.step_costs``);
    when set, the cut weighs each prefix of the best-first nodes by it instead of by
    ``row_cost``'s line (llama.cpp's quantized kernels, whose costs are far from a line)."""
    prior_first: tuple[float, ...] = (0.25, 0.3, 0.8)
    """Prior ``q(n, 1)`` for n = 1, 2, 3, ... (the last entry serves longer n-grams)."""
    prior_later: tuple[float, ...] = (0.3, 0.6, 0.88)
    """Prior ``q(n, >1)``, indexed like ``prior_first``."""
    prior_strength: float = 8.0
    """Pseudo-observations behind each prior rate; 0 = trust the counts alone."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.max_extend < 0:
            raise ValueError(f"max_extend must be >= 0, got {self.max_extend}")
        if self.max_copy < 1 or self.max_matches < 1:
            raise ValueError(f"max_copy and max_matches must be >= 1, got {self.max_copy} and {self.max_matches}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"min_prob must lie in [0, 1), got {self.min_prob}")
        if self.row_cost is not None and not self.row_cost >= 0.0:
            raise ValueError(f"row_cost must be >= 0, got {self.row_cost}")
        check_step_costs(self.step_costs)
        if not self.prior_first or len(self.prior_first) != len(self.prior_later):
            raise ValueError("prior_first and prior_later need the same, non-zero length")
        if any(not 0.0 < q <= 1.0 for q in (*self.prior_first, *self.prior_later)):
            raise ValueError("prior rates must lie in (0, 1]")
        if self.prior_strength < 0:
            raise ValueError(f"prior_strength must be >= 0, got {self.prior_strength}")


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


class CopyRates:
    """Online ``q(n, first|later)``: how often a copied token is right given its parent was.

    >>> r = CopyRates((0.5,), (0.5,), strength=2.0)
    >>> r.record(1, 1, True); r.record(1, 1, True)
    >>> r.rate(1, 1), r.rate(1, 2)
    (0.75, 0.5)

    Two branches with half the support each, one of them right: one try, one hit.

    >>> r.record(1, 2, True, weight=0.5); r.record(1, 2, False, weight=0.5)
    >>> r.rate(1, 2)
    0.6666666666666666
    """

    def __init__(self, prior_first: Sequence[float], prior_later: Sequence[float], strength: float):
        # [buckets, 2] (first, later) prior rates; bucket = min(n, len) - 1
        self.prior = np.array([prior_first, prior_later], dtype=np.float64).T
        self.strength = strength
        self.hits = np.zeros_like(self.prior)
        self.tries = np.zeros_like(self.prior)

    def _index(self, n: int, depth: int) -> tuple[int, int]:
        return min(n, len(self.prior)) - 1, int(depth > 1)

    def copy(self) -> "CopyRates":
        other = CopyRates.__new__(CopyRates)
        other.prior, other.strength = self.prior, self.strength
        other.hits, other.tries = self.hits.copy(), self.tries.copy()
        return other

    def rate(self, n: int, depth: int) -> float:
        i = self._index(n, depth)
        num = self.hits[i] + self.strength * self.prior[i]
        den = self.tries[i] + self.strength
        return float(num / den) if den > 0 else float(self.prior[i])

    def record(self, n: int, depth: int, hit: bool, weight: float = 1.0) -> None:
        """One outcome; ``weight`` is the share of a try it stands for (a branch's ``share``)."""
        i = self._index(n, depth)
        self.tries[i] += weight
        self.hits[i] += hit


@dataclass
class PLDState:
    """One sequence's context (as an array grown in place), copy rates and last proposal."""

    context: np.ndarray
    rates: CopyRates
    # the last proposal, for observe: tokens, parents, (n, depth, share) per node
    last: tuple[list[int], list[int], list[tuple[int, int, float]]] | None = None

    def sync(self, context: Sequence[int]) -> np.ndarray:
        """The context as an array; the engine's context only grows, so only its new tail is converted."""
        known = len(self.context)
        if len(context) < known or (known and context[known - 1] != self.context[-1]):
            self.context = np.asarray(context, dtype=np.int64)
        elif len(context) > known:
            self.context = np.concatenate([self.context, np.asarray(context[known:], dtype=np.int64)])
        return self.context


def prune(
    parents: Sequence[int], probs: Sequence[float], keep: list[int], budget: int, row_cost: float | None,
    step_costs: Sequence[float] | None = None,
) -> list[int]:
    """The nodes of ``keep`` (closed under parents, ascending) to propose: the best ``budget`` by
    estimated acceptance ``probs``, cut further by the row cost, or by the measured
    ``step_costs``, when one is given.

    >>> prune([-1, 0, 1], [0.9, 0.45, 0.1], [0, 1, 2], 8, None), prune([-1, 0, 1], [0.9, 0.45, 0.1], [0, 1, 2], 8, 0.1)
    ([0, 1, 2], [0, 1])
    >>> prune([-1], [0.3], [0], 8, None, (1.0, 1.38, 1.6, 1.42))
    []
    """
    if row_cost is not None or step_costs is not None:
        sub = cost_aware_subset(reindex(parents, keep), [probs[i] for i in keep], budget, row_cost or 0.0, step_costs)
        return [keep[i] for i in sub]
    if len(keep) > budget:
        keep = [keep[i] for i in best_first(reindex(parents, keep), [probs[i] for i in keep], budget)]
    return keep


class PLDDrafter(StatelessDrafter):
    """Tree prompt-lookup drafter (source ``pld``).

    The copy rates are learned per request from the priors (``learning=Learning.REQUEST``), or
    across requests when ``learning=Learning.SHARED`` (a drafter then learns how reliable
    copies are for its model and workload; the rates are six numbers, no text).
    """

    name: ClassVar[str] = "pld"

    def __init__(self, config: PLDConfig = PLDConfig(), learning: Learning = Learning.REQUEST):
        self.config = config
        self.learning = Learning(learning)
        # shared: the priors, or what every request learned (Learning.SHARED)
        self.rates = CopyRates(config.prior_first, config.prior_later, config.prior_strength)

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> PLDState:
        rates = self.rates if self.learning is Learning.SHARED else self.rates.copy()
        return PLDState(context=np.asarray(prompt, dtype=np.int64), rates=rates)

    def matches(self, ctx: np.ndarray) -> list[tuple[int, int]]:
        """``(end of match, n)`` for up to ``max_matches`` earlier matches, longest n first, then most recent."""
        cfg = self.config
        starts: list[tuple[int, int]] = []
        seen: set[int] = set()
        for n in range(cfg.max_ngram, cfg.min_ngram - 1, -1):
            for i in find_matches(ctx, n)[: cfg.max_matches]:
                end = int(i) + n
                if end not in seen:
                    seen.add(end)
                    starts.append((end, n))
            if len(starts) >= cfg.max_matches:
                break
        return starts[: cfg.max_matches]

    def agreement(self, ctx: np.ndarray, end: int, n: int) -> int:
        """How many tokens before ``end`` agree with the context's tail (``n`` at least, at most
        ``n + max_extend``): the match that agrees with the context for longer is the likelier
        source (e.g. the passage a summary is quoting, over an earlier repeat of a phrase).

        >>> PLDDrafter().agreement(np.array([7, 1, 2, 3, 9, 1, 2, 3]), 4, 2)
        3
        """
        length = len(ctx)
        k = n
        while k < n + self.config.max_extend and end - k - 1 >= 0 and ctx[end - k - 1] == ctx[length - k - 1]:
            k += 1
        return k

    def propose(self, state: PLDState, context: Sequence[int], budget: int) -> Draft:
        ctx = state.sync(context)
        cfg = self.config
        length = len(ctx)
        # trie of continuations: (parent node, token) -> node
        index: dict[tuple[int, int], int] = {}
        tokens: list[int] = []
        parents: list[int] = []
        support: list[float] = []  # summed match weight through each node
        longest: list[int] = []  # longest n behind each node
        depth: list[int] = []
        for rank, (end, n) in enumerate(self.matches(ctx)):
            # matches agreeing with the context for longer carry more weight; recency breaks ties
            weight = self.agreement(ctx, end, n) + 1e-3 * (cfg.max_matches - rank)
            parent = -1
            for tok in ctx[end : min(end + cfg.max_copy, length)].tolist():
                key = (parent, tok)
                node = index.get(key)
                if node is None:
                    node = len(tokens)
                    index[key] = node
                    tokens.append(tok)
                    parents.append(parent)
                    support.append(0.0)
                    longest.append(n)
                    depth.append(1 if parent < 0 else depth[parent] + 1)
                support[node] += weight
                longest[node] = max(longest[node], n)
                parent = node
        # estimated acceptance: p(parent) * share of the parent's continuing support * q(n, depth)
        continuing = [0.0] * (len(tokens) + 1)  # [-1] is the root
        for i, p in enumerate(parents):
            continuing[p] += support[i]
        probs: list[float] = []
        for i, p in enumerate(parents):
            base = probs[p] if p >= 0 else 1.0
            probs.append(base * support[i] / continuing[p] * state.rates.rate(longest[i], depth[i]))
        # a child never beats its parent (p only shrinks), so dropping p < min_prob keeps a tree
        keep = [i for i in range(len(tokens)) if probs[i] >= cfg.min_prob]
        keep = prune(parents, probs, keep, budget, cfg.row_cost, cfg.step_costs)
        draft = Draft(source=self.name, tokens=tokens, parents=parents, scores=probs).subset(keep)
        # every proposed node, kept or not: observe learns the copy rates from all of them
        shares = [support[i] / continuing[p] for i, p in enumerate(parents)]
        state.last = (tokens, parents, list(zip(longest, depth, shares, strict=True)))
        return draft

    def observe(self, state: PLDState, step: StepResult) -> None:
        """Learn ``q`` from the target's tokens: a node whose parent lay on the accepted path
        (or is the root) was right iff its token is the target's token at its depth.

        ``p(node) = p(parent) * share * q``, so under a parent on the path the expected number of
        right children is ``q`` (shares sum to one): each child counts ``share`` tries and its
        hit one hit, and ``hits / tries`` estimates ``q`` without penalising branching."""
        if state.last is None:
            return
        tokens, parents, keys = state.last
        state.last = None
        truth = step.new_tokens  # accepted tokens + the bonus token
        on_path = [False] * len(tokens)
        for i, p in enumerate(parents):
            n, d, share = keys[i]
            if (p < 0 or on_path[p]) and d <= len(truth):
                hit = tokens[i] == truth[d - 1]
                state.rates.record(n, d, hit, weight=share)
                on_path[i] = hit
