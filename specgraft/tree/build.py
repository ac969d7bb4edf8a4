"""Merge drafts from several drafters into one tree, deduplicating shared prefixes, under a budget.

Example: a lookup chain ``[5, 9, 4]`` and a recycling draft ``5 -> {9, 2}`` share the prefix
``5, 9``::

    >>> a = Draft.chain("pld", [5, 9, 4])
    >>> b = Draft("recycling", tokens=[5, 9, 2], parents=[-1, 0, 0])
    >>> t = merge_drafts([a, b], budget=8)
    >>> t.tokens, t.parents, t.sources
    ([5, 9, 4, 2], [-1, 0, 1, 0], ['pld', 'pld', 'pld', 'recycling'])

With ``budget=3`` the recycling node ``2`` does not fit and is dropped.
"""

from __future__ import annotations

import heapq
from typing import Sequence

import torch

from specgraft.types import Draft, DraftTree


def merge_drafts(drafts: Sequence[Draft], budget: int) -> DraftTree:
    """Merge ``drafts`` (highest priority first) into a tree of at most ``budget`` nodes.

    Within one draft, nodes are admitted best-first by ``scores`` (higher first) when the draft
    has them, otherwise in node order, and a node is only admitted after its parent, so the
    result is always a closed tree. A node whose (parent, token) already exists in the tree is
    mapped onto it and costs nothing. ``sources`` keeps the drafter that first proposed a node.

    ``draft_probs`` rows are carried over per node where the admitting draft has them; rows of
    nodes from drafts without them are NaN, which tells the sampling verifier to fall back to
    sample-and-match at that parent (see ``verify/sampling.py``).

    Probe nodes (``Draft.probe``) merge like any other node and cost budget like any other row;
    a candidate that lands on an existing probe turns it into a candidate (same row, same
    logits), and a probe that lands on a candidate stays a candidate.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    tokens: list[int] = []
    parents: list[int] = []
    sources: list[str] = []
    scores: list[float] = []
    prob_rows: list[torch.Tensor | None] = []
    probe: list[bool] = []
    index: dict[tuple[int, int], int] = {}
    any_scores = any(d.scores is not None for d in drafts)
    any_probs = any(d.draft_probs is not None for d in drafts)

    for draft in drafts:
        children: list[list[int]] = [[] for _ in range(len(draft) + 1)]
        for j, p in enumerate(draft.parents):
            children[p + 1].append(j)

        def key(j: int) -> tuple[float, int]:
            return (-draft.scores[j] if draft.scores is not None else 0.0, j)

        mapped = [-1] * len(draft)
        heap = [(key(j), j) for j in children[0]]
        heapq.heapify(heap)
        while heap:
            _, j = heapq.heappop(heap)
            p = draft.parents[j]
            tree_parent = -1 if p < 0 else mapped[p]
            k = (tree_parent, draft.tokens[j])
            if k in index:
                mapped[j] = index[k]
                if not draft.is_probe(j):
                    probe[mapped[j]] = False
            elif len(tokens) < budget:
                mapped[j] = len(tokens)
                index[k] = len(tokens)
                tokens.append(draft.tokens[j])
                parents.append(tree_parent)
                sources.append(draft.source)
                scores.append(draft.scores[j] if draft.scores is not None else float("nan"))
                prob_rows.append(draft.draft_probs[j] if draft.draft_probs is not None else None)
                probe.append(draft.is_probe(j))
            else:
                continue
            for c in children[j + 1]:
                heapq.heappush(heap, (key(c), c))

    draft_probs = None
    if any_probs and tokens:
        vocab = next(d.draft_probs.shape[-1] for d in drafts if d.draft_probs is not None)
        like = next(d.draft_probs for d in drafts if d.draft_probs is not None)
        nan_row = torch.full((vocab,), float("nan"), dtype=like.dtype, device=like.device)
        # [N, V]
        draft_probs = torch.stack([r if r is not None else nan_row for r in prob_rows])
    return DraftTree(
        tokens=tokens,
        parents=parents,
        sources=sources,
        draft_probs=draft_probs,
        scores=scores if any_scores else None,
        probe=probe if any(probe) else None,
    )


def truncate_depth(tree: DraftTree, max_depth: int) -> DraftTree:
    """Drop candidate nodes deeper than ``max_depth`` (children of the root have depth 1).

    >>> t = DraftTree(tokens=[5, 9, 4, 2], parents=[-1, 0, 1, 0], sources=["pld"] * 4)
    >>> truncate_depth(t, 2).tokens
    [5, 9, 2]

    Probe nodes (``DraftTree.probe``) are kept whenever their parent is (the root counts as
    kept): they are never accepted, so ``max_depth`` (the engine passes the tokens still to
    emit) does not apply to them. Their positions stay inside the context window because the
    whole tree has at most ``budget`` nodes and the engine keeps the budget within the room
    left. A probe under a dropped candidate is dropped with it, so the result stays a closed
    tree. Trees without probes are cut exactly as before.

    >>> p = DraftTree(tokens=[5, 9, 7, 8], parents=[-1, 0, -1, 2], sources=["ptd"] * 4,
    ...               probe=[False, False, True, True])
    >>> cut = truncate_depth(p, 1)
    >>> cut.tokens, cut.parents, cut.probe
    ([5, 7, 8], [-1, -1, 1], [False, True, True])
    """
    depth: list[int] = []
    kept: list[bool] = []
    for i, p in enumerate(tree.parents):
        depth.append(1 if p < 0 else depth[p] + 1)
        kept.append(depth[i] <= max_depth or (tree.is_probe(i) and (p < 0 or kept[p])))
    keep = [i for i, k in enumerate(kept) if k]
    if len(keep) == len(tree):
        return tree
    new_index = {old: new for new, old in enumerate(keep)}
    return DraftTree(
        tokens=[tree.tokens[i] for i in keep],
        parents=[new_index[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in keep],
        sources=[tree.sources[i] for i in keep],
        draft_probs=tree.draft_probs[keep] if tree.draft_probs is not None else None,
        scores=[tree.scores[i] for i in keep] if tree.scores is not None else None,
        probe=[tree.probe[i] for i in keep] if tree.probe is not None else None,
    )
