"""The greedy and sampling suites on a CUDA GPU, fp32 tiny models; every test skips without one.

Run them where a GPU exists (``python -m pytest -m cuda``). On the GPU the adapter builds masks,
positions and slot writes on the device, the draft model drafts with device tensors, sampling
draws from a generator on the device, and timings synchronise; these tests check that all of
it stays exact there.
"""

from __future__ import annotations

import random

import pytest
import torch

from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.engine import PrefillFusion, SpecEngine
from specgraft.methods import GraftOptions, MethodOptions, build_method
from specgraft.models.hf import HFTarget
from specgraft.types import DraftTree

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS, perturbed

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

METHODS = (
    "ar", "pld", "recycling", "ptd", "draft-tree", "graft", "graft-prune", "graft-tail", "adapld", "adapld-full", "reader", "reader-widen",
)


def engines(model, draft, options: MethodOptions = MethodOptions()) -> dict[str, SpecEngine]:
    target = HFTarget(model)
    out = {}
    for name in METHODS:
        drafters, composer = build_method(name, target, options, draft)
        out[name] = SpecEngine(target, drafters, composer, method=name)
    return out


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_every_method_greedy_equals_plain_decoding_on_cuda(arch):
    torch.backends.cuda.matmul.allow_tf32 = False
    model = TINY_MODELS[arch]().cuda()
    draft = perturbed(model)
    config = GenerationConfig(max_new_tokens=20, budget=12)
    options = MethodOptions(graft=GraftOptions(thresholds=(0.02, 0.01, 0.005)))
    for name, engine in engines(model, draft, options).items():
        assert engine.target.device.type == "cuda"
        for prompt, _ in make_prompts(8, model.config.vocab_size):
            assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, 20), f"{arch}/{name} diverged on cuda"


def test_seeded_sampling_equals_plain_sampling_on_cuda():
    """Sample-and-match (every method with deterministic drafts) draws one token per emitted
    token from the device generator: the same seed reproduces ``ar`` token for token."""
    model = TINY_MODELS["llama"]().cuda()
    draft = perturbed(model)
    all_engines = engines(model, draft, MethodOptions(graft=GraftOptions(thresholds=(0.02, 0.01, 0.005))))
    rng = random.Random(5)
    for _ in range(4):
        unit = [rng.randrange(3, 96) for _ in range(rng.randint(2, 5))]
        prompt = (unit * 8)[: rng.randint(8, 30)]
        config = GenerationConfig(max_new_tokens=20, budget=12, sampling=SamplingConfig(temperature=0.5, top_p=0.9, seed=3))
        plain = all_engines["ar"].generate_ids(prompt, config)
        for name, engine in all_engines.items():
            assert engine.generate_ids(prompt, config) == plain, f"{name} sampled differently on cuda"


def test_sampled_drafts_and_rejection_run_on_cuda():
    model = TINY_MODELS["llama"]().cuda()
    draft = perturbed(model)
    target = HFTarget(model)
    options = MethodOptions(graft=GraftOptions(sample_drafts=True, seed=2, thresholds=(0.02, 0.01, 0.005)))
    for name in ("draft-tree", "graft"):
        drafters, composer = build_method(name, target, options, draft)
        engine = SpecEngine(target, drafters, composer, method=name)
        config = GenerationConfig(max_new_tokens=20, budget=12, sampling=SamplingConfig(temperature=1.0, seed=4))
        prompt = [5, 6, 7, 5, 6, 7, 5]
        first = engine.generate_ids(prompt, config)
        assert engine.generate_ids(prompt, config) == first and len(first) == 20
        assert engine.last_stats.steps < 20, "rejection sampling must accept some sampled nodes"


def test_batched_commit_equals_fresh_prefill_on_cuda():
    model = TINY_MODELS["qwen2"]().cuda()
    target = HFTarget(model)
    slots = [target.allocate() for _ in range(2)]
    prompts = [[5, 6, 7, 8, 9], [10, 11, 12]]
    for slot, prompt in zip(slots, prompts):
        target.prefill(slot, prompt[:-1])
    tree = DraftTree(tokens=[20, 21, 22], parents=[-1, 0, -1], sources=["t"] * 3)
    target.forward_batch(range(2), [[p[-1], *tree.tokens] for p in prompts], [[-1, 0, 1, 0]] * 2)
    for slot, prompt in zip(slots, prompts):
        target.commit(slot, [0, 3])
        fresh = HFTarget(model)
        other = fresh.allocate()
        fresh.prefill(other, prompt + [22])
        n = len(prompt) + 1
        for a, b in zip(target.cache.layers, fresh.cache.layers, strict=True):
            torch.testing.assert_close(a.keys[slot, :, :n], b.keys[other, :, :n], rtol=1e-5, atol=1e-5)


def test_batched_greedy_equals_plain_decoding_on_cuda():
    """Continuous batching on the GPU (scattered slots gathered on the device, a draft model
    drafting the batch in one forward per layer): every request equals plain greedy decoding."""
    from specgraft.batch import BatchEngine

    torch.backends.cuda.matmul.allow_tf32 = False
    model = TINY_MODELS["llama"]().cuda()
    draft = perturbed(model)
    prompts = [p for p, _ in make_prompts(10, model.config.vocab_size)]
    for name, engine in engines(model, draft).items():
        batch = BatchEngine(engine, max_batch=4)
        ids = [batch.submit(p, GenerationConfig(max_new_tokens=12 + i % 5, budget=8)) for i, p in enumerate(prompts)]
        results = batch.run_to_completion()
        for i, (rid, p) in enumerate(zip(ids, prompts)):
            assert results[rid].tokens == hf_greedy(model, p, 12 + i % 5), f"{name} diverged in a batch on cuda"


def test_packed_attention_on_cuda_equals_sdpa_and_speculates_exactly():
    """The CPU's grouped-query attention without copies (``specgraft_sdpa``; our loaders keep
    ``sdpa`` on a GPU) computes ``sdpa``'s function on the GPU too: the same tree forward's logits,
    and greedy ``draft-tree`` over it equals plain decoding."""
    from tests.helpers.models import packed_twin

    torch.backends.cuda.matmul.allow_tf32 = False
    model = TINY_MODELS["qwen2"]().cuda()
    twin = packed_twin(model)
    prompt = [5 + (7 * i) % 80 for i in range(23)]
    logits = []
    for m in (model, twin):
        target = HFTarget(m, prefill_chunk=6)
        slot = target.allocate()
        target.prefill(slot, prompt)
        logits.append(target.forward_rows(slot, [9, 10, 11, 12, 13, 14], [-1, 0, 0, 1, 2, 4]).logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-5)
    engine = engines(twin, perturbed(model))["draft-tree"]
    config = GenerationConfig(max_new_tokens=20, budget=12)
    for p, _ in make_prompts(4, model.config.vocab_size):
        assert engine.generate_ids(p, config) == hf_greedy(model, p, 20)


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_fused_projections_on_cuda_compute_the_plain_function(arch):
    """q/k/v and gate/up fused (``models/fusion.py``; CPU loaders fuse, GPU loaders only when
    asked): the same tree forward's logits as the plain layout on the GPU, and greedy
    ``draft-tree`` over fused target and draft equals plain decoding of the plain model."""
    from specgraft.models.fusion import fuse_projections

    torch.backends.cuda.matmul.allow_tf32 = False
    model = TINY_MODELS[arch]().cuda()
    fused, draft = TINY_MODELS[arch]().cuda(), perturbed(model)
    assert fuse_projections(fused) > 0 and fuse_projections(draft) > 0
    prompt = [5 + (7 * i) % 80 for i in range(23)]
    logits = []
    for m in (model, fused):
        target = HFTarget(m)
        slot = target.allocate()
        target.prefill(slot, prompt)
        logits.append(target.forward_rows(slot, [9, 10, 11, 12, 13, 14], [-1, 0, 0, 1, 2, 4]).logits)
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-5)
    target = HFTarget(fused)
    drafters, composer = build_method("draft-tree", target, MethodOptions(), draft)
    engine = SpecEngine(target, drafters, composer, method="draft-tree")
    config = GenerationConfig(max_new_tokens=20, budget=12)
    for p, _ in make_prompts(4, model.config.vocab_size):
        assert engine.generate_ids(p, config) == hf_greedy(model, p, 20)


@pytest.mark.parametrize("name", ["ar", "draft-tree"])
def test_cuda_graphs_replay_exactly(name):
    """Forwards replayed as CUDA graphs (``models/graphs.py``, on by default on a GPU) for target
    and draft model: greedy outputs equal plain decoding and the eager forwards' outputs, and
    graphs were captured and replayed (not only the eager path ran)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = TINY_MODELS["llama"]().cuda()
    draft = perturbed(model)
    config = GenerationConfig(max_new_tokens=24, budget=12)
    runs = {}
    for graphs in (True, False):
        target = HFTarget(model, cuda_graphs=graphs)
        drafters, composer = build_method(name, target, MethodOptions(), draft)
        engine = SpecEngine(target, drafters, composer, method=name)
        runs[graphs] = [engine.generate_ids(p, config) for p, _ in make_prompts(8, model.config.vocab_size)]
        if graphs:
            assert target.graphs.capture and target.graphs.stats.replayed > 0, target.graphs.stats
            if name == "draft-tree":
                assert drafters[0].lm.graphs.stats.replayed > 0
        else:
            assert target.graphs is None
    assert runs[True] == runs[False]
    for (p, _), out in zip(make_prompts(8, model.config.vocab_size), runs[True]):
        assert out == hf_greedy(model, p, 24)


def test_adapld_fused_and_apart_and_packed_rows_on_cuda():
    """AdaPLD's prompt in the first forward (``fill_outputs``: copies of the graphs' buffers) and
    prefilled apart give plain decoding's tokens on the GPU; ``observe``'s one packed copy to the
    host gives what the three copies give."""
    import numpy as np

    from specgraft.drafters.adapld import rows_to_host, top_rows, unit_rows

    torch.backends.cuda.matmul.allow_tf32 = False
    model = TINY_MODELS["qwen2"]().cuda()
    config = GenerationConfig(max_new_tokens=24, budget=12)
    target = HFTarget(model)
    for name in ("adapld", "adapld-full"):
        drafters, composer = build_method(name, target, MethodOptions())
        engine = SpecEngine(target, drafters, composer, method=name)
        for fuse_max in (512, 0):
            twin = engine.with_fusion(PrefillFusion(max_rows=fuse_max))
            for p, _ in make_prompts(6, model.config.vocab_size):
                assert twin.generate_ids(p, config) == hf_greedy(model, p, 24), f"{name} fusion max_rows={fuse_max}"
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(4, 151_936, device="cuda", generator=gen, dtype=torch.bfloat16)
    hidden = torch.randn(4, 128, device="cuda", generator=gen, dtype=torch.bfloat16)
    ids, probs, units = rows_to_host(logits, hidden, 9)
    plain_ids, plain_probs = top_rows(logits, 9)
    assert (ids == plain_ids).all() and np.allclose(probs, plain_probs, rtol=1e-4, atol=1e-9) and (units == unit_rows(hidden)).all()
