"""The batch policy's prior from a method's measured gains (``specgraft/budget/adaptive.py``):
it reproduces the measured tokens and nodes per step, makes a fresh policy predict what the
default-budget derivation predicts, outlasts a short unlucky warm-up, and yields to sustained
evidence."""

from __future__ import annotations

import json

import pytest

from specgraft.budget.acceptance import Acceptance
from specgraft.budget.adaptive import AdaptiveBudget
from specgraft.budget.costs import CostTable
from specgraft.budget.acceptance import GAINS_PRIOR_WEIGHT, per_rank
from specgraft.budget.acceptance import GAINS_PATH, budget_gains
from specgraft.budget.defaults import predicted_tokens_per_s
from specgraft.methods import METHODS

ZEN3 = GAINS_PATH.parent / "costs" / "qwen2.5-coder-1.5b-instruct-cpu-t2.json"
MEASURED = sorted(json.loads(GAINS_PATH.read_text())["methods"])


@pytest.fixture(scope="module")
def zen3() -> CostTable:
    return CostTable.load(ZEN3)


@pytest.mark.parametrize("method", MEASURED)
def test_prior_reproduces_the_measured_gains(method):
    gains = budget_gains(method)
    acc = Acceptance.from_gains(gains)
    assert acc.prior_weight == GAINS_PRIOR_WEIGHT
    assert all(0.0 <= p <= 1.0 for p in acc.prior + acc.nodes_prior)
    for k, e, n in zip(gains.budgets, gains.tokens_per_step, gains.nodes_per_step, strict=True):
        assert acc.expected_tokens(k) == pytest.approx(e, abs=1e-9), f"{method}: E({k})"
        assert acc.expected_nodes(k) == pytest.approx(n, abs=1e-9), f"{method}: N({k})"
    last = gains.budgets[-1]
    assert acc.expected_tokens(2 * last) == pytest.approx(gains.tokens_per_step[-1]), "nothing gained past the largest measured budget"


def test_per_rank_spreads_and_clips():
    assert per_rank([1, 3], [1.5, 2.5], base=1.0) == [0.5, 0.5, 0.5, 0.0]
    assert per_rank([1, 2], [1.5, 1.25], base=1.0) == [0.5, 0.0, 0.0], "a drop between budgets is noise, not a negative rate"
    assert per_rank([2], [5.0]) == [1.0, 1.0, 0.0], "a rank is filled at most once a step"
    with pytest.raises(ValueError, match="increasing budgets"):
        per_rank([4, 2], [1.0, 2.0])
    with pytest.raises(ValueError, match="increasing budgets"):
        per_rank([1, 2], [1.0])


def test_fresh_policy_predicts_what_the_gains_predict(zen3):
    """Before any step, at B = 1 and each measured budget, the policy's prediction is
    E(k) / (T(1, 1 + N(k)) + D(k) T(1, 1)), the one the default budget is derived from."""
    gains = budget_gains("draft-tree")
    policy = AdaptiveBudget.for_method(zen3, "draft-tree")
    for k, expected in zip(gains.budgets, predicted_tokens_per_s(zen3, gains), strict=True):
        assert policy.predicted(1, k) == pytest.approx(expected, rel=1e-9), f"budget {k}"
    assert policy.best(1, 16) == 8 and policy.predicted(1, 8) > 1.8 * policy.predicted(1, 0)
    # drafting time: linear between measured budgets, flat past the last, the B = 1 figure at every B
    step = zen3.cost(1, 1)
    d2, d4 = (d * step for d in gains.draft_steps[1:3])
    assert policy.predicted(1, 3) == pytest.approx(policy.acceptance.expected_tokens(3) / (zen3.cost(1, 1 + policy.acceptance.expected_nodes(3)) + (d2 + d4) / 2))
    assert policy.predicted(4, 60) == pytest.approx(4 * policy.acceptance.expected_tokens(60) / (zen3.cost(4, 61) + gains.draft_steps[-1] * step))


def test_measured_drafting_time_replaces_the_prior(zen3):
    policy = AdaptiveBudget.for_method(zen3, "draft-tree")
    policy.observe(1, 8, 8, [0, 1, 2], draft_s=0.5)
    e8, rows = policy.acceptance.expected_tokens(8), 1 + policy.acceptance.expected_nodes(8)
    assert policy.predicted(1, 8) == pytest.approx(e8 / (zen3.cost(1, rows) + 0.5))
    assert policy.predicted(4, 8) == pytest.approx(4 * e8 / (zen3.cost(4, 9) + 0.5)), "the nearest measured batch size's"


def test_prior_outlasts_a_short_unlucky_warmup_but_not_sustained_failure(zen3):
    """Draft-tree at B = 1 on the Zen 3: 15 steps that accept nothing (1 token a step) leave
    budget 8 chosen (the generic prior, worth 2 steps, gives up); 500 such steps switch it to 0."""
    draft_s = budget_gains("draft-tree").draft_steps[3] * zen3.cost(1, 1)
    seeded, generic = AdaptiveBudget.for_method(zen3, "draft-tree"), AdaptiveBudget(zen3)
    assert seeded.best(1, 8) == 8 and generic.best(1, 8) > 0
    for _ in range(15):
        seeded.observe(1, 8, 8, [], draft_s)
        generic.observe(1, 8, 8, [], draft_s)
    assert generic.best(1, 8) == 0, "the failure of issue 12: the generic prior follows a short warm-up"
    assert seeded.best(1, 8) == 8 and seeded.speculating(1, 8)
    for _ in range(485):
        seeded.observe(1, 8, 8, [], draft_s)
    assert seeded.best(1, 8) == 0 and not seeded.speculating(1, 8)
    assert seeded.acceptance.rate(0) < 0.1 * budget_gains("draft-tree").tokens_per_step[0], "the counts dominate the prior"


@pytest.mark.parametrize("method", ["ar", "reader", "no-such-method"])
def test_methods_without_gains_keep_the_generic_prior(zen3, method):
    policy = AdaptiveBudget.for_method(zen3, method)
    generic = Acceptance()
    assert policy.prior == "generic" and not policy.draft_prior
    assert policy.acceptance.prior == generic.prior and policy.acceptance.prior_weight == generic.prior_weight
    assert policy.predicted(1, 8) == pytest.approx(generic.expected_tokens(8) / zen3.cost(1, 9)), "drafting free until measured"


def test_ablations_read_their_base_methods_gains(zen3):
    policy = AdaptiveBudget.for_method(zen3, "graft-fixed", METHODS["graft-fixed"].gains_from)
    assert policy.acceptance.prior == Acceptance.from_gains(budget_gains("graft")).prior
    assert policy.prior == "measured gains of graft-fixed"
