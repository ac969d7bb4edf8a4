import numpy as np
import pytest
import torch

from specgraft.drafters.base import Learning
from specgraft.drafters.pld import PLDConfig, PLDDrafter, find_matches
from specgraft.drafters.recycling import RecyclingConfig, RecyclingDrafter, SuccessorMatrix
from specgraft.tree.build import merge_drafts
from specgraft.tree.templates import rank_template
from specgraft.types import DraftTree, PrefillOutput, StepResult, VerifyResult

from tests.helpers.stubs import begin


def test_find_matches_most_recent_first():
    ctx = np.array([1, 2, 3, 9, 1, 2, 4, 7, 1, 2])
    assert find_matches(ctx, 2).tolist() == [4, 0]
    assert find_matches(ctx, 3).tolist() == []
    assert find_matches(np.array([5]), 1).tolist() == []


def test_pld_branches_when_matches_continue_differently():
    d = PLDDrafter(PLDConfig(max_ngram=2, min_ngram=1, max_copy=3, min_prob=0.0))
    ctx = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    draft = d.propose(begin(d, ctx), ctx, budget=16)
    tree = merge_drafts([draft], 16)
    firsts = [tree.tokens[i] for i, p in enumerate(tree.parents) if p == -1]
    assert 4 in firsts and 3 in firsts
    # the two branches share the root's support: both first tokens come before either second token
    assert sorted(tree.tokens[:2]) == [3, 4] and tree.parents[:2] == [-1, -1]
    # the more recent match wins the tie
    assert tree.tokens[0] == 4
    assert len(merge_drafts([draft], 2)) == 2


def test_pld_scores_are_acceptance_estimates():
    cfg = PLDConfig(max_ngram=3, min_ngram=1, max_copy=12, min_prob=0.0, prior_first=(0.25, 0.3, 0.8), prior_later=(0.3, 0.6, 0.9))
    d = PLDDrafter(cfg)
    ctx = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 10, 11, 12]
    draft = d.propose(begin(d, ctx), ctx, budget=64)
    # one 3-gram match (plus shorter ones at the same place): a chain 13, 14, ... scored 0.8 * 0.9^(d-1)
    assert draft.tokens[:4] == [13, 14, 15, 16]
    assert draft.scores[:4] == pytest.approx([0.8 * 0.9**i for i in range(4)])


def test_pld_min_prob_cuts_weak_copies():
    ctx = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    # two 2-gram matches: first tokens 0.5 * 0.3 = 0.15, second tokens 0.15 * 0.6 = 0.09
    d = PLDDrafter(PLDConfig(max_ngram=2, max_copy=3, min_prob=0.1))
    draft = d.propose(begin(d, ctx), ctx, budget=16)
    assert sorted(draft.tokens) == [3, 4] and draft.parents == [-1, -1]
    assert min(draft.scores) >= 0.1


def test_pld_learns_copy_rates_from_verify_passes():
    ctx = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 10, 11, 12]
    d = PLDDrafter(PLDConfig(max_copy=12, min_prob=0.1, prior_strength=4.0))
    s = begin(d, ctx)
    deep = len(d.propose(s, ctx, budget=64))
    # the target keeps disagreeing with the first copied token: the copy rate after a 3-gram falls
    for _ in range(30):
        draft = d.propose(s, ctx, budget=64)
        tree = DraftTree(tokens=draft.tokens, parents=draft.parents, sources=["pld"] * len(draft))
        d.observe(s, StepResult(root_token=ctx[-1], tree=tree, verify=VerifyResult([], 99), logits=torch.zeros(1, 1), context=ctx))
    assert s.rates.rate(3, 1) < 0.2
    assert len(d.propose(s, ctx, budget=64)) < deep
    # and rises again when the copies are right
    for _ in range(60):
        draft = d.propose(s, ctx, budget=64)
        tree = DraftTree(tokens=draft.tokens, parents=draft.parents, sources=["pld"] * len(draft))
        # the target continues with the copy: the chain is accepted and the bonus is the next copied
        # token (with an empty tree, the first one: observe still learns from unproposed nodes)
        accepted = list(range(len(draft)))
        bonus = ctx[3 + len(draft)]
        d.observe(s, StepResult(root_token=ctx[-1], tree=tree, verify=VerifyResult(accepted, bonus), logits=torch.zeros(1, 1), context=ctx))
    assert s.rates.rate(3, 1) > 0.5
    # learning=request (the default): the next request starts from the priors again
    assert begin(d, ctx).rates.rate(3, 1) == pytest.approx(0.8) and d.rates.rate(3, 1) == pytest.approx(0.8)


def test_learning_policy_decides_what_crosses_requests():
    """request: what one sequence learns (copy rates, successor rows) never reaches another's
    state; shared: it is written to the drafter's shared state for later requests."""
    ctx = [10, 11, 12, 13, 10, 11, 12]
    miss = lambda draft: StepResult(ctx[-1], DraftTree(draft.tokens, draft.parents, ["pld"] * len(draft)), VerifyResult([], 99), torch.zeros(1, 1), ctx)
    for learning, crosses in ((Learning.REQUEST, False), (Learning.SHARED, True)):
        d = PLDDrafter(learning=learning)
        a, b = begin(d, ctx), begin(d, ctx)
        for _ in range(10):
            d.observe(a, miss(d.propose(a, ctx, 16)))
        assert (b.rates.rate(3, 1) < 0.8) is crosses and (begin(d, ctx).rates.rate(3, 1) < 0.8) is crosses
        m = SuccessorMatrix(10, k=2)
        r = RecyclingDrafter(10, RecyclingConfig(k=2), m, learning)
        first = begin(r, [1, 2, 3], prefill=PrefillOutput(topk=torch.tensor([[4, 5], [6, 7]])))
        assert first.matrix.table[1].tolist() == [4, 5]
        second = begin(r, [8, 9])
        assert (second.matrix.table[1].tolist() == [4, 5]) is crosses and (m.table[1].tolist() == [4, 5]) is crosses


def test_pld_proposes_at_most_its_budget_best_first():
    ctx = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 10, 11, 12]
    d = PLDDrafter(PLDConfig(max_copy=12, min_prob=0.0))
    s = begin(d, ctx)
    full = d.propose(s, ctx, budget=64)
    for budget in (0, 1, 3, 5):
        draft = d.propose(s, ctx, budget=budget)
        assert len(draft) == min(budget, len(full)) and draft.tokens == full.tokens[: len(draft)]


def test_pld_no_match_is_empty_and_context_sync():
    d = PLDDrafter()
    s = begin(d, [1, 2, 3])
    assert len(d.propose(s, [1, 2, 3], 8)) == 0
    # growing context is appended incrementally, a new context is taken whole
    assert len(d.propose(s, [1, 2, 3, 1], 8)) > 0
    assert len(d.propose(s, [7, 8], 8)) == 0


def test_recycling_fill_and_observe():
    m = SuccessorMatrix(vocab_size=10, k=2)
    m.update_rows([7, 5], np.array([[5, 3], [9, 1]]))
    tokens, parents = m.fill_template(7, rank_template([2, 1], k=2))
    assert tokens == [5, 3, 9] and parents == [-1, -1, 0]
    # an unknown row drops the node and its subtree
    tokens, parents = m.fill_template(4, rank_template([2, 1], k=2))
    assert tokens == [] and parents == []

    drafter = RecyclingDrafter(10, RecyclingConfig(k=2), m, Learning.SHARED)
    state = begin(drafter, [7])
    tree = DraftTree(tokens=[5, 3], parents=[-1, -1], sources=["recycling"] * 2)
    logits = torch.zeros(3, 10)
    logits[0, 8], logits[0, 6] = 5, 4  # root 7 -> [8, 6]
    logits[1, 2], logits[1, 1] = 5, 4  # node 5 -> [2, 1]
    logits[2, 4], logits[2, 0] = 5, 4  # node 3 (rejected) -> [4, 0]
    drafter.observe(state, StepResult(root_token=7, tree=tree, verify=VerifyResult([], 8), logits=logits, context=[7, 8]))
    assert m.table[7].tolist() == [8, 6] and m.table[5].tolist() == [2, 1] and m.table[3].tolist() == [4, 0]


def test_recycling_prefill_rows_and_save_load(tmp_path):
    drafter = RecyclingDrafter(10, RecyclingConfig(k=2))
    state = begin(drafter, [1, 2, 3], prefill=PrefillOutput(topk=torch.tensor([[4, 5], [6, 7]])))
    assert state.matrix.table[1].tolist() == [4, 5] and state.matrix.table[2].tolist() == [6, 7]
    assert state.matrix.table[3].tolist() == [-1, -1]
    path = tmp_path / "state.npz"
    state.matrix.save(path)
    loaded = SuccessorMatrix.load(path, vocab_size=10)
    assert np.array_equal(loaded.table, state.matrix.table) and loaded.k == 2
    with pytest.raises(ValueError, match="vocabulary"):
        SuccessorMatrix.load(path, vocab_size=11)
    with pytest.raises(ValueError, match="does not exist"):
        SuccessorMatrix.load(tmp_path / "missing.npz")


def test_pld_learned_rate_does_not_penalise_branching():
    """Two branches share the root; the target takes one of them half the time (and neither
    otherwise): the copy rate after a 2-gram is the chance that *a* branch is right, 0.5."""
    ctx = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    d = PLDDrafter(PLDConfig(max_ngram=2, min_ngram=2, max_copy=1, min_prob=0.0, prior_strength=1.0))
    s = begin(d, ctx)
    for step in range(400):
        draft = d.propose(s, ctx, budget=8)
        assert sorted(draft.tokens) == [3, 4]
        tree = DraftTree(tokens=draft.tokens, parents=draft.parents, sources=["pld"] * len(draft))
        target = (3 if step % 4 == 0 else 4) if step % 2 == 0 else 99
        accepted = [draft.tokens.index(target)] if target in draft.tokens else []
        d.observe(s, StepResult(root_token=2, tree=tree, verify=VerifyResult(accepted, 5), logits=torch.zeros(1, 1), context=ctx))
    assert s.rates.rate(2, 1) == pytest.approx(0.5, abs=0.02)
