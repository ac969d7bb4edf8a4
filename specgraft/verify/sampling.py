"""Lossless verification under sampling: sample-and-match and recursive rejection sampling.

Both walk the tree from the root. At each node they emit one token whose law, given the
committed prefix and the path so far, is exactly ``target_probs`` of that node's row; if the
token is a child, they move to it and repeat, otherwise it is the bonus token and the step
ends. By the chain rule the emitted sequence then has exactly the target's law, whatever the
candidates were. The two rules differ only in *how* a node draws its token:

- **sample-and-match** draws ``x ~ target_probs(row)`` and follows the child with token
  ``x``, if any (READER Appendix D). It needs nothing about how the candidates were made, and
  draws exactly once per emitted token, so with the same generator it emits the same tokens
  as plain sampling (``sample_token(target_probs(row), generator)`` per token).
- **recursive rejection** uses the draft distribution ``q`` the children were sampled from to
  accept them more often (a child whose ``q`` is high is tried with acceptance
  ``min(1, p/q)`` instead of having to be hit by a fresh target draw).

Which rule runs is decided per node; see :func:`verify_rejection` for why mixing is exact.
"""

from __future__ import annotations

import torch

from specgraft.config import SamplingConfig
from specgraft.types import DraftTree, VerifyResult
from specgraft.verify.greedy import check_rows, child_index, verify_greedy
from specgraft.verify.processing import draw_uniform, sample_token, target_probs


def verify(
    tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
) -> VerifyResult:
    """Greedy if ``sampling.greedy``, else rejection if the tree carries ``draft_probs``, else sample-and-match.

    ``ValueError`` when a tree token lies outside the vocabulary of ``logits`` (``[N + 1, V]``).
    """
    if sampling.greedy:
        return verify_greedy(tree, logits)
    if tree.draft_probs is not None:
        return verify_rejection(tree, logits, sampling, generator)
    return verify_sample_match(tree, logits, sampling, generator)


def verify_sample_match(
    tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
) -> VerifyResult:
    """At each node draw ``x ~ target_probs(row)``; follow the child with token ``x`` or stop with bonus ``x``.

    Example, chain ``tokens=[5, 9], parents=[-1, 0]``: if the draw at the root (row 0) is 5,
    node 0 is accepted; if the draw at node 0 (row 1) is 3, there is no child 3, so the
    result is ``accepted=[0], bonus_token=3``: two draws for two emitted tokens.
    """
    check_rows(tree, logits)
    index = child_index(tree)
    accepted: list[int] = []
    node = -1
    while True:
        token = sample_token(target_probs(logits[node + 1], sampling), generator)
        child = index.get((node, token))
        if child is None:
            return VerifyResult(accepted=accepted, bonus_token=token)
        accepted.append(child)
        node = child


def verify_rejection(
    tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
) -> VerifyResult:
    """Recursive rejection sampling at nodes whose children were drawn from a draft distribution.

    **Contract for ``tree.draft_probs``** (``[N, V]``): row ``c`` is the distribution ``q``
    that node ``c`` was sampled from, shared by all children of one parent, and the children
    in node order are the *distinct* values of i.i.d. draws from ``q`` in order of first
    appearance (or draws without replacement), possibly cut to a prefix (as ``merge_drafts``'
    budget does for a draft without ``scores``). Reordering or selecting children by their
    tokens (best-first by score, pruning by confidence) breaks this; such drafters must leave
    ``draft_probs`` out (NaN rows), and those nodes use sample-and-match.

    **The rule at a node** whose children ``c_1, c_2, ...`` all carry the same non-NaN row:
    start with ``p = target_probs(row)`` and ``q_1 = q``; for ``j = 1, 2, ...``: draw
    ``u ~ U[0, 1)`` and accept ``c_j`` if ``u < p(c_j) / q_j(c_j)``; otherwise set
    ``p <- normalize(max(p - q_j, 0))`` and ``q_{j+1} = q_j`` with ``c_j`` removed and
    renormalised. If all are rejected, the bonus token is drawn from the final ``p``.

    **Why ``q`` is renormalised, and why deduplication needs it.** The distinct values of
    i.i.d. draws, in order of first appearance, are draws *without replacement*: given the
    earlier ones, ``c_j ~ q_j``. One step of speculative sampling with candidate ``c_j ~ q_j``
    outputs ``min(q_j, p)`` + (rejection mass) x ``normalize(max(p - q_j, 0))`` = ``p``; by
    induction from the last child (whose fallback is a draw from the residual) the node emits
    exactly ``p``. SpecInfer's rule keeps ``q`` fixed, which is exact only when *duplicates
    stay in the list*: a rejected token has ``p'(c) = 0`` in the residual, so its duplicate is
    always rejected, but that rejection still moves the residual to
    ``normalize(max(p' - q, 0))``. Dropping the duplicate skips that move, and fixed-``q``
    on deduplicated children is biased (by up to 0.17 in total variation at one node with
    V = 3 and three draws, found by enumeration; ``tests/test_sampling_stats.py`` shows a
    statistical test catching it). Renormalising ``q`` is exact with or without duplicates
    removed, and a rejected token can never come back: ``p`` and ``q_j`` are 0 there.

    **Residual with no mass.** ``sum(max(p - q_j, 0)) >= q_j(c_j) - p(c_j) > 0`` whenever a
    rejection is possible, so an all-zero residual only comes from rounding when ``p`` is
    within rounding of ``q_j``; the rejection then had probability ~0 and ``p`` is kept
    unchanged (any choice on a probability-0 event is exact; keeping ``p`` is the nearest).

    **Why mixing rules per node is exact.** Each node's rule, whichever it is, emits a token
    whose law given everything decided so far is ``target_probs(row)``: sample-and-match
    for any fixed candidates, rejection for candidates drawn as above. The chain rule only
    needs that per-node property, so nodes with NaN rows, children with different rows, or
    no children use sample-and-match while their neighbours use rejection.

    Example: ``p = [0, 1, 0]`` at the root, children tokens ``[0, 1]`` drawn from
    ``q = [0.5, 0.5, 0]``: child 0 is rejected (``p(0) = 0``), the residual is
    ``normalize(max(p - q, 0)) = [0, 1, 0]``, ``q_2 = [0, 1, 0]``, child 1 is accepted with
    probability ``1 / 1``.
    """
    check_rows(tree, logits)
    index = child_index(tree)
    children = tree.children()
    accepted: list[int] = []
    node = -1
    while True:
        kids = children[node + 1]
        probs = target_probs(logits[node + 1], sampling)
        draft = shared_draft_row(tree, kids)
        if draft is None:
            token = sample_token(probs, generator)
            child = index.get((node, token))
        else:
            child, token = recursive_rejection(probs, draft, [tree.tokens[c] for c in kids], kids, generator)
        if child is None:
            return VerifyResult(accepted=accepted, bonus_token=token)
        accepted.append(child)
        node = child


def shared_draft_row(tree: DraftTree, kids: list[int]) -> torch.Tensor | None:
    """The draft row ``[V]`` shared by all of ``kids``, or None when the node must use sample-and-match.

    None when there are no children, no ``draft_probs``, or the children's rows are not all
    equal to the first one: a NaN row (a deterministic candidate) never compares equal, and
    differing rows mean the children were not drawn from one ``q``.
    """
    if tree.draft_probs is None or not kids:
        return None
    # [k, V]
    rows = tree.draft_probs[kids]
    if not bool((rows == rows[0]).all()):
        return None
    return rows[0]


def recursive_rejection(
    target: torch.Tensor,
    draft: torch.Tensor,
    tokens: list[int],
    kids: list[int],
    generator: torch.Generator | None,
) -> tuple[int | None, int]:
    """One node of recursive rejection sampling: ``(accepted child, its token)`` or ``(None, bonus token)``.

    ``target`` and ``draft`` are ``[V]`` rows; ``tokens[j]`` is the token of ``kids[j]``.
    Arithmetic is float64 so residuals stay clean after several rejections. ``q_j`` is ``q``
    over the untried tokens, divided by their mass ``q_mass``; the tried tokens need no zeroing
    in the residual because ``p`` is already 0 there (each was rejected, so ``p < q_j`` there).
    """
    # [V], normalised once in float64 so that the rule's identity (the node emits p) holds to
    # float64 rounding even when the float32 row sums to 1 +- 1e-7
    p = target.to(torch.float64)
    p = p / p.sum()
    # [V]
    q = draft.to(device=p.device, dtype=torch.float64)
    q_tokens = q[tokens].tolist()
    q_mass = float(q.sum())
    for j, (child, token, q_token) in enumerate(zip(kids, tokens, q_tokens, strict=True)):
        if not q_token > 0.0:
            raise ValueError(
                f"node {child} (token {token}) has draft probability {q_token} for its own token, "
                "so it cannot have been sampled from its draft_probs row"
            )
        if draw_uniform(generator) * q_token < float(p[token]) * q_mass:
            return child, token
        # [V]
        residual = (p - q / q_mass).clamp_(min=0.0)
        mass = float(residual.sum())
        if mass > 0.0:
            p = residual / mass
        # the untried mass is at least that of the untried children, whatever the rounding
        q_mass = max(q_mass - q_token, sum(q_tokens[j + 1 :]))
    return None, sample_token(p, generator)
