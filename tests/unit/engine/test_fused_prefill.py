"""A fused start: a short prompt's prefill fed as a chain ahead of the root in the first step's
forward (``SpecEngine.start``, ``HFTarget.forward_batch(logits_from=...)``).

Its twin is the separate prefill (``engine.with_fusion(PrefillFusion.OFF)``): same tokens, same steps,
same cache rows, greedy and sampled.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specgraft.batch import BatchEngine
from specgraft.composers.graft import GraftComposer
from specgraft.methods.graft import graft_config
from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.drafters.draft_model import DraftModelDrafter, DraftTreeConfig
from specgraft.engine import PrefillFusion, SpecEngine
from specgraft.methods import MethodOptions, get_method
from specgraft.models.hf import HFTarget

from tests.helpers.lossless import make_prompts
from tests.helpers.models import TINY_MODELS, perturbed, tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

FUSE = PrefillFusion(max_rows=512)


def engines(model) -> dict[str, SpecEngine]:
    """``ar``, ``pld`` and a draft-model tree over one target (each method's own slots)."""
    target = HFTarget(model)
    out = {}
    for name in ("ar", "pld"):
        drafters, composer = get_method(name).build(target, MethodOptions())
        out[name] = SpecEngine(target, drafters, composer, method=name)
    drafter = DraftModelDrafter(perturbed(model), DraftTreeConfig(depth=3, top_k=3), target_vocab=model.config.vocab_size)
    out["draft-tree"] = SpecEngine(target, [drafter], GraftComposer(graft_config("draft-tree")), method="draft-tree")
    return out


def run(engine: SpecEngine, prompt: list[int], config: GenerationConfig, fuse: bool) -> tuple[list[int], int, dict]:
    engine = engine.with_fusion(FUSE if fuse else PrefillFusion.OFF)
    tokens = engine.generate_ids(prompt, config)
    stats = engine.last_stats
    return tokens, stats.steps, dict(stats.accepted_by_source)


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_fused_start_equals_separate_prefill(arch):
    """Greedy and sampled: tokens, steps and accepted drafts as with the prefill apart."""
    model = TINY_MODELS[arch]()
    greedy = GenerationConfig(max_new_tokens=16, budget=8)
    sampled = GenerationConfig(max_new_tokens=16, budget=8, sampling=SamplingConfig(temperature=0.8, seed=3))
    for name, engine in engines(model).items():
        for prompt, _ in make_prompts(12, vocab=model.config.vocab_size):
            for config in (greedy, sampled):
                fused, apart = run(engine, prompt, config, True), run(engine, prompt, config, False)
                assert fused == apart, f"{arch}/{name}: a fused start changed the output on {prompt}"


def test_fused_start_fills_the_same_cache_rows():
    """After the first step the slot holds the prompt and the accepted tokens, as a prefill would
    have left them (float tolerance: the prompt rows ride in a larger forward)."""
    model = tiny_llama()
    engine = engines(model)["draft-tree"]
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 9, 11]
    config = GenerationConfig(max_new_tokens=8, budget=8)
    caches = []
    for fuse in (True, False):
        engine = engine.with_fusion(FUSE if fuse else PrefillFusion.OFF)
        seq = engine.start(prompt, config)
        assert seq.unfilled == (prompt[:-1] if fuse else [])
        assert engine.target.length(seq.slot) == (0 if fuse else len(prompt) - 1)
        engine.step(seq)
        assert seq.unfilled == []
        if fuse:  # the fused forward is the sequence's prefill, not a verify forward
            assert seq.stats.prefill_s > 0 and seq.stats.forward_s == 0
        n = engine.target.length(seq.slot)
        assert n == len(seq.context) - 1, "every committed token but the next root is cached"
        caches.append([(layer.keys[seq.slot, :, :n].clone(), layer.values[seq.slot, :, :n].clone()) for layer in engine.target.cache.layers])
        engine.finish(seq)
    for (k1, v1), (k2, v2) in zip(*caches, strict=True):
        torch.testing.assert_close(k1, k2)
        torch.testing.assert_close(v1, v2)


def test_fused_start_only_without_prefill_requests_and_for_short_prompts():
    model = tiny_llama()
    target = HFTarget(model)
    drafters, composer = get_method("recycling").build(target, MethodOptions())
    recycling = SpecEngine(target, drafters, composer, method="recycling")  # asks for the prompt's top-k
    seq = recycling.start([5, 6, 7, 8], GenerationConfig(max_new_tokens=4))
    assert seq.unfilled == [] and target.length(seq.slot) == 3
    recycling.finish(seq)
    pld = engines(model)["pld"]
    seq = pld.start([5, 6, 7, 8], GenerationConfig(max_new_tokens=4), fuse_prefill=False)
    assert seq.unfilled == [] and pld.target.length(seq.slot) == 3
    pld.finish(seq)
    pld = pld.with_fusion(PrefillFusion(max_rows=2))
    seq = pld.start([5, 6, 7, 8], GenerationConfig(max_new_tokens=4))
    assert seq.unfilled == [], "a prompt longer than fusion.max_rows is prefilled apart"
    pld.finish(seq)


def test_a_batch_prefills_apart():
    """A batch's sequences never fuse: the others' trees would be padded to a prompt's length."""
    model = tiny_llama()
    engine = engines(model)["pld"]
    started = []
    plain_start_many = engine.start_many

    def start_many(*args, **kw):
        seqs = plain_start_many(*args, **kw)
        started.extend((list(seq.unfilled), engine.target.length(seq.slot)) for seq in seqs)
        return seqs

    engine.start_many = start_many
    batch = BatchEngine(engine, max_batch=2)
    batch.submit([5, 6, 7, 5, 6, 7], GenerationConfig(max_new_tokens=4))
    batch.submit([9, 8, 7], GenerationConfig(max_new_tokens=4))
    while batch.has_work:
        batch.step()
    assert started == [([], 5), ([], 2)]


def test_logits_from_returns_the_later_rows():
    model = tiny_llama()
    target = HFTarget(model)
    tokens = [5, 6, 7, 8, 9, 10]
    parents = [-1, 0, 1, 2, 3, 3]  # a chain, then two children of row 3
    full, part = target.allocate(), target.allocate()
    want = target.forward_batch([full], [tokens], [parents])[0]
    got = target.forward_batch([part], [tokens], [parents], logits_from=[4])[0]
    assert got.logits.shape == (2, model.config.vocab_size)
    torch.testing.assert_close(got.logits, want.logits[4:])
    with pytest.raises(ValueError, match="logits_from"):
        target.forward_batch([target.allocate()], [tokens], [parents], logits_from=[7])


def adapld_engine(model, variant: str = "adapld") -> SpecEngine:
    target = HFTarget(model)
    drafters, composer = get_method(variant).build(target, MethodOptions())
    return SpecEngine(target, drafters, composer, method=variant)


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_adapld_fused_start_is_lossless(arch):
    """AdaPLD asks the prefill for hidden states only, so a short prompt rides in the first
    forward and the prompt's rows reach the drafter with the first step. Its first tree differs
    (no reranking, no branches: nothing to rank with yet), so steps may too, never tokens."""
    model = TINY_MODELS[arch]()
    plain = engines(model)["ar"]
    for variant in ("adapld", "adapld-full"):
        engine = adapld_engine(model, variant)
        for prompt, _ in make_prompts(12, vocab=model.config.vocab_size):
            config = GenerationConfig(max_new_tokens=16, budget=8)
            want = plain.generate_ids(prompt, config)
            for fuse in (True, False):
                twin = engine.with_fusion(FUSE if fuse else PrefillFusion.OFF)
                assert twin.generate_ids(prompt, config) == want, f"{arch}/{variant} fuse={fuse} on {prompt}"
        # sampled: runs through (the verify rules are the tree's, fused or not)
        engine.with_fusion(FUSE).generate_ids(make_prompts(1, vocab=model.config.vocab_size)[0][0],
                            GenerationConfig(max_new_tokens=8, budget=8, sampling=SamplingConfig(temperature=0.8, seed=1)))


def prompt_memory(state, rows: int) -> tuple:
    """An AdaPLD state's prompt rows: unit layer states, final hidden states, which have top-k."""
    return state.hidden[:rows].copy(), state.prompt_final.clone(), state.has_top[:rows].copy()


def assert_same_memory(a: tuple, b: tuple, rows: int, hidden_size: int) -> None:
    """Two runs' prompt memories agree (float tolerance: the rows rode in forwards of other sizes)."""
    np.testing.assert_allclose(a[0], b[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a[1], b[1])
    assert a[1].shape == (rows, hidden_size)


def test_adapld_gets_the_prompt_rows_with_its_first_step():
    """Fused: ``begin`` sees no hidden states, the first ``observe`` gets the prompt's rows; after
    it the memory holds what a prefill apart gives (float tolerance: a larger forward)."""
    model = tiny_llama()
    engine = adapld_engine(model)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 9, 11, 5, 6]
    config = GenerationConfig(max_new_tokens=8, budget=8)
    memories = []
    for fuse in (True, False):
        engine = engine.with_fusion(FUSE if fuse else PrefillFusion.OFF)
        seq = engine.start(prompt, config)
        state = seq.drafter_states[0]
        assert seq.unfilled == (prompt[:-1] if fuse else []) and seq.deferred_prefill == fuse
        assert state.known == (0 if fuse else len(prompt) - 1)
        engine.step(seq)
        assert not seq.deferred_prefill and state.known == len(seq.context) - 1
        memories.append(prompt_memory(state, len(prompt) - 1))
        engine.finish(seq)
    assert_same_memory(*memories, rows=len(prompt) - 1, hidden_size=model.config.hidden_size)


def test_fused_start_needs_a_target_that_returns_the_prompt_rows():
    model = tiny_llama()
    engine = adapld_engine(model)
    seq = engine.start([5, 6, 7, 8], GenerationConfig(max_new_tokens=4))
    assert seq.unfilled == [5, 6, 7] and seq.deferred_prefill
    engine.finish(seq)
    engine.target.fill_outputs = False  # a target whose forward_batch has no fill_outputs
    seq = engine.start([5, 6, 7, 8], GenerationConfig(max_new_tokens=4))
    assert seq.unfilled == [] and not seq.deferred_prefill and engine.target.length(seq.slot) == 3
    engine.finish(seq)


def tail_engines(model, chunk: int) -> dict[str, SpecEngine]:
    """``ar``, ``pld``, a draft-model tree and both AdaPLD variants over one target whose prefill
    runs in chunks of ``chunk`` rows."""
    target = HFTarget(model, prefill_chunk=chunk)
    out = {}
    for name in ("ar", "pld", "adapld", "adapld-full"):
        drafters, composer = get_method(name).build(target, MethodOptions())
        out[name] = SpecEngine(target, drafters, composer, method=name)
    drafter = DraftModelDrafter(perturbed(model), DraftTreeConfig(depth=3, top_k=3), target_vocab=model.config.vocab_size)
    out["draft-tree"] = SpecEngine(target, [drafter], GraftComposer(graft_config("draft-tree")), method="draft-tree")
    return out


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_a_long_prompt_fuses_its_tail(arch):
    """Past ``PrefillFusion.max_rows`` a prompt prefills its whole chunks apart and fuses the rest
    (``SpecEngine.fused_head``): the same tokens as the prefill apart, greedy and sampled (and
    the same steps, but for AdaPLD, whose first tree has no hidden states of the fused rows)."""
    model = TINY_MODELS[arch]()
    greedy = GenerationConfig(max_new_tokens=12, budget=8)
    sampled = GenerationConfig(max_new_tokens=12, budget=8, sampling=SamplingConfig(temperature=0.8, seed=5))
    prompts = [p * 3 for p, _ in make_prompts(8, vocab=model.config.vocab_size)]
    for name, engine in tail_engines(model, chunk=8).items():
        fused_tails = 0
        for prompt in prompts:
            for config in (greedy, sampled):
                outs = {}
                for tail in (True, False):
                    engine = engine.with_fusion(PrefillFusion(max_rows=5, tail=tail))
                    seq = engine.start(prompt, config)
                    head = engine.fused_head(len(prompt) - 1)
                    if head is None or (head and not tail):
                        assert seq.unfilled == []
                    else:
                        fused_tails += head > 0
                        assert engine.target.length(seq.slot) == head and seq.unfilled == prompt[head:-1]
                    while not seq.done:
                        engine.step(seq)
                    outs[tail] = (list(seq.new_tokens), seq.stats.steps)
                    engine.finish(seq)
                if name.startswith("adapld"):
                    assert outs[True][0] == outs[False][0], f"{arch}/{name} on {prompt}"
                else:
                    assert outs[True] == outs[False], f"{arch}/{name} on {prompt}"
        assert fused_tails >= 8, f"{name}: too few prompts fused a tail"


def test_adapld_takes_a_long_prompt_in_two_parts():
    """A fused tail: AdaPLD gets the head's rows at ``begin`` and the tail's with its first
    ``observe``; after it the memory holds what one prefill apart gives."""
    model = tiny_llama()
    engine = tail_engines(model, chunk=8)["adapld"]
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 9, 11, 5, 6, 7, 12]
    config = GenerationConfig(max_new_tokens=8, budget=8)
    memories = []
    for tail in (True, False):
        engine = engine.with_fusion(PrefillFusion(max_rows=5, tail=tail))
        seq = engine.start(prompt, config)
        state = seq.drafter_states[0]
        assert state.known == (8 if tail else len(prompt) - 1) and seq.deferred_prefill == tail
        engine.step(seq)
        assert state.known == len(seq.context) - 1
        memories.append(prompt_memory(state, len(prompt) - 1))
        engine.finish(seq)
    assert_same_memory(*memories, rows=len(prompt) - 1, hidden_size=model.config.hidden_size)


def test_a_fused_tail_through_the_graphs_path():
    """The same with the forwards going through ``DecoderGraphs`` (its plain twin on the CPU:
    static tensors, rows padded to a power of two), as on a GPU: tokens equal to plain decoding."""
    model = tiny_llama()
    plain = engines(model)["ar"]
    target = HFTarget(model, prefill_chunk=8, cuda_graphs=True)
    assert target.graphs is not None and not target.graphs.capture
    config = GenerationConfig(max_new_tokens=12, budget=8)
    for name in ("pld", "adapld"):
        drafters, composer = get_method(name).build(target, MethodOptions())
        engine = SpecEngine(target, drafters, composer, method=name, fusion=PrefillFusion(max_rows=5))
        for prompt, _ in make_prompts(6, vocab=model.config.vocab_size):
            prompt = prompt * 3
            assert engine.generate_ids(prompt, config) == plain.generate_ids(prompt, config), f"{name} on {prompt}"
    assert target.graphs.stats.replayed > 0
