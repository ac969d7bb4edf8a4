"""Batched generation: a sequence's output never depends on what else is in the batch.

Every method on the tiny fp32 models runs a randomized continuous-batching schedule (requests
submitted at random steps, random lengths and budgets, a random cap on the batch, the budget
cap changing every step, 0 included) and each request's greedy output must equal
single-sequence ``ar`` token for token. Sampled requests keep their own seeds' outputs.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from specgraft.batch import BatchEngine, QueueFull
from specgraft.budget.acceptance import Acceptance
from specgraft.budget.adaptive import AdaptiveBudget
from specgraft.budget.costs import CostTable
from specgraft.budget.policy import FixedBudget
from specgraft.budget.adaptive import GUARD_STEPS
from specgraft.budget.policy import StepPlan
from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.engine import PrefillFusion, SpecEngine
from specgraft.methods import MethodOptions, get_method, method_names
from specgraft.models.hf import HFTarget
from specgraft.types import PrefillRequest
from specgraft.drafters.draft_model import CATCH_UP_CHAIN

from tests.helpers.batch import RandomCap, run_schedule
from tests.helpers.lossless import make_prompts
from tests.helpers.models import TINY_MODELS, perturbed

pytestmark = pytest.mark.usefixtures("one_thread")

METHODS = ("ar", "pld", "recycling", "ptd", "adapld", "draft-tree", "graft", "reader")


class EveryOtherCatchesUp(FixedBudget):
    """Budget 8 for all; every other sequence's catch-up is refused, and such mixed steps run
    the drafting sequences in a forward of their own (or padded, ``split=False``)."""

    def __init__(self, split: bool):
        self.split, self.asked = split, 0

    def pays_back(self, batch_size, budget, tokens, remaining):
        self.asked += 1
        return self.asked % 2 == 1

    def split_pays(self, batch_size, drafting, budget):
        return self.split


def build(target: HFTarget, method: str, draft) -> SpecEngine:
    drafters, composer = get_method(method).build(target, MethodOptions(), draft if get_method(method).needs_draft_model else None)
    return SpecEngine(target, drafters, composer, method=method)


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
@pytest.mark.parametrize("method", METHODS)
def test_batched_greedy_equals_single_ar(arch, method):
    model = TINY_MODELS[arch]()
    draft = perturbed(model)
    target = HFTarget(model)
    ar = build(target, "ar", None)
    engine = build(target, method, draft)
    rng = random.Random(hash((arch, method)) % 1000)
    prompts = [p for p, _ in make_prompts(n=12, vocab=model.config.vocab_size)]
    requests = [(p, GenerationConfig(max_new_tokens=rng.randint(1, 20), budget=rng.choice([4, 8, 16]))) for p in prompts]
    expected = {str(i): ar.generate_ids(p, c) for i, (p, c) in enumerate(requests)}
    batch = BatchEngine(engine, max_batch=rng.randint(2, 5), policy=RandomCap(rng.randrange(100)))
    got = run_schedule(batch, requests, rng)
    assert got == expected
    assert batch.num_running == 0 and target.cache.num_slots >= 2
    assert batch.stats.requests_finished == len(requests)
    assert sum(len(v) for v in got.values()) == batch.stats.tokens
    if method != "ar":
        assert batch.stats.tokens > batch.stats.sequence_steps, "no draft was accepted in the whole schedule"


class PlainPolicy(FixedBudget):
    """Speculation never pays: every step at 0, no sequence expected to draft, probes as asked."""

    def __init__(self, probe_every: int = 0):
        self.probe_every, self.steps = probe_every, 0

    def plan(self, batch_size, budgets, keys=None):
        self.steps += 1
        if self.probe_every and self.steps % self.probe_every == 0:
            return StepPlan(cap=0, probe=8, split=True)
        return StepPlan(cap=0)

    def speculating(self, batch_size, budget):
        return False



def ar_requests(n: int):
    """A tiny fp32 target, ``n`` greedy requests (12 tokens, budget 8) and ``ar``'s outputs by request id."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    ar = build(target, "ar", None)
    requests = [(p, GenerationConfig(max_new_tokens=12, budget=8)) for p, _ in make_prompts(n=n, vocab=model.config.vocab_size)]
    return model, target, requests, {str(i): ar.generate_ids(p, c) for i, (p, c) in enumerate(requests)}


def record_prefills(monkeypatch, target: HFTarget) -> list[PrefillRequest]:
    """Every ``PrefillRequest`` the target's prefill is asked from now on (the prefill still runs)."""
    requested: list[PrefillRequest] = []
    prefill = target.prefill
    monkeypatch.setattr(target, "prefill", lambda slot, tokens, request=PrefillRequest(): requested.append(request) or prefill(slot, tokens, request))
    return requested


@pytest.mark.parametrize("method", ["ar", "draft-tree"])
def test_a_request_alone_starts_as_a_single_generation(monkeypatch, method):
    """One request into an empty batch with none waiting starts as ``generate`` does: its prompt
    is fed in its first step's forward (no target prefill of its own), and that step stays out
    of the policy's step and forward observations and of ``decode_by_batch``. Requests that join
    together or beside a running one are prefilled apart. The outputs are ``ar``'s either way."""

    class Recording(FixedBudget):
        def __init__(self):
            self.steps, self.forwards = [], []

        def observe_step(self, batch_size, drafted, tokens, seconds):
            self.steps.append(batch_size)

        def observe_forward(self, batch_size, rows, seconds):
            self.forwards.append(rows)

    model, target, requests, expected = ar_requests(3)
    engine = build(target, method, perturbed(model))
    prefills = record_prefills(monkeypatch, target)
    policy = Recording()
    batch = BatchEngine(engine, max_batch=2, policy=policy)
    rid = batch.submit(*requests[0])
    first = batch.step()
    assert prefills == [] and batch.stats.fused_steps == 1, "the prompt went in with the first step"
    assert policy.steps == [] and policy.forwards == [] and batch.stats.decode_by_batch == {}
    assert first[0].tokens == expected["0"][: len(first[0].tokens)]
    # two more: one joins the running request, the other waits; neither is fused
    ids = {rid: "0", batch.submit(*requests[1]): "1", batch.submit(*requests[2]): "2"}
    got = {k: v.tokens for k, v in batch.run_to_completion().items()}
    got[rid] = first[0].tokens + got[rid]
    assert {ids[k]: v for k, v in got.items()} == expected
    assert len(prefills) == 2 and batch.stats.fused_steps == 1
    assert len(policy.steps) == batch.stats.steps - 1 and max(policy.forwards) <= 1 + 16, "no prompt-long forward observed"
    # one at a time (max_batch 1): every request starts fused, queue or not
    single = BatchEngine(engine, max_batch=1, policy=FixedBudget())
    ids = {single.submit(p, c): str(i) for i, (p, c) in enumerate(requests)}
    got = {ids[k]: v.tokens for k, v in single.run_to_completion().items()}
    assert got == expected and single.stats.fused_steps == len(requests) and len(prefills) == 2


def test_a_plainly_decoding_batch_does_no_drafting_work(monkeypatch):
    """The full fallback: at budget 0 the draft model never runs (not even its slot and prefill,
    deferred to a first proposal that never comes) and Token Recycling's prompt top-k is not
    computed."""
    model, target, requests, expected = ar_requests(4)
    requested = record_prefills(monkeypatch, target)
    for method in ("recycling", "draft-tree"):
        engine = build(target, method, perturbed(model))
        draft_calls = []
        if method == "draft-tree":
            lm = engine.drafters[0].lm
            for name in ("allocate", "prefill", "forward_rows", "forward_batch"):
                monkeypatch.setattr(lm, name, lambda *a, _n=name, **k: draft_calls.append(_n))
        requested.clear()
        batch = BatchEngine(engine, max_batch=3, policy=PlainPolicy())
        got = run_schedule(batch, requests, random.Random(0))
        assert got == expected
        assert draft_calls == [] and requested and all(not r.topk for r in requested), method
        assert batch.stats.tokens == batch.stats.sequence_steps


def test_optional_prefill_is_weighed_at_admission(monkeypatch):
    """A request expected to draft pays Token Recycling's prompt top-k only if the policy says
    its remaining tokens repay it (``prefill_pays``, asked with the prompt's prefilled tokens
    and ``max_new_tokens``); the work it paid is timed and reported, a refused one is counted
    in ``plain_starts``; the output is ``ar``'s either way. Methods whose prefill has no
    optional cost are never asked."""
    model, target, requests, expected = ar_requests(5)
    requested = record_prefills(monkeypatch, target)

    class EveryOther(FixedBudget):
        def __init__(self):
            self.asked, self.observed = [], []

        def prefill_pays(self, batch_size, budget, tokens, remaining):
            self.asked.append((tokens, remaining))
            return len(self.asked) % 2 == 1

        def observe_optional_prefill(self, tokens, seconds):
            self.observed.append((tokens, seconds))

    for method, optional in (("recycling", True), ("pld", False), ("draft-tree", False)):
        engine = build(target, method, perturbed(model))
        assert engine.optional_prefill is optional
        drafted: list[bool] = []  # plain_only of every sequence that got a budget
        propose = engine.propose_batch
        monkeypatch.setattr(engine, "propose_batch", lambda seqs, budgets, depths, _p=propose: drafted.extend(
            s.plain_only for s, b in zip(seqs, budgets) if b > 0) or _p(seqs, budgets, depths))
        requested.clear()
        policy = EveryOther()
        batch = BatchEngine(engine, max_batch=2, policy=policy)
        assert run_schedule(batch, requests, random.Random(1)) == expected, method
        if not optional:
            assert policy.asked == [] and policy.observed == [] and batch.stats.plain_starts == 0
            continue
        assert sorted(policy.asked) == sorted((len(p) - 1, 12) for p, _ in requests)
        paid = [r.topk > 0 for r in requested]
        assert paid == [i % 2 == 0 for i in range(len(requests))]
        # each paid start reports its own prompt's prefilled tokens, and a time
        assert [t for t, _ in policy.observed] == [t for t, _ in policy.asked[::2]]
        assert all(s > 0 for _, s in policy.observed)
        assert batch.stats.plain_starts == len(requests) - sum(paid)
        assert drafted and not any(drafted), "a sequence refused its optional prefill work never drafts"
    # a real policy measures the work from the first start on and weighs the rest with it
    costs = CostTable("m", "cpu", {1: {1: 1e-3, 9: 1.2e-3}, 2: {1: 1.5e-3, 9: 2e-3}})
    policy = AdaptiveBudget(costs, Acceptance(prior=[0.9] * 8, prior_weight=1e9), budgets=(8,))
    asked = []
    weigh = policy.prefill_pays
    monkeypatch.setattr(policy, "prefill_pays", lambda *a: asked.append(policy.optional_per_token) or weigh(*a))
    batch = BatchEngine(build(target, "recycling", None), max_batch=2, policy=policy)
    assert run_schedule(batch, requests, random.Random(1)) == expected
    assert asked[0] is None and policy.optional_per_token is not None and policy.optional_per_token > 0
    assert all(a is not None for a in asked[1:])


@pytest.mark.parametrize("method", ["draft-tree", "graft"])  # draft-model methods: a catch-up to refuse
def test_a_mixed_step_split_in_two_forwards_emits_what_the_padded_one_does(method):
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    engine = build(target, method, perturbed(model))
    prompts = [p for p, _ in make_prompts(n=6, vocab=model.config.vocab_size)]
    config = GenerationConfig(max_new_tokens=12, budget=8)
    expected = {str(i): build(target, "ar", None).generate_ids(p, config) for i, p in enumerate(prompts)}
    padding = {}
    for split in (False, True):
        batch = BatchEngine(engine, max_batch=3, policy=EveryOtherCatchesUp(split))
        assert run_schedule(batch, [(p, config) for p in prompts], random.Random(0)) == expected
        assert (batch.stats.split_steps > 0) == split
        padding[split] = batch.stats.padding_share
    assert 0 <= padding[True] < padding[False], "plain sequences padded to the drafting ones' trees, unless split apart"


def test_a_forward_counts_the_rows_its_sequences_filled():
    """``ForwardTiming.used``: the rows the trees and roots filled; the rest of batch x rows is padding."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    engine = build(target, "pld", None).with_fusion(PrefillFusion.OFF)  # prompts prefilled apart: rows are tree rows
    seqs = [engine.start([5, 6, 7, 8, 5, 6, 7], GenerationConfig(max_new_tokens=8, budget=4)),
            engine.start([9, 10, 11], GenerationConfig(max_new_tokens=8, budget=4))]
    engine.step_batch(seqs, [4, 0])
    forward = seqs[0].last_forward
    assert forward is seqs[1].last_forward and forward.batch == 2
    assert seqs[0].last_tree_nodes > 0 and seqs[1].last_tree_nodes == 0, "the repeating prompt's lookup drafts, the other decodes plainly"
    assert forward.rows == 1 + seqs[0].last_tree_nodes and forward.used == forward.rows + 1
    batch = BatchEngine(engine, max_batch=2)
    for p in ([5, 6, 7, 8, 5, 6, 7], [9, 10, 11]):
        batch.submit(p, GenerationConfig(max_new_tokens=6, budget=4))
    batch.run_to_completion()
    assert 0 < batch.stats.rows_used <= batch.stats.rows_fed


@pytest.mark.parametrize("method", ["recycling", "draft-tree"])
@pytest.mark.parametrize("probe_every", [3, CATCH_UP_CHAIN + 3])
def test_probes_catch_up_after_plain_stretches(method, probe_every):
    """One sequence drafts every few steps (in its own forward) after plain stretches: the draft
    model catches up on what it missed, as a chain in its root forward or, past
    ``CATCH_UP_CHAIN`` tokens, by a prefill; every output still equals ``ar``."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    ar, engine = build(target, "ar", None), build(target, method, perturbed(model))
    requests = [(p, GenerationConfig(max_new_tokens=48, budget=8)) for p, _ in make_prompts(n=4, vocab=model.config.vocab_size)]
    expected = {str(i): ar.generate_ids(p, c) for i, (p, c) in enumerate(requests)}
    catch_ups = []
    if method == "draft-tree":
        lm = engine.drafters[0].lm
        prefill = lm.prefill
        lm.prefill = lambda slot, tokens, *a: catch_ups.append(len(tokens)) or prefill(slot, tokens, *a)
    batch = BatchEngine(engine, max_batch=3, policy=PlainPolicy(probe_every=probe_every))
    assert run_schedule(batch, requests, random.Random(1)) == expected
    assert batch.stats.probe_steps > 0 and batch.stats.tokens > batch.stats.sequence_steps, "no probe draft was accepted"
    if method == "draft-tree" and probe_every > CATCH_UP_CHAIN:
        assert any(n >= CATCH_UP_CHAIN for n in catch_ups), "no plain stretch was caught up by a prefill"


@pytest.mark.parametrize("method", sorted(set(method_names()) - set(METHODS)))
def test_every_other_method_batches(method):
    """The variants (ablations, Graft's gated forms, READER's) on one schedule of 6 requests."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    ar, engine = build(target, "ar", None), build(target, method, perturbed(model))
    rng = random.Random(7)
    requests = [(p, GenerationConfig(max_new_tokens=rng.randint(4, 16), budget=8)) for p, _ in make_prompts(n=6, vocab=model.config.vocab_size)]
    expected = {str(i): ar.generate_ids(p, c) for i, (p, c) in enumerate(requests)}
    assert run_schedule(BatchEngine(engine, max_batch=3, policy=RandomCap(1)), requests, rng) == expected


@pytest.mark.parametrize("method", ["pld", "draft-tree-sampled"])
def test_sampled_requests_keep_their_seeds(method):
    """Per-request temperature, top-p and seed inside one batch: each request's tokens equal the
    same request run alone (its generator is its own; sampled draft children come from the
    sequence's own draft sampler in the batched draft forwards). With sampled drafts this holds
    because the budget is fixed: their children and accept tests draw from the generator too,
    so a tree of another size (an adaptive budget) draws other values; the law stays exact."""
    from specgraft.methods import GraftOptions

    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    if method == "pld":
        engine = build(target, "pld", None)
    else:
        options = MethodOptions(graft=GraftOptions(sample_drafts=True))
        engine = SpecEngine(target, *get_method("draft-tree").build(target, options, perturbed(model)), method="draft-tree")
    prompts = [p for p, _ in make_prompts(n=6, vocab=model.config.vocab_size)]
    configs = [
        GenerationConfig(max_new_tokens=12, budget=8, sampling=SamplingConfig(temperature=t, top_p=q, seed=s))
        for t, q, s in [(0.7, 1.0, 1), (1.0, 0.9, 2), (0.0, 1.0, None), (1.3, 0.8, 3), (0.5, 1.0, 4), (1.0, 1.0, 5)]
    ]
    alone = [engine.generate_ids(p, c) for p, c in zip(prompts, configs)]
    batch = BatchEngine(engine, max_batch=4)
    ids = [batch.submit(p, c) for p, c in zip(prompts, configs)]
    results = batch.run_to_completion()
    assert [results[i].tokens for i in ids] == alone


@pytest.mark.parametrize("method", ["pld", "recycling", "draft-tree", "reader"])
def test_seeded_requests_reproduce_plain_sampling_whatever_the_budget(method):
    """Deterministic drafts (every method's default): one draw from the request's own generator
    per emitted token, so a seeded request in a batch whose budget changes every step (0
    included, probes, refused catch-ups) emits exactly what ``ar`` sampling with the same seed
    emits alone. This is the promise ``generate_batch`` and the server make for seeds."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    ar, engine = build(target, "ar", None), build(target, method, perturbed(model))
    rng = random.Random(5)
    prompts = [p for p, _ in make_prompts(n=8, vocab=model.config.vocab_size)]
    requests = [
        (p, GenerationConfig(max_new_tokens=rng.randint(6, 16), budget=8, sampling=SamplingConfig(temperature=t, top_p=q, seed=s)))
        for p, (t, q, s) in zip(prompts, [(0.7, 1.0, 1), (1.0, 0.9, 2), (1.3, 0.8, 3), (0.5, 1.0, 4)] * 2)
    ]
    expected = {str(i): ar.generate_ids(p, c) for i, (p, c) in enumerate(requests)}
    assert run_schedule(BatchEngine(engine, max_batch=4, policy=RandomCap(9)), requests, rng) == expected


def test_sampled_law_in_a_batch():
    """The first sampled token of a request batched with others follows the target's law
    (statistical: ~0.1 TV)."""
    model = TINY_MODELS["llama"](vocab=8)
    target = HFTarget(model)
    engine = build(target, "pld", None)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    with torch.no_grad():
        p = model(torch.tensor([prompt])).logits[0, -1].softmax(-1)
    batch = BatchEngine(engine, max_batch=8)
    n = 240
    ids = [batch.submit(prompt, GenerationConfig(max_new_tokens=2, budget=4, sampling=SamplingConfig(temperature=1.0, seed=s))) for s in range(n)]
    results = batch.run_to_completion()
    counts = torch.zeros(8)
    for i in ids:
        counts[results[i].tokens[0]] += 1
    tv = 0.5 * (counts / n - p).abs().sum().item()
    assert tv < 0.12, f"first-token law off by TV {tv:.3f}"


def test_cancel_errors_and_queue():
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    engine = build(target, "pld", None)
    batch = BatchEngine(engine, max_batch=2, max_queue=2)
    a = batch.submit([5, 6, 7, 5, 6], GenerationConfig(max_new_tokens=50))
    b = batch.submit([9, 10, 11], GenerationConfig(max_new_tokens=50))
    with pytest.raises(QueueFull):
        batch.submit([3, 4], GenerationConfig(max_new_tokens=5))
    with pytest.raises(ValueError, match="empty"):
        batch.submit([], GenerationConfig())
    with pytest.raises(ValueError, match="context window"):
        batch.submit([3] * (target.max_positions + 1), GenerationConfig())
    with pytest.raises(ValueError, match="outside the vocabulary"):
        batch.submit([5, target.vocab_size], GenerationConfig())
    with pytest.raises(ValueError, match="already in use"):
        batch.submit([3], GenerationConfig(), request_id=a)
    events = batch.step()
    assert batch.num_running == 2
    batch.cancel(a)
    batch.cancel("never-submitted")
    events += batch.step()
    assert any(e.request_id == a and e.finished and e.finish_reason == "cancelled" for e in events)
    assert batch.num_running == 1
    c = batch.submit([4, 4, 4], GenerationConfig(max_new_tokens=0))
    results = batch.run_to_completion()
    before = sum(len(e.tokens) for e in events if e.request_id == b)
    assert results[b].finish_reason == "length" and before + len(results[b].tokens) == 50
    assert results[c].tokens == [] and results[c].finish_reason == "length"
    assert target.cache.free and len(target.cache.free) == target.cache.num_slots, "every slot is free again"


def test_close_cancels_everything():
    target = HFTarget(TINY_MODELS["llama"]())
    batch = BatchEngine(build(target, "ar", None), max_batch=1)
    ids = [batch.submit([3, 4, 5], GenerationConfig(max_new_tokens=9)) for _ in range(3)]
    batch.step()
    events = batch.close()
    assert sorted(e.request_id for e in events) == sorted(ids) and all(e.finish_reason == "cancelled" for e in events)
    assert not batch.has_work


def test_adaptive_budget_falls_back_when_speculation_does_not_pay():
    costs = CostTable("m", "cpu", {1: {1: 0.30, 9: 0.50, 17: 0.70}, 8: {1: 0.68, 9: 2.4, 17: 4.4}})
    good = AdaptiveBudget(costs, Acceptance(prior=[0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.2, 0.1], prior_weight=1e9), budgets=(4, 8, 16))
    assert good.best(1, 16) > 0 and good.best(8, 16) > 0
    assert round(good.predicted(1, 8), 1) == 8.2 and round(good.predicted(8, 8), 1) == 13.7  # the module docstring's figures
    poor = AdaptiveBudget(costs, Acceptance(prior=[0.4, 0.2, 0.1], prior_weight=1e9), budgets=(4, 8, 16))
    assert poor.best(1, 16) > 0 and poor.best(8, 16) == 0
    assert poor.predicted(8, 0) > poor.predicted(8, 4)
    # at 0 nothing is drafted; every `explore` steps one sequence probes a positive budget,
    # in its own forward when that costs less than padding the batch (here: 0.30 + 0.50 s for
    # B = 7 plain + a probe of 8 nodes, against 2.4 s for 8 x 9 rows)
    poor.explore, poor.warmup = 3, 0
    plans = [poor.plan(8, [16]) for _ in range(6)]
    assert all(p.cap == 0 for p in plans)
    probes = [p for p in plans if p.probe]
    assert len(probes) == 2 and all(p.probe in (4, 8, 16) and p.split for p in probes)
    assert not poor.speculating(8, 16) and poor.speculating(1, 16)


def test_adaptive_budget_learns_acceptance_online():
    costs = CostTable("m", "cpu", {1: {1: 0.3, 5: 0.42}})
    policy = AdaptiveBudget(costs, Acceptance(prior=[0.0], prior_weight=1.0), budgets=(4,), refresh=1, warmup=3)
    assert policy.best(1, 4) == 0
    plan = policy.plan(1, [4])
    assert plan.cap == 0 and plan.probe == 4, "warm-up: a lone sequence probes its own budget until 3 steps are observed"
    assert not policy.plan(2, [4, 4]).split, "B = 2: one forward of 2 x 5 rows is cheaper than 1 + 5 rows apart"
    for _ in range(3):
        policy.observe(1, 4, 4, [], 0.0)
    assert policy.plan(1, [4]) == StepPlan(cap=0)
    for _ in range(50):
        policy.observe(1, 4, 4, [0, 1, 2, 3], 0.0)
    assert policy.best(1, 4) == 4


def test_adaptive_budget_corrects_its_table_with_measured_forwards():
    """The table overstates a plain B = 4 step (0.32 s; it took 0.20 s, as on the Zen 4 of
    RESULTS.md): the policy drafts on the table's word, but first decodes one step plainly to
    measure that step, and with the measurement it decodes plainly. Once every ``explore``
    speculating steps it measures a plain step again."""
    costs = CostTable("m", "cpu", {1: {1: 0.3, 5: 0.4}, 4: {1: 0.32, 5: 0.6}})
    policy = AdaptiveBudget(costs, Acceptance(prior=[0.5, 0.4, 0.3, 0.2], prior_weight=1e9), budgets=(4,), explore=3, warmup=0)
    assert policy.best(4, 4) == 4
    assert policy.plan(4, [4] * 4) == StepPlan(cap=0), "no plain B = 4 step measured yet: measure one"
    policy.observe_forward(4, 1, 0.20)
    assert policy.target_cost(4, 1) == pytest.approx(0.20) and policy.target_cost(4, 5) == pytest.approx(0.6 * 0.2 / 0.32)
    policy.observe_forward(4, 5, 0.6)
    assert policy.target_cost(4, 5) == pytest.approx(0.6) and policy.target_cost(4, 3) == pytest.approx(costs.cost(4, 3) * (0.625 + 1) / 2)
    assert policy.best(4, 4) == 0 and policy.plan(4, [4] * 4) == StepPlan(cap=0, probe=0)
    # a method that clearly pays keeps drafting and re-measures a plain step every 3 speculating steps
    good = AdaptiveBudget(costs, Acceptance(prior=[0.9] * 4, prior_weight=1e9), budgets=(4,), explore=3, warmup=0)
    good.observe_forward(4, 1, 0.20)
    assert [good.plan(4, [4] * 4).cap for _ in range(6)] == [4, 4, 0, 4, 4, 0]
    # a forward slowed by something else moves the average, within bounds
    good.observe_forward(1, 1, 100.0)
    assert good.target_cost(1, 1) == pytest.approx(5 * 0.3)


def test_the_sequences_in_flight_decide_by_their_own_acceptance():
    """The pooled estimate says a batch of 4 should draft (+12%); the four sequences in flight
    have accepted a third of what it expected, so the batch decodes plainly. Sequences that
    left no longer count, and a sequence without a record takes the pooled estimate."""
    costs = CostTable("m", "cpu", {1: {1: 0.3, 7: 0.45}, 4: {1: 0.45, 7: 1.12}})
    policy = AdaptiveBudget(costs, Acceptance(prior=[0.6, 0.5, 0.4, 0.3, 0.2, 0.2], prior_weight=1e9), budgets=(6,), warmup=0)
    policy.observe_forward(4, 1, 0.45)
    keys = ["a", "b", "c", "d"]
    assert policy.best(4, 6) == 6 and policy.best(4, 6, keys) == 6
    for _ in range(20):
        for k in keys:
            policy.observe(4, 6, 6, [0], 0.1, key=k)  # 1 node a step where 2.2 were expected
    assert [round(policy.multiplier(k), 3) for k in keys] == [round((20 + 8) / (44 + 8), 3)] * 4
    assert policy.best(4, 6) == 6 and policy.best(4, 6, keys) == 0
    assert policy.plan(4, [6] * 4, keys=keys) == StepPlan(cap=0)
    for k in keys:
        policy.release(k)
    assert policy.multiplier("a") == 1.0 and policy.best(4, 6, keys) == 6


def test_realized_throughput_overrules_the_prediction():
    """Drafting whose steps produce fewer tokens a second than plain steps at the same batch size
    stops there for ``explore`` steps (no probes either), whatever the prediction says; fewer
    than ``GUARD_STEPS`` drafting steps, or drafting that beats plain, change nothing; the other
    batch sizes keep their own records."""
    costs = CostTable("m", "cpu", {1: {1: 0.30, 9: 0.50}, 2: {1: 0.33, 9: 0.70}})
    policy = AdaptiveBudget(costs, Acceptance(prior=[0.9] * 8, prior_weight=1e9), budgets=(8,), explore=5, warmup=0)
    for b, plain_s in ((1, 0.30), (2, 0.33)):
        policy.observe_forward(b, 1, plain_s)
        policy.observe_step(b, False, b, plain_s)
    assert policy.plan(2, [8, 8]).cap == 8 and policy.plan(1, [8]).cap == 8
    for _ in range(GUARD_STEPS - 1):
        policy.observe_step(2, True, 4, 1.0)  # 4 tokens/s against 6.1 plain
        policy.observe_step(1, True, 4, 0.6)  # 6.7 tokens/s against 3.3 plain
    assert policy.plan(2, [8, 8]).cap == 8, "too few drafting steps to overrule the prediction"
    policy.observe_step(2, True, 4, 1.0)  # 4 x (1 + 1/2) < 6.1
    policy.observe_step(1, True, 4, 0.6)
    plans = [policy.plan(2, [8, 8]) for _ in range(4)]
    assert not policy.speculating(2, 8), "a request joining the vetoed batch size starts plainly"
    plans.append(policy.plan(2, [8, 8]))
    assert all(p.cap == 0 and not p.probe for p in plans)
    assert policy.plan(1, [8]).cap == 8 and policy.speculating(1, 8), "batch size 1's drafting pays"
    assert policy.plan(2, [8, 8]).cap == 8, "after `explore` plain steps the prediction chooses again"
    assert policy.realized[2].steps[True] == 0, "and drafting builds a fresh record"
    # drafting that keeps up with plain is left alone; a loss of 10% is stopped once ~10 steps show it
    for rate, stopped_after in ((7.1, None), (5.5, 10)):
        fresh = AdaptiveBudget(costs, Acceptance(prior=[0.9] * 8, prior_weight=1e9), budgets=(8,), warmup=0)
        fresh.observe_step(2, False, 2, 0.33)
        steps = 0
        while steps < 30 and not fresh.vetoed.get(2):
            fresh.observe_step(2, True, 11, 11 / rate)
            steps += 1
        assert (None if steps == 30 else steps) == stopped_after


def test_a_veto_at_batch_size_one_ends_with_its_request():
    """At batch size 1 a veto belongs to the request it was measured on: when that request
    leaves, the next one drafts as ``generate`` would; another request leaving does not lift it,
    and at ``B > 1`` release lifts nothing (the veto runs its ``explore`` steps)."""
    costs = CostTable("m", "cpu", {1: {1: 0.30, 9: 0.50}, 2: {1: 0.33, 9: 0.70}})
    policy = AdaptiveBudget(costs, Acceptance(prior=[0.9] * 8, prior_weight=1e9), budgets=(8,), explore=100, warmup=0)
    for b, plain_s in ((1, 0.30), (2, 0.33)):
        policy.observe_forward(b, 1, plain_s)
        policy.observe_step(b, False, b, plain_s)
    for keys in (["a"], ["b", "c"]):
        assert policy.plan(len(keys), [8] * len(keys), keys=keys).cap == 8
        for _ in range(GUARD_STEPS):
            policy.observe_step(len(keys), True, 1, 1.0)  # 1 token/s: far below plain
        assert policy.plan(len(keys), [8] * len(keys), keys=keys).cap == 0
    policy.release("z")
    assert policy.plan(1, [8], keys=["a"]).cap == 0, "another request leaving lifts nothing"
    for key in ("a", "b", "c"):
        policy.release(key)
    assert policy.plan(1, [8], keys=["d"]).cap == 8, "the next request alone drafts afresh"
    assert policy.plan(2, [8, 8], keys=["d", "e"]).cap == 0, "B = 2's veto runs its course"


def test_the_engine_reports_each_step_realized():
    """``observe_step`` gets every batched step but those that fed a fused start's prompt: the
    tokens it emitted, whether a sequence drafted, and seconds that leave out catch-up prefills."""

    class Recording(RandomCap):
        def __init__(self):
            super().__init__(seed=3)
            self.steps: list[tuple[int, bool, int, float]] = []

        def observe_step(self, batch_size, drafted, tokens, seconds):
            self.steps.append((batch_size, drafted, tokens, seconds))

    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    engine = build(target, "draft-tree", perturbed(model))
    fused_tokens = []  # tokens emitted by the steps that fed a fused start's prompt (one sequence, one call)
    step_batch = engine.step_batch

    def recording_step_batch(seqs, budget=None):
        fed = any(seq.unfilled for seq in seqs)
        emitted = step_batch(seqs, budget)
        if fed:
            fused_tokens.append(sum(map(len, emitted)))
        return emitted

    engine.step_batch = recording_step_batch
    policy = Recording()
    batch = BatchEngine(engine, max_batch=3, policy=policy)
    requests = [(p, GenerationConfig(max_new_tokens=16, budget=8)) for p, _ in make_prompts(n=5, vocab=model.config.vocab_size)]
    run_schedule(batch, requests, random.Random(2))
    assert batch.stats.fused_steps == len(fused_tokens) >= 1, "the first request started alone"
    assert len(policy.steps) == batch.stats.steps - batch.stats.fused_steps, "every step but those that fed a prompt"
    assert sum(t for _, _, t, _ in policy.steps) + sum(fused_tokens) == batch.stats.tokens
    assert {d for _, d, _, _ in policy.steps} == {True, False}
    assert all(1 <= b <= 3 and s >= 0 for b, _, _, s in policy.steps)
    assert all(t <= b for b, d, t, _ in policy.steps if not d), "a plain step emits at most one token a sequence"
    by_batch = {b: [sum(t for bb, _, t, _ in policy.steps if bb == b), sum(x for bb, _, _, x in policy.steps if bb == b)] for b, *_ in policy.steps}
    assert batch.stats.decode_by_batch.keys() == by_batch.keys()
    for b, (tokens, seconds) in by_batch.items():  # the stats keep the same tokens and seconds per batch size
        assert batch.stats.decode_by_batch[b] == [tokens, pytest.approx(seconds)]


def test_catch_up_that_cannot_pay_back_is_skipped():
    """A draft model prefills a sequence's prompt at its first proposal; a policy that says this
    cannot pay back keeps the sequence plain (no draft-model work at all) while the output
    stays ``ar``'s. With a real :class:`AdaptiveBudget` the batch engine reports every target
    forward and catch-up to it."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    ar, engine = build(target, "ar", None), build(target, "draft-tree", perturbed(model))
    requests = [(p, GenerationConfig(max_new_tokens=16, budget=4)) for p, _ in make_prompts(n=4, vocab=model.config.vocab_size)]
    expected = {str(i): ar.generate_ids(p, c) for i, (p, c) in enumerate(requests)}

    class Refuse(FixedBudget):
        asked: list = []

        def pays_back(self, batch_size, budget, tokens, remaining):
            self.asked.append((tokens, remaining))
            return False

    lm = engine.drafters[0].lm
    calls: list[int] = []
    prefill = lm.prefill
    lm.prefill = lambda slot, tokens, *a: calls.append(len(tokens)) or prefill(slot, tokens, *a)
    batch = BatchEngine(engine, max_batch=3, policy=Refuse())
    assert run_schedule(batch, requests, random.Random(2)) == expected
    assert calls == [] and batch.stats.tokens == batch.stats.sequence_steps
    # asked at every step: the whole context but the root is uncached, and one token fewer is left
    assert Refuse.asked and {n + left for n, left in Refuse.asked} <= {len(p) - 1 + 16 for p, _ in requests}
    costs = CostTable("m", "cpu", {1: {1: 1e-3, 5: 1.2e-3}, 2: {1: 1.5e-3, 5: 2e-3}, 3: {1: 2e-3, 5: 3e-3}})
    policy = AdaptiveBudget(costs, Acceptance(prior=[0.9] * 4, prior_weight=1e9), budgets=(4,))
    batch = BatchEngine(engine, max_batch=3, policy=policy)
    assert run_schedule(batch, requests, random.Random(2)) == expected
    assert calls and policy.catch_up_per_token is not None and policy.catch_up_per_token > 0
    assert 3 in policy.forward_ratio and set(policy.forward_ratio) <= {1, 2, 3}
    assert all(1 in rows for rows in policy.forward_ratio.values()), "a plain step measured at every batch size"


def test_sparse_drafts_are_costed_by_the_nodes_drafted():
    """A prompt-lookup method that drafts 2 nodes under a budget of 16 pays for 3 rows alone,
    for the padded 17 in a batch."""
    costs = CostTable("m", "cpu", {1: {1: 0.3, 17: 0.7}, 4: {1: 0.4, 17: 1.6}})
    acc = Acceptance(prior=[0.5], prior_weight=0.0)
    for _ in range(10):
        acc.add(16, [0], tree_nodes=2)
    assert acc.expected_nodes(16) == 2.0 and acc.expected_tokens(16) == 2.0
    policy = AdaptiveBudget(costs, acc, budgets=(16,))
    assert policy.predicted(1, 16) == pytest.approx(2.0 / costs.cost(1, 3))
    assert policy.predicted(4, 16) == pytest.approx(4 * 2.0 / 1.6)


def test_cost_table_round_trip(tmp_path):
    t = CostTable("m", "cpu", {1: {1: 0.3, 8: 0.5}}, threads=2)
    t.save(tmp_path / "c.json")
    assert CostTable.load(tmp_path / "c.json").seconds == t.seconds
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a specgraft cost table"):
        CostTable.load(tmp_path / "bad.json")


def test_fixed_budget_is_single_sequence_behaviour():
    assert FixedBudget().plan(4, [8, 3]) == StepPlan(cap=None) and FixedBudget().speculating(8, 4)


def test_measure_costs_and_find_table(tmp_path, monkeypatch):
    from specgraft.budget.costs import find_cost_table, table_name
    from specgraft.budget.profile import measure_costs

    target = HFTarget(TINY_MODELS["llama"]())
    table = measure_costs(target, batch_sizes=(1, 3), rows=(1, 4), context=8, reps=1)
    assert set(table.seconds) == {1, 3} and all(set(r) == {1, 4} and min(r.values()) > 0 for r in table.seconds.values())
    assert target.cache.num_slots >= 3 and len(target.cache.free) == target.cache.num_slots, "slots released"
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))
    assert find_cost_table("/models/tiny", "cpu", 2) is None
    table.save(tmp_path / "costs" / table_name("/models/tiny", "cpu", 2))
    assert find_cost_table("/models/tiny", "cpu", 2) == tmp_path / "costs" / "tiny-cpu-t2.json"
    assert find_cost_table("/models/tiny", "cpu", 16) == tmp_path / "costs" / "tiny-cpu-t2.json", "another thread count's table"
    assert find_cost_table("/models/tiny", "cuda:0", 2) is None
    with pytest.raises(ValueError, match="exceed the context window"):
        measure_costs(target, context=target.max_positions)


def test_profile_and_bench_serve_cli(tmp_path, monkeypatch, capsys, tiny_model_dir):
    import json

    from tests.helpers.cli import run_cli

    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"id": f"p{i}", "task": "t", "turns": [text]}) + "\n" for i, text in enumerate(["w5 w6 w7 w5 w6", "w9 w10 w11", "w4"])))
    code, _, err = run_cli(monkeypatch, capsys, "profile", "--model", tiny_model_dir, "--batch-sizes", "1,2", "--rows", "1,3", "--context", "8", "--reps", "1", "--threads", "1")
    assert code == 0, err
    written = list((tmp_path / "costs").glob("*.json"))
    assert len(written) == 1 and "wrote" in err
    code, out, err = run_cli(
        monkeypatch, capsys, "bench-serve", "--model", tiny_model_dir, "--methods", "pld", "--batch-sizes", "1,3",
        "--suite", str(suite), "--max-new-tokens", "6", "--out", str(tmp_path / "bs"), "--threads", "1",
    )
    assert code == 0, err
    rows = [json.loads(line) for line in (tmp_path / "bs" / "results.jsonl").read_text().splitlines()]
    assert [(r["method"], r["batch"]) for r in rows] == [(m, b) for b in (1, 3) for m in ("ar", "pld", "hf", "ar-end")], "ar first and last"
    assert all(r["exact"] for r in rows if r["method"] != "hf") and all(r["tokens"] == 6 * r["prompts"] for r in rows)
    for b in (1, 3):  # ratios against the mean time of the two ar passes
        ar, end, pld = ({r["method"]: r for r in rows if r["batch"] == b}[m] for m in ("ar", "ar-end", "pld"))
        assert pld["ratio_vs_ar"] == pytest.approx(pld["tokens_per_s"] * (ar["wall_s"] + end["wall_s"]) / 2 / ar["tokens"])
    assert "bracketed by ar and ar-end" in err
    assert json.loads((tmp_path / "bs" / "run.json").read_text())["cost_table"] == str(written[0])
    code, out, err = run_cli(
        monkeypatch, capsys, "bench-serve", "--model", tiny_model_dir, "--methods", "pld", "--batch-sizes", "2", "--rounds", "3",
        "--suite", str(suite), "--max-new-tokens", "6", "--out", str(tmp_path / "rounds"), "--threads", "1",
    )
    assert code == 0, err
    rows = {(r := json.loads(line))["method"]: r for line in (tmp_path / "rounds" / "results.jsonl").read_text().splitlines()}
    assert list(rows) == ["ar", "pld", "hf"], "rounds bracket each other: no ar-end"
    assert all(len(r["passes_s"]) == 3 and r["wall_s"] == pytest.approx(sum(r["passes_s"])) and r["tokens"] == 3 * 6 * 3 for r in rows.values())
    assert rows["hf"]["decode_tokens_per_s"] is None and all(rows[m]["decode_tokens_per_s"] > 0 for m in ("ar", "pld"))
    assert rows["pld"]["exact"] and rows["pld"]["ratio_vs_ar"] == pytest.approx(rows["ar"]["wall_s"] / rows["pld"]["wall_s"])
    order = [line.split()[3] for line in err.splitlines() if " round " in line]
    assert order == ["ar", "pld", "hf", "hf", "pld", "ar", "ar", "pld", "hf"], "the order alternates every round"
    assert "pld: " in err and "over 3 alternating rounds" in err
    assert json.loads((tmp_path / "rounds" / "run.json").read_text())["rounds"] == 3
    assert "warm-up" not in err and json.loads((tmp_path / "bs" / "run.json").read_text())["warmup"] is False  # CPU default
    code, out, err = run_cli(
        monkeypatch, capsys, "bench-serve", "--model", tiny_model_dir, "--methods", "pld", "--batch-sizes", "2", "--warmup",
        "--suite", str(suite), "--max-new-tokens", "6", "--out", str(tmp_path / "warm"), "--threads", "1",
    )
    assert code == 0, err
    assert "B=2 warm-up (not timed): ar and hf, 2 prompts x 4 tokens" in err
    rows = [json.loads(line) for line in (tmp_path / "warm" / "results.jsonl").read_text().splitlines()]
    assert [r["method"] for r in rows] == ["ar", "pld", "hf", "ar-end"] and all(r["tokens"] == 6 * 3 for r in rows)
    assert json.loads((tmp_path / "warm" / "run.json").read_text())["warmup"] is True
    from specgraft.drafters.recycling import SuccessorMatrix
    from transformers import AutoConfig

    state = tmp_path / "state.npz"
    matrix = SuccessorMatrix(AutoConfig.from_pretrained(tiny_model_dir).vocab_size)
    matrix.update_rows([5, 6], np.array([[6] * matrix.k, [7] * matrix.k]))
    matrix.save(state)
    common = ["bench-serve", "--model", tiny_model_dir, "--methods", "recycling", "--batch-sizes", "1", "--suite", str(suite),
              "--max-new-tokens", "4", "--threads", "1", "--no-hf", "--no-bracket"]
    code, _, err = run_cli(monkeypatch, capsys, *common, "--recycling-state", str(state), "--out", str(tmp_path / "warm"))
    assert code == 0, err
    assert json.loads((tmp_path / "warm" / "run.json").read_text())["recycling_state"] == str(state)
    code, _, err = run_cli(monkeypatch, capsys, *common, "--recycling-state", str(tmp_path / "missing.npz"), "--out", str(tmp_path / "x"))
    assert code == 2 and "does not exist" in err
    SuccessorMatrix(matrix.vocab_size + 1).save(other := tmp_path / "other.npz")
    code, _, err = run_cli(monkeypatch, capsys, *common, "--recycling-state", str(other), "--out", str(tmp_path / "y"))
    assert code != 0 and "vocabulary" in err, "the state is loaded: another vocabulary's is refused"
    code, _, err = run_cli(monkeypatch, capsys, "profile", "--model", tiny_model_dir, "--batch-sizes", "0")
    assert code == 2 and "--batch-sizes must be integers >= 1" in err


def test_bench_serve_can_stop_at_eos(tiny_model_dir, tmp_path):
    """``--stop-on-eos``: a request ends at its EOS (kept), Hugging Face's padded batches are cut
    there too, and every method's outputs still equal single-sequence ``ar``'s."""
    from specgraft.api import SpecDecoder
    from specgraft.bench.batched import bench_batches, write_rows

    ar = SpecDecoder.from_pretrained(tiny_model_dir, method="ar", dtype="float32", progress=False)
    decoders = {"ar": ar, "pld": ar.with_method("pld")}
    prompts = [[5, 6, 7, 5, 6], [9, 10, 11, 12], [4, 4, 4]]
    free = ar.generate(prompts[0], config=SpecDecoder.make_config(max_new_tokens=8, stop_on_eos=False)).tokens
    eos = free[2]  # the first prompt's third token ends its request
    for dec in decoders.values():
        dec.engine.eos_token_ids = frozenset({eos})
    rows = bench_batches(decoders, prompts, [2], 8, None, log=lambda _: None, bracket=False, stop_on_eos=True)
    by = {r.method: r for r in rows}
    assert by["ar"].exact and by["pld"].exact and by["pld"].tokens == by["ar"].tokens < 8 * len(prompts)
    assert by["hf"].tokens <= 8 * len(prompts) and (not by["hf"].exact or by["hf"].tokens == by["ar"].tokens)
    report = write_rows(rows, tmp_path / "eos", {"prompts": 3, "max_new_tokens": 8, "stop_on_eos": True}).read_text()
    assert report.startswith("3 prompts, up to 8 tokens, ending at EOS.")
