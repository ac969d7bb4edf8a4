"""Typed objects passed between the stages of one speculative step.

Glossary of tensor dimensions used in shape comments throughout the package:

- ``N``: number of tree nodes (the root is *not* a node; it is row 0 of a verify pass)
- ``V``: vocabulary size
- ``S``: committed sequence length (tokens whose KV is cached)
- ``D``: maximum tree depth (a child of the root has depth 1)
- ``H``: hidden size
- ``P``: rows of a draft-probability table (one per parent whose children were sampled)
- ``B``: sequences (cache slots) in one forward

A **probe** node is fed to the target in the verify pass only for its logits (PTD's
perturbation draft tree): it is never accepted, never committed and never counted as a
candidate. A probe's children are probes; a node that is both a candidate and a probe (a
candidate with the same parent and token) is a candidate whose logits the prober also reads.

Example of one step with the root token ``7``, a draft chain ``[5, 9]`` and a branch ``[6]``::

    tree = DraftTree(tokens=[5, 9, 6], parents=[-1, 0, -1], sources=["pld"] * 3)
    # verify pass rows: 0 = root (7), 1 = node 0 (5), 2 = node 1 (9), 3 = node 2 (6)
    # if the target's argmax after 7 is 5 and after 5 is 9 and after 9 is 4:
    #   accepted nodes [0, 1], bonus token 4, tokens this step = 3
"""

from __future__ import annotations

from collections import Counter
import dataclasses
from dataclasses import dataclass, field
from numbers import Integral
from typing import ClassVar, Sequence

import torch


class _Nodes:
    """What :class:`Draft` and :class:`DraftTree` share: per-node lists, checks, subsets."""

    #: Fields holding one entry per node (None when absent), subset together by :meth:`subset`.
    PER_NODE: ClassVar[tuple[str, ...]] = ("tokens", "scores", "prob_rows", "probe")

    tokens: list[int]
    parents: list[int]
    draft_probs: torch.Tensor | None
    prob_rows: list[int] | None
    probe: list[bool] | None

    def _check(self) -> None:
        check_nodes(self.tokens, self.parents, self.probe)
        n = len(self.tokens)
        for name in self.PER_NODE:
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{len(value)} {name} for {n} nodes")
        if (self.draft_probs is None) != (self.prob_rows is None):
            missing = "prob_rows" if self.prob_rows is None else "draft_probs"
            raise ValueError(f"draft_probs and prob_rows go together (a table of rows and each node's row in it); {missing} is missing")
        if self.prob_rows is not None:
            rows = self.draft_probs.shape[0]
            if any(not -1 <= r < rows for r in self.prob_rows):
                raise ValueError(f"prob_rows must index the {rows} draft_probs rows (or be -1), got {self.prob_rows}")

    def __len__(self) -> int:
        return len(self.tokens)

    def is_probe(self, i: int) -> bool:
        return self.probe is not None and self.probe[i]

    def subset(self, keep: Sequence[int]):
        """The nodes ``keep`` (ascending, closed under parents), reindexed; everything else as is.

        >>> Draft("pld", tokens=[5, 9, 4], parents=[-1, 0, -1], scores=[0.9, 0.5, 0.2]).subset([0, 2])
        Draft(source='pld', tokens=[5, 4], parents=[-1, -1], scores=[0.9, 0.2], draft_probs=None, prob_rows=None, probe=None, anchor=())
        """
        keep = list(keep)
        fields = {name: [getattr(self, name)[i] for i in keep] for name in self.PER_NODE if getattr(self, name) is not None}
        return dataclasses.replace(self, parents=reindex(self.parents, keep), **fields)


@dataclass
class Draft(_Nodes):
    """Candidates from one drafter, already shaped as a tree rooted at the root token.

    A chain ``[a, b, c]`` is ``tokens=[a, b, c], parents=[-1, 0, 1]``.
    ``scores`` (optional) rank nodes when several drafts compete for the budget: higher is
    kept first.

    ``draft_probs`` and ``prob_rows`` (optional, together) say which distribution each node was
    *sampled* from: ``draft_probs[prob_rows[i]]`` for node ``i``, ``prob_rows[i] = -1`` for a
    node that was not sampled. Siblings drawn together share one row (the draft model's
    distribution at their parent), so the table has a row per sampling parent, not per node.
    Only drafters that really sample their candidates set them; they enable multi-candidate
    rejection sampling (``verify/sampling.py`` states the contract).

    ``anchor`` hangs the draft below the root: its children of the root become children of
    the node reached from the root by that token path (Graft's TAIL, READER's deepening). A
    merge drops an anchored draft whose anchor path is not in the tree.

    Invariants (``ValueError`` when broken, also under ``python -O``): a parent comes before
    its children, siblings carry distinct tokens, token ids are >= 0, and the optional
    per-node lists have one entry per node.
    """

    source: str
    # [N]
    tokens: list[int]
    # [N], -1 = child of the root; parents[i] < i
    parents: list[int]
    # [N] or None
    scores: list[float] | None = None
    # [P, V] or None: the distributions nodes were sampled from, one row per sampling parent
    draft_probs: torch.Tensor | None = None
    # [N] or None: node i was sampled from draft_probs[prob_rows[i]]; -1 = not sampled
    prob_rows: list[int] | None = None
    # [N] or None: True = probe node (fed for its logits only, see the module docstring)
    probe: list[bool] | None = None
    # the token path from the root to the node this draft hangs from; () = the root itself
    anchor: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        self._check()
        if any(not isinstance(t, Integral) or t < 0 for t in self.anchor):
            raise ValueError(f"anchor must be a path of token ids >= 0, got {self.anchor}")

    @staticmethod
    def chain(source: str, tokens: Sequence[int]) -> "Draft":
        return Draft(source=source, tokens=list(tokens), parents=list(range(-1, len(tokens) - 1)))


@dataclass
class DraftTree(_Nodes):
    """The merged tree that the target verifies in one forward pass.

    Nodes are in topological order (a parent before its children); siblings carry distinct
    tokens (merging deduplicates shared prefixes); both are checked on construction
    (``ValueError``), like the token ids (>= 0 here, < vocab in :meth:`check_vocab`).
    ``sources[i]`` names the drafter that proposed node ``i`` (the first one, when several
    proposed the same prefix). ``draft_probs``/``prob_rows`` as in :class:`Draft`; the merge
    keeps a node's row only where rejection sampling is exact (``tree/build.py``).
    """

    PER_NODE: ClassVar[tuple[str, ...]] = ("tokens", "sources", "scores", "prob_rows", "probe")

    # [N]
    tokens: list[int]
    # [N]
    parents: list[int]
    # [N]
    sources: list[str]
    # [P, V] or None: see Draft.draft_probs
    draft_probs: torch.Tensor | None = None
    # [N] or None: see Draft.prob_rows
    prob_rows: list[int] | None = None
    # [N] or None
    scores: list[float] | None = None
    # [N] or None: True = probe node (fed for its logits only, see the module docstring)
    probe: list[bool] | None = None

    def __post_init__(self) -> None:
        self._check()

    def check_vocab(self, vocab_size: int) -> None:
        """``ValueError`` unless every token id lies in ``[0, vocab_size)`` (ids >= 0 are checked
        on construction; the vocabulary is known only where logits are)."""
        if self.tokens and max(self.tokens) >= vocab_size:
            bad = next(t for t in self.tokens if t >= vocab_size)
            raise ValueError(f"tree token id {bad} is outside the vocabulary [0, {vocab_size})")

    @staticmethod
    def empty() -> "DraftTree":
        return DraftTree(tokens=[], parents=[], sources=[])

    @property
    def num_candidates(self) -> int:
        """Nodes the verifier may accept (every node but the probes)."""
        return len(self) - (sum(self.probe) if self.probe is not None else 0)

    def children(self) -> list[list[int]]:
        """``children()[p + 1]`` lists the candidate children of node ``p`` (index 0 is the root);
        probe nodes are left out (verifiers never follow them)."""
        out: list[list[int]] = [[] for _ in range(len(self) + 1)]
        for i, p in enumerate(self.parents):
            if not self.is_probe(i):
                out[p + 1].append(i)
        return out


@dataclass(frozen=True)
class PrefillRequest:
    """What drafters want from the prefill of a prompt besides the cache (the union of every drafter's)."""

    topk: int = 0
    """Successor ids per prompt position (Token Recycling fills its matrix from them)."""
    hidden: bool = False
    """Hidden states per prompt position (of layer ``hidden_layer``)."""
    topk_probs: bool = False
    """Also the target's probabilities of those successors (AdaPLD's branch tokens)."""
    hidden_layer: int | None = None
    """Which hidden states: ``None`` = the final layer's, after the final norm; ``l`` in
    ``1 .. num_layers - 1`` = the output of decoder layer ``l`` (AdaPLD reranks at one layer)."""
    final_hidden: bool = False
    """Also the final layer's hidden states (after the final norm), from which a drafter can
    compute the logits of the few positions it needs (``HFTarget.logits_of``) instead of the
    whole prompt's ``[T, V]``."""

    @property
    def fusable(self) -> bool:
        """Whether a fused start's first forward can deliver it (``SpecEngine.start``): hidden
        states of any layer come with every forward; successor top-k would need the prompt's
        ``[T, V]`` logits, which a fused forward does not compute.

        >>> PrefillRequest(hidden=True, hidden_layer=3, final_hidden=True).fusable, PrefillRequest(topk=8).fusable
        (True, False)
        """
        return self.topk == 0 and not self.topk_probs

    def union(self, other: "PrefillRequest") -> "PrefillRequest":
        """
        >>> PrefillRequest(topk=8).union(PrefillRequest(hidden=True))
        PrefillRequest(topk=8, hidden=True, topk_probs=False, hidden_layer=None, final_hidden=False)
        """
        if self.hidden and other.hidden and self.hidden_layer != other.hidden_layer:
            raise ValueError(f"drafters ask for hidden states of two layers ({self.hidden_layer} and {other.hidden_layer})")
        return PrefillRequest(
            max(self.topk, other.topk),
            self.hidden or other.hidden,
            self.topk_probs or other.topk_probs,
            self.hidden_layer if self.hidden else other.hidden_layer,
            self.final_hidden or other.final_hidden,
        )


@dataclass
class PrefillOutput:
    """What a prefill returns for the prefilled tokens (every prompt token but the last)."""

    # [T, topk] successor ids of every prefilled token, or None
    topk: torch.Tensor | None = None
    # [T, H] hidden states (of the requested layer), or None
    hidden: torch.Tensor | None = None
    # [T, topk] float32 target probabilities of those successors, or None
    topk_probs: torch.Tensor | None = None
    # [T, H] final-layer hidden states (after the final norm), or None
    final_hidden: torch.Tensor | None = None
    # seconds spent on ``topk`` (the whole prompt's logits and their top-k), beyond the cache
    # fill itself: what a drafter marked ``prefill_optional`` costs a sequence at its start
    topk_s: float = 0.0
    # True on a fused start (``SpecEngine.start``): the prompt was not prefilled apart and the
    # fields asked for arrive with the first step, as ``StepResult.prefill`` (only drafters
    # with ``deferred_prefill`` get this)
    deferred: bool = False


@dataclass
class RowsOutput:
    """Result of feeding rows to a model: one logits row (and hidden state) per fed row."""

    # [n, V] float32
    logits: torch.Tensor
    # [n, H] or None: hidden states when asked for (the final layer's after the final norm, or
    # decoder layer ``hidden_layer``'s output)
    hidden: torch.Tensor | None = None
    # what ``forward_batch(fill_outputs=True)`` returns of the rows fed before ``logits_from``
    # (a fused start's prompt): their hidden states and final hidden states, or None
    fill: PrefillOutput | None = None


@dataclass
class VerifyResult:
    """What a verifier decided: the kept path and the bonus token.

    ``accepted`` lists node indices from the root downwards, e.g. ``[0, 3]`` when node 0 and
    its child node 3 were accepted. ``bonus_token`` is the target's own token after the last
    accepted node (or after the root when nothing was accepted).
    """

    accepted: list[int]
    bonus_token: int


@dataclass
class StepResult:
    """Everything drafters may learn from after a verify pass (``Drafter.observe``)."""

    root_token: int
    tree: DraftTree
    verify: VerifyResult
    # [N + 1, V]: target logits of the root (row 0) and of every node (row i + 1)
    logits: torch.Tensor
    # committed tokens after this step, prompt included (the engine's live list: read only)
    context: list[int]
    # [N + 1, H] or None: target hidden states (of the drafters' ``hidden_layer``), for drafters
    # with needs_hidden
    hidden: torch.Tensor | None = None
    # the first step of a fused start whose drafters' prefill was deferred: the prompt's outputs
    # (every prompt token but the last, as a prefill returns them); None otherwise
    prefill: PrefillOutput | None = None

    @property
    def new_tokens(self) -> list[int]:
        return [self.tree.tokens[i] for i in self.verify.accepted] + [self.verify.bonus_token]


@dataclass
class GenerationStats:
    """Counters for one generation. MAT (mean accepted tokens per step) counts the bonus token."""

    method: str = ""
    prompt_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0
    # tokens per step (accepted + bonus) -> how many steps
    tokens_per_step: Counter = field(default_factory=Counter)
    # source -> nodes proposed / nodes accepted
    proposed_by_source: Counter = field(default_factory=Counter)
    accepted_by_source: Counter = field(default_factory=Counter)
    tree_nodes: int = 0
    """Nodes fed to the target over all steps, probes included (verify-pass rows minus the root)."""
    probe_nodes: int = 0
    """Probe nodes fed over all steps (PTD's perturbation tree); not candidates."""
    last_step_tokens: int = 0
    prefill_s: float = 0.0
    """The target's prefill of the prompt and the drafters' catch-up prefills; with a fused start
    (``SpecEngine.start``) the first step's whole forward, which carries the prompt."""
    draft_s: float = 0.0
    forward_s: float = 0.0
    verify_s: float = 0.0
    commit_s: float = 0.0
    observe_s: float = 0.0
    total_s: float = 0.0

    @property
    def mat(self) -> float:
        """Mean tokens per step, bonus token included."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def overhead_s(self) -> float:
        """Step time spent outside the target forward: draft + verify rule + commit + observe."""
        return self.draft_s + self.verify_s + self.commit_s + self.observe_s

    @property
    def overhead_fraction(self) -> float:
        """Share of the decoding steps' time that is not the target forward."""
        steps_s = self.overhead_s + self.forward_s
        return self.overhead_s / steps_s if steps_s > 0 else 0.0

    def acceptance_by_source(self) -> dict[str, float]:
        return {
            s: self.accepted_by_source[s] / n for s, n in sorted(self.proposed_by_source.items()) if n
        }

    def record_step(self, step: StepResult, emitted: int) -> None:
        """Count one step; ``emitted`` may be below accepted + 1 when a stop condition cut it."""
        self.steps += 1
        self.new_tokens += emitted
        self.tokens_per_step[emitted] += 1
        self.last_step_tokens = emitted
        tree = step.tree
        self.tree_nodes += len(tree)
        self.probe_nodes += len(tree) - tree.num_candidates
        self.proposed_by_source.update(s for i, s in enumerate(tree.sources) if not tree.is_probe(i))
        self.accepted_by_source.update(tree.sources[i] for i in step.verify.accepted)

    def trim_last_step(self, dropped: int) -> None:
        """Forget ``dropped`` tokens of the last step (a stop string ended the text inside it)."""
        if dropped <= 0:
            return
        last = self.last_step_tokens
        if not 0 < dropped <= last:
            raise ValueError(f"cannot drop {dropped} of the last step's {last} tokens")
        self.tokens_per_step[last] -= 1
        if not self.tokens_per_step[last]:
            del self.tokens_per_step[last]
        self.tokens_per_step[last - dropped] += 1
        self.new_tokens -= dropped
        self.last_step_tokens = last - dropped

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "steps": self.steps,
            "mat": round(self.mat, 4),
            "tokens_per_s": round(self.tokens_per_s, 4),
            "tokens_per_step": {str(k): v for k, v in sorted(self.tokens_per_step.items())},
            "proposed_by_source": dict(self.proposed_by_source),
            "accepted_by_source": dict(self.accepted_by_source),
            "acceptance_by_source": {k: round(v, 4) for k, v in self.acceptance_by_source().items()},
            "overhead_fraction": round(self.overhead_fraction, 4),
            "mean_tree_nodes": round(self.tree_nodes / self.steps, 3) if self.steps else 0.0,
            "mean_probe_nodes": round(self.probe_nodes / self.steps, 3) if self.steps else 0.0,
            "time_s": {
                "prefill": round(self.prefill_s, 6),
                "draft": round(self.draft_s, 6),
                "forward": round(self.forward_s, 6),
                "verify": round(self.verify_s, 6),
                "commit": round(self.commit_s, 6),
                "observe": round(self.observe_s, 6),
                "total": round(self.total_s, 6),
            },
        }


def reindex(parents: Sequence[int], keep: Sequence[int]) -> list[int]:
    """The parents of the nodes ``keep`` (ascending, closed under parents) in the kept tree.

    >>> reindex([-1, 0, -1, 2], [0, 2, 3])
    [-1, -1, 1]
    """
    new_index = {old: new for new, old in enumerate(keep)}
    try:
        return [new_index[parents[i]] if parents[i] >= 0 else -1 for i in keep]
    except KeyError as e:
        raise ValueError(f"the kept nodes {list(keep)} leave out node {e.args[0]}, the parent of a kept node") from None


def check_nodes(tokens: Sequence[int], parents: Sequence[int], probe: Sequence[bool] | None) -> None:
    """``ValueError`` unless the nodes form a tree in topological order with distinct siblings,
    token ids >= 0, and (with ``probe``) a flag per node and no candidate under a probe (a
    probe's row is never committed).

    >>> check_nodes([5, 5], [-1, -1], None)
    Traceback (most recent call last):
    ValueError: node 1 repeats token 5 of a sibling under parent -1; siblings must carry distinct tokens
    """
    if len(tokens) != len(parents):
        raise ValueError(f"tokens ({len(tokens)}) and parents ({len(parents)}) differ in length")
    if probe is not None and len(probe) != len(parents):
        raise ValueError(f"{len(probe)} probe flags for {len(parents)} nodes")
    seen: set[tuple[int, int]] = set()
    for i, (t, p) in enumerate(zip(tokens, parents)):
        if not -1 <= p < i:
            raise ValueError(f"node {i} has parent {p}; parents must come before children")
        if not isinstance(t, Integral) or t < 0:
            raise ValueError(f"node {i} has token {t!r}; token ids are integers >= 0")
        if (p, t) in seen:
            raise ValueError(f"node {i} repeats token {t} of a sibling under parent {p}; siblings must carry distinct tokens")
        seen.add((p, t))
        if probe is not None and p >= 0 and probe[p] and not probe[i]:
            raise ValueError(f"candidate node {i} hangs under probe node {p}")
