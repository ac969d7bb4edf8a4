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

from specgraft.drafters.adapld.config import KINDS, AdaPLDConfig, default_layer
from specgraft.drafters.adapld.drafter import AdaPLDDrafter, build_adapld
from specgraft.drafters.adapld.state import AdaPLDState, Proposal, SeenTokens, rows_to_host, top_rows, unit_rows

__all__ = [
    "KINDS", "AdaPLDConfig", "AdaPLDDrafter", "AdaPLDState", "Proposal", "SeenTokens", "build_adapld", "default_layer", "rows_to_host",
    "top_rows", "unit_rows",
]
