"""One sequence's AdaPLD memory: the tokens seen with their hidden states and the target's top-k
after each (:class:`SeenTokens`, :class:`AdaPLDState`), and moving a step's rows to the host in one
transfer (:func:`rows_to_host`; :func:`top_rows` and :func:`unit_rows` its twins)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np
import torch

from specgraft.drafters.pld import CopyRates

#: Reranking layer per model signature ``(model_type, num_layers, hidden_size)``, from the
#: sweep in ``benchmarks/experiments/adapld-reader/adapld_layer_sweep.py`` (PLD+'s protocol, AdaPLD Table 6).
#: Qwen2.5-Coder-1.5B (28 layers): 40 held-out texts, 1264 positions with two or more anchors;
#: mean accepted copy 0.595 with the most recent anchor, 0.92-1.00 reranked at any layer, best
#: at layer 21 (0.998; layer 9 = 28 // 3: 0.936), oracle 1.347.
RERANK_LAYERS: dict[tuple[str, int, int], int] = {("qwen2", 28, 1536): 21}

MAIN, BRANCH, SUCCESSOR = 0, 1, 2
class Proposal(NamedTuple):
    """What ``observe`` needs of the last ``propose``: every node built (kept or not), with its
    kind and ``(n, depth, weight)`` key, the successors left out under the cut
    (``(branch node, branch token)``), the anchor and the root's position."""

    tokens: list[int]
    parents: list[int]
    kinds: list[int]
    keys: list[tuple[int, int, float]]
    deferred: list[tuple[int, int]]
    anchor: int
    root: int


@dataclass
class SeenTokens:
    """The distinct tokens of a memory in order of first appearance, with their first positions
    and unit input embeddings, grown as the memory grows: the semantic fallback's search set.

    Rows are appended in order of first position, so the distinct tokens of ``mem[:end]`` are
    the first ``searchsorted(first, end)`` rows (what ``np.unique(mem[:end])`` lists, in
    another order) and the fallback is one matrix-vector product over a kept array instead of
    a fresh ``[distinct, H]`` stack of every distinct token's embedding at every lookup.

    >>> seen = SeenTokens.empty(2)
    >>> seen.extend(np.array([7, 3, 7, 9]), lambda toks: np.eye(2, dtype=np.float32)[[t % 2 for t in toks]])
    >>> seen.tokens[: seen.n].tolist(), seen.first[: seen.n].tolist(), seen.upto(3)
    ([7, 3, 9], [0, 1, 3], 2)
    """

    tokens: np.ndarray  # [cap] int64
    first: np.ndarray  # [cap] int64, ascending
    units: np.ndarray  # [cap, H] float32
    n: int = 0
    scanned: int = 0  # memory positions looked at
    index: set[int] = field(default_factory=set)

    @classmethod
    def empty(cls, hidden_size: int) -> "SeenTokens":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, hidden_size), np.float32))

    def extend(self, mem: np.ndarray, unit_embeddings: Callable[[np.ndarray], np.ndarray]) -> None:
        """Take in ``mem[scanned:]``: the tokens not seen before, their embeddings in one batch."""
        new, first = [], []
        for j in range(self.scanned, len(mem)):
            t = int(mem[j])
            if t not in self.index:
                self.index.add(t)
                new.append(t)
                first.append(j)
        self.scanned = len(mem)
        if not new:
            return
        m = self.n + len(new)
        if m > len(self.tokens):
            cap = max(2 * len(self.tokens), m, 64)
            for name in ("tokens", "first", "units"):
                old = getattr(self, name)
                grown = np.zeros((cap, *old.shape[1:]), dtype=old.dtype)
                grown[: self.n] = old[: self.n]
                setattr(self, name, grown)
        self.tokens[self.n : m] = new
        self.first[self.n : m] = first
        self.units[self.n : m] = unit_embeddings(np.asarray(new, dtype=np.int64))
        self.n = m

    def upto(self, end: int) -> int:
        """How many distinct tokens ``mem[:end]`` holds (a prefix of the rows)."""
        return int(np.searchsorted(self.first[: self.n], end))


@dataclass
class AdaPLDState:
    """One sequence's memory: tokens, unit hidden states and the target's top-k per position.

    ``hidden[j]`` / ``top_ids[j]`` / ``top_probs[j]`` are known for ``j < known`` (the engine's
    context minus its last token, the root, whose row comes with the next verify pass)."""

    tokens: np.ndarray
    hidden: np.ndarray  # [cap, H] float32 unit vectors
    top_ids: np.ndarray  # [cap, k] int64
    top_probs: np.ndarray  # [cap, k] float32
    known: int
    rates: CopyRates  # main copy, by agreement n
    branch_rate: CopyRates
    successor_rate: CopyRates
    last: Proposal | None = None  # the last proposal, for observe
    anchors: dict[str, int] = field(default_factory=lambda: {"lexical": 0, "semantic": 0, "none": 0})
    # [P, H] final hidden states of the prefilled prompt positions (their logits on demand), or None
    prompt_final: torch.Tensor | None = None
    # [cap] bool: top_ids/top_probs of the position are filled
    has_top: np.ndarray | None = None
    # ([P, k] ids, [P, k] probabilities) of every prompt position, computed at once (prompt_logits)
    prompt_top: tuple[np.ndarray, np.ndarray] | None = None
    # the memory's distinct tokens and their unit embeddings (the semantic fallback), built on first use
    seen: SeenTokens | None = None

    def sync(self, context: Sequence[int]) -> np.ndarray:
        if len(context) > len(self.tokens):
            self.tokens = np.concatenate([self.tokens, np.asarray(context[len(self.tokens) :], dtype=np.int64)])
        return self.tokens

    def append_rows(self, hidden: np.ndarray, top_ids: np.ndarray, top_probs: np.ndarray, filled: bool = True) -> None:
        n = len(hidden)
        if self.known + n > len(self.hidden):
            cap = max(2 * len(self.hidden), self.known + n)
            for name in ("hidden", "top_ids", "top_probs"):
                old = getattr(self, name)
                new = np.zeros((cap, *old.shape[1:]), dtype=old.dtype)
                new[: self.known] = old[: self.known]
                setattr(self, name, new)
        self.hidden[self.known : self.known + n] = hidden
        self.top_ids[self.known : self.known + n] = top_ids
        self.top_probs[self.known : self.known + n] = top_probs
        if self.has_top is not None:
            if len(self.has_top) < len(self.hidden):
                self.has_top = np.concatenate([self.has_top, np.zeros(len(self.hidden) - len(self.has_top), dtype=bool)])
            self.has_top[self.known : self.known + n] = filled
        self.known += n


def unit_rows(h: torch.Tensor) -> np.ndarray:
    h = h.float()
    return (h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12)).cpu().numpy()


def top_rows(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    best = logits.float().topk(k, dim=-1)
    probs = (best.values - logits.float().logsumexp(dim=-1, keepdim=True)).exp()
    return best.indices.cpu().numpy(), probs.cpu().numpy()


def packed_top(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``[n, 2k]`` float32 on the logits' device: the top-k ids (exact below 2**24), then their
    probabilities, from one ``log_softmax`` (what :func:`rows_to_host` and
    ``AdaPLDDrafter.prompt_top`` copy to the host)."""
    best = torch.log_softmax(logits, dim=-1, dtype=torch.float32).topk(k, dim=-1)
    return torch.cat([best.indices.float(), best.values.exp()], dim=-1)


def rows_to_host(logits: torch.Tensor, hidden: torch.Tensor | None, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(*top_rows(logits, k), unit_rows(hidden))`` with one device-to-host copy instead of three (two
    without ``hidden``, which gives None for it).

    On a GPU each ``.cpu()`` waits for the device; the verified rows' top-k ids (exact in
    float32 below 2**24), probabilities and unit hidden states travel packed in one
    ``[n, 2k + H]`` float32 tensor, and the probabilities come from one ``log_softmax`` (a fused
    kernel) instead of ``logsumexp``'s several. On an H200 (bf16 rows of a 151,936-token
    vocabulary): 0.29-0.42 ms for 1-8 rows against 0.40-0.66 ms for the twin's three copies; on
    a 2-core Zen 5 0.28-1.03 ms against 0.28-1.24 (``results-issue13/gpu-adapld-host``). The
    same ids as the twin and the same probabilities to 1e-4 (float32 sums over the vocabulary
    in another order; ``tests/unit/drafters/test_adapld.py``). They rank branches; verification never sees them.

    >>> ids, probs, units = rows_to_host(torch.tensor([[0.0, 2.0, 1.0]]), torch.tensor([[3.0, 4.0]]), 2)
    >>> ids.tolist(), [round(float(u), 3) for u in units[0]]
    ([[1, 2]], [0.6, 0.8])
    """
    if logits.shape[-1] >= 1 << 24:  # ids would not be exact in float32
        ids, probs = top_rows(logits, k)
        return ids, probs, unit_rows(hidden) if hidden is not None else None
    parts = [packed_top(logits, k)]
    if hidden is not None:
        h = hidden.float().to(logits.device)
        parts.append(h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    packed = torch.cat(parts, dim=-1).cpu().numpy()
    units = np.ascontiguousarray(packed[:, 2 * k :]) if hidden is not None else None
    return packed[:, :k].astype(np.int64), np.ascontiguousarray(packed[:, k : 2 * k]), units


