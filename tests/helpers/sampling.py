"""The ``V = 4`` synthetic target of the statistical sampling checks, its exact law, the TV bound
derived from ``n`` alone (``lossless/test_sampling_stats.py`` explains it), and speculative
sampling runs against it."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import torch

from specgraft.config import SamplingConfig
from specgraft.types import StepResult
from specgraft.verify import verify_rejection
from specgraft.verify.reference import reference_target_probs

V = 4
L = 3
PROMPT = (0, 1)
DELTA = 1e-6

Pair = tuple[int, int]


class SyntheticTarget:
    """Next-token logits as a fixed random table of the previous two tokens, plus a draft table."""

    def __init__(self, sampling: SamplingConfig, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.sampling = sampling
        # [V, V, V]: logits[a, b] scores the token after (..., a, b)
        self.logits = torch.randn(V, V, V, generator=g) * 1.5
        # [V * V, V]: row a * V + b
        self.flat_logits = self.logits.reshape(V * V, V)
        # [V, V, V]: an overconfident, wrong draft model: 0.7 on the target's least likely token,
        # the rest uniform. That token is drawn again and again and rejected, so deduplication
        # matters (it is what makes SpecInfer's fixed-q rule visibly biased below)
        worst = torch.nn.functional.one_hot(self.logits.argmin(dim=-1), V).double()
        self.draft_rows = (0.7 * worst + 0.3 / V).tolist()
        # exact processed target rows, computed by the pure-Python twin (independent of the code under test)
        self.probs = [[reference_target_probs(self.logits[a, b].tolist(), sampling) for b in range(V)] for a in range(V)]

    def exact_law(self) -> dict[tuple[int, ...], float]:
        law = {}
        for seq in itertools.product(range(V), repeat=L):
            ctx, prob = list(PROMPT), 1.0
            for tok in seq:
                prob *= self.probs[ctx[-2]][ctx[-1]][tok]
                ctx.append(tok)
            law[seq] = prob
        assert abs(sum(law.values()) - 1.0) < 1e-9, "exact law must sum to 1"
        return law

    def rows(self, pairs: list[Pair]) -> torch.Tensor:
        """[len(pairs), V] target logits of the root and every node."""
        return self.flat_logits[[a * V + b for a, b in pairs]]


def node_pairs(root: Pair, tokens: list[int], parents: list[int]) -> list[Pair]:
    """Context pair (previous two tokens) seen by each verify row: the root, then every node."""
    pairs = [root]
    for tok, parent in zip(tokens, parents, strict=True):
        pairs.append((pairs[parent + 1][1], tok))
    return pairs


def tv_bound(law: dict[tuple[int, ...], float], n: int) -> float:
    """A lossless sampler's TV from ``law`` over ``n`` samples exceeds this with probability at most ``DELTA``."""
    expected = 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in law.values())
    return expected + math.sqrt(math.log(1 / DELTA) / (2 * n))


def sample_sequences(
    target: SyntheticTarget, make_tree, n: int, length: int, seed: int, new_sequence=None
) -> tuple[Counter, float]:
    """``n`` speculative generations of ``length`` tokens with ``verify_rejection``; (counts, tokens/step).

    ``make_tree(context) -> (DraftTree, observers)``; every observer, a ``(drafter, state)``
    pair, sees each step. ``new_sequence()`` (if given) runs before each generation (drafters
    begin their per-sequence states there).
    """
    gen = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    steps = 0
    for _ in range(n):
        out = list(PROMPT)
        if new_sequence is not None:
            new_sequence()
        while len(out) - len(PROMPT) < length:
            tree, observers = make_tree(out)
            root = (out[-2], out[-1])
            logits = target.rows(node_pairs(root, tree.tokens, tree.parents))
            result = verify_rejection(tree, logits, target.sampling, gen)
            step = StepResult(root_token=out[-1], tree=tree, verify=result, logits=logits, context=out)
            out += step.new_tokens
            for drafter, state in observers:
                drafter.observe(state, step)
            steps += 1
        counts[tuple(out[len(PROMPT) : len(PROMPT) + length])] += 1
    return counts, n * length / steps


def total_variation(counts: Counter, law: dict, n: int) -> float:
    """Total variation between the empirical law of ``counts`` (``n`` samples) and ``law``."""
    assert set(counts) <= set(law)
    return 0.5 * sum(abs(counts[s] / n - p) for s, p in law.items())
