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
from specgraft.verify.processing import draw_uniforms, sample_token, target_probs


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

    **Contract for ``tree.draft_probs``** (``[P, V]``) and ``tree.prob_rows`` (``[N]``):
    ``draft_probs[prob_rows[c]]`` is the distribution ``q`` that node ``c`` was sampled from,
    one row shared by all children of one parent, and the children in node order are the
    *distinct* values of i.i.d. draws from ``q`` in order of first appearance (or draws without
    replacement), possibly cut to a prefix whose length does not depend on their values (as
    ``merge_drafts``' budget does for a draft without ``scores``). Reordering or selecting
    children by their tokens (best-first by score, pruning by confidence) breaks this; such
    nodes must get row -1, and they use sample-and-match.

    **The rule at a node** whose children ``c_1, c_2, ...`` all carry the same row ``>= 0``:
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
    V = 3 and three draws, found by enumeration; ``tests/lossless/test_sampling_stats.py`` shows a
    statistical test catching it). Renormalising ``q`` is exact with or without duplicates
    removed, and a rejected token can never come back: ``p`` and ``q_j`` are 0 there.

    **Residual with no mass.** ``sum(max(p - q_j, 0)) >= q_j(c_j) - p(c_j) > 0`` whenever a
    rejection is possible, so an all-zero residual only comes from rounding when ``p`` is
    within rounding of ``q_j``; the rejection then had probability ~0 and ``p`` is kept
    unchanged (any choice on a probability-0 event is exact; keeping ``p`` is the nearest).

    **Why mixing rules per node is exact.** Each node's rule, whichever it is, emits a token
    whose law given everything decided so far is ``target_probs(row)``: sample-and-match
    for any fixed candidates, rejection for candidates drawn as above. The chain rule only
    needs that per-node property, so nodes with children of row -1, children with different
    rows, or no children use sample-and-match while their neighbours use rejection, provided
    the choice at a node never depends on its children's sampled values (``tree/build.py``
    decides it by what is offered there).

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
    """The draft row ``[V]`` all of ``kids`` were sampled from, or None when the node must use
    sample-and-match: no children, no ``draft_probs``, a child that was not sampled (row -1),
    or children from different rows (not drawn from one ``q``)."""
    if tree.prob_rows is None or not kids:
        return None
    row = tree.prob_rows[kids[0]]
    if row < 0 or any(tree.prob_rows[c] != row for c in kids):
        return None
    return tree.draft_probs[row]


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
    over the untried tokens, divided by their mass; the tried tokens need no zeroing in the
    residual because ``p`` is already 0 there (each was rejected, so ``p < q_j`` there).

    One uniform per child is drawn up front (``draw_uniforms``), so the number of values taken
    from the generator does not depend on the outcome, and every child's test and residual is
    computed on the rows' device: one host sync per node reads the first accepted child (plus
    the bonus draw when none is).
    """
    # [V], normalised once in float64 so that the rule's identity (the node emits p) holds to
    # float64 rounding even when the float32 row sums to 1 +- 1e-7
    p = target.to(torch.float64)
    p = p / p.sum()
    # [V]
    q = draft.to(device=p.device, dtype=torch.float64)
    m = len(tokens)
    tok = torch.tensor(tokens, device=p.device)
    # [m]
    u = draw_uniforms(generator, m).to(p.device)
    q_tok = q[tok]
    # [m]: the untried mass before each child; rounding never lets it fall below the untried children's
    suffix = q_tok.flip(0).cumsum(0).flip(0)
    accepted = []
    mass = q.sum()
    for j in range(m):
        accepted.append(u[j] * q_tok[j] < p[tok[j]] * mass)
        residual = (p - q / mass).clamp_(min=0.0)
        total = residual.sum()
        p = torch.where(total > 0.0, residual / total, p)
        if j + 1 < m:
            mass = torch.maximum(mass - q_tok[j], suffix[j + 1])
    # one sync: [m] accepted flags, then whether a child had draft probability 0
    flags = torch.stack([*accepted, (q_tok <= 0.0).any()]).tolist()
    if flags[-1]:
        j = next(i for i, x in enumerate(q_tok.tolist()) if not x > 0.0)
        raise ValueError(
            f"node {kids[j]} (token {tokens[j]}) has draft probability {q_tok[j].item()} for its own token, "
            "so it cannot have been sampled from its draft_probs row"
        )
    first = next((j for j, ok in enumerate(flags[:-1]) if ok), None)
    if first is not None:
        return kids[first], tokens[first]
    return None, sample_token(p, generator)
