"""Typed objects passed between the stages of one speculative step.

Glossary of tensor dimensions used in shape comments throughout the package:

- ``N``: number of tree nodes (the root is *not* a node; it is row 0 of a verify pass)
- ``V``: vocabulary size
- ``S``: committed sequence length (tokens whose KV is cached)
- ``D``: maximum tree depth (a child of the root has depth 1)
- ``P``: number of root-to-leaf paths
- ``H``: hidden size

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

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from numbers import Integral
from typing import Sequence

import torch


@dataclass
class Draft:
    """Candidates from one drafter, already shaped as a tree rooted at the root token.

    A chain ``[a, b, c]`` is ``tokens=[a, b, c], parents=[-1, 0, 1]``.
    ``scores`` (optional) rank nodes when several drafts compete for the budget: higher is
    kept first. ``draft_probs`` (optional) is the distribution each node was *sampled* from
    (the draft model's distribution at its parent); only drafters that really sample their
    candidates set it, and it enables multi-candidate rejection sampling.

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
    # [N, V] or None
    draft_probs: torch.Tensor | None = None
    # [N] or None: True = probe node (fed for its logits only, see the module docstring)
    probe: list[bool] | None = None
    # the token path from the root to the node this draft hangs from; () = the root itself
    anchor: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_nodes(self.tokens, self.parents, self.probe)
        if self.scores is not None and len(self.scores) != len(self.tokens):
            raise ValueError(f"{len(self.scores)} scores for {len(self.tokens)} nodes")
        if self.draft_probs is not None and self.draft_probs.shape[0] != len(self.tokens):
            raise ValueError(f"{self.draft_probs.shape[0]} draft_probs rows for {len(self.tokens)} nodes")
        if any(not isinstance(t, Integral) or t < 0 for t in self.anchor):
            raise ValueError(f"anchor must be a path of token ids >= 0, got {self.anchor}")

    def is_probe(self, i: int) -> bool:
        return self.probe is not None and self.probe[i]

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def chain(source: str, tokens: Sequence[int]) -> "Draft":
        return Draft(source=source, tokens=list(tokens), parents=list(range(-1, len(tokens) - 1)))


@dataclass
class DraftTree:
    """The merged tree that the target verifies in one forward pass.

    Nodes are in topological order (a parent before its children); siblings carry distinct
    tokens (merging deduplicates shared prefixes); both are checked on construction
    (``ValueError``), like the token ids (>= 0 here, < vocab in :meth:`check_vocab`). ``sources[i]`` names the drafter that
    proposed node ``i`` (the first one, when several proposed the same prefix).
    """

    # [N]
    tokens: list[int]
    # [N]
    parents: list[int]
    # [N]
    sources: list[str]
    # [N] or None: draft probability rows, see Draft.draft_probs
    draft_probs: torch.Tensor | None = None
    # [N] or None
    scores: list[float] | None = None
    # [N] or None: True = probe node (fed for its logits only, see the module docstring)
    probe: list[bool] | None = None

    def __post_init__(self) -> None:
        if len(self.sources) != len(self.tokens):
            raise ValueError(f"{len(self.sources)} sources for {len(self.tokens)} nodes")
        check_nodes(self.tokens, self.parents, self.probe)
        if self.scores is not None and len(self.scores) != len(self.tokens):
            raise ValueError(f"{len(self.scores)} scores for {len(self.tokens)} nodes")
        if self.draft_probs is not None and self.draft_probs.shape[0] != len(self.tokens):
            raise ValueError(f"{self.draft_probs.shape[0]} draft_probs rows for {len(self.tokens)} nodes")

    def check_vocab(self, vocab_size: int) -> None:
        """``ValueError`` unless every token id lies in ``[0, vocab_size)`` (ids >= 0 are checked
        on construction; the vocabulary is known only where logits are)."""
        if self.tokens and max(self.tokens) >= vocab_size:
            bad = next(t for t in self.tokens if t >= vocab_size)
            raise ValueError(f"tree token id {bad} is outside the vocabulary [0, {vocab_size})")

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def empty() -> "DraftTree":
        return DraftTree(tokens=[], parents=[], sources=[])

    def is_probe(self, i: int) -> bool:
        return self.probe is not None and self.probe[i]

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
    # [N + 1, H] or None: target hidden states, for drafters with needs_hidden
    hidden: torch.Tensor | None = None

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
        assert 0 < dropped <= last, f"cannot drop {dropped} of the last step's {last} tokens"
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


def group_by_parent(parents: Sequence[int]) -> dict[int, list[int]]:
    """``{parent: [children...]}`` with ``-1`` for the root, e.g. ``[-1, 0, -1] -> {-1: [0, 2], 0: [1]}``."""
    out: dict[int, list[int]] = defaultdict(list)
    for i, p in enumerate(parents):
        out[p].append(i)
    return dict(out)
