"""AdaPLD: adaptive retrieval and reuse from prompt + output (source ``adapld``), as a small tree.

The AdaPLD paper (``papers/002_df5e16bbc617d809.txt``, section 3) drafts from the observed
context alone (prompt and generated tokens, the *memory* ``x_0 .. x_t``; ``x_t`` is the root):

1. **Anchors** (eq. 3-5): positions ``j < t`` with ``x_j == x_t`` (lexical); only when there is
   none, positions whose token's *input embedding* has cosine >= ``threshold`` with ``x_t``'s
   (semantic fallback).
2. **Reranking** (eq. 6-7): each candidate ``j`` is scored by the cosine between the target's
   hidden state at layer ``layer`` after ``x_{j-1}`` and the one after ``x_{t-1}`` (the contexts
   that *preceded* the anchor token and the query); the best one is the anchor ``a``.
3. **Main copy** (eq. 8-9), lexical anchors only: ``x_{a+1} .. x_{a+max_copy}`` (up to ``x_t``).
4. **Branches** (eq. 10-12): the ``branch_k`` most likely next tokens of the target's own
   distribution after ``x_a``, minus the main copy's first token, each a child of the root.
   For generated positions the verify pass computed that distribution and it is kept; for
   prompt positions the prefill keeps the final hidden states and the logits of an anchor are
   computed when it is first chosen (one row through an int8 copy of the output embedding on a
   CPU, ``anchor_logits``), not the prompt's whole ``[T, V]`` (on a 1,500-token prompt that
   costs ~3 s on the 2-core CPU); on a GPU, where one row costs what hundreds do, every prompt
   position's top-k is computed when the prompt's rows arrive (``prompt_logits``).
5. **Successors** (eq. 13-15): each branch token ``b`` is looked up like a query (lexical
   positions ``j`` with ``x_j == b``, else the semantic fallback), reranked by the cosine between
   the hidden state after ``x_{j-1}`` and the one after ``x_a`` (``b``'s context if it follows the
   anchor), and ``x_{j+1}`` becomes ``b``'s one child.

The tree is verified like any other (greedy or rejection-free sample-and-match: every node is
deterministic), so outputs are the target's.

**Choices where the paper is silent** (this machine: every verified row costs 5-15% of a step):

- *Which nodes to verify.* The paper verifies the whole tree (up to 30 + 8 + 8 nodes). Here each
  node gets an estimated acceptance probability and only nodes with ``p >= min_prob`` are
  proposed, best first, at most ``budget`` (``min_prob = 0`` gives the paper's whole tree, the
  ``adapld-full`` method): a main-copy node at depth ``d`` gets ``p(parent) * q(n, d)``, with
  ``n`` how many tokens before the anchor agree with the context before the query (1-3) and
  ``q`` PLD's learned copy rates (``drafters/pld.py``); a branch ``b`` gets
  ``min(1, c * p_target(b | x_<=a))``, with ``c`` learned online (how often branches are right
  against what the anchor's distribution promised); a successor ``p(branch) * s``, ``s`` its
  learned rate. All rates start from priors and learn per request (or across requests with
  ``Learning.SHARED``).
- *What is computed for nodes under the cut.* A branch's estimate ``c * q`` never exceeds ``c``,
  so while ``c < min_prob`` a prompt anchor's distribution (a row of the output embedding, ~21 ms
  in fp32 and ~6 ms in int8 on a 2-core Zen 5, most of the drafting) is not computed and it gets
  no branches;
  a generated anchor's distribution came with its verify pass, so its branches are still built
  and ``c`` keeps learning from them. A successor under the cut is looked up only if its branch
  turns out right (``observe``, to learn ``s``); ``lazy=False`` builds them all and cuts after,
  with the same trees and rates.
- *Semantic threshold.* The text lost its value; the paper's sweep (0.0-0.8) found low to
  moderate thresholds alike and high ones worse. ``threshold = 0.5`` here, from Qwen2.5-Coder-1.5B's
  input embeddings: 1,000 random token pairs have cosine median 0.16, p95 0.35, p99 0.44, while
  variants of one word sit above 0.5 (``" return"``/``"return"`` 0.78, ``" cat"``/``" cats"``
  0.69, ``"("``/``" ("`` 0.59, ``" run"``/``" running"`` 0.54; ``" the"``/``"The"`` 0.33 falls
  below); a threshold of 0.3 would admit about one random token in ten.
- *Reranking layer.* Table 6 takes each model's layer from PLD+'s sweep (the layer whose
  reranking best predicts the continuation on held-out text). ``RERANK_LAYERS`` holds the
  result of the same sweep for the catalog models (``specgraft.calibration.rerank_layer``;
  ``benchmarks/experiments/adapld-reader/adapld_layer_sweep.py``); other models get ``num_layers // 3`` (Table 6's
  Vicuna layers lie at 0.18-0.33 of the depth).

Example: memory ``[5, 7, 1, 9, 5, 7, 2, 8, 5]`` (root ``x_8 = 5``). Lexical anchors of ``5``: 0
and 4; reranking prefers 4 if the state after ``x_3 = 9`` looks more like the one after ``x_7 =
8`` than the (absent) one before position 0 does. Main copy from 4: ``7, 2, 8, 5``; branches:
the target's top tokens after ``x_4`` other than ``7``, say ``3``; successor of ``3``: the token
after the best earlier ``3``, if any.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, NamedTuple, Sequence

import numpy as np
import torch

from specgraft.config import GenerationConfig
from specgraft.drafters.base import Learning, StatelessDrafter
from specgraft.drafters.pld import CopyRates, prune
from specgraft.types import Draft, PrefillOutput, PrefillRequest, StepResult

#: Reranking layer per model signature ``(model_type, num_layers, hidden_size)``, from the
#: sweep in ``benchmarks/experiments/adapld-reader/adapld_layer_sweep.py`` (PLD+'s protocol, AdaPLD Table 6).
#: Qwen2.5-Coder-1.5B (28 layers): 40 held-out texts, 1264 positions with two or more anchors;
#: mean accepted copy 0.595 with the most recent anchor, 0.92-1.00 reranked at any layer, best
#: at layer 21 (0.998; layer 9 = 28 // 3: 0.936), oracle 1.347.
RERANK_LAYERS: dict[tuple[str, int, int], int] = {("qwen2", 28, 1536): 21}

MAIN, BRANCH, SUCCESSOR = 0, 1, 2
KINDS = ("main", "branch", "successor")


def default_layer(model_type: str, num_layers: int, hidden_size: int) -> int:
    """The reranking layer for a model: the swept one, else a third of the depth (at least 1).

    >>> default_layer("llama", 2, 64)
    1
    """
    return RERANK_LAYERS.get((model_type, num_layers, hidden_size), max(1, min(num_layers - 1, num_layers // 3)))


@dataclass(frozen=True)
class AdaPLDConfig:
    max_copy: int = 30
    """Longest main copy (the paper's L = 30)."""
    branch_k: int = 8
    """Branch tokens from the anchor's next-token distribution (the paper's k = 8)."""
    threshold: float = 0.5
    """Cosine of input embeddings above which the semantic fallback takes a position (tau)."""
    layer: int | None = None
    """Hidden-state layer for reranking; None = ``default_layer`` for the target."""
    fallback: bool = True
    """Semantic fallback when no lexical anchor exists (off: ``adapld-no-fallback``)."""
    rerank: bool = True
    """Hidden-state reranking of anchors (off: the most recent anchor, as PLD)."""
    branches: bool = True
    """Branch tokens (off: ``adapld-no-branches``, which also has no successors)."""
    successors: bool = True
    """One successor per branch (off: ``adapld-no-successor``)."""
    min_prob: float = 0.1
    """Nodes whose estimated acceptance is below this are not proposed (0 = the whole tree)."""
    row_cost: float | None = None
    """Cost of a verified row relative to a one-row step: cut the tree where expected tokens
    per cost peaks, as ``PLDConfig.row_cost``; None = ``min_prob`` and the budget alone."""
    lazy: bool = True
    """Look up a successor only when it can pass ``min_prob`` (else only if its branch turns out
    right, in ``observe``, to learn from it); False builds every successor and cuts after (the
    plain twin: the same trees and rates, ``tests/test_adapld.py``)."""
    anchor_logits: str = "draft"
    """How a prompt anchor's next-token distribution (its branch tokens) is computed from its
    final hidden state: ``"draft"`` through the target's drafting head (``HFTarget.draft_head``:
    an int8 copy of the output embedding on a CPU, ~6 ms a row against ~21 ms), ``"exact"``
    through the target's own head (the plain twin). Branches only; verification is exact."""
    prompt_logits: str = "auto"
    """When a prompt anchor's next-token distribution is computed: ``"on-demand"``, the first
    time the position is an anchor whose branches can pass the cut (one row through the drafting
    head); ``"at-once"``, every prompt position's top-k when the prompt's rows arrive (chunks
    through the head, one copy to the host), read at first use, so the trees are on-demand's;
    ``"auto"``: at once when those rows are on a GPU, where one row's head and top-k cost what
    hundreds do (launch-bound), on demand on a CPU, where a 1,500-token prompt's logits cost ~3 s
    on two cores."""
    prior_first: tuple[float, ...] = (0.3, 0.5, 0.8)
    """Prior rate of the main copy's first token, by agreement n = 1, 2, >=3 before the anchor."""
    prior_later: tuple[float, ...] = (0.5, 0.7, 0.88)
    """Prior rate of a later main-copy token given its parent was right, by n."""
    prior_branch: float = 0.57
    """Prior ``c``: a branch is right ``c`` times as often as the anchor's distribution says.
    Measured with Qwen2.5-Coder-1.5B over 11 held-out prompts of the input-guided tasks, math and
    qa (408 steps, every branch of every step): 103 of 3,264 branches right against a summed
    anchor probability of 181, c = 0.57 (the anchor's context is not the query's)."""
    prior_successor: float = 0.3
    """Prior rate of a successor given its branch was right (measured as ``prior_branch``: 10 of
    32). The main copy's priors below measured within 0.07 of themselves there (e.g. a first
    token after n = 1: 61 of 237; later tokens after n >= 3: 271 of 297)."""
    prior_strength: float = 8.0
    """Pseudo-observations behind each prior."""

    def __post_init__(self) -> None:
        if self.max_copy < 1 or self.branch_k < 0:
            raise ValueError(f"max_copy must be >= 1 and branch_k >= 0, got {self.max_copy}, {self.branch_k}")
        if not -1.0 <= self.threshold <= 1.0:
            raise ValueError(f"threshold is a cosine in [-1, 1], got {self.threshold}")
        if not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"min_prob must lie in [0, 1), got {self.min_prob}")
        if self.row_cost is not None and not self.row_cost >= 0.0:
            raise ValueError(f"row_cost must be >= 0, got {self.row_cost}")
        if self.layer is not None and self.layer < 1:
            raise ValueError(f"layer must be >= 1 (a decoder layer's output), got {self.layer}")
        if self.anchor_logits not in ("draft", "exact"):
            raise ValueError(f"anchor_logits is 'draft' or 'exact', got {self.anchor_logits!r}")
        if self.prompt_logits not in ("auto", "on-demand", "at-once"):
            raise ValueError(f"prompt_logits is 'auto', 'on-demand' or 'at-once', got {self.prompt_logits!r}")
        if len(self.prior_first) != len(self.prior_later) or not self.prior_first:
            raise ValueError("prior_first and prior_later need the same, non-zero length")

    @property
    def lexical_only(self) -> bool:
        """No semantic fallback, no reranking, no branches: the most recent lexical anchor's main
        copy, which needs nothing of the target but token ids (the vLLM proposer,
        ``specgraft/integrations/vllm.py``).

        >>> AdaPLDConfig(fallback=False, rerank=False, branches=False).lexical_only
        True
        """
        return not (self.fallback or self.rerank or self.branches)


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


def _unit(h: torch.Tensor) -> np.ndarray:
    h = h.float()
    return (h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12)).cpu().numpy()


def _top(logits: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
    best = logits.float().topk(k, dim=-1)
    probs = (best.values - logits.float().logsumexp(dim=-1, keepdim=True)).exp()
    return best.indices.cpu().numpy(), probs.cpu().numpy()


def _packed_top(logits: torch.Tensor, k: int) -> torch.Tensor:
    """``[n, 2k]`` float32 on the logits' device: the top-k ids (exact below 2**24), then their
    probabilities, from one ``log_softmax`` (what :func:`_rows_to_host` and
    ``AdaPLDDrafter.prompt_top`` copy to the host)."""
    best = torch.log_softmax(logits, dim=-1, dtype=torch.float32).topk(k, dim=-1)
    return torch.cat([best.indices.float(), best.values.exp()], dim=-1)


def _rows_to_host(logits: torch.Tensor, hidden: torch.Tensor | None, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(*_top(logits, k), _unit(hidden))`` with one device-to-host copy instead of three (two
    without ``hidden``, which gives None for it).

    On a GPU each ``.cpu()`` waits for the device; the verified rows' top-k ids (exact in
    float32 below 2**24), probabilities and unit hidden states travel packed in one
    ``[n, 2k + H]`` float32 tensor, and the probabilities come from one ``log_softmax`` (a fused
    kernel) instead of ``logsumexp``'s several. On an H200 (bf16 rows of a 151,936-token
    vocabulary): 0.29-0.42 ms for 1-8 rows against 0.40-0.66 ms for the twin's three copies; on
    a 2-core Zen 5 0.28-1.03 ms against 0.28-1.24 (``results-issue13/gpu-adapld-host``). The
    same ids as the twin and the same probabilities to 1e-4 (float32 sums over the vocabulary
    in another order; ``tests/test_adapld.py``). They rank branches; verification never sees them.

    >>> ids, probs, units = _rows_to_host(torch.tensor([[0.0, 2.0, 1.0]]), torch.tensor([[3.0, 4.0]]), 2)
    >>> ids.tolist(), [round(float(u), 3) for u in units[0]]
    ([[1, 2]], [0.6, 0.8])
    """
    if logits.shape[-1] >= 1 << 24:  # ids would not be exact in float32
        ids, probs = _top(logits, k)
        return ids, probs, _unit(hidden) if hidden is not None else None
    parts = [_packed_top(logits, k)]
    if hidden is not None:
        h = hidden.float().to(logits.device)
        parts.append(h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12))
    packed = torch.cat(parts, dim=-1).cpu().numpy()
    units = np.ascontiguousarray(packed[:, 2 * k :]) if hidden is not None else None
    return packed[:, :k].astype(np.int64), np.ascontiguousarray(packed[:, k : 2 * k]), units


class AdaPLDDrafter(StatelessDrafter):
    """AdaPLD over the target's own hidden states and input embeddings (source ``adapld``).

    ``embeddings`` is the target's ``[V, H]`` input embedding matrix (the semantic fallback);
    ``layer`` the decoder layer whose hidden states rerank anchors (``HFTarget`` returns them
    for the prompt at prefill and for every verified row). A ``config.lexical_only`` drafter
    needs neither (``embeddings=None``): it reads token ids alone and asks the target for nothing.
    """

    name: ClassVar[str] = "adapld"
    needs_hidden: ClassVar[bool] = True
    # a fused start (``SpecEngine.start``) may deliver the prompt's hidden states with the first
    # step: the first tree then anchors at the most recent lexical match (nothing to rerank with
    # yet) and has no branches, as any step whose anchor has no hidden state
    deferred_prefill: ClassVar[bool] = True

    def __init__(
        self,
        embeddings: torch.Tensor | None,
        layer: int,
        config: AdaPLDConfig = AdaPLDConfig(),
        learning: Learning = Learning.REQUEST,
        logits_of: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.config = config
        # final hidden states [n, H] -> logits [n, V]: the target's drafting head or its own (anchor_logits)
        self.logits_of = logits_of
        self.hidden_layer = layer
        if embeddings is None and not config.lexical_only:
            raise ValueError("AdaPLD's semantic fallback, reranking and branches need the target's input embeddings")
        # [V, H], or None (lexical only)
        self.embeddings = embeddings.detach() if embeddings is not None else None
        self.learning = Learning(learning)
        c = config
        self.rates = CopyRates(c.prior_first, c.prior_later, c.prior_strength)
        self.branch_rate = CopyRates((c.prior_branch,), (c.prior_branch,), c.prior_strength)
        self.successor_rate = CopyRates((c.prior_successor,), (c.prior_successor,), c.prior_strength)
        # token id -> unit input embedding (a model constant: shared, read-only after first use)
        self._unit_embedding: dict[int, np.ndarray] = {}

    @property
    def top_k(self) -> int:
        return max(self.config.branch_k + 1, 1)

    def prefill_request(self) -> PrefillRequest:
        if self.config.lexical_only:
            return PrefillRequest()
        if self.logits_of is not None:
            return PrefillRequest(hidden=True, hidden_layer=self.hidden_layer, final_hidden=self.config.branches)
        return PrefillRequest(topk=self.top_k, hidden=True, topk_probs=True, hidden_layer=self.hidden_layer)

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> AdaPLDState:
        shared = self.learning is Learning.SHARED
        state = AdaPLDState(
            tokens=np.asarray(prompt, dtype=np.int64),
            hidden=np.zeros((0, self.embeddings.shape[1] if self.embeddings is not None else 0), dtype=np.float32),
            top_ids=np.zeros((0, self.top_k), dtype=np.int64),
            top_probs=np.zeros((0, self.top_k), dtype=np.float32),
            known=0,
            rates=self.rates if shared else self.rates.copy(),
            branch_rate=self.branch_rate if shared else self.branch_rate.copy(),
            successor_rate=self.successor_rate if shared else self.successor_rate.copy(),
        )
        if len(prompt) > 1 and not self.config.lexical_only and not prefill.deferred:
            self.take_prefill(state, prefill)
        return state

    def take_prefill(self, state: AdaPLDState, prefill: PrefillOutput) -> None:
        """The prompt's rows of the memory (hidden states, and the top-k or the final hidden
        states it is computed from), from the prefill or, on a fused start, the first step; a
        long prompt's come in two parts (its whole prefill chunks at begin, the rest with the
        first step: ``SpecEngine.fused_head``), appended in order."""
        if prefill.hidden is None:
            raise ValueError("AdaPLD needs the prefill's hidden states (prefill_request)")
        n = len(prefill.hidden)
        ids = np.zeros((n, self.top_k), dtype=np.int64)
        probs = np.zeros((n, self.top_k), dtype=np.float32)
        if prefill.final_hidden is not None:
            # the prompt's logits are read on first use (top_of), computed then or now
            if state.prompt_final is not None and len(state.prompt_final) != state.known:
                raise ValueError(f"AdaPLD got prompt rows after {state.known} rows of its memory, "
                                 f"{len(state.prompt_final)} of them the prompt's: they must follow the prompt's first part")
            first = state.prompt_final is None
            state.prompt_final = prefill.final_hidden if first else torch.cat([state.prompt_final, prefill.final_hidden])
            if first:
                state.has_top = np.zeros(n, dtype=bool)
            mode = self.config.prompt_logits
            if self.config.branches and (mode == "at-once" or (mode == "auto" and prefill.final_hidden.device.type != "cpu")):
                top = self.prompt_top(prefill.final_hidden)
                if state.prompt_top is not None:
                    top = (np.concatenate([state.prompt_top[0], top[0]]), np.concatenate([state.prompt_top[1], top[1]]))
                state.prompt_top = top
            state.append_rows(_unit(prefill.hidden), ids, probs, filled=False)
            return
        if prefill.topk is not None and prefill.topk_probs is not None:
            k = min(self.top_k, prefill.topk.shape[1])
            ids[:, :k], probs[:, :k] = prefill.topk[:, :k].numpy(), prefill.topk_probs[:, :k].numpy()
        elif self.config.branches:
            raise ValueError("AdaPLD's branches need the prefill's top-k or final hidden states (prefill_request)")
        state.append_rows(_unit(prefill.hidden), ids, probs)

    @staticmethod
    def has_top(state: AdaPLDState, a: int) -> bool:
        """Whether the target's top-k after position ``a`` is at hand (a generated position, or a
        prompt position whose logits were computed)."""
        return state.has_top is None or a >= len(state.has_top) or bool(state.has_top[a])

    def prompt_top(self, final: torch.Tensor, chunk: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """``[P, k]`` top-k ids and probabilities of every prompt position from its final hidden
        state ``final`` ``[P, H]`` (``prompt_logits="at-once"``): ``chunk`` rows at a time through
        the drafting head, one copy to the host at the end."""
        if self.logits_of is None:
            raise ValueError("AdaPLD's prompt logits need the target's logits_of")
        parts = [_packed_top(self.logits_of(final[i : i + chunk]), self.top_k) for i in range(0, len(final), chunk)]
        if not parts:
            return np.zeros((0, self.top_k), np.int64), np.zeros((0, self.top_k), np.float32)
        packed = torch.cat(parts).cpu().numpy()
        return packed[:, : self.top_k].astype(np.int64), np.ascontiguousarray(packed[:, self.top_k :])

    def top_of(self, state: AdaPLDState, a: int) -> tuple[np.ndarray, np.ndarray]:
        """The target's top-k ids and probabilities after position ``a`` (read on first use for a
        prompt position, computed then unless ``prompt_top`` was; kept from the verify pass for
        a generated one)."""
        if state.has_top is not None and a < len(state.has_top) and not state.has_top[a]:
            if state.prompt_top is not None:
                state.top_ids[a], state.top_probs[a] = state.prompt_top[0][a], state.prompt_top[1][a]
            else:
                if self.logits_of is None or state.prompt_final is None:
                    raise ValueError(f"AdaPLD has no logits for prompt position {a}: build it with the target's logits_of")
                ids, probs, _ = _rows_to_host(self.logits_of(state.prompt_final[a : a + 1]), None, self.top_k)
                state.top_ids[a], state.top_probs[a] = ids[0], probs[0]
            state.has_top[a] = True
        return state.top_ids[a], state.top_probs[a]

    # -- retrieval ---------------------------------------------------------------------------

    def unit_embeddings(self, tokens: np.ndarray) -> np.ndarray:
        """``[n, H]`` unit input embeddings of ``tokens`` (cached per token id)."""
        missing = [int(t) for t in np.unique(tokens) if int(t) not in self._unit_embedding]
        if missing:
            rows = _unit(self.embeddings[torch.as_tensor(missing, device=self.embeddings.device)])
            self._unit_embedding.update(zip(missing, rows, strict=True))
        return np.stack([self._unit_embedding[int(t)] for t in tokens]) if len(tokens) else np.zeros((0, self.embeddings.shape[1]), np.float32)

    def candidates(self, state: AdaPLDState, mem: np.ndarray, query: int, end: int) -> tuple[np.ndarray, bool]:
        """Positions ``j < end`` to anchor ``query`` at, and whether they are lexical (eq. 3-5):
        the earlier positions of ``query`` itself, else (the semantic fallback) those of every
        distinct earlier token whose input embedding has cosine >= ``threshold`` with it. The
        distinct tokens and their embeddings are kept in ``state.seen`` as the memory grows;
        :meth:`candidates_plain` is the twin that recomputes them at every call."""
        lexical = np.flatnonzero(mem[:end] == query)
        if len(lexical) or not self.config.fallback or end == 0:
            return lexical, True
        if state.seen is None:
            state.seen = SeenTokens.empty(self.embeddings.shape[1])
        state.seen.extend(mem, self.unit_embeddings)
        k = state.seen.upto(end)
        sims = state.seen.units[:k] @ self.unit_embeddings(np.array([query]))[0]
        close = state.seen.tokens[:k][sims >= self.config.threshold]
        return np.flatnonzero(np.isin(mem[:end], close)), False

    def candidates_plain(self, mem: np.ndarray, query: int, end: int) -> tuple[np.ndarray, bool]:
        """:meth:`candidates` computed from scratch (the distinct tokens of ``mem[:end]`` and all
        their embeddings at every call): the plain twin the tests compare it with."""
        lexical = np.flatnonzero(mem[:end] == query)
        if len(lexical) or not self.config.fallback or end == 0:
            return lexical, True
        uniq = np.unique(mem[:end])
        sims = self.unit_embeddings(uniq) @ self.unit_embeddings(np.array([query]))[0]
        close = uniq[sims >= self.config.threshold]
        return np.flatnonzero(np.isin(mem[:end], close)), False

    def select(self, state: AdaPLDState, cands: np.ndarray, reference: int) -> int:
        """The candidate whose preceding hidden state is closest to ``hidden[reference]`` (eq. 6-7,
        13-14); ties and ``rerank=False``: the most recent. A candidate at position 0 has no
        preceding state and ranks last."""
        if not self.config.rerank or reference < 0 or reference >= state.known:
            return int(cands[-1])
        prev = cands - 1
        usable = (prev >= 0) & (prev < state.known)
        if not usable.any():
            return int(cands[-1])
        scores = np.full(len(cands), -2.0, dtype=np.float32)
        scores[usable] = state.hidden[prev[usable]] @ state.hidden[reference]
        # the last maximum: most recent on ties
        return int(cands[len(scores) - 1 - int(np.argmax(scores[::-1]))])

    @staticmethod
    def agreement(mem: np.ndarray, a: int, t: int, cap: int = 3) -> int:
        """How many tokens up to the anchor agree with those up to the query (1 .. cap).

        >>> AdaPLDDrafter.agreement(np.array([4, 5, 9, 4, 5]), 1, 4)
        2
        """
        n = 1
        while n < cap and a - n >= 0 and mem[a - n] == mem[t - n]:
            n += 1
        return n

    # -- the tree ----------------------------------------------------------------------------

    def propose(self, state: AdaPLDState, context: Sequence[int], budget: int) -> Draft:
        mem = state.sync(context)
        cfg = self.config
        t = len(mem) - 1  # the root's position
        tokens: list[int] = []
        parents: list[int] = []
        kinds: list[int] = []
        keys: list[tuple[int, int, float]] = []
        probs: list[float] = []
        state.last = None
        cands, lexical = self.candidates(state, mem, int(mem[t]), t)
        if not len(cands):
            state.anchors["none"] += 1
            return Draft(source=self.name, tokens=[], parents=[], scores=[])
        state.anchors["lexical" if lexical else "semantic"] += 1
        a = self.select(state, cands, t - 1)
        main_first = None
        if lexical:
            n = self.agreement(mem, a, t)
            p, parent = 1.0, -1
            for d, tok in enumerate(mem[a + 1 : min(a + cfg.max_copy, t) + 1].tolist(), start=1):
                p *= state.rates.rate(n, d)
                tokens.append(int(tok))
                parents.append(parent)
                kinds.append(MAIN)
                keys.append((n, d, 1.0))
                probs.append(p)
                parent = len(tokens) - 1
            main_first = tokens[0] if tokens else None
        deferred: list[tuple[int, int]] = []  # (branch node, branch token): successor looked up in observe
        if cfg.branches and a < state.known and (state.branch_rate.rate(1, 1) >= cfg.min_prob or self.has_top(state, a)):
            c = state.branch_rate.rate(1, 1)
            s = state.successor_rate.rate(1, 1)
            top_ids, top_probs = self.top_of(state, a)
            branch_ids = [(int(b), float(q)) for b, q in zip(top_ids, top_probs, strict=True) if int(b) != main_first]
            for b, q in branch_ids[: cfg.branch_k]:
                node = len(tokens)
                p_b = min(1.0, c * q)
                tokens.append(b)
                parents.append(-1)
                kinds.append(BRANCH)
                keys.append((1, 1, q))
                probs.append(p_b)
                if not cfg.successors:
                    continue
                if cfg.lazy and p_b * s < cfg.min_prob:
                    deferred.append((node, b))  # below the cut: not proposed, only learned from
                    continue
                succ = self.successor(state, mem, b, a, t)
                if succ is not None:
                    tokens.append(succ)
                    parents.append(node)
                    kinds.append(SUCCESSOR)
                    keys.append((1, 2, 1.0))
                    probs.append(p_b * s)
        # a child never beats its parent (rates <= 1), so dropping p < min_prob keeps a tree
        keep = prune(parents, probs, [i for i in range(len(tokens)) if probs[i] >= cfg.min_prob], budget, cfg.row_cost)
        state.last = Proposal(tokens, parents, kinds, keys, deferred, a, t)
        return Draft(source=self.name, tokens=tokens, parents=parents, scores=probs).subset(keep)

    def successor(self, state: AdaPLDState, mem: np.ndarray, branch: int, anchor: int, t: int) -> int | None:
        """The one successor of branch token ``branch`` (eq. 13-15): the token after the earlier
        position of ``branch`` (lexical first, else the semantic fallback) whose preceding state
        is closest to the anchor's; None when ``branch`` has no earlier position."""
        cands, _ = self.candidates(state, mem, branch, t)  # x_{j+1} must exist: j <= t - 1
        if not len(cands):
            return None
        return int(mem[self.select(state, cands, anchor) + 1])

    # -- learning ----------------------------------------------------------------------------

    def observe(self, state: AdaPLDState, step: StepResult) -> None:
        """Extend the memory with the verified rows' hidden states and top-k; learn the rates."""
        truth = step.new_tokens
        last = state.last
        if last is not None and len(truth) >= 2:
            # successors left out of the tree (below the cut) of branches that were right
            for _, b in last.deferred:
                if b == truth[0]:
                    succ = self.successor(state, state.tokens, b, last.anchor, last.root)
                    if succ is not None:
                        state.successor_rate.record(1, 1, succ == truth[1])
        if not self.config.lexical_only:
            if step.prefill is not None:  # a fused start: the prompt's rows come first
                self.take_prefill(state, step.prefill)
            rows = [0, *(i + 1 for i in step.verify.accepted)]
            if step.hidden is None:
                raise ValueError("AdaPLD needs the verify pass's hidden states (needs_hidden)")
            idx = torch.as_tensor(rows, device=step.logits.device)
            ids, probs, units = _rows_to_host(step.logits[idx], step.hidden[idx.to(step.hidden.device)], self.top_k)
            state.append_rows(units, ids, probs)
        state.sync(step.context)
        if last is None:
            return
        tokens, parents, kinds, keys = last.tokens, last.parents, last.kinds, last.keys
        state.last = None
        right = [False] * len(tokens)
        for i, p in enumerate(parents):
            n, d, weight = keys[i]
            if not (p < 0 or right[p]) or d > len(truth):
                continue
            right[i] = hit = tokens[i] == truth[d - 1]
            if kinds[i] == MAIN:
                state.rates.record(n, d, hit)
            elif kinds[i] == BRANCH:
                state.branch_rate.record(1, 1, hit, weight=weight)
            else:
                state.successor_rate.record(1, 1, hit)


def build_adapld(target: Any, config: AdaPLDConfig, learning: Learning = Learning.REQUEST) -> AdaPLDDrafter:
    """An :class:`AdaPLDDrafter` for an :class:`~specgraft.models.hf.HFTarget` (its embeddings and
    layer count; the layer from ``config.layer`` or :func:`default_layer`)."""
    num_layers = int(target.num_layers)
    if num_layers < 2:
        raise ValueError(f"AdaPLD reranks with a hidden layer below the last; {target.name!r} has {num_layers} layer(s)")
    layer = config.layer
    if layer is None:
        cfg = target.config
        layer = default_layer(str(getattr(cfg, "model_type", "")), num_layers, int(getattr(cfg, "hidden_size", 0)))
    if not 1 <= layer < num_layers:
        raise ValueError(f"AdaPLD layer {layer} is not in 1 .. {num_layers - 1} for {target.name!r}")
    head = target.logits_of
    if config.anchor_logits == "draft" and config.branches and hasattr(target, "draft_head"):
        head = target.draft_head()
    return AdaPLDDrafter(target.input_embeddings(), layer, config, learning, logits_of=head)
