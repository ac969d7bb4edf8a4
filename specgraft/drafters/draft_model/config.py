"""The draft tree's shape and gating (:class:`DraftTreeConfig`) and the presets it starts from
(:data:`PRESETS`: the papers' GPU setting and the one tuned on 2-core CPUs); the package's
docstring says what each knob does and what it measured."""

from __future__ import annotations

from dataclasses import dataclass




#: Longest n-gram the copy guess matches (``pool.copy_guess``).
COPY_MAX_NGRAM = 3


@dataclass(frozen=True)
class DraftTreeConfig:
    """Shape and gating of the draft tree; ``depth`` and ``top_k`` default to ``PRESETS["cpu"]``'s."""

    depth: int = 4
    """Draft layers, i.e. draft forwards per step (the root forward makes layer 1)."""
    top_k: int = 2
    """Children per expanded node, and (unless ``expand`` says otherwise) nodes expanded per
    layer (EAGLE-2's top-k)."""
    expand: int | None = None
    """Nodes expanded per layer, the layer's best by path score (module docstring, *Narrow
    expansion*); None = ``top_k`` (EAGLE-2). Each deeper layer's draft forward feeds this many rows."""
    checkpoints: tuple[int, ...] = ()
    """Depths ``d`` after which the confidence ``c_d`` is checked (0 = the root step); each must be < depth."""
    thresholds: tuple[float, ...] | None = None
    """``tau_d`` per checkpoint: drafting stops when ``c_d <= tau_d``. None = record ``c_d`` only, never stop."""
    sample: bool = False
    """In a sampling generation, draw children i.i.d. from the draft distribution (processed by
    the generation's sampling config) and attach ``draft_probs`` (for rejection sampling).
    Greedy generations always draft the top-k."""
    seed: int = 0
    """Offset of each sequence's draft-sampler seed from its generation's sampling seed
    (sampling mode; see :meth:`DraftModelDrafter.begin`)."""
    extend: int = 0
    """Most one-row draft forwards that continue the best path past ``depth`` (module
    docstring, *Extension*); 0 = the fixed-depth tree."""
    extend_min: float = 0.3
    """An extension continues only while the path's draft probability ``exp(S)`` is at least
    this (and the node would survive the trim to the budget)."""
    stop_min: float = 0.0
    """Stop drafting deeper layers (and do not extend) when the best node of the newest layer
    has a path probability ``exp(S)`` below this (module docstring, *Early stop*); 0 = always
    draft ``depth`` layers. Top-k drafting only."""
    extend_adapt: bool = False
    """Cap each sequence's extension by what the target accepted of its recent chains (module
    docstring, *Extension*); False (the default: it measured no faster, 2.26x vs 2.28x `ar` on
    the tuning prompts, and with ``draft-tree``'s long chains 1.48x vs 1.56x on three
    summarization prompts, where the draft's chains are often rejected): every eligible step
    may extend by ``extend``."""
    tree_budget: int | None = None
    """With a larger budget, the nodes kept by path score alone: nodes past it are kept only
    while their path probability ``exp(S)`` reaches ``extend_min`` (module docstring, *Long
    chains*; :func:`keep_count`). None = the budget's best nodes, whatever their scores."""
    row_cost: float | None = None
    """Cost of one more verified row as a fraction of a step that verifies no node (the target's
    one-row forward plus this step's draft forwards): the kept nodes are cut, best first, where
    the step's expected tokens per unit of cost peaks, each node's acceptance estimated by its
    path probability ``exp(S)`` (module docstring, *Cost-aware cut*; :func:`keep_count`). None =
    no such cut. Top-k drafting only."""
    copy_ahead: int = 0
    """Rows guessed from the context per extension forward (module docstring, *Copy-ahead*): each
    extension forward also feeds up to this many tokens that followed an earlier occurrence of
    the path's last ``copy_ngram`` tokens, and keeps the chain's nodes while the draft's own top
    token equals the guess. Changes what a chain costs, not which tokens it holds. 0 = off."""
    copy_ngram: int = 2
    """Shortest n-gram match (of the context and the path) that guesses rows for ``copy_ahead``
    (the longest of 3 down to this is used, the most recent occurrence)."""

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if not isinstance(self.extend, int) or self.extend < 0:
            raise ValueError(f"extend must be an integer >= 0, got {self.extend!r}")
        if not isinstance(self.extend_adapt, bool):
            raise ValueError(f"extend_adapt must be a bool, got {self.extend_adapt!r}")
        if not 0.0 <= self.extend_min <= 1.0:
            raise ValueError(f"extend_min must lie in [0, 1], got {self.extend_min}")
        if not 0.0 <= self.stop_min <= 1.0:
            raise ValueError(f"stop_min must lie in [0, 1], got {self.stop_min}")
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.tree_budget is not None and (not isinstance(self.tree_budget, int) or self.tree_budget < 1):
            raise ValueError(f"tree_budget must be an integer >= 1 (or None), got {self.tree_budget!r}")
        if self.row_cost is not None and not self.row_cost >= 0.0:
            raise ValueError(f"row_cost must be >= 0 (or None), got {self.row_cost!r}")
        if not isinstance(self.copy_ahead, int) or self.copy_ahead < 0:
            raise ValueError(f"copy_ahead must be an integer >= 0, got {self.copy_ahead!r}")
        if not isinstance(self.copy_ngram, int) or not 1 <= self.copy_ngram <= COPY_MAX_NGRAM:
            raise ValueError(f"copy_ngram must be an integer in [1, {COPY_MAX_NGRAM}], got {self.copy_ngram!r}")
        if self.expand is not None and (not isinstance(self.expand, int) or self.expand < 1):
            raise ValueError(f"expand must be an integer >= 1 (or None: top_k), got {self.expand!r}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0 (an offset from the sampling seed), got {self.seed!r}")
        if list(self.checkpoints) != sorted(set(self.checkpoints)) or any(d < 0 for d in self.checkpoints):
            raise ValueError(f"checkpoints must be distinct increasing depths >= 0, got {self.checkpoints}")
        if self.checkpoints and self.checkpoints[-1] >= self.depth:
            raise ValueError(f"checkpoint {self.checkpoints[-1]} needs depth > {self.checkpoints[-1]}, got depth {self.depth}")
        if self.thresholds is not None:
            if len(self.thresholds) != len(self.checkpoints):
                raise ValueError(f"{len(self.thresholds)} thresholds for {len(self.checkpoints)} checkpoints")
            if any(not 0.0 <= t <= 1.0 for t in self.thresholds):
                raise ValueError(f"thresholds must lie in [0, 1], got {self.thresholds}")


@dataclass(frozen=True)
class DraftPreset:
    depth: int
    top_k: int
    checkpoints: tuple[int, ...]
    """Graft's pruning checkpoints for this depth."""
    thresholds: tuple[float, ...]
    """Uncalibrated default ``tau_d`` (Graft Table 11, Qwen3-8B medians); ``specgraft calibrate`` replaces them."""
    budget: int
    """The verification budget this preset is meant for: a generation that gives no budget
    verifies this many nodes per step (``methods.graft.preset_budget``)."""
    extend: int = 0
    """Extension forwards past ``depth`` (``DraftTreeConfig.extend``)."""
    stop_min: float = 0.0
    """Early stop of the tree's layers (``DraftTreeConfig.stop_min``)."""
    expand: int | None = None
    """Nodes expanded per layer (``DraftTreeConfig.expand``; None = ``top_k``)."""
    long_budget: int | None = None
    """``draft-tree``'s budget (the ungated tree alone; Graft's variants keep ``budget``): past
    ``budget`` nodes a step keeps only confident ones (*Long chains*: ``DraftTreeConfig.tree_budget
    = budget``). None = ``budget``."""
    long_extend: int | None = None
    """``draft-tree``'s extension with ``long_budget`` (None = ``extend``)."""
    long_row_cost: float | None = None
    """``draft-tree``'s cost-aware cut with ``long_budget`` (``DraftTreeConfig.row_cost``; None = none)."""
    copy_ahead: int = 0
    """Rows an extension forward guesses from the context (``DraftTreeConfig.copy_ahead``)."""


PRESETS: dict[str, DraftPreset] = {
    "gpu": DraftPreset(depth=8, top_k=10, checkpoints=(0, 1, 5), thresholds=(0.14, 0.14, 0.49), budget=60),
    # extend=8: on the 9 tuning prompts (AMD EPYC Zen 4, 1.5B fp32 target, int8 0.5B draft, 96
    # tokens) graft-prune went from 2.06x to 2.28x `ar`, MAT 4.00 -> 5.30 (benchmarks/RESULTS.md)
    # stop_min=0.35: on the same prompts draft-tree went from 2.20x to 2.28x `ar` and graft-prune
    # from 2.23x to 2.26x; on 6 short translation/qa answers draft-tree from 1.65x to 1.83x
    # long_budget=16, long_extend=12 (draft-tree only): on 3 HumanEval, 2 math, 2 translation and 2 qa
    # tuning prompts (Zen 3, one process) draft-tree went from 2.38x to 2.56x `ar` (code 2.47x -> 2.79x)
    # long_row_cost=0.05 (draft-tree only): issue 14's six short answers 59.4 s -> 56.3 s a round over three
    # alternating rounds (182 nodes verified instead of 301), 11 tuning prompts 2.07x -> 2.12x `ar` (Zen 3)
    # copy_ahead=7: on the first turns of issue 14's 27 generations (24 prompts, one alternating
    # process, Zen 3) draft-tree drafted in 180.6 s instead of 201.3 s (summarization 20.7 s vs
    # 27.6 s, code 60.4 s vs 71.6 s) in 489 steps instead of 488, 738 s vs 745 s in all
    "cpu": DraftPreset(
        depth=4, top_k=2, checkpoints=(0, 1, 2), thresholds=(0.14, 0.14, 0.49), budget=8, extend=8, stop_min=0.35,
        long_budget=16, long_extend=12, long_row_cost=0.05, copy_ahead=7,
    ),
}


def next_extend_cap(cap: int, most: int, depth: int, chain: int, reached: int) -> int:
    """The next step's extension cap after a step whose tree (``depth`` layers) was extended by
    ``chain`` nodes and whose accepted path reached depth ``reached`` of the draft's pool.

    Additive increase, fast decrease (HF's assisted generation adds 2 to its draft length when
    every drafted token was accepted and takes 1 away otherwise; a rejected chain costs a
    one-row draft forward per node, so here a failure cuts the cap to one past what was
    accepted): the chain (or, without one, the tree's full depth) all accepted -> ``cap + 2``
    (at most ``most``); part of a chain rejected -> at most one more node than was accepted of
    it, and less than before; a step that reached neither leaves the cap alone when it spent
    nothing on a chain.

    >>> next_extend_cap(4, 8, depth=4, chain=4, reached=8), next_extend_cap(8, 8, depth=4, chain=8, reached=12)
    (6, 8)
    >>> next_extend_cap(8, 8, depth=4, chain=8, reached=5), next_extend_cap(8, 8, depth=4, chain=3, reached=2)
    (2, 1)
    >>> next_extend_cap(1, 8, depth=4, chain=1, reached=3), next_extend_cap(0, 8, depth=4, chain=0, reached=4)
    (0, 2)
    >>> next_extend_cap(3, 8, depth=4, chain=0, reached=2)
    3
    """
    if reached >= depth + chain:
        return min(most, cap + 2)
    if chain == 0:
        return cap
    return max(0, min(cap - 1, max(0, reached - depth) + 1))


def budget_depth(config: DraftTreeConfig, depth: int, budget: int | None) -> int:
    """The layers worth drafting for a ``budget``-node tree: ``min(depth, budget)``, but never
    fewer than the gates need (``max(checkpoints) + 1`` layers when ``thresholds`` are set).

    A node of layer ``d`` enters the trimmed tree only with its ``d - 1`` ancestors (best-first
    by path score, which never rises along a path, a parent before its child on ties; sampled
    drafts keep the first ``budget`` in creation order, layer after layer), so layers past the
    budget never survive :func:`trim`, and neither does an extension hung from them: the
    capped draft trims to the same tree with fewer draft forwards. Gated drafts keep the layers
    their checkpoints read, so a gate decides the same stage as with the full depth.

    >>> budget_depth(DraftTreeConfig(depth=4), 4, 2), budget_depth(DraftTreeConfig(depth=4), 4, 8), budget_depth(DraftTreeConfig(depth=4), 4, None)
    (2, 4, 4)
    >>> budget_depth(DraftTreeConfig(depth=4, checkpoints=(0, 1, 2), thresholds=(0.1, 0.1, 0.5)), 4, 1)
    3
    """
    if budget is None:
        return depth
    gates = config.checkpoints[-1] + 1 if config.thresholds is not None and config.checkpoints else 0
    return min(depth, max(budget, gates))


def get_preset(name: str) -> DraftPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown draft preset {name!r}; choose one of {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


