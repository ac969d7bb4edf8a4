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


def merge_drafts(drafts: Sequence[Draft], budget: int, offers: Sequence[Draft] = ()) -> DraftTree:
    """Merge ``drafts`` (highest priority first) into a tree of at most ``budget`` nodes.

    Within one draft, nodes are admitted best-first by ``scores`` (higher first) when the draft
    has them, otherwise in node order, and a node is only admitted after its parent, so the
    result is always a closed tree. A node whose (parent, token) already exists in the tree is
    mapped onto it and costs nothing. ``sources`` keeps the drafter that first proposed a node.
    A draft with an ``anchor`` hangs under the node that token path reaches; it is dropped when
    the tree does not hold that path.

    **Which rule verifies the children of a node** (sampling). A node's children are verified
    by recursive rejection sampling only when every candidate *offered* under that node, by
    any draft, admitted or not, was sampled by one draft; their ``prob_rows`` are then carried
    over (into the tree's table, each draft's at its offset). Everywhere else the children get
    row -1, which tells the sampling verifier to use sample-and-match there
    (``verify/sampling.py``). ``offers`` are drafts
    that only count as offers and are never admitted (Graft offers its whole retrieval
    envelope, of which a step admits a stage-dependent part).

    Why offers and not admissions: rejection sampling is exact at a node only if its rule
    does not depend on the sampled values of its children. Which nodes a merge admits does:
    a deterministic candidate that equals a sampled child is mapped onto it, so "does this
    parent have a child without ``draft_probs``" would depend on whether the sampled values
    collided with it (a PLD token 0 beside two draws from ``q = [.5, .3, .15, .05]`` biases
    the root's law to TV 0.074 that way). What the drafts *offer* under a path is decided
    before any value is drawn there (a deterministic drafter does not read the sampled
    children; a sampled one draws all its children from one ``q``), so the rule is fixed
    before the children are.

    Example: the sampled root children ``[5, 6]`` (``q`` rows) merged before a lookup chain
    ``[5, 9]``: the lookup offers ``5`` under the root, so both root children get row -1
    and the root uses sample-and-match; ``9`` under ``5`` is offered by the lookup alone.

    Probe nodes (``Draft.probe``) merge like any other node and cost budget like any other row;
    a candidate that lands on an existing probe turns it into a candidate (same row, same
    logits), and a probe that lands on a candidate stays a candidate. For the rule a probe
    counts as a deterministic offer: a sampled child landing on an earlier probe would take the
    probe's place among its siblings, out of draw order, so such a parent uses sample-and-match
    whatever is drawn. A draft with sampled nodes must not carry ``scores`` (``ValueError``):
    admitting sampled siblings by score would select them by their values.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    for draft in drafts:
        if draft.scores is not None and draft.prob_rows is not None and any(r >= 0 for r in draft.prob_rows):
            raise ValueError(
                f"draft {draft.source!r} has sampled nodes and scores: a merge would admit sampled children by "
                "score, which rejection sampling forbids (leave scores out of sampled drafts)"
            )
    paths = _PathIds()
    # parent path id -> identities of the drafts offering candidates under it: the draft's
    # index when it carries draft_probs, DETERMINISTIC otherwise
    offered_under: dict[int, set[int]] = {}
    # per draft: the path id of every node
    node_paths: list[list[int]] = []
    for d, draft in enumerate([*drafts, *offers]):
        anchor = paths.walk(draft.anchor)
        ids: list[int] = []
        for j, (tok, p) in enumerate(zip(draft.tokens, draft.parents, strict=True)):
            parent = anchor if p < 0 else ids[p]
            ids.append(paths.child(parent, tok))
            # a probe counts as a deterministic offer: a sampled child that lands on it would
            # take its earlier place among the siblings, out of draw order
            sampled = not draft.is_probe(j) and draft.prob_rows is not None and draft.prob_rows[j] >= 0
            offered_under.setdefault(parent, set()).add(d if sampled else _DETERMINISTIC)
        node_paths.append(ids)

    tokens: list[int] = []
    parents: list[int] = []
    sources: list[str] = []
    scores: list[float] = []
    prob_rows: list[int] = []
    probe: list[bool] = []
    index: dict[tuple[int, int], int] = {}
    any_scores = any(d.scores is not None for d in drafts)
    # one table of draft rows for the tree: each sampled draft's table at its offset
    tables = [d.draft_probs for d in drafts if d.draft_probs is not None]
    offsets, offset = [], 0
    for d in drafts:
        offsets.append(offset)
        offset += d.draft_probs.shape[0] if d.draft_probs is not None else 0

    for d, draft in enumerate(drafts):
        anchor_node = _find(index, draft.anchor)
        if anchor_node is None:
            continue
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
            tree_parent = anchor_node if p < 0 else mapped[p]
            k = (tree_parent, draft.tokens[j])
            parent_path = node_paths[d][p] if p >= 0 else paths.walk(draft.anchor)
            row = draft.prob_rows[j] if draft.prob_rows is not None else -1
            rejection_here = row >= 0 and offered_under.get(parent_path) == {d}
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
                prob_rows.append(offsets[d] + row if rejection_here else -1)
                probe.append(draft.is_probe(j))
            else:
                continue
            for c in children[j + 1]:
                heapq.heappush(heap, (key(c), c))

    draft_probs = None
    if tables and any(r >= 0 for r in prob_rows):
        # [P, V]: no copy when one draft sampled (the usual case)
        draft_probs = tables[0] if len(tables) == 1 else torch.cat(tables)
    return DraftTree(
        tokens=tokens,
        parents=parents,
        sources=sources,
        draft_probs=draft_probs,
        prob_rows=prob_rows if draft_probs is not None else None,
        scores=scores if any_scores else None,
        probe=probe if any(probe) else None,
    )


_DETERMINISTIC = -1


class _PathIds:
    """Ids of token paths from the root (the root is ``0``), shared by every draft of one merge."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, int], int] = {}

    def child(self, parent: int, token: int) -> int:
        return self._ids.setdefault((parent, int(token)), len(self._ids) + 1)

    def walk(self, path: Sequence[int]) -> int:
        node = 0
        for tok in path:
            node = self.child(node, tok)
        return node


def _find(index: dict[tuple[int, int], int], path: Sequence[int]) -> int | None:
    """The tree node that ``path`` reaches from the root (-1 = the root), None if it is not there."""
    node = -1
    for tok in path:
        node = index.get((node, int(tok)))
        if node is None:
            return None
    return node


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
    if all(kept):
        return tree
    return tree.subset([i for i, k in enumerate(kept) if k])
