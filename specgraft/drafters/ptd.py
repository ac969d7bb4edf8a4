"""PTD, Progressive Tree Drafting (source ``ptd``): the target drafts for itself from a perturbation tree.

Paper: *Accelerating LLM inference via speculative decoding with progressive tree drafting*
(``001_f7ca4e9c9cbbb660.txt``), section 3 and Appendices A-C. No draft model, no training:

1. **Draft tree.** A small tree of *probe* nodes hangs from the root (the last committed token),
   initialised with random tokens. Every verify pass feeds it to the target beside the
   candidate tree; each probe node attends to the committed prefix, the root and its own
   ancestors only (the shared tree layout gives exactly that), so its logits are the target's
   view of "committed text + this perturbed branch". Probe nodes are never accepted and never
   committed (``DraftTree.probe``).
2. **Expansion** (eq. for ``V^i, E^i``). After the pass, every fed probe node ``v`` gets the
   target's greedy token ``d_v`` at ``v`` as a child, unless ``v`` already has a child with that
   token or has ``max_children`` children (the width limit, 4 in the paper). Leaves always grow,
   so the tree deepens by one level per pass; inner nodes branch when the committed text has
   moved on and their prediction changed.
3. **Stepping.** When the tree is deeper than ``max_depth`` (6 in the paper), only the top
   node's earliest-added child and its descendants are kept: that child becomes the new top.
   The tree slides forward like a window, shedding the random initial tokens first.
4. **Pool.** Every sub-tree of the draft tree is merged into a candidate pool keyed by its
   root token with the paper's merge ``M(T, T')`` (children of ``T'`` missing from ``T`` are
   added, shared children merged recursively). The pool is a dict ``token -> trie``.
5. **Candidates.** The next pass's candidate tree is the pool trie of the last committed
   token, verified with the shared verifiers (greedy; sample-and-match when sampling, which is
   the paper's Appendix B rule in its exact sequential form).

Worked example (``max_children = 4``): committed text ``... the cat``, root ``cat``, draft tree
``q -> z`` (random). The pass feeds ``[cat, q, z]``; the target's greedy tokens are ``sat``
after ``cat q`` and ``on`` after ``cat q z``: the tree becomes ``q -> {z -> on, sat}``. The
pool now holds ``q: {z: {on}, sat}`` and ``z: {on}``. Once the text ends in ``z``, the
candidate tree is ``on``.

**Choices where the paper is silent** (made for speed and stated here):

- *Initial tree.* ``T^0`` is a top node with ``init_width`` children (a shallow tree), its
  tokens drawn uniformly from the prompt's own tokens with a seeded generator: random but in
  distribution (uniform vocabulary ids are mostly byte pieces and rare scripts), as Lookahead
  decoding fills its window from the prompt. Reseeded at every generation, so runs repeat.
- *Budget.* The engine's budget caps the rows of a pass. The draft tree gets
  ``round(probe_share * budget)`` nodes at most (paper GPU runs fed about as many draft as
  verify tokens, Table 4's Dft/Ver); the candidates get the rest. When the draft tree would
  outgrow its cap, the newest leaves off the *main line* (the chain of earliest-added
  children from the top, the part stepping keeps) are dropped first. Stepping uses the depth
  limit ``min(max_depth, cap)``: a tree capped below ``max_depth`` nodes could otherwise
  never reach the depth that triggers stepping, and would freeze instead of sliding forward.
- *Which candidates.* When the pool trie has more nodes than the candidate budget, nodes are
  taken best-first by recency (the last pass that confirmed them), then by how often they
  were merged: the most recent drafts were made from the most recent context.
- *Pool lifetime.* The pool starts empty at every generation (the paper decodes one prompt).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

import torch

from specgraft.tree.build import merge_drafts
from specgraft.types import Draft, StepResult


@dataclass(frozen=True)
class PTDConfig:
    max_children: int = 4
    """Width limit: children per draft-tree node (the paper's default, 4)."""
    max_depth: int = 6
    """Depth limit of the draft tree; deeper triggers stepping (the paper's default, 6)."""
    init_width: int = 3
    """Random children of the initial top node (the initial tree has ``1 + init_width`` nodes)."""
    probe_share: float = 0.5
    """Share of the per-step budget the draft tree may use (at least one node)."""
    seed: int = 0
    """Seed of the generator that draws the initial random tokens (reseeded every generation)."""

    def __post_init__(self) -> None:
        if self.max_children < 1:
            raise ValueError(f"max_children must be >= 1, got {self.max_children}")
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        if self.init_width < 0 or self.init_width > self.max_children:
            raise ValueError(f"init_width must lie in [0, max_children={self.max_children}], got {self.init_width}")
        if not 0.0 < self.probe_share < 1.0:
            raise ValueError(f"probe_share must lie in (0, 1), got {self.probe_share}")


class DraftNode:
    """A node of the perturbation draft tree; ``born`` orders nodes by creation (earliest first)."""

    __slots__ = ("token", "parent", "children", "born")

    def __init__(self, token: int, parent: "DraftNode | None", born: int):
        self.token = token
        self.parent = parent
        self.children: list[DraftNode] = []
        self.born = born

    def child(self, token: int) -> "DraftNode | None":
        return next((c for c in self.children if c.token == token), None)


class PoolNode:
    """A trie node of the candidate pool: children by token, with recency and merge count."""

    __slots__ = ("children", "last", "count")

    def __init__(self) -> None:
        self.children: dict[int, PoolNode] = {}
        self.last = -1
        self.count = 0


class PerturbationTree:
    """PTD's draft tree (one top node under the root), with expansion, stepping and a size cap.

    Not the verify-pass :class:`specgraft.types.DraftTree`: it persists across steps and is fed
    to the target as probe nodes.
    """

    def __init__(self, tokens: Sequence[int]):
        assert tokens, "the initial tree needs a top token"
        self._born = itertools.count()
        self.top = DraftNode(int(tokens[0]), None, next(self._born))
        for t in tokens[1:]:
            if self.top.child(int(t)) is None:
                self.top.children.append(DraftNode(int(t), self.top, next(self._born)))

    def nodes(self) -> list[DraftNode]:
        """Every node, parents before children (breadth first, children by age)."""
        out, frontier = [], [self.top]
        while frontier:
            out += frontier
            frontier = [c for n in frontier for c in n.children]
        return out

    def depth(self) -> int:
        depth, frontier = 0, [self.top]
        while frontier:
            depth += 1
            frontier = [c for n in frontier for c in n.children]
        return depth

    def main_line(self) -> set[int]:
        """``id`` of the nodes on the chain of earliest-added children from the top."""
        line, node = set(), self.top
        while True:
            line.add(id(node))
            if not node.children:
                return line
            node = node.children[0]

    def expand(self, greedy: dict[int, int], max_children: int) -> int:
        """Add child ``greedy[id(v)]`` to each node ``v`` that has an entry; returns nodes added."""
        added = 0
        for node in self.nodes():
            token = greedy.get(id(node))
            if token is None or node.child(token) is not None or len(node.children) >= max_children:
                continue
            node.children.append(DraftNode(token, node, next(self._born)))
            added += 1
        return added

    def step(self) -> None:
        """Keep only the top's earliest-added child and its descendants (the paper's stepping)."""
        assert self.top.children, "a tree of depth 1 cannot step"
        self.top = self.top.children[0]
        self.top.parent = None

    def cap(self, max_nodes: int) -> None:
        """Drop the newest leaves off the main line until at most ``max_nodes`` nodes remain."""
        nodes = self.nodes()
        if len(nodes) <= max_nodes:
            return
        line = self.main_line()
        leaves = [n for n in nodes if not n.children and id(n) not in line]
        heap = [(-n.born, id(n), n) for n in leaves]
        heapq.heapify(heap)
        size = len(nodes)
        while size > max_nodes and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            parent.children.remove(leaf)
            size -= 1
            if not parent.children and id(parent) not in line:
                heapq.heappush(heap, (-parent.born, id(parent), parent))

    def subtrees(self) -> list[DraftNode]:
        return [n for n in self.nodes() if n.children]


def merge_into_pool(pool: dict[int, PoolNode], sub: DraftNode, now: int) -> None:
    """The paper's ``M(pool[token], T_sub)``: add the missing children, recurse into shared ones."""
    root = pool.setdefault(sub.token, PoolNode())
    root.last = now
    root.count += 1
    stack = [(sub, root)]
    while stack:
        node, trie = stack.pop()
        for child in node.children:
            t = trie.children.get(child.token)
            if t is None:
                t = trie.children[child.token] = PoolNode()
            t.last = now
            t.count += 1
            stack.append((child, t))


def pool_candidates(trie: PoolNode, budget: int) -> tuple[list[int], list[int]]:
    """Up to ``budget`` nodes of ``trie`` below its root, best-first by (recency, count).

    A node is taken only after its parent, so the result is a tree; returned as ``tokens``,
    ``parents`` (``-1`` = child of the root), parents before children.

    >>> t = PoolNode(); a = t.children[5] = PoolNode(); b = t.children[6] = PoolNode()
    >>> a.last, b.last = 3, 7; a.children[9] = PoolNode(); a.children[9].last = 3
    >>> pool_candidates(t, 2)
    ([6, 5], [-1, -1])
    """
    tokens: list[int] = []
    parents: list[int] = []
    tie = itertools.count()
    heap = [(-c.last, -c.count, next(tie), tok, c, -1) for tok, c in trie.children.items()]
    heapq.heapify(heap)
    while heap and len(tokens) < budget:
        _, _, _, tok, node, parent = heapq.heappop(heap)
        index = len(tokens)
        tokens.append(tok)
        parents.append(parent)
        for ctok, c in node.children.items():
            heapq.heappush(heap, (-c.last, -c.count, next(tie), ctok, c, index))
    return tokens, parents


class PTDDrafter:
    """Progressive Tree Drafting (source ``ptd``): candidates from the pool, probes from the draft tree."""

    name: ClassVar[str] = "ptd"
    needs_hidden: ClassVar[bool] = False

    def __init__(self, config: PTDConfig = PTDConfig()):
        self.config = config
        self.generator = torch.Generator(device="cpu")
        self.tree: PerturbationTree | None = None
        self.pool: dict[int, PoolNode] = {}
        self.passes = 0
        # the draft-tree nodes fed in the last proposal, parents first
        self._fed: list[DraftNode] = []
        # draft-tree node cap of the last proposal (it bounds the stepping depth)
        self._cap = config.max_depth

    def prefill_topk_k(self) -> int:
        return 0

    def begin(self, prompt: Sequence[int], prefill_topk: torch.Tensor | None) -> None:
        self.generator.manual_seed(self.config.seed)
        self.pool = {}
        self.passes = 0
        self._fed = []
        # [1 + init_width] random prompt positions -> their tokens
        picks = torch.randint(len(prompt), (1 + self.config.init_width,), generator=self.generator).tolist()
        self.tree = PerturbationTree([int(prompt[i]) for i in picks])

    def probe_budget(self, budget: int) -> int:
        """Draft-tree nodes fed per pass under a total ``budget``."""
        return max(1, round(self.config.probe_share * budget)) if budget > 1 else 0

    def propose(self, context: Sequence[int], budget: int) -> Draft:
        """Candidates from ``pool[context[-1]]`` plus the draft tree as probe nodes, ``budget`` rows at most."""
        assert self.tree is not None, "begin() first"
        n_probe = self.probe_budget(budget)
        self._cap = max(n_probe, 1)
        self.tree.cap(self._cap)
        nodes = self.tree.nodes()[:n_probe]
        trie = self.pool.get(int(context[-1]))
        cand_tokens, cand_parents = pool_candidates(trie, budget - len(nodes)) if trie is not None else ([], [])
        position = {id(n): i for i, n in enumerate(nodes)}
        probes = Draft(
            source=self.name,
            tokens=[n.token for n in nodes],
            parents=[position[id(n.parent)] if n.parent is not None else -1 for n in nodes],
            probe=[True] * len(nodes),
        )
        self._fed = nodes
        candidates = Draft(source=self.name, tokens=cand_tokens, parents=cand_parents)
        # one tree: a probe equal to a candidate (same parent and token) shares its row
        tree = merge_drafts([candidates, probes], budget)
        return Draft(source=self.name, tokens=tree.tokens, parents=tree.parents, probe=tree.probe)

    def observe(self, step: StepResult) -> None:
        """Expand the fed draft-tree nodes by the target's greedy tokens, step, refresh the pool."""
        assert self.tree is not None, "begin() first"
        tree = step.tree
        index = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens, strict=True))}
        # draft-tree node -> verify-pass row (row 0 = root, node i = row i + 1)
        rows: dict[int, int] = {}
        for node in self._fed:
            parent_row = rows.get(id(node.parent), None) if node.parent is not None else 0
            if parent_row is None:
                continue
            i = index.get((parent_row - 1, node.token))
            if i is not None:
                rows[id(node)] = i + 1
        self._fed = []
        if not rows:
            return
        row_ids = list(rows.values())
        # [fed] greedy token at every fed draft-tree node
        greedy = step.logits[row_ids].argmax(dim=-1).tolist()
        self.tree.expand(dict(zip(rows.keys(), greedy, strict=True)), self.config.max_children)
        if self.tree.depth() > min(self.config.max_depth, self._cap):
            self.tree.step()
        self.passes += 1
        for sub in self.tree.subtrees():
            merge_into_pool(self.pool, sub, self.passes)
