"""From a specgraft tree to the one chain vLLM verifies: the best chain of each length
(:func:`best_chains`) and the length worth its cost (:class:`ChainCost`, measured by
``python -m specgraft.integrations.vllm_probe``)."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from specgraft.integrations.vllm.env import CHAIN_COST_ENV



logger = logging.getLogger(__name__)

def best_chains(parents: Sequence[int], scores: Sequence[float], max_len: int | None = None) -> list[list[int]]:
    """For each ``L = 1 .. max_len``, the root-to-node path of exactly ``L`` nodes with the largest
    sum of ``scores`` (``[]`` where no path is that deep); node indices. A node's score is its
    estimated acceptance, so a path's sum is its expected number of accepted tokens. Ties: the
    earlier node.

    >>> best_chains([-1, -1, 1, 2], [0.6, 0.5, 0.45, 0.4])
    [[0], [1, 2], [1, 2, 3], []]
    """
    n = len(parents)
    cap = n if max_len is None else min(max_len, n)
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for i, p in enumerate(parents):
        children[p + 1].append(i)
    # exact[i]: best sum of a path of exactly L nodes starting at node i (None: none that deep);
    # nexts[L][i]: the child that path continues with
    exact: list[float | None] = [float(x) for x in scores]
    nexts: list[list[int]] = [[-1] * n]
    roots: list[int] = []
    for length in range(1, cap + 1):
        if length > 1:
            row: list[float | None] = [None] * n
            pick = [-1] * n
            for i in range(n):
                for c in children[i + 1]:
                    if exact[c] is not None and (pick[i] < 0 or exact[c] > exact[pick[i]]):  # type: ignore[operator]
                        pick[i] = c
                if pick[i] >= 0:
                    row[i] = scores[i] + exact[pick[i]]  # type: ignore[operator]
            exact = row
            nexts.append(pick)
        best = -1
        for i in children[0]:
            if exact[i] is not None and (best < 0 or exact[i] > exact[best]):  # type: ignore[operator]
                best = i
        roots.append(best)
    chains: list[list[int]] = []
    for length, node in enumerate(roots, start=1):
        chain: list[int] = []
        for d in range(length, 0, -1):
            if node < 0:
                break
            chain.append(node)
            node = nexts[d - 1][node]
        chains.append(chain)
    return chains


def best_chain(
    parents: Sequence[int], scores: Sequence[float], max_len: int | None = None, token_cost: float = 0.0
) -> list[int]:
    """The root-to-node path of at most ``max_len`` nodes with the largest sum of
    ``score - token_cost`` (``token_cost``: what verifying one more draft token costs, in accepted
    tokens); node indices. The path stops where going deeper no longer pays (with
    ``token_cost = 0``, at a leaf or at ``max_len``): of equal sums the shorter.

    A greedy walk takes the likelier first token; this takes the longer expected run, when it fits:

    >>> best_chain([-1, -1, 1, 2], [0.6, 0.5, 0.45, 0.4])
    [1, 2, 3]
    >>> best_chain([-1, -1, 1, 2], [0.6, 0.5, 0.45, 0.4], max_len=1)
    [0]
    >>> best_chain([-1, -1, 1, 2], [0.6, 0.5, 0.45, 0.4], token_cost=0.42)  # the deep branch no longer pays
    [0]
    """
    return _best_net(parents, scores, max_len, lambda length: token_cost * length)[0]


def _best_net(
    parents: Sequence[int], scores: Sequence[float], max_len: int | None, cost_of: Callable[[int], float]
) -> tuple[list[int], float]:
    """The path with the largest sum of scores minus ``cost_of(its length)``, and that value
    (``([], 0.0)`` for an empty tree); of equal values the shorter."""
    best: list[int] = []
    value = 0.0
    for chain in best_chains(parents, scores, max_len):
        v = sum(scores[i] for i in chain) - cost_of(len(chain))
        if chain and (not best or v > value):
            best, value = chain, v
    return best, value


@dataclass(frozen=True)
class ChainCost:
    """What vLLM pays to verify a draft chain, in plain decoding steps: ``step`` once for a step
    that verifies any draft (vLLM's speculative path: rejection sampler, draft bookkeeping) and
    ``token`` per draft token, or, where ``by_length`` is given, the measured extra cost of a
    step verifying ``L = 1, 2, ...`` draft tokens (past the table, its last entry plus ``token``
    per further token). A proposer drafts the path whose expected number of accepted tokens
    minus :meth:`of` its length is largest, and nothing when none is positive (:meth:`choose`).

    Why a table: on the Zen 3 the cost is not a line. Verifying 3 draft tokens costs 0.49 of a
    step against 0.25 for 2, and 5 cost 0.59 (Qwen2.5-Coder-1.5B, 500 cached tokens: relative to
    a step without a draft 1.154 / 1.248 / 1.492 / 1.556 / 1.591 for L = 1..5; vLLM's kernels
    step up at 4 rows). So a third token must bring a quarter of a token to pay for itself, while
    the fourth and fifth cost 0.06 and 0.04: the line it replaced (``ChainCost(0, 0.1)``) cut good
    5-token copies at 3 and let 3-token ones through too cheaply. Replaying vLLM's greedy loop
    with these costs, the table predicts 0.7-1.0% less time than the line on the vLLM benchmark's
    outputs and on 18 held-out ones; timed side by side on the Zen 3, the PLD proposer with it
    took 0.983x / 0.945x / 0.937x vLLM ngram's time on the 1.5B / 0.5B / SmolLM2
    (``benchmarks/RESULTS.md``, *the measured cost curve*). That table is ``CPU_DEFAULT``;
    :meth:`from_probe` reads any machine's.

    The probe (``python -m specgraft.integrations.vllm_probe``, in vLLM 0.32) drafts rejected chains of every
    length 0..k in a shuffled order within one generation and times each step, so drift cancels.
    Other CPUs measured other curves (AVX-512 EPYC and Xeon: ~0.05 per token, 0.01-0.12 for the
    first; README, "What a draft costs vLLM"); replayed with the Xeon's costs, the Zen 3 table
    predicts the same time as the line did there. (A first estimate, fitted to whole-generation
    times of the vLLM benchmark rows, put a fixed 0.25 on every drafting step; it was confounded
    with drift and with which proposer drafted what, and the proposer tuned to it drafted too
    little.) Not measured on a GPU, where a few more verified tokens are nearly free: there the
    default is ``ChainCost(0, 0)`` (``min_prob`` alone decides). Override with
    ``$SPECGRAFT_VLLM_CHAIN_COST``: ``STEP,TOKEN``, or the path of a probe's JSON.

    >>> ChainCost(0.25, 0.065).pays([0.3])   # 0.3 expected accepted < 0.25 + 0.065
    False
    >>> ChainCost(0.25, 0.065).pays([0.8, 0.64])
    True
    >>> CPU_DEFAULT.of(2), CPU_DEFAULT.of(3)
    (0.248, 0.4915)
    >>> CPU_DEFAULT.choose([-1, 0, 1, 2, 3], [0.7, 0.5, 0.2, 0.15, 0.12], 5)   # 1.67 - 0.5911 beats 1.2 - 0.248
    [0, 1, 2, 3, 4]
    """

    step: float = 0.0
    token: float = 0.0
    by_length: tuple[float, ...] = ()
    """Extra cost of a step verifying ``L = 1, 2, ...`` draft tokens (empty: ``step + token * L``)."""

    def __post_init__(self) -> None:
        if not (self.step >= 0.0 and self.token >= 0.0):
            raise ValueError(f"chain costs must be >= 0, got step={self.step}, token={self.token}")
        if any(not c >= 0.0 for c in self.by_length) or any(b < a for a, b in zip(self.by_length, self.by_length[1:])):
            raise ValueError(f"by_length must be >= 0 and non-decreasing (a longer draft never costs less), got {self.by_length}")

    def of(self, length: int) -> float:
        """What verifying a chain of ``length`` draft tokens costs, in steps (0 for no chain)."""
        if length <= 0:
            return 0.0
        table = self.by_length
        if table:
            return table[length - 1] if length <= len(table) else table[-1] + self.token * (length - len(table))
        return self.step + self.token * length

    @property
    def cheapest_token(self) -> float:
        """The least any one more draft token adds to :meth:`of` (a node estimated below it never pays)."""
        if not self.by_length:
            return self.token
        steps = [b - a for a, b in zip((0.0, *self.by_length), self.by_length)]
        return min(min(steps), self.token)

    def pays(self, scores: Sequence[float]) -> bool:
        """Whether a chain whose nodes have these estimated acceptances is worth verifying."""
        return bool(scores) and sum(scores) > self.of(len(scores))

    def choose(self, parents: Sequence[int], scores: Sequence[float], max_len: int) -> list[int]:
        """The tree's path (node indices, at most ``max_len``) with the largest expected number of
        accepted tokens net of :meth:`of` its length; ``[]`` when none is positive."""
        chain, value = _best_net(parents, scores, max_len, self.of)
        return chain if value > 0 else []

    @classmethod
    def parse(cls, text: str) -> "ChainCost":
        """``"0.25,0.065"`` -> ``ChainCost(0.25, 0.065)``; a path to a probe's JSON ->
        :meth:`from_probe`; a one-line ``ValueError`` otherwise."""
        if text.endswith(".json") or os.path.isfile(text):
            return cls.from_probe(text)
        try:
            step, token = (float(v) for v in text.split(","))
        except ValueError:
            raise ValueError(f"${CHAIN_COST_ENV} must be STEP,TOKEN (two numbers) or a step-cost JSON file, got {text!r}") from None
        return cls(step, token)

    @classmethod
    def from_probe(cls, path: str | os.PathLike[str]) -> "ChainCost":
        """The costs ``python -m specgraft.integrations.vllm_probe`` measured (its ``--out`` JSON): the table of
        ``relative_to_no_draft`` (each entry at least the one before: a dip is noise) and its
        least-squares ``step`` / ``token`` (``token`` prices tokens past the table)."""
        try:
            probe = json.loads(Path(path).read_text())
            rel = {int(k): float(v) for k, v in probe["relative_to_no_draft"].items()}
            fit = probe.get("chain_cost", {})
            table: list[float] = []
            for length in range(1, max(rel) + 1):
                table.append(max(rel[length] - 1.0, table[-1] if table else 0.0))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}: not a step-cost file of specgraft.integrations.vllm_probe ({e})") from None
        return cls(max(float(fit.get("step", 0.0)), 0.0), max(float(fit.get("token", 0.0)), 0.0), tuple(round(c, 4) for c in table))

    @classmethod
    def for_device(cls, device_type: str | None) -> "ChainCost":
        """``$SPECGRAFT_VLLM_CHAIN_COST`` if set, else the measured CPU default on ``cpu``, else none."""
        env = os.environ.get(CHAIN_COST_ENV, "").strip()
        if env:
            return cls.parse(env)
        return CPU_DEFAULT if device_type == "cpu" else cls()


CPU_DEFAULT = ChainCost(0.0518, 0.1182, (0.1541, 0.248, 0.4915, 0.5563, 0.5911))
"""Measured on an AMD EPYC Zen 3 (AVX2), Qwen2.5-Coder-1.5B, vLLM 0.32, 1 model thread
(``benchmarks/experiments/vllm/step-cost-qwen1.5b-zen3.json``)."""


def costed_chain(tree: Any, k: int, cost: ChainCost) -> list[int]:
    """The tokens of ``tree``'s best chain of at most ``k`` nodes under ``cost`` (``[]`` when no
    chain is expected to pay for its verification)."""
    return [tree.tokens[i] for i in cost.choose(tree.parents, tree.scores or [1.0] * len(tree), k)]


