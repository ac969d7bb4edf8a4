"""CUDA graphs of decoder forwards (``models/graphs.py``) through their plain twin on the CPU.

No graph can be captured on a CPU; ``DecoderGraphs(capture=False)`` does everything else
(keys, buckets, static tensors, the cache writing through given row indices, masks padded to
the bucket, dropping graphs when the cache grows) and "replays" by running the eager forward
on the static tensors. These tests check that path against plain forwards; ``tests/lossless/test_cuda.py``
runs the captured graphs on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from specgraft.batch import BatchEngine
from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import MethodOptions, build_method
from specgraft.models import hf
from specgraft.models.graphs import DecoderGraphs, graphs_by_default, replays_graphs
from specgraft.models.hf import HFTarget

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS, perturbed


def with_twin(model, kv_step: int = 8, **kw) -> HFTarget:
    """An HFTarget whose forwards go through the twin, with small buckets (so masks get padded)."""
    target = HFTarget(model, capacity=16)
    target.graphs = DecoderGraphs(target._decode, target.cache, capture=False, kv_step=kv_step, **kw)
    return target


def test_defaults():
    assert not graphs_by_default("cpu") and graphs_by_default("cuda")
    model = TINY_MODELS["llama"]()
    assert HFTarget(model).graphs is None  # eager on a CPU
    asked = HFTarget(model, cuda_graphs=True)
    assert asked.graphs is not None and not asked.graphs.capture  # asked for on a CPU: the twin
    assert not replays_graphs(asked) and not replays_graphs(HFTarget(model))  # what configs record
    with pytest.raises(ValueError, match="kv_step"):
        DecoderGraphs(None, HFTarget(model).cache, kv_step=0)


def test_defaults_follow_the_environment(monkeypatch):
    monkeypatch.setenv("SPECGRAFT_CUDA_GRAPHS", "0")
    assert not graphs_by_default("cuda")


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_twin_forwards_equal_plain_forwards(arch):
    """Tree and plain forwards, several slots at different offsets, a hidden layer: the twin's
    logits, hidden states and cache rows equal the eager path's, through eager, capture and
    replay, across a cache growth (which drops every graph)."""
    torch.manual_seed(0)
    model = TINY_MODELS[arch]()
    plain, twin = HFTarget(model, capacity=16), with_twin(model)
    prompts = [[5 + (3 * i + j) % 70 for i in range(9 + 2 * j)] for j in range(3)]
    slots = {}
    for t in (plain, twin):
        slots[id(t)] = [t.allocate() for _ in prompts]
        for s, p in zip(slots[id(t)], prompts):
            t.prefill(s, p)
    for step in range(14):
        outs = []
        for t in (plain, twin):
            ss = slots[id(t)]
            if step % 3 == 2:  # a tree per slot, one slot's rows shorter (padding rows)
                toks = [[9, 10, 11, 12], [13, 14], [15, 16, 17, 18]]
                pars = [[-1, 0, 0, 1], [-1, 0], [-1, 0, 1, 2]]
                out = t.forward_batch(ss, toks, pars, output_hidden=True, hidden_layer=1)
                for s, keep in zip(ss, ([0, 1, 3], [0], [0, 1, 2])):
                    t.commit(s, keep)
            else:  # plain step
                out = t.forward_batch(ss, [[20 + step]] * 3, [[-1]] * 3)
                for s in ss:
                    t.commit(s, [0])
            outs.append(out)
        for a, b in zip(*outs):
            torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
            if a.hidden is not None:
                torch.testing.assert_close(a.hidden, b.hidden, rtol=1e-5, atol=1e-5)
    for a, b in zip(plain.cache.layers, twin.cache.layers, strict=True):
        for sa, sb in zip(slots[id(plain)], slots[id(twin)]):
            n = plain.length(sa)
            assert n == twin.length(sb) and n > 16  # grew past the first capacity
            torch.testing.assert_close(a.keys[sa, :, :n], b.keys[sb, :, :n], rtol=1e-5, atol=1e-5)
    stats = twin.graphs.stats
    assert stats.captured >= 2 and stats.replayed >= 2 and stats.dropped >= 1 and stats.eager >= 2, stats  # every path ran


@pytest.mark.parametrize("slots", [1, 3])
def test_padded_rows_equal_unpadded_forwards(slots):
    """Trees of 3, 5 and 4 rows padded up to 4, 8 and 4 rows (``DecoderGraphs.rows``) give the
    plain forward's logits, hidden states and cache rows, and share keys: one per padded size."""
    torch.manual_seed(0)
    model = TINY_MODELS["qwen2"]()
    plain, twin = HFTarget(model, capacity=64), HFTarget(model, capacity=64)
    twin.graphs = DecoderGraphs(twin._decode, twin.cache, capture=False, kv_step=64, capture_after=1)
    prompts = [[5 + (3 * i + j) % 70 for i in range(9 + 2 * j)] for j in range(slots)]
    ids = {}
    for t in (plain, twin):
        ids[id(t)] = [t.allocate() for _ in prompts]
        for s, p in zip(ids[id(t)], prompts):
            t.prefill(s, p)
    trees = [([9, 10, 11], [-1, 0, 0], [0, 2]), ([12, 13, 14, 15, 16], [-1, 0, 1, 1, 2], [0, 1, 2, 4]), ([17, 18, 19, 20], [-1, 0, 0, 2], [0])]
    for toks, pars, keep in trees:
        outs = []
        for t in (plain, twin):
            ss = ids[id(t)]
            out = t.forward_batch(ss, [toks] * len(ss), [pars] * len(ss), output_hidden=True, hidden_layer=1)
            for s in ss:
                t.commit(s, keep)
            outs.append(out)
        for a, b in zip(*outs):
            assert a.logits.shape == b.logits.shape == (len(toks), model.config.vocab_size)
            torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a.hidden, b.hidden, rtol=1e-5, atol=1e-5)
    for a, b in zip(plain.cache.layers, twin.cache.layers, strict=True):
        for sa, sb in zip(ids[id(plain)], ids[id(twin)]):
            n = plain.length(sa)
            assert n == twin.length(sb) and twin.cache.pending[sb] == 0
            torch.testing.assert_close(a.values[sa, :, :n], b.values[sb, :, :n], rtol=1e-5, atol=1e-5)
    assert sorted(key[1] for key in twin.graphs._graphs) == [4, 8]  # 3 and 4 rows share a graph
    assert twin.graphs.stats.replayed == 1


def test_twin_outputs_are_not_static_tensors():
    """What a forward returns stays valid after the next forward of the same key (a drafter
    may keep hidden states across steps)."""
    model = TINY_MODELS["qwen2"]()
    twin = with_twin(model, kv_step=64)
    slot = twin.allocate()
    twin.prefill(slot, [5, 6, 7, 8])
    kept = []
    for tok in (9, 10, 11, 12):
        out = twin.forward_rows(slot, [tok], [-1], output_hidden=True, hidden_layer=1)
        kept.append((out.logits.clone(), out.logits, out.hidden.clone(), out.hidden))
        twin.commit(slot, [0])
    for copy, live, hcopy, hlive in kept:
        assert torch.equal(copy, live) and torch.equal(hcopy, hlive)
    assert twin.graphs.stats.replayed >= 2


def test_least_recently_used_graphs_are_dropped():
    model = TINY_MODELS["llama"]()
    twin = with_twin(model, kv_step=64, max_graphs=1, capture_after=1)
    slot = twin.allocate()
    twin.prefill(slot, [5, 6, 7, 8])
    for rows in (1, 2, 1, 2):  # two keys alternating, one kept
        twin.forward_rows(slot, list(range(9, 9 + rows)), list(range(-1, rows - 1)))
        twin.commit(slot, [0])
    assert len(twin.graphs) == 1 and twin.graphs.stats.captured == 4 and twin.graphs.stats.dropped == 3


@pytest.mark.parametrize("name", ["ar", "pld", "draft-tree", "graft"])
def test_greedy_through_the_twin_equals_plain_decoding(monkeypatch, name):
    """Every forward of target and draft model through the twin (``HFTarget`` builds it when
    asked on a CPU); greedy outputs equal Hugging Face's plain greedy decoding."""
    monkeypatch.setattr(hf, "graphs_by_default", lambda device: True)
    model = TINY_MODELS["llama"]()
    draft = perturbed(model)
    target = HFTarget(model)
    drafters, composer = build_method(name, target, MethodOptions(), draft)
    engine = SpecEngine(target, drafters, composer, method=name)
    config = GenerationConfig(max_new_tokens=20, budget=12)
    for prompt, _ in make_prompts(10, model.config.vocab_size):
        assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, 20), name
    assert target.graphs.stats.replayed > 0
    if name == "draft-tree":
        assert drafters[0].lm.graphs.stats.replayed > 0


def test_batched_greedy_through_the_twin_equals_plain_decoding(monkeypatch):
    """Continuous batching (slots joining and leaving: keys change, slots not contiguous)."""
    monkeypatch.setattr(hf, "graphs_by_default", lambda device: True)
    model = TINY_MODELS["qwen2"]()
    draft = perturbed(model)
    target = HFTarget(model)
    drafters, composer = build_method("draft-tree", target, MethodOptions(), draft)
    batch = BatchEngine(SpecEngine(target, drafters, composer, method="draft-tree"), max_batch=3)
    prompts = [p for p, _ in make_prompts(8, model.config.vocab_size)]
    ids = [batch.submit(p, GenerationConfig(max_new_tokens=10 + i % 4, budget=8)) for i, p in enumerate(prompts)]
    results = batch.run_to_completion()
    for i, (rid, p) in enumerate(zip(ids, prompts)):
        assert results[rid].tokens == hf_greedy(model, p, 10 + i % 4)
    assert target.graphs.stats.replayed > 0


def test_a_failed_capture_falls_back_to_eager_forwards():
    """Capturing where it cannot work (here: no CUDA) warns once, turns the graphs off and the
    generation goes on eagerly with the same tokens."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    target.graphs = DecoderGraphs(target._decode, target.cache, capture=True)
    drafters, composer = build_method("ar", target, MethodOptions(), None)
    engine = SpecEngine(target, drafters, composer, method="ar")
    prompt = [5, 6, 7, 8, 9]
    with pytest.warns(RuntimeWarning, match="capture failed"):
        out = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=12))
    assert out == hf_greedy(model, prompt, 12)
    assert target.graphs.failed and len(target.graphs) == 0
