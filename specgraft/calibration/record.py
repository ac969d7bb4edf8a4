"""Recording calibration steps through the engine: every stage's tree verified in one pass.

**Recording.** On held-out prompts (records not used for the warm-up, so retrieval is not
scored on text it has memorised) we decode greedily for ``max_new_tokens`` tokens per prompt.
At every step the draft model drafts the *dense* tree (every layer) and records the confidence
``c_d`` of every checkpoint; from that one draft we build the tree each stage would verify (the
``K_draft(s)`` best nodes of the layers drafted before checkpoint ``s`` stops, plus, for
``graft``, the stage's retrieved nodes) and the dense tree, verify their union in one target
forward and read off each tree's accepted length ``a_s`` (greedy acceptance of a sub-tree only
depends on its own nodes' rows). We also measure the time of one draft forward ``t_draft`` and
of a verify forward of ``n`` nodes ``t_verify(n)`` for every ``n <= K``.

The union holds several trees' worth of rows, but a real step verifies one tree of at most
``K`` nodes. So the successor matrix is refreshed only from the rows a real dense step verifies
(the root and the ``K`` nodes of the dense tree: exactly what ``draft-tree`` and an unpruned
``graft`` step verify) plus the union's accepted path (a real decode commits the same tokens and
refreshes their rows in a later step, as a root or an accepted node). Refreshing from the whole
union would fill the matrix from several times more verified rows than serving ever does and
make retrieval's acceptance, hence pruning, look better than it is. (A pruned ``graft`` step
verifies retrieved nodes instead of the pruned draft nodes: as many rows, other tokens.)

The decode runs through :class:`~specgraft.engine.SpecEngine` like any method: one
:class:`UnionDrafter` drafts the dense pool once, builds each stage's tree from it and
proposes their union, and learns from each verify pass what each stage's tree would have
accepted. The engine's target, slots and commit are the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Sequence

import torch  # noqa: F401  (the doctests')

from specgraft.composers.graft import GraftComposer
from specgraft.config import GenerationConfig
from specgraft.drafters.base import StatelessDrafter
from specgraft.drafters.draft_model import DraftModelDrafter, ModelDraft, trim
from specgraft.drafters.graft_retrieval import GraftRetrieval
from specgraft.engine import SpecEngine
from specgraft.models.base import TargetModel
from specgraft.tree.build import merge_drafts
from specgraft.tree.paths import token_paths
from specgraft.types import Draft, DraftTree, PrefillOutput, PrefillRequest, StepResult
from specgraft.verify.greedy import verify_greedy


@dataclass
class Recording:
    """What the calibration decodes measure, one row per step."""

    # [steps, J] confidence c_d at each checkpoint
    confidences: list[list[float]] = field(default_factory=list)
    # variant -> [steps, J + 1] accepted nodes of each stage's tree (last column: the dense tree)
    accepted: dict[str, list[list[int]]] = field(default_factory=dict)
    # [J + 1] draft forwards spent by each stage (last: the dense tree)
    forwards: list[int] = field(default_factory=list)
    # variant -> [steps, J + 1] nodes of each stage's tree (last column: the dense tree)
    sizes: dict[str, list[list[int]]] = field(default_factory=dict)
    # [steps] index of the prompt each step decodes
    prompt_of_step: list[int] = field(default_factory=list)
    draft_forward_s: list[float] = field(default_factory=list)


def greedy_accepted(tree: DraftTree, row_of: dict[tuple[int, ...], int], argmax: list[int]) -> int:
    """Nodes of ``tree`` greedy verification accepts, given the argmax of every row of a super-tree.

    ``row_of`` maps a token path from the root to its row in the super-tree's verify pass (``()``
    is the root, row 0). Tree attention makes a node's row depend only on its own path, so the
    answer equals verifying ``tree`` alone.

    >>> greedy_accepted(DraftTree([5, 6], [-1, 0], ["d"] * 2), {(): 0, (5,): 1, (5, 6): 2, (7,): 3}, [5, 6, 0, 0])
    2
    """
    paths = set(token_paths(tree.tokens, tree.parents))
    path: tuple[int, ...] = ()
    while (nxt := path + (argmax[row_of[path]],)) in paths:
        path = nxt
    return len(path)


def sub_step(step: StepResult, keep: Sequence[int]) -> StepResult:
    """``step`` restricted to the tree nodes ``keep`` (ascending, closed under parents): their
    logits rows (and the root's) and greedy verification of the smaller tree.

    >>> t = DraftTree(tokens=[5, 6, 7], parents=[-1, 0, -1], sources=["d"] * 3)
    >>> s = sub_step(StepResult(1, t, verify_greedy(t, torch.eye(8)[[5, 6, 0, 0]]), torch.eye(8)[[5, 6, 0, 0]], [1]), [0, 1])
    >>> s.tree.tokens, s.logits.argmax(-1).tolist(), s.verify.accepted
    ([5, 6], [5, 6, 0], [0, 1])
    """
    sub = step.tree.subset(keep)
    # [len(keep) + 1, V]
    logits = step.logits[[0, *(i + 1 for i in keep)]]
    return StepResult(root_token=step.root_token, tree=sub, verify=verify_greedy(sub, logits), logits=logits, context=step.context)


def trim_tree(draft: ModelDraft, budget: int) -> DraftTree:
    """The dense tree: the draft's ``budget`` best nodes."""
    kept = trim(draft, budget)
    return DraftTree(tokens=kept.tokens, parents=kept.parents, sources=[kept.source] * len(kept))


@dataclass
class _UnionState:
    draft: Any
    retrieval: Any
    prompt_index: int
    # the last proposal: its pool, dense tree and each variant's stage trees
    pool: ModelDraft | None = None
    dense: DraftTree | None = None
    stage_trees: dict[str, list[DraftTree]] = field(default_factory=dict)


class UnionDrafter(StatelessDrafter):
    """Drafts the dense pool once per step and proposes the union of the dense tree and every
    stage's tree of every variant; its ``observe`` records what each tree accepted.

    The successor matrix learns only from the rows a real dense step verifies plus the accepted
    path (module docstring); the draft model commits the union's accepted path, as it would
    any tree's.
    """

    name: ClassVar[str] = "union"

    def __init__(
        self, drafter: DraftModelDrafter, retrieval: GraftRetrieval, composers: dict[str, GraftComposer], budget: int, rec: Recording
    ):
        self.drafter, self.retrieval, self.composers = drafter, retrieval, composers
        self.budget, self.rec = budget, rec
        self.prompt_index = 0

    def prefill_request(self) -> PrefillRequest:
        return self.drafter.prefill_request().union(self.retrieval.prefill_request())

    def begin(self, prompt: Sequence[int], prefill: PrefillOutput, config: GenerationConfig) -> _UnionState:
        return _UnionState(self.drafter.begin(prompt, prefill, config), self.retrieval.begin(prompt, prefill, config), self.prompt_index)

    def end(self, state: _UnionState) -> None:
        self.drafter.end(state.draft)
        self.retrieval.end(state.retrieval)

    def pending_prefill(self, state: _UnionState, context: Sequence[int]) -> int:
        return self.drafter.pending_prefill(state.draft, context)

    def catch_up(self, state: _UnionState) -> tuple[int, float]:
        return self.drafter.catch_up(state.draft)

    def propose(self, state: _UnionState, context: Sequence[int], budget: int) -> Draft:
        pool = state.pool = self.drafter.draft_pool(state.draft, context)
        self.rec.draft_forward_s += state.draft.forward_s
        envelope = self.retrieval.propose(state.retrieval, context, self.budget)
        dense = state.dense = trim_tree(pool, self.budget)
        trees = [dense]
        state.stage_trees = {}
        for variant, composer in self.composers.items():
            per_stage = []
            for j, d in enumerate(self.drafter.config.checkpoints):
                # what the drafter returns when it stops at checkpoint j
                stopped = trim(pool.subset(range(sum(pool.layer_sizes[: d + 1]))), self.budget)
                per_stage.append(composer.compose(stopped, envelope, self.budget, j))
            state.stage_trees[variant] = per_stage
            trees += per_stage
        union = merge_drafts([Draft("union", t.tokens, t.parents) for t in trees], sum(len(t) for t in trees))
        return Draft(self.name, union.tokens, union.parents)

    def observe(self, state: _UnionState, step: StepResult) -> None:
        pool, dense, rec = state.pool, state.dense, self.rec
        assert pool is not None and dense is not None
        argmax = step.logits.argmax(dim=-1).tolist()
        row_of = {p: i + 1 for i, p in enumerate(token_paths(step.tree.tokens, step.tree.parents))}
        row_of[()] = 0
        if len(pool.confidences) == len(self.drafter.config.checkpoints):
            rec.confidences.append(list(pool.confidences))
            rec.prompt_of_step.append(state.prompt_index)
            dense_accepted = greedy_accepted(dense, row_of, argmax)
            for variant, per_stage in state.stage_trees.items():
                rec.accepted[variant].append([greedy_accepted(t, row_of, argmax) for t in per_stage] + [dense_accepted])
                rec.sizes[variant].append([len(t) for t in per_stage] + [len(dense)])
        # the draft model's cache follows the committed path of the union
        self.drafter.observe(state.draft, step)
        # the matrix learns only from the rows a real step verifies (module docstring)
        keep = sorted({row_of[p] - 1 for p in token_paths(dense.tokens, dense.parents)} | set(step.verify.accepted))
        self.retrieval.observe(state.retrieval, sub_step(step, keep))


def record_steps(
    target: TargetModel,
    drafter: DraftModelDrafter,
    retrieval: GraftRetrieval,
    composers: dict[str, GraftComposer],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    budget: int,
    progress: bool = False,
) -> Recording:
    """Greedy decoding of ``prompts`` with the union of every stage tree; see the module docstring."""
    checkpoints = drafter.config.checkpoints
    if drafter.config.thresholds is not None:
        raise ValueError(f"record with an ungated drafter (thresholds=None), got thresholds {drafter.config.thresholds}")
    rec = Recording(accepted={v: [] for v in composers}, sizes={v: [] for v in composers})
    rec.forwards = [d + 1 for d in checkpoints] + [drafter.config.depth]
    union = UnionDrafter(drafter, retrieval, composers, budget, rec)
    engine = SpecEngine(target, [union], _AsProposed(), method="calibration")
    # room for the deepest tree past the tokens recorded, so the engine never cuts a union short
    config = GenerationConfig(max_new_tokens=max_new_tokens + drafter.config.depth + 1, budget=budget, stop_on_eos=False)
    it: Any = enumerate(prompts)
    if progress:
        from rich.progress import track

        it = track(it, total=len(prompts), description="calibration")
    for index, prompt in it:
        union.prompt_index = index
        generated = 0
        steps = engine.stream_ids(prompt, config)
        for chunk in steps:
            generated += len(chunk)
            if generated >= max_new_tokens:
                break
        steps.close()
    return rec


class _AsProposed:
    """The union as proposed: larger than the budget (it holds several trees of the budget)."""

    def build(self, drafts: Sequence[Draft], budget: int) -> DraftTree:
        (d,) = drafts
        return DraftTree(tokens=d.tokens, parents=d.parents, sources=[d.source] * len(d))
