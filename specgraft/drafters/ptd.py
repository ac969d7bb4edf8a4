"""PTD, Progressive Tree Drafting (source ``ptd``): the target drafts for itself from a perturbation tree.

Paper: *Accelerating LLM inference via speculative decoding with progressive tree drafting*
(``001_f7ca4e9c9cbbb660.txt``), section 3 and Appendices A-C. No draft model, no training:

1. **Draft tree.** Several *sub-trees* hang directly under the root (the last committed token),
   each started from one random token. Every verify pass feeds them to the target beside the
   candidate tree as *probe* nodes; each probe node attends to the committed prefix, the root
   and its own ancestors only (the shared tree layout gives exactly that), so its logits are
   the target's view of "committed text + this perturbed branch". Probe nodes are never
   accepted and never committed (``DraftTree.probe``).
2. **Expansion** (eq. for ``V^i, E^i``). After the pass, every fed probe node ``v`` gets the
   target's greedy token ``d_v`` at ``v`` as a child, unless ``v`` already has a child with that
   token or has ``max_children`` children (the width limit, 4 in the paper). Leaves always grow,
   so every sub-tree deepens by one level per pass; inner nodes branch when the committed text
   has moved on and their prediction changed. The root is not expanded: its greedy token is
   the next committed token, not a draft.
3. **Stepping**, per sub-tree. When a sub-tree is deeper than ``max_depth`` (6 in the paper),
   only its top's earliest-added child and that child's descendants are kept: that child
   becomes the sub-tree's new top. Each sub-tree slides forward like a window on its own,
   shedding its random initial token first; the other sub-trees are untouched.
4. **Pool.** Every sub-tree of the draft tree (every node with children) is merged into a
   candidate pool keyed by its top token with the paper's merge ``M(T, T')`` (children of
   ``T'`` missing from ``T`` are added, shared children merged recursively). The pool is a dict
   ``token -> trie``.
5. **Candidates.** The next pass's candidate tree is the pool trie of the last committed
   token, verified with the shared verifiers (greedy; sample-and-match when sampling, which is
   the paper's Appendix B rule in its exact sequential form).

**Why several sub-trees under the root.** Section 3.2 steps "the immediate sub-tree ``T_s`` of
the root ``r``" when it "exceeds a predefined depth threshold": "only the earliest-added child
node and its descendants are retained", and "this retained branch is then treated as the new
sub-tree replacing ``T_s``". So the unit of stepping is a child of the root with its
descendants, and the root (the decoded text's end, blue in Figure 3) may have several such
children; Algorithm 1's ``if depth(T^i) > d_max: STEPANDPRUNE(T^i)`` applies to each of them.
The random initial tokens exist "to ensure the draft content diversity as it grows": with
one random top and random children under it, the first stepping would keep one child and
throw the others away at once. Here each random token starts its own sub-tree under the root
(``init_width`` of them; the root obeys the width limit like every node), and each keeps its
diversity until its own window slides past it.

Worked example (``max_depth = 2``): committed text ``... the cat``, root ``cat``, sub-trees
``q`` and ``z`` (random). The pass feeds ``[cat, q, z]``; the target's greedy tokens are
``sat`` after ``cat q`` and ``on`` after ``cat z``: the tree becomes ``q -> sat`` and
``z -> on``, and the pool holds ``q: {sat}`` and ``z: {on}``. One pass later ``q -> sat -> on``
is 3 deep and steps to ``sat -> on``; ``z -> on -> a`` steps to ``on -> a``. Once the text
ends in ``z``, the candidate tree is ``on``.

**Choices where the paper is silent** (made for speed and stated here):

- *Initial tokens.* Each sub-tree's top is a token drawn uniformly from the committed text with
  a seeded generator: random but in distribution (uniform vocabulary ids are mostly byte
  pieces and rare scripts), as Lookahead decoding fills its window from the prompt. Reseeded
  at every generation, so runs repeat. Tops are distinct: when a sub-tree steps onto the
  token of another top it is dropped (the two would feed the same rows and grow alike), and a
  sub-tree dropped that way is replaced by a fresh random token at the next pass.
- *Budget.* The engine's budget caps the rows of a pass (the paper does not cap the draft
  tree's node count; its limits keep it at about 31-42 nodes, Table 4's Dft). The draft tree
  gets ``round(probe_share * budget)`` rows at most (at least one, and at least one row is
  left for candidates); the candidates get the rest. :meth:`PTDConfig.limits` resolves what a
  budget allows, and the drafter's ``repr`` shows it:

  - *sub-trees*: all ``init_width`` random tops are fed while they are young; when their
    *main lines* (the chains of earliest-added children from each top, the part stepping
    keeps) no longer fit the rows, the newest sub-trees are dropped, down to
    ``min(init_width, (rows - 1) // max_depth)`` (at least one), the count whose
    depth-limited main lines always fit with a row to spare for a branch; a sub-tree missing
    from that count is drawn anew. So a small budget
    still samples every random start in its first passes (the pool keeps what they drafted)
    and then follows the surviving sub-tree(s);
  - *depth limit*: ``min(max_depth, rows)``; a tree capped below ``max_depth`` rows could
    otherwise never reach the depth that triggers stepping, and would freeze instead of
    sliding forward;
  - *size*: when the draft tree outgrows its rows, the newest leaves off the main lines are
    dropped first.

  **The paper's limits need a budget of at least 14** with the default ``probe_share = 0.5``
  (:meth:`PTDConfig.paper_limits_budget`): from 7 draft rows on, one sub-tree reaches depth 6
  and a node beside its main line can exist, so both the depth and the width limit can bind.
  At the CPU default budget of 8 (``methods.DEFAULT_BUDGETS``, chosen by measurement) the
  draft tree has 4 rows: the four random tops for a pass or two, then one sub-tree with depth
  limit 4, in practice a sliding chain of 4 whose windows the pool collects as 4-grams.
  :meth:`PTDConfig.paper` with ``budget = PAPER_BUDGET`` is the paper's scale: 38 draft rows
  (4 sub-trees of depth 6 plus branches) and up to 26 candidate rows, like Table 4's 31-42
  draft and 17-32 verify tokens.
- *Budget below 2.* There is no row for probes: the pass feeds candidates only and the draft
  tree is kept as it is (not cut), so generation near the end of the context window, where
  the engine lowers the budget, goes on and drafting resumes if rows come back. It is not a
  ``ValueError`` for that reason; a user budget of 1 simply drafts nothing new.
- *Which candidates.* When the pool trie has more nodes than the candidate rows, nodes are
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

from specgraft.config import GenerationConfig
from specgraft.drafters.base import StatelessDrafter
from specgraft.tree.build import merge_drafts
from specgraft.types import Draft, PrefillOutput, StepResult

#: Nodes per verify pass at the paper's scale (with :meth:`PTDConfig.paper`: 38 draft, 26 candidate rows).
PAPER_BUDGET = 64


@dataclass(frozen=True)
class PTDLimits:
    """What one budget allows the draft tree (:meth:`PTDConfig.limits`); shown by the drafter's ``repr``.

    >>> PTDConfig().limits(8)
    PTDLimits(budget=8, draft_rows=4, sub_trees=1, depth_limit=4, max_children=4, paper_limits_bind=False)
    """

    budget: int
    draft_rows: int
    """Draft-tree nodes fed per pass at most (0: the pass feeds candidates only)."""
    sub_trees: int
    """Sub-trees under the root (random tops) once grown; up to ``init_width`` while young."""
    depth_limit: int
    """A sub-tree deeper than this steps."""
    max_children: int
    """Width limit per node."""
    paper_limits_bind: bool
    """Whether the configured depth limit is reached and a node beside the main lines fits."""

    @property
    def candidate_rows(self) -> int:
        return self.budget - self.draft_rows

    def __str__(self) -> str:
        if self.draft_rows == 0:
            return f"budget {self.budget}: no draft rows (candidates only)"
        return (
            f"budget {self.budget}: {self.draft_rows} draft rows ({self.sub_trees} grown sub-tree(s), depth <= "
            f"{self.depth_limit}, width <= {self.max_children}), {self.candidate_rows} candidate rows"
        )


@dataclass(frozen=True)
class PTDConfig:
    max_children: int = 4
    """Width limit: children per draft-tree node, the root included (the paper's default, 4)."""
    max_depth: int = 6
    """Depth limit of each sub-tree under the root; deeper triggers stepping (the paper's default, 6)."""
    init_width: int = 4
    """Sub-trees under the root, each started from one random token (at most ``max_children``)."""
    probe_share: float = 0.5
    """Share of the per-step budget the draft tree may use (at least one row, and one row left
    for candidates)."""
    seed: int = 0
    """Seed of the generator that draws the random tokens (reseeded every generation)."""

    def __post_init__(self) -> None:
        if self.max_children < 1:
            raise ValueError(f"max_children must be >= 1, got {self.max_children}")
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        if not 1 <= self.init_width <= self.max_children:
            raise ValueError(f"init_width must lie in [1, max_children={self.max_children}], got {self.init_width}")
        if not 0.0 < self.probe_share < 1.0:
            raise ValueError(f"probe_share must lie in (0, 1), got {self.probe_share}")

    @classmethod
    def paper(cls, seed: int = 0) -> "PTDConfig":
        """The paper's setting, to run with ``budget = PAPER_BUDGET``: width 4, depth 6 (section 4.2.2),
        four random sub-trees and a 0.6 draft share, so 38 draft rows and up to 26 candidate rows
        (Table 4: 31-42 draft and 17-32 verify tokens per pass).

        >>> PTDConfig.paper().limits(PAPER_BUDGET)
        PTDLimits(budget=64, draft_rows=38, sub_trees=4, depth_limit=6, max_children=4, paper_limits_bind=True)
        """
        return cls(max_children=4, max_depth=6, init_width=4, probe_share=0.6, seed=seed)

    def limits(self, budget: int) -> PTDLimits:
        """The draft tree's rows, sub-trees and depth limit under a total ``budget`` (see the module docstring)."""
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        if budget < 2:
            return PTDLimits(budget, 0, 0, 0, self.max_children, False)
        rows = min(budget - 1, max(1, round(self.probe_share * budget)))
        # full-depth main lines plus at least one spare row, so the width limit can bind too
        sub_trees = max(1, min(self.init_width, (rows - 1) // self.max_depth))
        depth_limit = min(self.max_depth, rows)
        binds = depth_limit == self.max_depth and rows > sub_trees * self.max_depth
        return PTDLimits(budget, rows, sub_trees, depth_limit, self.max_children, binds)

    def paper_limits_budget(self) -> int:
        """The smallest budget from which the width and depth limits can bind.

        >>> PTDConfig().paper_limits_budget(), PTDConfig.paper().paper_limits_budget()
        (14, 11)
        """
        # rows grow with the budget, so the first budget that binds is the answer
        return next(b for b in itertools.count(2) if self.limits(b).paper_limits_bind)


class DraftNode:
    """A node of the perturbation draft tree; ``born`` orders nodes by creation (earliest first).

    ``parent`` is ``None`` for the top of a sub-tree (a child of the root).
    """

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


def levels(tops: Sequence[DraftNode]) -> list[list[DraftNode]]:
    """The nodes under ``tops`` level by level (children by age)."""
    out, frontier = [], list(tops)
    while frontier:
        out.append(frontier)
        frontier = [c for n in frontier for c in n.children]
    return out


class PerturbationTree:
    """PTD's draft tree: sub-trees under the root (``tops``, oldest first), with expansion,
    per-sub-tree stepping and a size cap.

    Not the verify-pass :class:`specgraft.types.DraftTree`: it persists across steps and is fed
    to the target as probe nodes.

    >>> tree = PerturbationTree([10, 20])
    >>> tree.expand({id(tree.tops[0]): 11, id(tree.tops[1]): 21}, max_children=4)
    2
    >>> [n.token for n in tree.nodes()], tree.depth()
    ([10, 20, 11, 21], 2)
    """

    def __init__(self, tops: Sequence[int] = ()):
        self._born = itertools.count()
        self.tops: list[DraftNode] = []
        for t in tops:
            self.add_top(int(t))

    def add_top(self, token: int) -> bool:
        """Start a sub-tree at ``token`` unless a top already has that token."""
        if any(t.token == token for t in self.tops):
            return False
        self.tops.append(DraftNode(token, None, next(self._born)))
        return True

    def nodes(self) -> list[DraftNode]:
        """Every node, parents before children (breadth first over all sub-trees, children by age)."""
        return [n for level in levels(self.tops) for n in level]

    def depth(self, top: DraftNode | None = None) -> int:
        """Depth of the sub-tree at ``top`` (a top alone has depth 1), or of the deepest one."""
        return len(levels([top] if top is not None else self.tops))

    def main_line(self) -> set[int]:
        """``id`` of the nodes on the chains of earliest-added children from each top."""
        line = set()
        for node in self.tops:
            while True:
                line.add(id(node))
                if not node.children:
                    break
                node = node.children[0]
        return line

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

    def step(self, top: DraftNode) -> DraftNode | None:
        """The paper's stepping of one sub-tree: keep only ``top``'s earliest-added child and its
        descendants, as the new sub-tree in ``top``'s place. Returns the new top, or ``None``
        when another top already has its token (the stepped sub-tree is then dropped)."""
        assert top.children, "a sub-tree of depth 1 cannot step"
        i = next(k for k, t in enumerate(self.tops) if t is top)
        new = top.children[0]
        new.parent = None
        if any(t.token == new.token for t in self.tops if t is not top):
            del self.tops[i]
            return None
        self.tops[i] = new
        return new

    def step_deep(self, depth_limit: int) -> int:
        """Step every sub-tree deeper than ``depth_limit`` until it is not; returns steps taken."""
        steps = 0
        for top in list(self.tops):
            node: DraftNode | None = top
            while node is not None and self.depth(node) > depth_limit:
                node = self.step(node)
                steps += 1
        return steps

    def cap(self, max_nodes: int) -> None:
        """Drop the newest leaves off the main lines until at most ``max_nodes`` nodes remain."""
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


@dataclass
class PTDState:
    """One sequence's perturbation tree, candidate pool and random stream."""

    tree: PerturbationTree
    generator: torch.Generator
    pool: dict[int, PoolNode] = field(default_factory=dict)
    passes: int = 0
    # the draft-tree nodes fed in the last proposal, parents first
    fed: list[DraftNode] = field(default_factory=list)
    # limits of the last proposal's budget (None before the first)
    limits: PTDLimits | None = None


class PTDDrafter(StatelessDrafter):
    """Progressive Tree Drafting (source ``ptd``): candidates from the pool, probes from the draft tree.

    Everything PTD learns (tree, pool) is per sequence: it starts empty at every generation.

    >>> d = PTDDrafter(); s = d.begin([5, 6, 7, 8], PrefillOutput(), GenerationConfig())
    >>> _ = d.propose(s, [5, 6, 7, 8], budget=8); s.limits
    PTDLimits(budget=8, draft_rows=4, sub_trees=1, depth_limit=4, max_children=4, paper_limits_bind=False)
    """

    name: ClassVar[str] = "ptd"

    def __init__(self, config: PTDConfig = PTDConfig()):
        self.config = config

    def __repr__(self) -> str:
        return f"PTDDrafter({self.config}; paper width/depth limits bind from budget {self.config.paper_limits_budget()})"

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> PTDState:
        state = PTDState(tree=PerturbationTree(), generator=torch.Generator(device="cpu").manual_seed(self.config.seed))
        self._draw_tops(state, prompt, self.config.init_width)
        return state

    @staticmethod
    def _draw_tops(state: PTDState, context: Sequence[int], n: int) -> None:
        """Start sub-trees at random tokens of ``context`` until there are ``n`` (distinct tops)."""
        missing = n - len(state.tree.tops)
        if missing <= 0 or not context:
            return
        # a fixed number of draws per call, so the stream of draws repeats run to run
        for i in torch.randint(len(context), (4 * missing,), generator=state.generator).tolist():
            if state.tree.add_top(int(context[i])):
                missing -= 1
                if missing == 0:
                    return

    def propose(self, state: PTDState, context: Sequence[int], budget: int) -> Draft:
        """Candidates from ``pool[context[-1]]`` plus the draft tree as probe nodes, ``budget`` rows at most."""
        limits = state.limits = self.config.limits(budget)
        tree = state.tree
        nodes: list[DraftNode] = []
        if limits.draft_rows > 0:
            # fit the tree to this budget: depth (a no-op at a steady budget: observe steps at the
            # same limit), sub-tree count (young ones go while their main lines outgrow the rows;
            # missing ones are drawn anew), size
            tree.step_deep(limits.depth_limit)
            while len(tree.main_line()) > limits.draft_rows:
                del tree.tops[-1]
            self._draw_tops(state, context, limits.sub_trees)
            tree.cap(limits.draft_rows)
            nodes = tree.nodes()
            assert len(nodes) <= limits.draft_rows, f"{len(nodes)} draft nodes under a cap of {limits.draft_rows}"
        trie = state.pool.get(int(context[-1]))
        cand_tokens, cand_parents = pool_candidates(trie, budget - len(nodes)) if trie is not None else ([], [])
        position = {id(n): i for i, n in enumerate(nodes)}
        probes = Draft(
            source=self.name,
            tokens=[n.token for n in nodes],
            parents=[position[id(n.parent)] if n.parent is not None else -1 for n in nodes],
            probe=[True] * len(nodes),
        )
        state.fed = nodes
        candidates = Draft(source=self.name, tokens=cand_tokens, parents=cand_parents)
        # one tree: a probe equal to a candidate (same parent and token) shares its row
        merged = merge_drafts([candidates, probes], budget)
        return Draft(source=self.name, tokens=merged.tokens, parents=merged.parents, probe=merged.probe)

    def observe(self, state: PTDState, step: StepResult) -> None:
        """Expand the fed draft-tree nodes by the target's greedy tokens, step, refresh the pool."""
        tree = step.tree
        index = {(p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens, strict=True))}
        # draft-tree node -> verify-pass row (row 0 = root, node i = row i + 1); nodes the engine
        # cut from the pass (e.g. near the context window's end) have no row and do not grow
        rows: dict[int, int] = {}
        for node in state.fed:
            parent_row = rows.get(id(node.parent), None) if node.parent is not None else 0
            if parent_row is None:
                continue
            i = index.get((parent_row - 1, node.token))
            if i is not None:
                rows[id(node)] = i + 1
        state.fed = []
        if not rows:
            return
        assert state.limits is not None
        row_ids = list(rows.values())
        # [fed] greedy token at every fed draft-tree node
        greedy = step.logits[row_ids].argmax(dim=-1).tolist()
        state.tree.expand(dict(zip(rows.keys(), greedy, strict=True)), self.config.max_children)
        state.tree.step_deep(state.limits.depth_limit)
        state.passes += 1
        for sub in state.tree.subtrees():
            merge_into_pool(state.pool, sub, state.passes)
