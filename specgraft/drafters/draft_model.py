"""Draft-model tree drafter (source ``draft``): a smaller LM with the target's vocabulary drafts a
tree the way EAGLE-2 does (Graft's base drafter, method ``draft-tree``).

One proposal, for the root token ``r`` (the last committed token):

1. **Root forward.** The draft model's cache slot (one per sequence, on the same adapter as the
   target: ``models/hf.py``) holds every committed token but the root, like the target's.
   Tokens accepted last step that the draft has not cached yet (retrieved ones, or the leaf it
   never fed) are fed in the same forward as ``r``, so catching up costs nothing. The prompt
   itself is prefilled at the sequence's *first* proposal, not when it starts: a sequence that
   never drafts (a batch that decodes plainly because speculation would not pay,
   ``batch/budget.py``) never pays for the draft model's prefill. The prompt, and a backlog
   longer than ``CATCH_UP_CHAIN`` tokens (decoded while the budget was 0), are prefilled on
   their own first, so a batched draft forward is never padded to them.
2. **Layers.** Layer 1 is the ``top_k`` most likely tokens after ``r``. Each deeper layer comes
   from *one* draft forward over the ``top_k`` best nodes of the previous layer (tree attention:
   each fed row sees the cache, its ancestors and itself), each contributing its ``top_k``
   most likely children. A node's path score is the cumulative log-probability
   ``S(child) = S(parent) + log q(child | path)`` (Graft eq. 5), so ``depth`` layers cost
   ``depth`` forwards. A tree of ``budget < depth`` nodes drafts only ``budget`` layers
   (:func:`budget_depth`): deeper nodes could not survive the trim.
3. **Rerank.** The ``budget`` best nodes by path score are kept, best-first, a node only after
   its parent (``S`` never increases along a path, so this is the plain top-``budget``).

Token ids, parent rows and scores stay on the model's device while the layers are drafted; the
tree comes to the host once per proposal, plus one scalar per layer with an early stop and per confidence checkpoint (a gate
decides on the host whether to run the next forward) and, with sampled drafts, the number of
distinct children per layer. The per-forward timers (``DraftState.forward_s``, which
calibration reads) synchronise on CUDA.

Worked example, ``top_k = 2``, ``depth = 2``, root ``r``: the root forward gives
``q(a) = 0.6, q(b) = 0.3`` -> layer 1 ``[a, b]`` with scores ``[log .6, log .3]``; one forward
over ``[a, b]`` gives children ``a -> {c: .5, d: .4}``, ``b -> {e: .9, f: .05}``, so layer 2
is ``[c, d, e, f]`` with scores ``log [.30, .24, .27, .015]``. With ``budget = 4`` the tree
keeps ``a, b, c, e`` (nodes by score: a .6, b .3, c .30, e .27).

**Confidence checkpoints (Graft eq. 6-7).** After the forward that produced layer ``d + 1``
the drafter knows ``c_d = exp(max over the nodes of layer d + 1 of S)`` (``d = 0``: the root's
top-1 probability). For every configured checkpoint ``d`` it records ``c_d``; with thresholds
set, ``c_d <= tau_d`` stops drafting there (no deeper forwards) and the draft reports the
checkpoint as its ``stage``, which :class:`~specgraft.composers.graft.GraftComposer` turns into
a smaller draft share of the budget. ``c_d`` is computed from the distributions at layer
``d`` (``max_t S(parent) + log q(t | parent)``), which is eq. 6 exactly for top-k children and,
for sampled children, keeps the decision independent of the sampled values (see below).

**Extension** (``extend > 0``; HF's assisted generation drafts a chain of up to 20 tokens while
the draft's confidence holds, and on long exact code continuations a depth-4 tree leaves those
tokens to later steps). When drafting reached ``depth`` ungated, the best node of the last
layer is fed alone and its most likely child appended, then that child, and so on, for at most
``extend`` one-row forwards, while the path's draft probability ``exp(S)`` of the node to feed
is at least ``extend_min`` and its child could enter the ``budget`` best nodes of the pool
(else the trim would drop the child and the forward would be wasted). Extension nodes have path
scores like any other node, so the trim to the budget compares them with the tree's other
nodes (EAGLE-2's reranking): a confident chain displaces unlikely siblings. Worked example,
budget 8, depth 4: the best depth-4 node has ``S = log 0.6``; fed, its top child has
``q = 0.9`` (``S = log 0.54``), then ``0.95`` (``log 0.51``), then ``0.5`` (``log 0.26 < log
0.3``): two extension forwards, three extension nodes (the last one unexpanded), and the 8 nodes
kept are the best 8 of the 14 + 3 drafted. With ``extend_adapt`` (off by default: on the
tuning prompts it measured 2.26x `ar` against 2.28x without) each sequence also caps its chain by what the target accepted of its recent ones (:func:`next_extend_cap`:
+2 after a chain accepted whole, down to one past the accepted part after a rejection), as
HF's assisted generation adapts its draft length: a confident draft the target keeps
disagreeing with (short answers, translation) stops paying one-row forwards for chains the
target rejects. Only top-k drafting extends (in sampling mode the chain's children would
have to be fresh draws whose number does not depend on their values; a sampled generation with
deterministic drafts is verified by sample-and-match, exact for any tree). The chain depends on
the draft and on earlier steps' outcomes, never on this step's verification, so greedy outputs
equal ``ar`` and sampled ones keep the target's distribution.

**Copy-ahead** (``copy_ahead > 0``). Where an answer copies its input (a summary quoting the
document, code repeating a name), the extension's chain is the context again, and feeding it one
row per forward pays a whole draft forward per token: on the 2-core Zen 3 an int8 0.5B forward
over ~700 cached tokens costs ~76 ms for one row, ~115 ms for four, ~125 ms for eight. So each
extension forward also feeds, as a chain under the row it feeds, up to ``copy_ahead`` tokens that
followed the most recent earlier occurrence of the path's last n-gram (context plus path; the
longest ``n`` of 3 down to ``copy_ngram``: :func:`copy_guess`, prompt lookup's guess). Row ``i``'s
output is used exactly when the plain loop would have fed row ``i``: the draft's top token of row
``i - 1`` equals the guess fed at row ``i`` and the chain would continue (``extend``,
``extend_min``, the budget); the rows after the first mismatch are never read and never
committed. So the chain's tokens and scores are the plain extension's (up to the last bits of a
multi-row forward's arithmetic, and an int8 draft's activation scale, which the other rows of the
forward share), drafted in fewer forwards. The cpu preset guesses 7 rows (a forward of 8 rows
costs ~1.6 one-row forwards): on the first turns of issue 14's set (24 prompts, Zen 3,
``benchmarks/experiments/draft-tree/measure_tree_cut.py --variants cut,copy,hf``) ``draft-tree`` drafted in 10% less
time (summarization 25%, code 16% less) in as many steps (489 against 488), every output equal
to ``ar``; where answers copy little (translation, qa, mt_bench) it guesses rarely and drafted
as before. Worked example: the path ends ``... the cat sat``, the
context has ``the cat sat on the mat .`` earlier, ``copy_ahead = 4``: one forward feeds
``sat, on, the, mat, .``; the draft's tops are ``on, the, mat, ,``: four chain nodes (``on, the,
mat, ,``) from one forward instead of four, and the next forward feeds ``,`` with a new guess.

**Early stop** (``stop_min > 0``; HF's assisted generation stops its chain at the first draft
token under 0.4, so a step whose draft is unsure costs it one or two draft forwards). After each
layer, when the best node of that layer has a path probability ``exp(S)`` below ``stop_min``, no
deeper layer is drafted and the tree is not extended: each deeper node would hang from a path
the draft itself gives less than ``stop_min``, and a draft forward costs ~12% of a target step
with the int8 0.5B draft and the 1.5B fp32 target on a 2-core CPU. Unlike a Graft gate it
leaves the budget's draft share alone (an early-stopped tree simply has fewer nodes) and needs
no calibration. Worked example, ``stop_min = 0.35``, top-k 1: layer 1 at ``q = 0.9``, layer 2
at ``0.9 * 0.5 = 0.45``, layer 3 at ``0.225 < 0.35``: three forwards instead of four plus the
extension. Top-k drafting only (sampled children lists must not depend on the drawn values).

**Long chains** (``tree_budget``, off by default). A budget caps what one step can accept
(``budget + 1`` tokens), and on long exact continuations (code) the cpu preset's 8 nodes bind:
MAT 7.5 of at most 9 on a HumanEval answer, where HF's assisted generation verifies chains of
up to 20 tokens. With ``tree_budget = t`` below the budget ``B``, a step keeps the ``t`` best
nodes by path score as before, and past them only nodes whose path probability ``exp(S)`` reaches
``extend_min`` (the extension's own bar), up to ``B`` (:func:`keep_count`): an unsure step
verifies what it verified with budget ``t``, a confident chain grows to ``B``. Worked example,
``t = 2``, ``B = 16``, ``extend_min = 0.3``, path probabilities ``.9, .8, .6, .05``: three nodes
kept (two by rank, the third for its 0.6). The count reads the draft's own scores, never the
target's, and greedy drafts only (sampled drafts keep ``t``, a count independent of the draws),
so outputs are unchanged.

**Cost-aware cut** (``row_cost``, off by default; the cpu preset gives ``draft-tree`` 0.05). On
a 2-core CPU every verified row is real work (a 1.5B row is ~3 GFLOP: on the Zen 3 a 9-row
verify pass costs ~40-50% more than a 3-row one), and an unsure step fills its 8 best nodes
even when most of them have path probabilities of a few percent; HF's assisted generation
verifies ~4 rows a step there, the tree ~7-9. With ``row_cost = r`` the kept nodes are cut,
best first, at the prefix that maximises ``(1 + sum p) / (1 + r k)`` over ``k`` nodes, ``p =
exp(S)`` the node's draft path probability as its acceptance estimate
(:func:`~specgraft.tree.paths.cost_aware_subset`, the rule ``pld``'s ``row_cost`` uses), ``r``
one row's cost as a fraction of a step verifying no node: the target's one-row forward plus the
step's draft forwards (Zen 3: ~40 ms a row against ~0.5 s + ~0.25 s; on a normal-speed day ~25
ms against ~0.3 s + ~0.15 s; both ~0.05). Path probability is a fair acceptance estimate for
the int8 0.5B draft of the 1.5B target (``benchmarks/experiments/draft-tree/measure_draft_calibration.py``, 117 steps
of tuning prompts: nodes under 0.05 accepted 2.5% of the time, 0.1-0.2 12%, 0.3-0.5 56%, over
0.9 98%). Timed on the Zen 3 (``benchmarks/experiments/draft-tree/measure_tree_cut.py``; ``benchmarks/RESULTS.md``,
*A cost-aware cut*): issue 14's six short answers verified 182 nodes instead of 301 in 53 steps
instead of 50, 5% faster over three alternating rounds; 11 tuning prompts 949 nodes instead of
1,042, 2% faster. Worked example, path
probabilities ``.9, .8, .6, .05``, ``r = 0.05``: ``3.3 / 1.15 = 2.87`` with three nodes,
``3.35 / 1.2 = 2.79`` with four, so three are verified. The cut reads the draft's own scores,
never the target's, and applies to top-k drafts only (sampled drafts keep their count), so
outputs are unchanged.

**Narrow expansion** (``expand``, off by default; EAGLE-2 expands as many nodes per layer as
each keeps children, ``top_k``). With ``expand = 1`` each deeper layer feeds only the best node
of the layer before (by path score), whose ``top_k`` children form the next layer: the tree is
the draft's best path with ``top_k - 1`` siblings at every depth, and every draft forward is one
row. Worked example, ``top_k = 2``: root children ``a .7, b .3``; only ``a`` is fed, children
``c .49, d .21``; only ``c`` is fed, and so on: two nodes a layer instead of up to four. Measured
on the 2-core Zen 3 (``benchmarks/RESULTS.md``, *Narrow expansion*): on six short answers it
verified 14% fewer nodes in 7% more steps (with the early stop at 0.5: 22-24% fewer in 11-14%
more), and inside a generation a one-row int8 draft forward costs 58 ms against 64 ms for two;
timed, it did not pay there (alone -5%; with the stop at 0.5 -5% and +7% in two runs of short
answers, level on the tuning prompts), so it stays off.

**Sampling mode** (``sample=True``, in a sampling generation). Each expanded node's children
are the distinct values of ``top_k`` i.i.d. draws from ``q``, the draft's distribution shaped
by the generation's own sampling config (temperature, top-k, top-p: ``verify.target_probs``,
so no draft mass lands where the target's processed distribution is 0), in order of first
appearance, and ``q`` is the children's ``draft_probs`` row (one row per expanded node), so
the verifier can use recursive rejection sampling. That rule is
exact only if a node's children list is a value-independent prefix of such draws; so in this
mode nothing cuts or reorders children by their own scores: the budget keeps the first
``budget`` nodes in creation order (layer by layer, parents in score order), and ``scores`` are
left out of the draft (the merge would otherwise admit siblings by score and reorder them).
Which nodes get *expanded* may depend on their own scores: that only shapes their children
lists, which are then drawn fresh. The gates are the one place where sampled values decide
a cut: ``c_d`` reads the values of layers ``1 .. d``, so Graft never lets a stage-dependent
cut fall inside those layers (``GraftComposer.draft_nodes``), and decides which rule a node
uses from what every stage would offer there (``tree/build.merge_drafts``).
``tests/test_sampling_exact.py`` proves this by enumerating every draw on a 4-token
vocabulary. In the default deterministic mode no ``draft_probs`` are set (sampling then
verifies by sample-and-match, exact for any candidates).

**Presets.** ``PRESETS["gpu"]`` is the paper's setting (depth 8, top-k 10, 60 nodes,
checkpoints after the root, depth 1 and depth 5). ``PRESETS["cpu"]`` (depth 4, top-k 2, 8
nodes, checkpoints after the root and depths 1 and 2; the last forward never saves anything by
stopping) was measured on the 2-core AVX2 host, fp32 with prepacked oneDNN linears: a 1.5B
target step costs ~0.3 s and every extra verified row ~0.03 s (8 nodes: ~1.8 steps), a 0.5B
draft forward ~0.13-0.19 s. So width is not free here as on a GPU, and a draft layer is about
half a target step. Over one mt_bench, one summarization and one HumanEval prompt (64 greedy
tokens) depth 4 / top-k 2 / 8 nodes gave 0.95x / 0.93x / 1.68x (MAT 2.9 / 4.0 / 4.3), depth 3 /
top-k 1 / 4 nodes 0.94x / 1.05x / 1.64x and depth 2 / top-k 3 / 6 nodes 1.03x / 0.95x / 1.92x:
differences within this machine's noise. The deeper shape is kept because it leaves Graft's
checkpoints the most draft forwards to save (``specgraft calibrate`` then prunes when drafting
does not pay).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import ClassVar, Generator, Protocol, Sequence

import numpy as np
import torch
from torch import nn

from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.drafters.base import StatelessDrafter
from specgraft.drafters.pld import find_matches
from specgraft.models.hf import HFTarget, synchronize
from specgraft.tree.paths import best_first, cost_aware_subset, token_paths
from specgraft.types import Draft, PrefillOutput, RowsOutput, StepResult, reindex
from specgraft.verify.processing import target_probs


def check_vocab(target_vocab: int | None, draft_vocab: int) -> None:
    """The draft model must score the target's token ids: same vocabulary size (same tokenizer)."""
    if target_vocab is not None and int(target_vocab) != int(draft_vocab):
        raise ValueError(
            f"the draft model's vocabulary has {draft_vocab} tokens but the target's has {target_vocab}; "
            "the draft model must use the target's tokenizer (e.g. a smaller model of the same family)"
        )


#: Longest n-gram the copy-ahead guess looks up (``DraftTreeConfig.copy_ahead``).
COPY_MAX_NGRAM = 3


def copy_guess(seq: np.ndarray, length: int, min_ngram: int = 2, max_ngram: int = COPY_MAX_NGRAM) -> list[int]:
    """Up to ``length`` tokens that followed the most recent earlier occurrence of ``seq``'s last
    ``n`` tokens, for the longest ``n`` from ``max_ngram`` down to ``min_ngram`` that occurs
    (``[]`` when none does): prompt lookup's guess, which a copy-ahead extension feeds to the
    draft model.

    >>> copy_guess(np.array([5, 1, 2, 3, 4, 9, 1, 2, 7, 8, 1, 2]), 3)
    [7, 8, 1]
    >>> copy_guess(np.array([5, 1, 2, 3, 4, 9, 1, 2, 7, 8, 4, 1, 2]), 3), copy_guess(np.array([1, 2, 3, 2]), 3)
    ([7, 8, 4], [])
    >>> copy_guess(np.array([1, 2, 3, 2]), 3, min_ngram=1)
    [3, 2]
    """
    if length <= 0:
        return []
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        found = find_matches(seq, n)
        if len(found):
            start = int(found[0]) + n
            return seq[start : start + length].tolist()
    return []


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


@dataclass
class ModelDraft(Draft):
    """A draft-model tree plus what Graft's composer needs to know about how drafting went."""

    stage: int | None = None
    """Index of the checkpoint whose gate failed (drafting stopped there); None = not pruned."""
    confidences: list[float] = field(default_factory=list)
    """``c_d`` of each checkpoint evaluated, in checkpoint order."""
    layer_sizes: list[int] = field(default_factory=list)
    """Nodes per depth before trimming to the budget (nodes are stored layer after layer)."""
    checkpoints: tuple[int, ...] = ()
    """The drafter's checkpoint depths (``stage`` indexes them)."""


def keep_count(draft: ModelDraft, budget: int, config: DraftTreeConfig) -> int:
    """How many nodes of ``draft`` a ``budget`` keeps (:func:`trim` keeps them): the budget, or,
    with ``config.tree_budget`` below it, ``tree_budget`` plus the confident nodes past it (path
    probability at least ``extend_min``), at most ``budget``; then, with ``config.row_cost``, the
    best-first prefix of those that maximises expected tokens per unit of cost
    (:func:`~specgraft.tree.paths.cost_aware_subset` with acceptance ``exp(S)``). Sampled drafts
    (no scores) keep ``tree_budget``: a count that never depends on the drawn values.

    >>> d = ModelDraft(source="draft", tokens=[5, 6, 7, 8], parents=[-1, 0, 1, -1], scores=[-0.1, -0.2, -0.5, -3.0])
    >>> [keep_count(d, b, DraftTreeConfig(tree_budget=2, extend_min=0.3)) for b in (1, 2, 3, 16)]
    [1, 2, 3, 3]
    >>> keep_count(d, 16, DraftTreeConfig()), keep_count(d, 16, DraftTreeConfig(tree_budget=2, extend_min=0.95))
    (16, 2)
    >>> [keep_count(d, 16, DraftTreeConfig(row_cost=r)) for r in (0.0, 0.05, 0.5)]
    [4, 3, 2]
    """
    n = budget
    tree = config.tree_budget
    if tree is not None and budget > tree:
        if draft.scores is None:
            return tree
        floor = math.log(config.extend_min) if config.extend_min > 0 else float("-inf")
        confident = sum(1 for s in draft.scores if s >= floor)
        n = min(budget, max(tree, confident))
    if config.row_cost is None or draft.scores is None:
        return n
    probs = [math.exp(s) for s in draft.scores]
    return len(cost_aware_subset(draft.parents, probs, min(n, len(probs)), config.row_cost))


def trim(draft: ModelDraft, n: int) -> ModelDraft:
    """Keep ``n`` nodes: the best by path score, or, for sampled drafts (no scores), the first ``n``.

    The second rule cuts every children list to a prefix whose length does not depend on the
    children's own values, which rejection sampling needs (module docstring).
    """
    if len(draft) <= n:
        return draft
    if draft.scores is None:
        return draft.subset(range(max(n, 0)))
    return draft.subset(best_first(draft.parents, draft.scores, n))


class DraftLanguageModel(Protocol):
    """What the drafter needs from the draft model: :class:`~specgraft.models.hf.HFTarget`'s slots
    and incremental rows (tests use table stubs)."""

    vocab_size: int
    max_positions: int
    device: torch.device

    def allocate(self) -> int: ...

    def release(self, slot: int) -> None: ...

    def length(self, slot: int) -> int: ...

    def prefill(self, slot: int, tokens: Sequence[int]) -> object: ...

    def forward_rows(self, slot: int, tokens: Sequence[int] | torch.Tensor, parent_rows: Sequence[int] | torch.Tensor) -> RowsOutput: ...

    def forward_batch(
        self, slots: Sequence[int], tokens: Sequence[Sequence[int] | torch.Tensor], parent_rows: Sequence[Sequence[int] | torch.Tensor]
    ) -> list[RowsOutput]: ...

    def commit(self, slot: int, keep_rows: Sequence[int]) -> None: ...

    def discard(self, slot: int) -> None: ...


#: Tokens the draft has not cached beyond which a proposal prefills them first (its own chunked,
#: causal forward) instead of feeding them as a chain in the root forward, which a batch pads to.
CATCH_UP_CHAIN = 16


def _catches_up(committed: int, pending: int) -> bool:
    """Whether ``pending`` uncached tokens (the root included) after ``committed`` cached ones
    are prefilled apart (the prompt, or a backlog longer than ``CATCH_UP_CHAIN``) rather than
    fed in the root forward.

    >>> _catches_up(0, 600), _catches_up(580, 3), _catches_up(580, 40)
    (True, False, True)
    """
    return pending > 1 and (committed == 0 or pending > CATCH_UP_CHAIN)


@dataclass
class _Rows:
    """One draft forward a proposal asks for: new pending rows of its slot (``forward_rows``)."""

    tokens: Sequence[int] | torch.Tensor
    parents: Sequence[int] | torch.Tensor


@dataclass
class _Proposal:
    """The last proposal's nodes that have draft-cache rows, for ``observe``."""

    # (parent node, token) -> node, over the whole untrimmed pool
    index: dict[tuple[int, int], int]
    # node -> pending row of the draft's slot (only expanded nodes have one)
    rows: dict[int, int]
    # the root's pending row (the tokens caught up with come before it)
    root_row: int
    # (tree depth, extension nodes) when the tree was eligible for extension, else None
    extension: tuple[int, int] | None = None


@dataclass
class DraftState:
    """One sequence's side of the draft model: its cache slot and sampler."""

    slot: int | None
    """The draft cache slot, allocated at the first proposal (None until then)."""
    # the draft distribution of sampled children (None: top-k drafting)
    sampling: SamplingConfig | None
    generator: torch.Generator | None
    proposal: _Proposal | None = None
    # wall time of each draft forward of the last proposal (calibration reads it)
    forward_s: list[float] = field(default_factory=list)
    # wall time of the last proposal's catch-up prefill (0: none; not in forward_s)
    catch_up_s: float = 0.0
    # tokens that catch-up prefilled
    catch_up_tokens: int = 0
    # the most extension forwards of the next proposal (``DraftTreeConfig.extend_adapt``)
    extend_cap: int = 0


class DraftModelDrafter(StatelessDrafter):
    """EAGLE-2-style tree drafting with a separate draft model (source ``draft``).

    ``model`` is a loaded Hugging Face causal LM (or an :class:`HFTarget` around one, or a
    :class:`DraftLanguageModel`) whose vocabulary is the target's; ``target_vocab`` checks
    that. The model and its adapter are shared by every sequence; each sequence drafts in
    its own cache slot (:class:`DraftState`).
    """

    name: ClassVar[str] = "draft"

    def __init__(
        self,
        model: nn.Module | HFTarget | DraftLanguageModel,
        config: DraftTreeConfig = DraftTreeConfig(),
        target_vocab: int | None = None,
        max_nodes: int | None = None,
    ):
        """``max_nodes`` caps every proposal's budget (READER gives its draft tree ``draft-tree``'s
        budget and the rest of its own to retrieved paths); None = the step's budget."""
        self.lm: DraftLanguageModel = HFTarget(model) if isinstance(model, nn.Module) else model
        check_vocab(target_vocab, self.lm.vocab_size)
        if max_nodes is not None and max_nodes < 0:
            raise ValueError(f"max_nodes must be >= 0 (or None), got {max_nodes}")
        self.config = config
        self.max_nodes = max_nodes
        self._checkpoint_of = {d: j for j, d in enumerate(config.checkpoints)}

    def _capped(self, budget: int) -> int:
        return budget if self.max_nodes is None else min(budget, self.max_nodes)

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> DraftState:
        """Start the sequence's state; its cache slot is allocated and the prompt prefilled at
        the first proposal (module docstring, step 1), so a sequence that never drafts costs the
        draft model nothing (measured: with the slot allocated at start, a batch of 8 pinned to
        budget 0 ran 3% slower than `ar`).

        The draft sampler's seed follows the generation's: ``sampling seed + 1 + config.seed``
        (never the sampling seed itself, so the two streams differ), and a fresh random seed when
        the generation has none. A fixed draft seed under a random sampling seed would draw the
        same children for the same context in every request while the verifier's draws vary:
        rejection sampling needs the children to be fresh draws, so that would bias the output.
        """
        sampled = self.config.sample and not config.sampling.greedy
        generator = None
        if sampled:
            generator = torch.Generator(device=self.lm.device)
            if config.sampling.seed is None:
                generator.seed()
            else:
                generator.manual_seed(config.sampling.seed + 1 + self.config.seed)
        return DraftState(slot=None, sampling=config.sampling if sampled else None, generator=generator, extend_cap=self.config.extend)

    def end(self, state: DraftState) -> None:
        if state.slot is not None:
            self.lm.release(state.slot)
            state.slot = None

    def propose(self, state: DraftState, context: Sequence[int], budget: int) -> ModelDraft:
        """The ``budget`` best nodes of :meth:`draft_pool` (see :func:`trim`)."""
        budget = self._capped(budget)
        if budget <= 0:
            if state.slot is not None:
                self.lm.discard(state.slot)
            state.proposal = None
            return ModelDraft(source=self.name, tokens=[], parents=[])
        pool = self.draft_pool(state, context, budget)
        return trim(pool, keep_count(pool, budget, self.config))

    def pending_prefill(self, state: DraftState, context: Sequence[int]) -> int:
        """Tokens the next proposal would prefill apart before drafting (its catch-up: the
        prompt at the first proposal, or a backlog longer than ``CATCH_UP_CHAIN`` tokens);
        0 when it would not. The batch budget policy weighs this cost against what drafting
        for the sequence's remaining tokens can save (``AdaptiveBudget.pays_back``)."""
        committed = 0 if state.slot is None else self.lm.length(state.slot)
        pending = len(context) - committed
        return pending - 1 if _catches_up(committed, pending) else 0

    def _now(self) -> float:
        synchronize(self.lm.device)
        return time.perf_counter()

    def propose_batch(self, states: Sequence[DraftState], contexts: Sequence[Sequence[int]], budgets: Sequence[int]) -> list[ModelDraft]:
        """:meth:`propose` for several sequences, one draft forward per layer for all of them
        (``forward_batch`` over their slots) instead of one per sequence and layer.

        Each sequence drafts exactly as alone (its own gates, depth and sampler); a sequence
        whose drafting stopped sits out the later forwards. Worked example: three sequences,
        depth 4, the second gated after its root forward: forwards over 3, 2, 2, 2 slots.
        """
        budgets = [self._capped(b) for b in budgets]
        drafts: list[ModelDraft | None] = [None] * len(states)
        runs: dict[int, Generator[_Rows, RowsOutput, ModelDraft]] = {}
        requests: dict[int, _Rows] = {}
        for b, (state, context, budget) in enumerate(zip(states, contexts, budgets, strict=True)):
            if budget <= 0:
                drafts[b] = self.propose(state, context, budget)
                continue
            runs[b] = self._draft_steps(state, context, budget)
            self._advance(b, runs, requests, drafts, None)
        while requests:
            order = list(requests)
            t0 = self._now()
            outs = self.lm.forward_batch([states[b].slot for b in order], [requests[b].tokens for b in order], [requests[b].parents for b in order])
            elapsed = self._now() - t0
            requests.clear()
            for b, out in zip(order, outs, strict=True):
                states[b].forward_s.append(elapsed)
                self._advance(b, runs, requests, drafts, out)
        return [trim(d, keep_count(d, budget, self.config)) if budget > 0 else d for d, budget in zip(drafts, budgets, strict=True)]  # type: ignore[arg-type]

    @staticmethod
    def _advance(b: int, runs: dict, requests: dict, drafts: list, out: RowsOutput | None) -> None:
        """Run sequence ``b``'s drafting to its next forward request (or to its draft)."""
        try:
            requests[b] = runs[b].send(out)  # type: ignore[arg-type]
        except StopIteration as done:
            drafts[b] = done.value
            del runs[b]

    def draft_pool(self, state: DraftState, context: Sequence[int], budget: int | None = None) -> ModelDraft:
        """Every drafted node, layer after layer, before trimming to a budget (``budget``, when
        given, bounds the layers (:func:`budget_depth`) and the extension: a node the trim would
        drop is neither drafted nor extended)."""
        run = self._draft_steps(state, context, budget)
        out: RowsOutput | None = None
        while True:
            try:
                rows = run.send(out)  # type: ignore[arg-type]
            except StopIteration as done:
                return done.value
            t0 = self._now()
            out = self.lm.forward_rows(state.slot, rows.tokens, rows.parents)
            state.forward_s.append(self._now() - t0)

    def _draft_steps(self, state: DraftState, context: Sequence[int], budget: int | None = None) -> Generator[_Rows, RowsOutput, ModelDraft]:
        """The drafting of one proposal as a coroutine: it yields each draft forward it needs
        (:class:`_Rows`), is sent that forward's output, and returns the pool of nodes. The
        drivers (:meth:`draft_pool` one sequence, :meth:`propose_batch` many) run the forwards
        and time them."""
        if state.slot is None:
            state.slot = self.lm.allocate()  # first proposal: the slot (and its prefill, below)
        cfg, lm, slot = self.config, self.lm, state.slot
        lm.discard(slot)  # a proposal never verified (propose called twice)
        state.forward_s = []
        state.catch_up_s, state.catch_up_tokens = 0.0, 0
        state.proposal = None
        committed = lm.length(slot)
        if len(context) <= committed:
            raise ValueError(f"the context ({len(context)} tokens) is not a continuation of the {committed} the draft cached")
        full_depth = min(cfg.depth, lm.max_positions - len(context) - 1)
        depth = budget_depth(cfg, full_depth, budget)
        if depth < 1:
            return ModelDraft(source=self.name, tokens=[], parents=[], checkpoints=cfg.checkpoints)
        dev = lm.device
        # the tokens accepted since the last commit, then the root: a chain of pending rows
        pending = [int(t) for t in context[committed:]]
        if _catches_up(committed, len(pending)):
            # the prompt (first proposal) or a long plain-decoding stretch: prefill it apart (not
            # timed in forward_s, which is the per-forward drafting cost)
            t0 = self._now()
            lm.prefill(slot, pending[:-1])
            state.catch_up_s, state.catch_up_tokens = self._now() - t0, len(pending) - 1
            pending = pending[-1:]
        out = yield _Rows(pending, list(range(-1, len(pending) - 1)))
        # [1, V]
        log_q, q = self._distribution(state, out.logits[-1:])
        root_row = len(pending) - 1
        # the frontier: expanded nodes (node id, pending row, path score); the root is node -1
        frontier_nodes = torch.tensor([-1], device=dev)
        frontier_rows = torch.tensor([root_row], device=dev)
        frontier_scores = torch.zeros(1, device=dev)
        rows_fed = len(pending)
        # per layer, [layer nodes] each: token, parent node, path score, q row, kept (not a duplicate draw)
        layers: list[tuple[torch.Tensor, ...]] = []
        q_tables: list[torch.Tensor] = []
        expanded: list[tuple[torch.Tensor, torch.Tensor]] = []  # (node ids, pending rows)
        confidences: list[float] = []
        stage = None
        n_nodes = 0
        for layer in range(1, depth + 1):
            # [m, k]
            kids, kid_log_q, kept = self._children(state, log_q, q)
            m, k = kids.shape
            scores = (frontier_scores[:, None] + kid_log_q).masked_fill(~kept, float("-inf"))
            q_row = None
            if q is not None:
                q_row = (sum(t.shape[0] for t in q_tables) + torch.arange(m, device=dev)).repeat_interleave(k)
                q_tables.append(q)
            node_ids = n_nodes + torch.arange(m * k, device=dev)
            layers.append((kids.flatten(), frontier_nodes.repeat_interleave(k), scores.flatten(), q_row, kept.flatten()))
            n_nodes += m * k
            j = self._checkpoint_of.get(layer - 1)
            if j is not None:
                # c_d from the distributions, not from the children drawn (see module docstring)
                confidences.append(float((frontier_scores + log_q.max(dim=-1).values).max().exp()))
                if cfg.thresholds is not None and confidences[-1] <= cfg.thresholds[j]:
                    stage = j
                    break
            if layer == depth:
                break
            if cfg.stop_min > 0.0 and q is None and float(scores.max().exp()) < cfg.stop_min:
                break  # early stop: the deeper layers would hang from an unlikely path
            # EAGLE-2: expand the top_k nodes of the layer by path score (ties: the earlier node)
            flat = scores.flatten()
            order = torch.sort(flat, descending=True, stable=True).indices
            width = cfg.top_k if cfg.expand is None else cfg.expand
            take = min(width, m * k) if q is None else min(width, int(kept.sum()))  # sampled: never a duplicate
            order = order[:take]
            out = yield _Rows(kids.flatten()[order], frontier_rows[order // k])
            frontier_rows = rows_fed + torch.arange(take, device=dev)
            rows_fed += take
            frontier_nodes, frontier_scores = node_ids[order], flat[order]
            expanded.append((frontier_nodes, frontier_rows))
            log_q, q = self._distribution(state, out.logits)
        eligible = cfg.extend > 0 and stage is None and q is None and layer == full_depth
        room = min(state.extend_cap if cfg.extend_adapt else cfg.extend, lm.max_positions - len(context) - 1 - depth)
        chain = 0
        if eligible and room > 0:
            # Extension: continue the best leaf's path one node per forward (module docstring)
            flat = scores.flatten()
            best = int(flat.argmax())
            node, score = int(node_ids[best]), flat[best : best + 1]
            token, parent_row = kids.flatten()[best : best + 1], frontier_rows[best // k : best // k + 1]
            pool = torch.cat([s for _, _, s, *_ in layers])
            # copy-ahead: the context and the tip's path, which the guesses continue
            seq = None
            if cfg.copy_ahead:
                pool_paths = token_paths(torch.cat([t for t, *_ in layers]).tolist(), torch.cat([p for _, p, *_ in layers]).tolist())
                seq = np.array([*context, *pool_paths[node]], dtype=np.int64)

            def goes_on() -> bool:  # the plain chain feeds its tip for a child
                return chain < room and self._worth_extending(float(score), pool, budget)

            while goes_on():
                guess = [] if seq is None else copy_guess(seq, min(cfg.copy_ahead, room - chain - 1), cfg.copy_ngram)
                fed = token if not guess else torch.cat([token, torch.tensor(guess, device=dev)])
                out = yield _Rows(fed, torch.cat([parent_row, rows_fed + torch.arange(len(guess), device=dev)]))
                # [1 + len(guess)]: the draft's top child of each fed row
                top = torch.log_softmax(out.logits.float(), dim=-1).max(dim=-1)
                for i in range(len(guess) + 1):
                    # row i's output counts only while the plain loop would have fed row i
                    # (the guesses before it were the draft's own top tokens, and it would continue)
                    if i > 0 and (int(token) != guess[i - 1] or not goes_on()):
                        break
                    parent_row = torch.tensor([rows_fed + i], device=dev)
                    expanded.append((torch.tensor([node], device=dev), parent_row))
                    token, score = top.indices[i : i + 1], score + top.values[i : i + 1]
                    layers.append((token, torch.tensor([node], device=dev), score, None, torch.ones(1, dtype=torch.bool, device=dev)))
                    pool = torch.cat([pool, score])
                    node, n_nodes = n_nodes, n_nodes + 1
                    chain += 1
                    if seq is not None:
                        seq = np.append(seq, int(token))
                rows_fed += len(guess) + 1
        draft = self._to_host(state, layers, q_tables, expanded, root_row, stage, confidences)
        if eligible and state.proposal is not None:
            state.proposal.extension = (depth, chain)
        return draft

    def _worth_extending(self, score: float, pool: torch.Tensor, budget: int | None) -> bool:
        """Whether to feed the path's last node (path score ``score``, already in ``pool``) for
        a child: its path probability reaches ``extend_min``, and its child (which scores at
        most ``score``) could still enter the ``budget`` best nodes: the pool has room, or the
        node scores above the ``budget``-th best, which the child would displace.

        >>> d = DraftModelDrafter.__new__(DraftModelDrafter); d.config = DraftTreeConfig(extend=4, extend_min=0.3)
        >>> pool = torch.tensor([-0.1, -0.2, -0.9, -1.0])
        >>> [d._worth_extending(-0.9, pool, b) for b in (None, 2, 3, 4, 5)], d._worth_extending(-1.5, pool, None)
        ([True, False, False, True, True], False)
        """
        if math.exp(score) < self.config.extend_min:
            return False
        if budget is None or pool.numel() < budget:
            return True
        return score > float(torch.topk(pool, budget).values[-1])

    def _to_host(
        self,
        state: DraftState,
        layers: list[tuple[torch.Tensor, ...]],
        q_tables: list[torch.Tensor],
        expanded: list[tuple[torch.Tensor, torch.Tensor]],
        root_row: int,
        stage: int | None,
        confidences: list[float],
    ) -> ModelDraft:
        """The drafted layers as a :class:`ModelDraft` (one host transfer), duplicates dropped."""
        tokens = torch.cat([t for t, *_ in layers]).tolist()
        parents = torch.cat([p for _, p, *_ in layers]).tolist()
        scores = torch.cat([s for _, _, s, *_ in layers]).tolist()
        kept = torch.cat([k for *_, k in layers]).tolist()
        sampled = layers[0][3] is not None
        q_rows = torch.cat([r for *_, r, _ in layers]).tolist() if sampled else None
        sizes = [int(t.shape[0]) for t, *_ in layers]
        node_rows = {int(n): int(r) for ids, rows in expanded for n, r in zip(ids.tolist(), rows.tolist(), strict=True)}
        # a sampled duplicate (and anything under it) is not a node
        alive_of: list[bool] = []
        for i, p in enumerate(parents):
            alive_of.append(bool(kept[i]) and (p < 0 or alive_of[p]))
        keep = [i for i, ok in enumerate(alive_of) if ok]
        new_index = {old: new for new, old in enumerate(keep)}  # pool node -> kept node (for the rows map)
        layer_sizes: list[int] = []
        start = 0
        for size in sizes:
            layer_sizes.append(sum(alive_of[start : start + size]))
            start += size
        draft = ModelDraft(
            source=self.name,
            tokens=[tokens[i] for i in keep],
            parents=reindex(parents, keep),
            scores=None if sampled else [scores[i] for i in keep],
            draft_probs=torch.cat(q_tables) if sampled else None,
            prob_rows=[q_rows[i] for i in keep] if sampled else None,
            stage=stage,
            confidences=confidences,
            layer_sizes=layer_sizes,
            checkpoints=self.config.checkpoints,
        )
        state.proposal = _Proposal(
            index={(p, t): i for i, (p, t) in enumerate(zip(draft.parents, draft.tokens, strict=True))},
            rows={new_index[n]: r for n, r in node_rows.items() if n in new_index},
            root_row=root_row,
        )
        return draft

    def _distribution(self, state: DraftState, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``log q`` ``[m, V]`` that path scores add up, and (sampling) ``q`` itself.

        Top-k drafting scores by the model's plain distribution; sampled drafts use the
        generation's processed one (what the verifier compares them with)."""
        if state.sampling is None:
            return torch.log_softmax(logits.float(), dim=-1), None
        q = target_probs(logits, state.sampling)
        return q.log(), q

    def _children(self, state: DraftState, log_q: torch.Tensor, q: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """Children of each row of ``log_q`` (``[m, V]``): tokens ``[m, k]``, their log-probabilities
        and which are kept (a repeated draw is not).

        Top-k drafting: the ``top_k`` most likely tokens. Sampling: ``top_k`` i.i.d. draws from
        ``q``, of which the first appearance of each value is kept, in draw order.
        """
        k = min(self.config.top_k, log_q.shape[-1])
        if q is None:
            top = torch.topk(log_q, k, dim=-1)
            return top.indices, top.values, torch.ones_like(top.indices, dtype=torch.bool)
        # [m, k]
        draws = torch.multinomial(q, k, replacement=True, generator=state.generator)
        # [m, k, k]: draw j repeats an earlier draw j' < j
        earlier = torch.ones(k, k, dtype=torch.bool, device=draws.device).tril_(-1)
        repeat = ((draws[:, :, None] == draws[:, None, :]) & earlier).any(dim=-1)
        return draws, log_q.gather(-1, draws), ~repeat

    def observe(self, state: DraftState, step: StepResult) -> None:
        """Commit the caught-up tokens, the root and the accepted nodes this drafter had fed.

        Accepted tokens the draft never fed (retrieved nodes, leaves) are fed with the next root.
        """
        proposal, state.proposal = state.proposal, None
        if proposal is None:
            return
        # the accepted path through this drafter's pool; its leading nodes that were fed have rows
        path: list[int] = []
        for i in step.verify.accepted:
            child = proposal.index.get((path[-1] if path else -1, step.tree.tokens[i]))
            if child is None:
                break
            path.append(child)
        path_rows: list[int] = []
        for node in path:
            if node not in proposal.rows:
                break
            path_rows.append(proposal.rows[node])
        self.lm.commit(state.slot, [*range(proposal.root_row + 1), *path_rows])
        if proposal.extension is not None and self.config.extend_adapt:
            reached = len(path)
            state.extend_cap = next_extend_cap(state.extend_cap, self.config.extend, *proposal.extension, reached)
