"""Cost-aware pruning (``tree.paths.cost_aware_subset``, ``PLDConfig.row_cost`` and
``step_costs``, ``MethodOptions.row_cost`` and ``step_costs``, ``CostTable.row_cost`` and
``step_costs``, ``--row-cost``): the rule, with a line or a measured curve, against a
brute-force twin over every parent-closed subset, its effect on real drafts, and greedy
losslessness of ``pld`` and ``adapld`` under it."""

import itertools
import random

import pytest

from specgraft.budget.costs import CostTable
from specgraft.budget.costs import resolve_row_cost
from specgraft.config import GenerationConfig
from specgraft.drafters.pld import PLDConfig, PLDDrafter
from specgraft.engine import SpecEngine
from specgraft.methods import MethodOptions, get_method
from specgraft.models.hf import HFTarget
from specgraft.tree.paths import cost_aware_subset

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS
from tests.helpers.stubs import begin


def random_tree(rng: random.Random, n: int) -> tuple[list[int], list[float]]:
    """A random tree whose probabilities never grow from parent to child (estimated acceptance)."""
    parents, probs = [], []
    for i in range(n):
        p = rng.randrange(-1, i)
        parents.append(p)
        top = probs[p] if p >= 0 else 1.0
        probs.append(round(top * rng.uniform(0.05, 1.0), 3))
    return parents, probs


def value(nodes, probs, row_cost, curve=None) -> float:
    """Expected tokens per unit of cost of verifying ``nodes``: a line, or ``curve[rows - 1]``."""
    cost = 1.0 + row_cost * len(nodes) if curve is None else curve[len(nodes)] / curve[0]
    return (1.0 + sum(probs[i] for i in nodes)) / cost


def brute_force_best(parents, probs, budget, row_cost, curve=None) -> float:
    """The best tokens-per-cost over every parent-closed subset of at most ``budget`` nodes."""
    best = 1.0
    for k in range(1, budget + 1):
        for nodes in itertools.combinations(range(len(parents)), k):
            chosen = set(nodes)
            if all(parents[i] < 0 or parents[i] in chosen for i in nodes):
                best = max(best, value(nodes, probs, row_cost, curve))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_best_first_prefix_is_the_best_closed_subset(seed):
    rng = random.Random(seed)
    parents, probs = random_tree(rng, rng.randint(1, 9))
    budget = rng.randint(1, len(parents))
    row_cost = rng.choice([0.0, 0.02, 0.07, 0.2, 0.5, 2.0])
    kept = cost_aware_subset(parents, probs, budget, row_cost)
    assert len(kept) <= budget and all(parents[i] < 0 or parents[i] in kept for i in kept)
    assert value(kept, probs, row_cost) == pytest.approx(brute_force_best(parents, probs, budget, row_cost))


@pytest.mark.parametrize("seed", range(40))
def test_best_first_prefix_is_the_best_closed_subset_for_any_cost_curve(seed):
    """Measured costs need not be a line, nor even grow (llama.cpp: 4 rows cheaper than 3): the
    best closed subset of each size is still a best-first prefix, so the cut stays exact."""
    rng = random.Random(1000 + seed)
    parents, probs = random_tree(rng, rng.randint(1, 9))
    budget = rng.randint(1, len(parents))
    curve = [1.0]
    for _ in range(len(parents)):
        curve.append(round(max(1.0, curve[-1] + rng.uniform(-0.3, 0.6)), 3))
    kept = cost_aware_subset(parents, probs, budget, 0.0, curve)
    assert len(kept) <= budget and all(parents[i] < 0 or parents[i] in kept for i in kept)
    assert value(kept, probs, 0.0, curve) == pytest.approx(brute_force_best(parents, probs, budget, 0.0, curve))


def test_step_costs_from_a_table_and_their_checks():
    table = CostTable("m", "llamacpp", {1: {1: 0.10, 2: 0.138, 3: 0.160, 4: 0.142, 8: 0.26}})
    curve = table.step_costs(1, max_rows=8)
    assert curve[:4] == (1.0, 1.38, 1.6, 1.42) and curve[5] == pytest.approx(2.01)  # 6 rows: between 4 and 8
    # one node of p 0.3 does not pay 38% more; three nodes at 42% do
    assert cost_aware_subset([-1], [0.3], 8, 0.0, curve) == []
    assert cost_aware_subset([-1, 0, 1], [0.5, 0.3, 0.2], 8, 0.0, curve) == [0, 1, 2]
    for bad in ([1.0], [1.0, 0.0], [1.0, float("nan")]):
        with pytest.raises(ValueError, match="step_costs"):
            cost_aware_subset([-1], [0.5], 8, 0.0, bad)
        with pytest.raises(ValueError, match="step_costs"):
            PLDConfig(step_costs=tuple(bad))
        with pytest.raises(ValueError, match="step_costs"):
            MethodOptions(step_costs=bad)


def test_row_cost_extremes_and_errors():
    parents, probs = [-1, 0, -1], [0.6, 0.3, 0.02]
    assert cost_aware_subset(parents, probs, 8, 0.0) == [0, 1, 2]  # free rows: every node with p > 0
    assert cost_aware_subset(parents, probs, 8, 10.0) == []  # dear rows: the root alone
    assert cost_aware_subset(parents, probs, 1, 0.0) == [0]
    with pytest.raises(ValueError, match="row_cost"):
        cost_aware_subset(parents, probs, 8, -0.1)
    with pytest.raises(ValueError, match="row_cost"):
        PLDConfig(row_cost=-1.0)
    with pytest.raises(ValueError, match="row_cost"):
        MethodOptions(row_cost=float("nan"))


def test_pld_row_cost_follows_the_device():
    """The same weak 2-gram matches: a CPU-like row cost drops what the fixed cut keeps, a
    GPU-like one keeps what the fixed cut drops."""
    ctx = [1, 2, 3, 9, 1, 2, 4, 7, 1, 2]  # two matches: first tokens p = 0.15, second 0.09, ...
    def proposed(**kw):
        d = PLDDrafter(PLDConfig(max_ngram=2, max_copy=3, **kw))
        return len(d.propose(begin(d, ctx), ctx, budget=16))
    assert proposed() == 2  # min_prob 0.1 keeps the first tokens
    assert proposed(row_cost=0.2) == 0  # 0.15 < 0.2 x 1: no node pays
    assert proposed(min_prob=0.0, row_cost=0.005) == 6  # nearly free rows: both three-token copies


def test_cost_table_row_cost_and_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path / "cache"))  # no user table shadows the shipped one
    table = CostTable("m", "cpu", {1: {1: 0.30, 2: 0.33, 4: 0.36, 8: 0.48}, 4: {1: 0.5, 2: 0.7, 4: 1.1, 8: 1.9}})
    assert 0.05 < table.row_cost(1) < 0.1 and table.row_cost(4) > table.row_cost(1)
    assert table.row_cost(1) < table.row_cost(2) < table.row_cost(4)  # batch size 2 interpolated
    with pytest.raises(ValueError, match="two or more row counts"):
        CostTable("m", "cpu", {1: {1: 0.3}}).row_cost()
    assert resolve_row_cost("none", "m", "cpu") == (None, "none")
    with pytest.raises(ValueError, match="--row-cost"):
        resolve_row_cost("cheap", "m", "cpu")
    with pytest.raises(ValueError, match=">= 0"):
        resolve_row_cost("-1", "m", "cpu")
    # the shipped table of the 1.5B target for this kind of CPU (AVX2: the Zen 3's; AVX-512: the Zen 5's)
    from specgraft.budget.costs import table_name
    from specgraft.machine import cpu_kind

    cost, source = resolve_row_cost("auto", "qwen2.5-coder-1.5b-instruct", "cpu", 2)
    low, high = (0.01, 0.06) if cpu_kind() == "avx512" else (0.03, 0.12)
    assert low < cost < high and table_name("qwen2.5-coder-1.5b-instruct", "cpu", 2, cpu_kind()) in source


@pytest.mark.parametrize("name,cut", [("pld", "line"), ("adapld", "line"), ("pld", "curve"), ("adapld", "curve")])
def test_greedy_equals_plain_decoding_with_row_cost(name, cut):
    """>= 50 prompts (half repetitive): cutting trees by cost changes which rows are verified, never the output."""
    model = TINY_MODELS["llama" if name == "pld" else "qwen2"]()
    target = HFTarget(model)
    curve = (1.0, 1.38, 1.6, 1.42, 1.9, 2.1, 2.3, 2.6)
    options = MethodOptions(row_cost=0.07) if cut == "line" else MethodOptions(step_costs=curve)
    drafters, composer = get_method(name).build(target, options)
    assert (drafters[0].config.row_cost, drafters[0].config.step_costs) == ((0.07, None) if cut == "line" else (None, curve))
    engine = SpecEngine(target, drafters, composer, method=name)
    config = GenerationConfig(max_new_tokens=16, budget=16)
    mats = []
    for prompt, repetitive in make_prompts(vocab=model.config.vocab_size):
        assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, 16), f"{name} diverged on {prompt}"
        if repetitive:
            mats.append(engine.last_stats.mat)
    assert sum(mats) / len(mats) > 1.3, f"{name}: drafts were not accepted"


def test_adapld_full_keeps_the_whole_tree():
    target = HFTarget(TINY_MODELS["llama"]())
    drafters, _ = get_method("adapld-full").build(target, MethodOptions(row_cost=0.07))
    assert drafters[0].config.row_cost is None and drafters[0].config.min_prob == 0.0
