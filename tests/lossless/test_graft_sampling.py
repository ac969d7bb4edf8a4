"""Statistical losslessness of sampling for the draft-model tree and every Graft variant.

Each variant's composer (the same one ``build_graft_method`` wires up: gates for the gated
variants, the retrieval envelope or TAIL's template for the retrieval variants) builds trees
from a table draft model over a ``V = 4`` synthetic target; the trees are verified with the
shared sampling verifier, and the empirical law of 3-token continuations must be within the
derived bound of ``tests/lossless/test_sampling_stats.py`` (no tuned tolerance) of the exact target law.
With sampled drafts the draft nodes carry ``draft_probs`` and are verified by recursive
rejection sampling, retrieved nodes (row -1) by sample-and-match in the same tree; with greedy
drafts every node uses sample-and-match.
"""

from __future__ import annotations

from collections import Counter

import pytest

from specgraft.composers.graft import GraftComposer, StagePlanner

from specgraft.methods.graft import graft_config
from specgraft.config import SamplingConfig
from specgraft.drafters.draft_model import DraftModelDrafter, DraftTreeConfig
from specgraft.drafters.graft_retrieval import GraftRetrieval
from specgraft.drafters.recycling import SuccessorMatrix

from tests.helpers.sampling import PROMPT, SyntheticTarget, sample_sequences, total_variation, tv_bound
from tests.helpers.stubs import TableLM, begin, random_table, sampling_config
from specgraft.methods.graft import GRAFT_BEHAVIOUR

VARIANTS = tuple(GRAFT_BEHAVIOUR)

N_STAT = 3000
BUDGET = 6


pytestmark = pytest.mark.usefixtures("one_thread")


def variant_sampling(variant: str, sample_drafts: bool = True, k: int = 3) -> tuple[float, float, float, Counter, Counter]:
    """``N_STAT`` sampled generations with ``variant``'s trees at budget 6: (TV, bound, tokens
    per step, pruning stages seen, nodes proposed per source with or without ``draft_probs``);
    ``k`` successors per token in the retrieval matrix."""
    target = SyntheticTarget(SamplingConfig(temperature=1.0), seed=3)
    law = target.exact_law()
    lm = TableLM(random_table(4, seed=6), 4)
    config = graft_config(variant, k=k)
    # gated variants: c_0 varies with the context, so the root gate sometimes stops drafting
    drafter = DraftModelDrafter(lm, DraftTreeConfig(
        depth=2, top_k=3, checkpoints=(0,) if config.gated else (), thresholds=(0.55,) if config.gated else None,
        sample=sample_drafts, seed=2,
    ))
    planner = StagePlanner(config)
    retrieval = GraftRetrieval(4, planner, SuccessorMatrix(4, k=k))
    composer = GraftComposer(config, planner)
    # as build_graft_method: TAIL fills its template in the composer from the retrieval drafter's matrix
    drafters = [drafter, retrieval] if config.retrieval is not None else [drafter]
    states: list = []
    stages: Counter = Counter()
    nodes: Counter = Counter()

    def new_sequence() -> None:
        for d, state in zip(drafters, states):
            d.end(state)
        states[:] = [begin(d, PROMPT, sampling_config(1.0)) for d in drafters]

    def make_tree(context):
        drafts = [d.propose(state, context, BUDGET) for d, state in zip(drafters, states)]
        stages[drafts[0].stage] += 1
        tree = composer.build(drafts, BUDGET)
        assert len(tree) <= BUDGET
        with_q = [False] * len(tree) if tree.prob_rows is None else [r >= 0 for r in tree.prob_rows]
        nodes.update(zip(tree.sources, with_q, strict=True))
        return tree, list(zip(drafters, states))

    counts, per_step = sample_sequences(target, make_tree, N_STAT, 3, seed=8, new_sequence=new_sequence)
    return total_variation(counts, law, N_STAT), tv_bound(law, N_STAT), per_step, stages, nodes


@pytest.mark.parametrize(
    "variant, sample_drafts", [(v, True) for v in VARIANTS] + [("graft", False)], ids=lambda x: str(x)
)
def test_sampled_trees_match_the_target_law(variant, sample_drafts):
    tv, bound, per_step, stages, nodes = variant_sampling(variant, sample_drafts)
    config = graft_config(variant)
    if config.gated:
        assert set(stages) == {0, None}, f"both the pruned and the full draft must occur, got {dict(stages)}"
    if sample_drafts:
        assert nodes["draft", True] > 0, "draft nodes carry draft_probs: the rejection path runs"
        if config.retrieval is None:
            assert nodes["draft", False] == 0, "without retrieval every sampled draft node keeps its row"
    else:
        assert nodes["draft", True] == 0, "greedy drafts have no draft_probs: sample-and-match everywhere"
    if config.retrieval is not None:
        assert nodes["retrieval", False] > 0 and nodes["retrieval", True] == 0, "retrieved nodes: sample-and-match (row -1)"
    else:
        assert nodes["retrieval", False] + nodes["retrieval", True] == 0
    assert per_step > 1.3, f"{variant}: trees must be accepted often ({per_step:.2f} tokens/step)"
    assert tv <= bound, f"{variant}: TV {tv:.4f} exceeds the derived bound {bound:.4f}"


def test_one_successor_retrieval_matches_the_target_law():
    """One successor per token: retrieval proposes one child per node, so retrieved nodes often
    land on sampled ones (the negative control of that rule is exact: ``test_sampling_exact.py``)."""
    tv, bound, *_ = variant_sampling("graft", k=1)
    assert tv <= bound, f"TV {tv:.4f} exceeds the derived bound {bound:.4f}"
