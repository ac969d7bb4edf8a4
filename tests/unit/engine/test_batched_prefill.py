"""Several prompts prefilled in one forward (``HFTarget.prefill_batch``, ``SpecEngine.start_many``):
on by default on a GPU; here forced on the CPU, where it computes the same cache rows."""

from __future__ import annotations

import pytest
import torch

from specgraft.batch import BatchEngine
from specgraft.config import GenerationConfig
from specgraft.engine import SequenceState, SpecEngine
from specgraft.methods import MethodOptions, build_method
from specgraft.models.hf import HFTarget

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS, perturbed


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_prefill_batch_equals_one_prefill_each(arch):
    """Prompts of different lengths, chunked (prefill_chunk 4), one slot already holding rows:
    the same committed lengths and cache rows as one prefill per slot."""
    torch.manual_seed(0)
    model = TINY_MODELS[arch]()
    prompts = [[5 + (3 * i + j) % 70 for i in range(n)] for j, n in enumerate((3, 9, 1, 6))]
    one, many = HFTarget(model, prefill_chunk=4), HFTarget(model, prefill_chunk=4)
    assert not one.batched_prefill  # off on a CPU by default
    slots = {}
    for t in (one, many):
        slots[id(t)] = [t.allocate() for _ in prompts]
        t.prefill(slots[id(t)][1], [7, 8, 9, 10, 11])  # an earlier prefix in one slot
    for s, p in zip(slots[id(one)], prompts):
        one.prefill(s, p)
    many.prefill_batch(slots[id(many)], prompts)
    for a, b in zip(one.cache.layers, many.cache.layers, strict=True):
        for sa, sb in zip(slots[id(one)], slots[id(many)]):
            n = one.length(sa)
            assert n == many.length(sb) and many.cache.pending[sb] == 0
            torch.testing.assert_close(a.keys[sa, :, :n], b.keys[sb, :, :n], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a.values[sa, :, :n], b.values[sb, :, :n], rtol=1e-5, atol=1e-5)


def test_prefill_batch_refuses_before_changing_anything():
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    a, b = target.allocate(), target.allocate()
    with pytest.raises(ValueError, match="outside"):
        target.prefill_batch([a, b], [[5, 6], [5, model.config.vocab_size]])
    with pytest.raises(ValueError, match="distinct"):
        target.prefill_batch([a, a], [[5], [6]])
    assert target.length(a) == target.length(b) == 0


def test_start_many_reports_a_bad_prompt_and_starts_the_rest():
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    target.batched_prefill = True
    engine = SpecEngine(target, [], method="ar")
    good = [5, 6, 7, 8]
    out = engine.start_many([(good, GenerationConfig(max_new_tokens=4), True), ([5, 10**6], GenerationConfig(), True), (good[:2], GenerationConfig(max_new_tokens=4), True)])
    assert isinstance(out[0], SequenceState) and isinstance(out[1], ValueError) and isinstance(out[2], SequenceState)
    assert target.length(out[0].slot) == 3 and target.length(out[2].slot) == 1
    assert engine.step_batch([out[0], out[2]]) == [hf_greedy(model, good, 1), hf_greedy(model, good[:2], 1)]


@pytest.mark.parametrize("name", ["ar", "pld", "draft-tree"])
def test_batched_greedy_with_batched_prefill_equals_plain_decoding(name):
    """Continuous batching whose admissions prefill together: every request equals plain greedy."""
    model = TINY_MODELS["qwen2"]()
    target = HFTarget(model)
    target.batched_prefill = True
    calls = []
    original = target.prefill_batch
    target.prefill_batch = lambda slots, lists: (calls.append(len(slots)), original(slots, lists))
    drafters, composer = build_method(name, target, MethodOptions(), perturbed(model))
    batch = BatchEngine(SpecEngine(target, drafters, composer, method=name), max_batch=4)
    prompts = [p for p, _ in make_prompts(9, model.config.vocab_size)]
    ids = [batch.submit(p, GenerationConfig(max_new_tokens=8 + i % 5, budget=8)) for i, p in enumerate(prompts)]
    results = batch.run_to_completion()
    for i, (rid, p) in enumerate(zip(ids, prompts)):
        assert results[rid].tokens == hf_greedy(model, p, 8 + i % 5), f"{name}: request {i}"
    assert calls and calls[0] == 4, calls  # the first four joined in one prefill
