"""Graft: prune the draft-model tree at confidence checkpoints, graft retrieval into the released slots.

Under a fixed verification budget ``K`` (Graft sections 2-3, Appendix A, Algorithm 2):

1. The draft model drafts layer by layer (:mod:`specgraft.drafters.draft_model`); at each
   pruning checkpoint ``d`` it compares ``c_d = exp(max path score)`` with a calibrated
   ``tau_d`` and stops drafting when ``c_d <= tau_d``. The checkpoint reached is the *stage*.
2. Stage ``s`` splits the budget ``K = K_draft(s) + K_ret(s)``: the paper keeps 8, 24, 40 of 60
   nodes from the draft for pruning at the root, after depth 1 and after depth 5; we keep the
   same shares of ``K`` (``round(K * 8 / 60)`` ...). The ``K_draft(s)`` best draft nodes by path
   score are kept (sampled drafts: the first ones, and never a cut inside the layers the gates
   read, :meth:`GraftComposer.draft_nodes`). No pruning: the whole budget goes to the draft.
3. Retrieval fills ``K_ret(s)`` slots from the successor matrix shared with Token Recycling
   (rows refreshed from the target's top-k at every verified node, warmed up from a corpus),
   rooted at the root token, with the stage's rank-path template (Table 7: ``d0`` 52 nodes
   ``8+10+8+6+5+4+4+4+3``, ``d1`` 36, ``d5`` 20; for other budgets the ``K_ret`` nodes of the
   stage template with the highest prior acceptance, :func:`~specgraft.tree.templates.scale_template`).
   The root-centred envelope holding every stage's template is filled once per step,
   independently of drafting (``drafters/graft_retrieval.py``); the composer takes the stage's part.
4. The kept draft nodes and the stage's retrieved nodes are merged (shared prefixes
   deduplicated) into one tree of at most ``K`` nodes, verified with the unchanged rule.

Variants (the ablations of the paper's Figures 2 and 5, all at the same budget ``K``):

==============  ==========  =====================  ==========================================
method          gates       draft / retrieval      retrieval rooted at
==============  ==========  =====================  ==========================================
``draft-tree``  no          K / 0                  (none: the dense EAGLE-2 tree)
``graft-prune`` yes         K_draft(s) / 0         (none: released slots stay empty)
``graft-fixed`` no          stage ``d1`` split     root ("w/o prune": a fixed split every step)
``graft-root``  no          stage ``d5`` split     root (a retrieved branch beside the draft)
``graft-tail``  no          stage ``d5`` split     the end of the best draft path
``graft``       yes         K_draft(s) / K_ret(s)  root
==============  ==========  =====================  ==========================================

``graft-fixed`` and ``graft-root`` are the same mechanism (no pruning, retrieval at the root,
a fixed split) at two splits: the paper describes ROOT as "a retrieved branch attached to the
root alongside the original candidates" and "w/o prune" as "a fixed draft/retrieval split";
we give ROOT and TAIL the small branch of the deepest stage and "w/o prune" the middle
stage's split, both configurable. TAIL follows the highest-scoring child from the root to a
leaf of the kept draft and hangs the stage template under it, filled from that leaf's token:
it only pays off when the whole draft prefix is accepted, as the paper says.

Example with ``K = 60`` and a draft pruned at the root (stage 0): 8 draft nodes (the 8 best
children of the root) + the 52-node ``d0`` template filled from ``M[root]`` -> a 60-node tree.
A retrieved node that repeats a draft node is merged, not duplicated, and its slot (like one a
gated draft leaves unused) goes to the next envelope node by prior acceptance, so the tree
still has 60 nodes (eq. 11) when the envelope has enough valid nodes whose prior reaches
``GraftConfig.refill_min_prior``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from specgraft.drafters.draft_model import ModelDraft, trim
from specgraft.drafters.recycling import SuccessorMatrix
from specgraft.tree.build import merge_drafts
from specgraft.tree.paths import best_path
from specgraft.tree.templates import FULL_ENVELOPE, STAGE_TEMPLATES, RankTemplate, node_priors, scale_template, union_template
from specgraft.types import Draft, DraftTree

if TYPE_CHECKING:
    from specgraft.drafters.graft_retrieval import EnvelopeDraft

#: The source name of retrieved nodes (``GraftRetrieval.name``).
RETRIEVAL_SOURCE = "retrieval"

#: The paper's budget and per-stage split (Appendix A: 8/24/40 draft nodes of 60).
PAPER_BUDGET = 60
PAPER_DRAFT_NODES = (8, 24, 40)

#: How a variant picks the split between drafted and retrieved nodes at each step (:class:`GraftConfig`).
SPLITS = ("checkpoint", "fixed", "branch")
#: Where retrieved nodes hang.
RETRIEVALS = (None, "root", "tail")


@dataclass(frozen=True)
class GraftConfig:
    variant: str = "graft"
    """The method's name, for messages and records (its behaviour is the fields below:
    ``methods/graft.py``'s ``graft_config`` sets them per variant)."""
    gated: bool = True
    """The drafter stops at confidence checkpoints and the released budget is grafted."""
    retrieval: str | None = "root"
    """Where retrieved nodes hang: ``"root"``, ``"tail"`` or None (no retrieval)."""
    split: str = "checkpoint"
    """The drafted/retrieved split of each step: the stage of the checkpoint the drafter stopped
    at (``"checkpoint"``), or always ``fixed_stage``'s (``"fixed"``) or ``branch_stage``'s
    (``"branch"``)."""
    draft_shares: tuple[float, ...] = tuple(n / PAPER_BUDGET for n in PAPER_DRAFT_NODES)
    """``K_draft(s) / K`` for each stage (one per pruning checkpoint, shallowest first)."""
    stage_templates: tuple[tuple[int, ...], ...] = (STAGE_TEMPLATES["d0"], STAGE_TEMPLATES["d1"], STAGE_TEMPLATES["d5"])
    """Retrieved nodes per depth of each stage's template at ``K = 60`` (Table 7), scaled to ``K_ret``."""
    envelope: tuple[int, ...] = FULL_ENVELOPE
    """The full retrieval envelope at ``K = 60`` (80 nodes, Table 7); scaled by ``K / 60``."""
    fixed_stage: int = 1
    """The stage whose split ``graft-fixed`` uses at every step."""
    branch_stage: int = 2
    """The stage whose split ``graft-root`` and ``graft-tail`` use at every step."""
    k: int = 8
    """Successors per token in the matrix (template ranks are ``< k``)."""
    refill_min_prior: float = 0.02
    """Envelope nodes outside the stage's template refill freed slots only if their prior
    acceptance (``tree/templates.py``, ``node_priors``) is at least this: on a CPU every row of a
    verify pass costs a few percent of a step, and a 0.4% node is not worth one. 0 = fill to K."""

    def __post_init__(self) -> None:
        if self.split not in SPLITS or self.retrieval not in RETRIEVALS:
            raise ValueError(f"split must be one of {SPLITS} and retrieval one of {RETRIEVALS}, got {self.split!r}, {self.retrieval!r}")
        if len(self.draft_shares) != len(self.stage_templates):
            raise ValueError(f"{len(self.draft_shares)} draft shares for {len(self.stage_templates)} stage templates")
        if any(not 0.0 <= s <= 1.0 for s in self.draft_shares):
            raise ValueError(f"draft shares must lie in [0, 1], got {self.draft_shares}")
        for name in ("fixed_stage", "branch_stage"):
            if not 0 <= getattr(self, name) < len(self.stage_templates):
                raise ValueError(f"{name} must index a stage (0..{len(self.stage_templates) - 1}), got {getattr(self, name)}")
        if self.k < 1:
            raise ValueError(f"k must be >= 1, got {self.k}")
        if not 0.0 <= self.refill_min_prior < 1.0:
            raise ValueError(f"refill_min_prior must lie in [0, 1), got {self.refill_min_prior}")

    @property
    def fixed(self) -> int | None:
        """The stage whose split every step uses (``split`` fixed or branch), else None."""
        return {"fixed": self.fixed_stage, "branch": self.branch_stage}.get(self.split)


@dataclass(frozen=True)
class BudgetPlan:
    """Everything that depends only on the budget ``K``, computed once per ``K``."""

    budget: int
    # [stages] retained draft nodes / retrieved nodes per stage
    k_draft: tuple[int, ...]
    k_ret: tuple[int, ...]
    # each stage's retrieval template (scaled to k_ret)
    stage_templates: tuple[RankTemplate, ...]
    # the root-centred envelope: the scaled full envelope and every stage template
    envelope: RankTemplate
    # [stages] envelope node indices of each stage's template
    stage_nodes: tuple[np.ndarray, ...]
    # [stages][envelope nodes] admission order of the retrieved nodes at each stage: the stage's
    # template first (scores >= 1), then the rest of the envelope, each by prior acceptance
    # (higher first); NaN = never offered (a refill node below ``refill_min_prior``)
    stage_scores: tuple[np.ndarray, ...]
    # [envelope nodes] the envelope nodes some stage offers (any score of that stage, NaN = none):
    # what decides the verification rule where the stage is chosen by sampled values
    offered_scores: np.ndarray


def plan_budget(config: GraftConfig, budget: int) -> BudgetPlan:
    """Split ``budget`` per stage and build the templates.

    >>> p = plan_budget(GraftConfig(), 60)
    >>> p.k_draft, p.k_ret, [t.depth_counts() for t in p.stage_templates][0]
    ((8, 24, 40), (52, 36, 20), [8, 10, 8, 6, 5, 4, 4, 4, 3])
    >>> plan_budget(GraftConfig(), 24).k_draft
    (3, 10, 16)
    """
    k_draft = tuple(min(budget, int(np.floor(share * budget + 0.5))) for share in config.draft_shares)
    k_ret = tuple(budget - kd for kd in k_draft)
    stages = tuple(
        scale_template(counts, kr, config.k)
        for counts, kr in zip(config.stage_templates, k_ret, strict=True)
    )
    full_size = int(np.floor(sum(config.envelope) * budget / PAPER_BUDGET + 0.5))
    full = scale_template(config.envelope, max(full_size, 1), config.k)
    envelope, where = union_template([full, *stages])
    prior = node_priors(envelope)
    scores = []
    for nodes in where[1:]:
        in_stage = np.zeros(len(envelope), dtype=bool)
        in_stage[nodes] = True
        score = prior + in_stage  # priors lie in (0, 1): stage nodes always come first
        # a dropped refill node's descendants have lower priors and are dropped too; the stage
        # template is closed under parents, so the offered nodes stay a tree
        score[~in_stage & (prior < config.refill_min_prior)] = np.nan
        scores.append(score)
    return BudgetPlan(
        budget=budget, k_draft=k_draft, k_ret=k_ret, stage_templates=stages, envelope=envelope,
        stage_nodes=tuple(where[1:]), stage_scores=tuple(scores), offered_scores=np.fmax.reduce(scores),
    )


class StagePlanner:
    """Caches :func:`plan_budget` per budget; shared by ``GraftRetrieval`` and :class:`GraftComposer`."""

    def __init__(self, config: GraftConfig):
        self.config = config
        self._plans: dict[int, BudgetPlan] = {}

    def plan(self, budget: int) -> BudgetPlan:
        if budget not in self._plans:
            self._plans[budget] = plan_budget(self.config, budget)
        return self._plans[budget]

    @property
    def k(self) -> int:
        """Successors per token the templates use (``GraftRetrieval`` reads it)."""
        return self.config.k

    def envelope(self, budget: int) -> RankTemplate:
        """The root-centred envelope of ``budget``'s plan (what ``GraftRetrieval`` fills)."""
        return self.plan(budget).envelope


def retrieval_part(envelope: EnvelopeDraft, scores: np.ndarray) -> Draft:
    """The envelope nodes offered at a stage, scored by ``scores[template node]`` (NaN: not
    offered) so that a merge admits the stage's template first and refills from the rest.

    A retrieved node that repeats a kept draft node is merged into it, a node under an unfilled
    matrix row is missing, and a gated draft may keep fewer nodes than ``K_draft``; each leaves
    a slot empty. Offering the envelope in the stage's order fills those slots (eq. 11,
    ``|T_s| = K_max``) with distinct candidates: the stage template's nodes, then the envelope's
    next best, as long as their prior reaches ``GraftConfig.refill_min_prior``.

    Example: stage template ``(0,)`` (score 1.45) and refill nodes ``(1,)`` (0.08) and
    ``(0, 0)`` (0.2); with a floor of 0.1, ``(1,)`` is not offered::

        retrieval_part(envelope, np.array([1.45, np.nan, 0.2]))   # tokens of (0,) and (0, 0)
    """
    keep = [i for i, t in enumerate(envelope.template_nodes) if not np.isnan(scores[t])]
    scored = Draft(source=envelope.source, tokens=envelope.tokens, parents=envelope.parents,
                   scores=[float(scores[t]) for t in envelope.template_nodes])
    return scored.subset(keep)


class GraftComposer:
    """Builds Graft's hybrid tree (or one of its ablation variants) from a :class:`ModelDraft`
    and, for retrieval variants, an :class:`EnvelopeDraft` (``graft-tail`` fills its template
    at a draft leaf from the envelope's matrix: the sequence's own). Holds no per-sequence state."""

    def __init__(self, config: GraftConfig = GraftConfig(), planner: StagePlanner | None = None):
        self.config = config
        self.planner = planner if planner is not None else StagePlanner(config)
        if self.planner.config != config:
            raise ValueError("the planner was built for another GraftConfig")

    def stage_of(self, draft: ModelDraft) -> int | None:
        """The stage whose split applies: the draft's pruning stage, the fixed one, or None (all draft)."""
        if self.config.gated:
            return draft.stage
        return self.config.fixed

    def build(self, drafts: Sequence[Draft], budget: int) -> DraftTree:
        model_drafts = [d for d in drafts if isinstance(d, ModelDraft)]
        envelopes = [d for d in drafts if d.source == RETRIEVAL_SOURCE]
        if len(model_drafts) != 1 or len(envelopes) > 1:
            raise ValueError(
                f"Graft composes one draft-model draft and at most one retrieval envelope, got {len(model_drafts)} "
                f"and {len(envelopes)} (sources {[d.source for d in drafts]})"
            )
        draft = model_drafts[0]
        return self.compose(draft, envelopes[0] if envelopes else None, budget, self.stage_of(draft))

    def compose(self, draft: ModelDraft, envelope: EnvelopeDraft | None, budget: int, stage: int | None) -> DraftTree:
        """The tree for ``stage`` (None: the dense tree): kept draft nodes first, then retrieved ones
        up to ``budget`` nodes (retrieval at the root refills slots freed by merged nodes).

        Sampled drafts (``--sample-drafts``) stay exact under the gates (see :meth:`draft_nodes`
        for the cut and :func:`~specgraft.tree.build.merge_drafts` for the rule): with
        retrieval at the root, what decides sample-and-match is every envelope node *some*
        stage offers, at every stage including the unpruned one, because the stage is chosen
        from sampled confidences; the stage only decides which of them are admitted. The price:
        in ``graft`` with sampled drafts, every node under which the envelope offers a child
        (the root, always) uses sample-and-match, even in a step that admits no retrieved node.
        """
        plan = self.planner.plan(budget)
        offers: list[Draft] = []
        if self.config.retrieval is not None and envelope is None:
            raise ValueError(f"{self.config.variant} needs the retrieval envelope (GraftRetrieval's draft)")
        if self.config.retrieval == "root":
            if envelope.budget != budget:
                raise ValueError(f"the envelope was filled for budget {envelope.budget}, but the tree is composed at {budget}")
            if self.config.gated:
                offers = [retrieval_part(envelope, plan.offered_scores)]
        if stage is None:
            return merge_drafts([trim(draft, budget)], budget, offers=offers)
        kept = trim(draft, self.draft_nodes(draft, plan, stage))
        if self.config.retrieval == "root":
            retrieved = retrieval_part(envelope, plan.stage_scores[stage])
            return merge_drafts([kept, retrieved], budget, offers=offers)
        if self.config.retrieval == "tail" and plan.k_ret[stage] > 0:
            tail = self.tail_part(kept, plan.stage_templates[stage], envelope.matrix)
            return merge_drafts([kept, tail] if tail is not None else [kept], budget)
        return merge_drafts([kept], budget)

    def draft_nodes(self, draft: ModelDraft, plan: BudgetPlan, stage: int) -> int:
        """Draft nodes kept at ``stage``: ``K_draft(s)``; for a sampled draft whose stage came
        from the gates, at least every node of layers ``1 .. d_s`` (``d_s`` the stage's
        checkpoint depth), at most the budget.

        Why: the gate at checkpoint ``d`` reads ``c_d``, the best path score through layer
        ``d``, so the stage depends on the sampled values of layers ``1 .. d``. A cut whose
        length depends on the stage must therefore not fall inside those layers, or a node
        would keep more or fewer children depending on its children's own values (rejection
        sampling needs them to be a value-independent prefix of i.i.d. draws). With the cut
        at ``max(K_draft(s), |layers 1..d_s|)`` capped at the budget, every layer ``t`` keeps the
        same prefix at every stage that reads it (``d_s >= t``) and in the dense tree; stages
        with ``d_s < t`` are decided from layers before ``t``. Greedy (deterministic) drafts
        are verified by sample-and-match or greedy matching, exact for any cut, and keep
        ``K_draft(s)``.

        Example, ``cpu`` preset (checkpoints 0/1/2, ``K_draft`` 1/3/5 at budget 8), layers of
        2, 4, 4 sampled nodes: stage 2 keeps ``max(5, 2 + 4) = 6`` nodes, stage 1 keeps 3, stage 0 keeps 1.
        """
        n = plan.k_draft[stage]
        if self.config.gated and draft.scores is None:
            n = max(n, sum(draft.layer_sizes[: draft.checkpoints[stage]]))
        return min(n, plan.budget)

    @staticmethod
    def tail_part(kept: Draft, template: RankTemplate, matrix: SuccessorMatrix) -> Draft | None:
        """``template`` filled from the last token of the best draft path (sampled drafts carry
        no scores: the first child at each node), anchored under that path (None when the draft
        is empty)."""
        path = best_path(kept.parents, kept.scores)
        if not path:
            return None
        toks, pars = matrix.fill_template(kept.tokens[path[-1]], template)
        return Draft(source=RETRIEVAL_SOURCE, tokens=toks, parents=pars, anchor=tuple(kept.tokens[i] for i in path))


__all__ = ["BudgetPlan", "GraftComposer", "GraftConfig", "StagePlanner", "plan_budget", "retrieval_part"]
