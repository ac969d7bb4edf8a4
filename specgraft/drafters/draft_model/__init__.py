"""Draft-model tree drafter (source ``draft``): a smaller LM with the target's vocabulary drafts a
tree the way EAGLE-2 does (Graft's base drafter, method ``draft-tree``).

One proposal, for the root token ``r`` (the last committed token):

1. **Root forward.** The draft model's cache slot (one per sequence, on the same adapter as the
   target: ``models/hf.py``) holds every committed token but the root, like the target's.
   Tokens accepted last step that the draft has not cached yet (retrieved ones, or the leaf it
   never fed) are fed in the same forward as ``r``, so catching up costs nothing. The prompt
   itself is prefilled at the sequence's *first* proposal, not when it starts: a sequence that
   never drafts (a batch that decodes plainly because speculation would not pay,
   ``budget/adaptive.py``) never pays for the draft model's prefill. The prompt, and a backlog
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
``tests/lossless/test_sampling_exact.py`` proves this by enumerating every draw on a 4-token
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

from specgraft.drafters.draft_model.config import COPY_MAX_NGRAM, PRESETS, DraftPreset, DraftTreeConfig, budget_depth, get_preset, next_extend_cap
from specgraft.drafters.draft_model.drafter import CATCH_UP_CHAIN, DraftLanguageModel, DraftModelDrafter, DraftState, check_vocab
from specgraft.drafters.draft_model.pool import ModelDraft, copy_guess, keep_count, trim

__all__ = [
    "CATCH_UP_CHAIN",
    "COPY_MAX_NGRAM",
    "PRESETS",
    "DraftLanguageModel",
    "DraftModelDrafter",
    "DraftPreset",
    "DraftState",
    "DraftTreeConfig",
    "ModelDraft",
    "budget_depth",
    "check_vocab",
    "copy_guess",
    "get_preset",
    "keep_count",
    "next_extend_cap",
    "trim",
]
