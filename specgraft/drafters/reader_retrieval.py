"""READER's retrieval source: a short-term trie per sequence and shared long-term datastores.

READER (``papers/003_a9ac2d7d1bbb97c9.txt``, section 4.2, Algorithms 1-4) widens a draft-model
tree with one deep retrieved path at the root and deepens it with one path hung from a draft
node. This drafter holds the retrieval side:

- the **short-term trie** (:class:`~specgraft.retrieval.trie.TokenTrie`) of one sequence: the
  prompt at ``begin`` (Alg. 1 line 2), every accepted token at ``observe`` (line 9), in O(new
  tokens x depth) per step;
- the **long-term datastores** (:class:`~specgraft.retrieval.datastore.Datastore`, suffix
  arrays over a corpus), shared and read-only: nothing of one request reaches another;
- ``propose`` returns the **widening** path (``SearchPath`` keyed by the last ``key_len``
  tokens, ``d_search`` deep, Alg. 3) as a :class:`RetrievalDraft` that also carries a
  ``search`` function, with which :class:`~specgraft.composers.reader.ReaderComposer` finds the
  **deepening** path once it knows the draft model's best node (Alg. 4).

Example (trie only)::

    drafter = ReaderRetrieval(ReaderConfig(d_search=4), datastores=[])
    state = drafter.begin([5, 6, 7, 8, 5, 6], PrefillOutput(), GenerationConfig())
    draft = drafter.propose(state, [5, 6, 7, 8, 5, 6], budget=8)
    draft.tokens        # [7, 8, 5, 6]: what followed "5 6" before, then what followed that
    draft.search([7], 2)  # SearchPath after context + [7]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, ClassVar, Sequence

from specgraft.config import GenerationConfig
from specgraft.drafters.base import StatelessDrafter
from specgraft.retrieval import Datastore, SearchPath, SearchTree, TokenTrie, search_path, search_tree
from specgraft.types import Draft, PrefillOutput, StepResult


@dataclass(frozen=True)
class ReaderConfig:
    """READER's tree shape (Algorithm 2's parameters) and retrieval keys."""

    d_search: int = 6
    """Depth of the widening path at the root (``d_search``)."""
    d_deep: int = 2
    """Depth of the deepening path (``d_deep``); 0 = no deepening (``reader-widen``)."""
    draft_nodes: int | None = None
    """Draft-model nodes of the tree (the rest of ``B_tokens`` goes to the two paths); None =
    ``draft-tree``'s budget under the run's preset (cpu 16, gpu 60: READER's draft tree is
    ``draft-tree``'s, ``methods/reader.py``), resolved by :meth:`with_draft_nodes`."""
    deepen_depth: int = 2
    """The deepening path hangs from the best draft path's node at min(this, draft depth) (Alg. 4)."""
    key_len: int = 8
    """Context suffix length of the search keys (``L_suffix``); keys back off to shorter suffixes."""
    merge: str = "longest"
    """How trie and datastore counts are combined (``retrieval/search.py``)."""
    min_match: int = 1
    """A retrieved path stops (a retrieved tree stops growing) at a level answered on a key
    shorter than this: the pruning Theorem 1 implies (1 = none, the paper's search)."""
    search_nodes: int = 0
    """0: the widening is one path of ``d_search`` tokens (READER with a draft model). Above 0: it
    is a best-first retrieved *tree* of this many nodes at most ``d_search`` deep
    (:func:`~specgraft.retrieval.search.search_tree`, the paper's retrieval-only "Search +
    datastore" setting, ``reader-search``)."""
    width: int = 4
    """Children per node of a retrieved tree (``search_nodes > 0``)."""

    def __post_init__(self) -> None:
        if self.d_search < 0 or self.d_deep < 0 or (self.draft_nodes is not None and self.draft_nodes < 0) or self.search_nodes < 0:
            raise ValueError(
                f"d_search, d_deep, draft_nodes and search_nodes must be >= 0, got {self.d_search}, {self.d_deep}, "
                f"{self.draft_nodes}, {self.search_nodes}"
            )
        if self.key_len < 1 or self.deepen_depth < 1 or self.min_match < 1 or self.width < 1:
            raise ValueError(
                f"key_len, deepen_depth, min_match and width must be >= 1, got {self.key_len}, {self.deepen_depth}, "
                f"{self.min_match}, {self.width}"
            )

    def with_draft_nodes(self, default: int) -> "ReaderConfig":
        """This shape with ``draft_nodes`` set: its own, else ``default`` (``draft-tree``'s budget).

        >>> ReaderConfig().with_draft_nodes(16).budget, ReaderConfig(draft_nodes=4).with_draft_nodes(16).budget
        (24, 12)
        >>> ReaderConfig(draft_nodes=0, d_deep=0, search_nodes=12, d_search=24).budget
        12
        """
        return self if self.draft_nodes is not None else replace(self, draft_nodes=default)

    @property
    def widening_nodes(self) -> int:
        """Nodes of the widening: the retrieved tree's, else the path's depth."""
        return self.search_nodes if self.search_nodes > 0 else self.d_search

    @property
    def budget(self) -> int:
        """``B_tokens``: nodes of the full per-step shape (``draft_nodes`` must be resolved)."""
        if self.draft_nodes is None:
            raise ValueError("READER's draft_nodes is not resolved: call with_draft_nodes(draft-tree's budget) first")
        return self.draft_nodes + self.widening_nodes + self.d_deep


@dataclass
class ReaderState:
    trie: TokenTrie
    # retrieval lookups this sequence made (READER's per-sample CPU search)
    searches: int = 0


@dataclass
class RetrievalDraft(Draft):
    """The widening path (a chain at the root) plus how to search a deepening path."""

    path: SearchPath | None = None
    tree: SearchTree | None = None
    """The widening as a retrieved tree (``ReaderConfig.search_nodes > 0``) instead of ``path``."""
    search: Callable[[Sequence[int], int], SearchPath] | None = field(default=None, repr=False)
    """``search(prefix, depth)``: the path after the context followed by ``prefix``."""


def path_drafts(path: SearchPath, anchor: Sequence[int] = ()) -> list[Draft]:
    """A retrieved path as chains of one source each (``trie`` / ``datastore``), each hung under
    the path before it, so the tree records per node where it was retrieved from.

    >>> p = SearchPath(tokens=(4, 5, 6), sources=("trie", "trie", "datastore"), shares=(1.0, 1.0, 1.0), matched=(2, 2, 1))
    >>> [(d.source, d.tokens, d.anchor) for d in path_drafts(p, anchor=(9,))]
    [('trie', [4, 5], (9,)), ('datastore', [6], (9, 4, 5))]
    """
    drafts: list[Draft] = []
    start = 0
    for i in range(1, len(path) + 1):
        if i == len(path) or path.sources[i] != path.sources[start]:
            tokens = list(path.tokens[start:i])
            drafts.append(Draft(source=path.sources[start], tokens=tokens, parents=list(range(-1, len(tokens) - 1)),
                                anchor=tuple(anchor) + tuple(path.tokens[:start])))
            start = i
    return drafts


def tree_drafts(tree: SearchTree) -> list[Draft]:
    """A retrieved tree as drafts that record each node's source: one draft when every node has
    the same source, else one single-node draft per node, hung under its parent's path, in the
    tree's (parents-first) order.

    >>> t = SearchTree(tokens=(4, 5, 6), parents=(-1, 0, 0), sources=("trie",) * 3, scores=(1.0, .6, .4), matched=(2, 2, 2))
    >>> [(d.source, d.tokens, d.parents) for d in tree_drafts(t)]
    [('trie', [4, 5, 6], [-1, 0, 0])]
    >>> t = SearchTree(tokens=(4, 5), parents=(-1, 0), sources=("trie", "datastore"), scores=(1.0, .5), matched=(2, 1))
    >>> [(d.source, d.tokens, d.anchor) for d in tree_drafts(t)]
    [('trie', [4], ()), ('datastore', [5], (4,))]
    """
    if not len(tree):
        return []
    if len(set(tree.sources)) == 1:
        return [Draft(source=tree.sources[0], tokens=list(tree.tokens), parents=list(tree.parents), scores=list(tree.scores))]
    return [
        Draft(source=tree.sources[i], tokens=[tree.tokens[i]], parents=[-1], scores=[tree.scores[i]],
              anchor=tree.path(tree.parents[i]) if tree.parents[i] >= 0 else ())
        for i in range(len(tree))
    ]


class ReaderRetrieval(StatelessDrafter):
    """Trie + datastores, READER's SearchPath (source names per node: ``trie`` / ``datastore``)."""

    name: ClassVar[str] = "retrieval"

    def __init__(self, config: ReaderConfig = ReaderConfig(), datastores: Sequence[Datastore] = ()):
        self.config = config
        self.datastores = list(datastores)

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> ReaderState:
        trie = TokenTrie(max_depth=self.config.key_len + 1)
        trie.extend([int(t) for t in prompt])
        return ReaderState(trie=trie)

    def search(self, state: ReaderState, context: Sequence[int], prefix: Sequence[int], depth: int) -> SearchPath:
        state.searches += 1
        key = [*context[-self.config.key_len :], *prefix]
        return search_path(key, depth, state.trie, self.datastores, key_len=self.config.key_len, merge=self.config.merge,
                           min_match=self.config.min_match)

    def propose(self, state: ReaderState, context: Sequence[int], budget: int) -> RetrievalDraft:
        cfg = self.config
        ctx = list(context[-cfg.key_len :])
        if cfg.search_nodes > 0:
            state.searches += 1
            tree = search_tree(ctx, min(cfg.search_nodes, budget), cfg.d_search, state.trie, self.datastores, key_len=cfg.key_len,
                               merge=cfg.merge, min_match=cfg.min_match, width=cfg.width)
            return RetrievalDraft(
                source=self.name, tokens=list(tree.tokens), parents=list(tree.parents), tree=tree,
                search=lambda prefix, depth: self.search(state, ctx, prefix, depth),
            )
        path = self.search(state, context, (), cfg.d_search)
        return RetrievalDraft(
            source=self.name, tokens=list(path.tokens), parents=list(range(-1, len(path) - 1)), path=path,
            search=lambda prefix, depth: self.search(state, ctx, prefix, depth),
        )

    def observe(self, state: ReaderState, step: StepResult) -> None:
        state.trie.extend(step.new_tokens)
