"""READER's heterogeneous tree: a draft-model tree, widened and deepened by retrieval (Alg. 2).

Per step, from a :class:`~specgraft.drafters.draft_model.ModelDraft` and a
:class:`~specgraft.drafters.reader_retrieval.RetrievalDraft`:

1. the draft tree, cut to ``draft_nodes`` (best-first by path score; sampled drafts by node
   order, a cut that does not depend on the children's values). READER's drafter is
   ``draft-tree``'s, capped at ``draft_nodes`` (``methods/reader.py``), so this is the tree
   ``draft-tree`` would verify;
2. **widening**: the retrieved path of ``d_search`` tokens at the root (or, with
   ``search_nodes > 0``, a retrieved tree of that many nodes: ``reader-search``, which has no
   draft model and so neither step 1 nor 3);
3. **deepening** (Alg. 4): ``u`` = the node at depth ``min(deepen_depth, draft depth)`` on the
   draft's best path; the path searched with the context followed by the draft tokens down to
   ``u`` (``d_deep`` tokens) hangs under ``u``.

``B_tokens = draft_nodes + d_search + d_deep`` is the per-step budget. One deviation from the
paper: the paper keeps a fixed shape by *not* merging a retrieved token that equals a draft
token at the same place; here the verifier needs distinct siblings, so such a token is mapped
onto the draft's node (its row is saved, its subtree continues from there) and the tree has
fewer rows that step. Batched generation pads trees to one shape anyway (Graft App. D).

Exactness under sampling (``--sample-drafts``): the draft's cut is value-independent (above),
and :func:`~specgraft.tree.build.merge_drafts` decides each node's rule by what is offered
under it: the root (the widening path is offered there) and ``u`` (when the deepening search
found something) use sample-and-match; ``u`` is chosen from the values of itself and its
ancestors and siblings, never of its own children, so rejection sampling stays exact at every
other node.

Example: draft ``5 -> {9, 2}, 9 -> 4`` (best path 5, 9), widening ``[7, 3]``, deepening after
``5 9``: ``[4, 8]``: tree ``5, 9, 2, 4, 7, 3, 8`` (``4`` merges with the draft's ``4``; ``8``
hangs under it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from specgraft.drafters.draft_model import ModelDraft, trim
from specgraft.drafters.reader_retrieval import ReaderConfig, RetrievalDraft, path_drafts, tree_drafts
from specgraft.retrieval import SearchTree
from specgraft.tree.build import merge_drafts
from specgraft.tree.paths import best_first_order, best_path, token_paths
from specgraft.types import Draft, DraftTree


def deepening_node(draft: Draft, depth: int) -> int | None:
    """Alg. 4: the node at ``min(depth, draft depth)`` on the best path (the first child when
    the draft has no scores), or None for an empty draft.

    >>> deepening_node(Draft("d", tokens=[5, 2, 9, 4], parents=[-1, -1, 0, 2], scores=[.6, .3, .5, .4]), 2)
    2
    """
    path = best_path(draft.parents, draft.scores)
    if not path:
        return None
    return path[min(depth, len(path)) - 1]


@dataclass
class ReaderParts:
    """What the last tree was made of (``specgraft tune`` reads it; one sequence at a time)."""

    draft_paths: list[tuple[int, ...]]
    """Token paths of the draft's nodes, best first (the order ``draft_nodes`` cuts in)."""
    widen: tuple[int, ...]
    deep_prefix: tuple[int, ...]
    deep: tuple[int, ...]
    search: SearchTree | None = None
    """``reader-search``: the retrieved tree."""

    @property
    def search_paths(self) -> list[tuple[int, ...]]:
        """Token paths of the retrieved tree's nodes, best first (the order ``search_nodes`` cuts in)."""
        return [self.search.path(i) for i in range(len(self.search))] if self.search is not None else []


class ReaderComposer:
    def __init__(self, config: ReaderConfig = ReaderConfig()):
        self.config = config
        self.last: ReaderParts | None = None

    def build(self, drafts: Sequence[Draft], budget: int) -> DraftTree:
        model = [d for d in drafts if isinstance(d, ModelDraft)]
        retrieval = [d for d in drafts if isinstance(d, RetrievalDraft)]
        if len(model) > 1 or len(retrieval) != 1 or len(drafts) != len(model) + len(retrieval):
            raise ValueError(f"READER composes at most one draft-model draft and one retrieval draft, got sources {[d.source for d in drafts]}")
        return self.compose(model[0] if model else None, retrieval[0], budget)

    def compose(self, draft: ModelDraft | None, retrieved: RetrievalDraft, budget: int) -> DraftTree:
        cfg = self.config
        parts: list[Draft] = []
        draft_paths: list[tuple[int, ...]] = []
        if draft is not None and len(draft):
            draft = trim(draft, budget if cfg.draft_nodes is None else min(cfg.draft_nodes, budget))
            order = best_first_order(draft.parents, draft.scores, len(draft)) if draft.scores is not None else range(len(draft))
            paths = token_paths(draft.tokens, draft.parents)
            draft_paths = [paths[i] for i in order]
            parts.append(draft)
        if retrieved.path is not None:
            parts += path_drafts(retrieved.path)
        if retrieved.tree is not None:
            parts += tree_drafts(retrieved.tree)
        prefix: list[int] = []
        deep_tokens: tuple[int, ...] = ()
        if draft is not None and len(draft) and cfg.d_deep > 0 and retrieved.search is not None:
            u = deepening_node(draft, cfg.deepen_depth)
            prefix = [draft.tokens[i] for i in _path_to(draft.parents, u)]
            deep = retrieved.search(prefix, cfg.d_deep)
            deep_tokens = deep.tokens
            parts += path_drafts(deep, anchor=prefix)
        self.last = ReaderParts(draft_paths, tuple(retrieved.path.tokens) if retrieved.path else (), tuple(prefix), deep_tokens, retrieved.tree)
        if not parts:
            return DraftTree.empty()
        return merge_drafts(parts, budget)


def _path_to(parents: Sequence[int], node: int | None) -> list[int]:
    """Nodes from the root down to ``node``."""
    path: list[int] = []
    while node is not None and node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
