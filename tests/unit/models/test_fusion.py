"""Fused q/k/v and gate/up projections (``models/fusion.py``) against the plain layout, their twin."""

import pytest
import torch

from specgraft.api import SpecDecoder
from specgraft.models.fusion import ProjectionSlice, fuse_projections, fused_groups
from specgraft.models.loading import load_causal_lm
from specgraft.models.kernels import OneDNNLinear, onednn_available, use_onednn_linears
from specgraft.models.loading import load_draft_model
from specgraft.models.quant import draft_numerics, int8_available, quantize_int8_dynamic

from tests.helpers.models import TINY_MODELS, tiny_qwen2, tiny_tokenizer


def _tree_inputs(vocab: int):
    """A prompt of 9 tokens and, after it, a tree of 5 rows (two branches) with its 4-D mask."""
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(3, vocab, (1, 9), generator=gen)
    rows = torch.randint(3, vocab, (1, 5), generator=gen)
    parents = [-1, 0, 0, 1, 2]  # rows 1-2 hang from row 0; 3 from 1; 4 from 2
    allowed = torch.zeros(5, 14, dtype=torch.bool)
    allowed[:, :9] = True
    for i, p in enumerate(parents):
        allowed[i, 9 + i] = True
        while p >= 0:
            allowed[i, 9 + p] = True
            p = parents[p]
    mask = torch.zeros(1, 1, 5, 14).masked_fill(~allowed, float("-inf"))
    positions = torch.tensor([[9, 10, 10, 11, 11]])
    return prompt, rows, mask, positions


def _logits(model, prompt, rows, mask, positions):
    with torch.inference_mode():
        out = model(prompt, use_cache=True)
        tree = model(rows, cache=out.past_key_values, attention_mask=mask, position_ids=positions, use_cache=True)
    return out.logits, tree.logits


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_fused_model_computes_what_the_plain_one_does(name):
    plain, fused = TINY_MODELS[name](), TINY_MODELS[name]()
    assert fuse_projections(fused) == 2 * 2  # two layers, two groups each
    assert fused_groups(fused) == 4 and fused_groups(plain) == 0
    attn = fused.model.layers[0].self_attn
    assert isinstance(attn.k_proj, ProjectionSlice) and type(attn.qkv_proj) is torch.nn.Linear
    assert not any(isinstance(m, torch.nn.Linear) and n.split(".")[-1] in ("q_proj", "up_proj") for n, m in fused.named_modules())
    inputs = _tree_inputs(plain.config.vocab_size)
    for a, b in zip(_logits(plain, *inputs), _logits(fused, *inputs)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_one_fused_call_a_group_and_nothing_kept_after_the_forward():
    model = tiny_qwen2()
    fuse_projections(model)
    calls = []
    for layer in model.model.layers:
        for module in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj):
            module.register_forward_hook(lambda m, i, o: calls.append(m))
    _logits(model, *_tree_inputs(model.config.vocab_size))
    assert len(calls) == 2 * 2 * 2  # two forwards x two layers x two groups: no member recomputed
    groups = [m._group for m in model.modules() if isinstance(m, ProjectionSlice)]
    assert groups and not any(g.pending for g in groups), "the layer's tensors are let go"


def test_fused_model_deep_copies_and_runs_in_two_threads():
    """A deep copy's slices read their own fused linears (the draft-model tests perturb copies),
    and two threads running forwards of one fused model do not take each other's outputs."""
    import copy
    import threading

    model = tiny_qwen2()
    fuse_projections(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.model.layers[0].self_attn.qkv_proj.weight.mul_(2.0)
    assert twin.model.layers[0].self_attn.k_proj._group.fused() is twin.model.layers[0].self_attn.qkv_proj
    inputs = _tree_inputs(model.config.vocab_size)
    want = _logits(model, *inputs)
    assert not torch.allclose(_logits(twin, *inputs)[1], want[1]), "the copy computes with its own weights"
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(3, model.config.vocab_size, (1, 40), generator=gen) for _ in range(2)]
    with torch.inference_mode():
        expected = [model(p).logits for p in prompts]
    got: dict[int, list] = {0: [], 1: []}

    def run(i: int) -> None:
        with torch.inference_mode():
            for _ in range(20):
                got[i].append(model(prompts[i]).logits)

    threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (0, 1):
        assert all(torch.equal(g, expected[i]) for g in got[i])


def test_a_member_called_alone_or_with_another_input_is_still_right():
    torch.manual_seed(0)
    parent = torch.nn.Module()
    parent.q_proj, parent.k_proj, parent.v_proj = torch.nn.Linear(8, 6), torch.nn.Linear(8, 2), torch.nn.Linear(8, 2)
    x, y = torch.randn(3, 8), torch.randn(4, 8)
    want = {n: getattr(parent, n)(t) for n in ("q_proj", "k_proj", "v_proj") for t in (x,)} | {"k_y": parent.k_proj(y)}
    weights = {n: getattr(parent, n).weight.clone() for n in ("q_proj", "k_proj", "v_proj")}
    assert fuse_projections(parent) == 1
    torch.testing.assert_close(parent.q_proj(x), want["q_proj"])
    torch.testing.assert_close(parent.k_proj(y), want["k_y"])  # another input before the group is done
    torch.testing.assert_close(parent.k_proj(x), want["k_proj"])
    torch.testing.assert_close(parent.v_proj(x), want["v_proj"])
    for n, w in weights.items():
        assert torch.equal(getattr(parent, n).weight, w)
    assert parent.k_proj.in_features == 8 and parent.k_proj.out_features == 2


def test_groups_that_cannot_be_fused_are_left_alone():
    torch.manual_seed(0)
    mixed = torch.nn.Module()
    mixed.gate_proj, mixed.up_proj = torch.nn.Linear(8, 4, bias=False), torch.nn.Linear(8, 4)  # bias on one only
    tied = torch.nn.Module()
    tied.gate_proj, tied.up_proj = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    tied.other = torch.nn.Linear(8, 4)
    tied.other.weight = tied.up_proj.weight  # shared: concatenating would untie it
    assert fuse_projections(mixed) == 0 and fuse_projections(tied) == 0
    assert type(tied.up_proj) is torch.nn.Linear and not hasattr(mixed, "gate_up_proj")
    model = tiny_qwen2()
    fuse_projections(model)
    assert fuse_projections(model) == 0, "fusing twice does nothing"


@pytest.mark.skipif(not onednn_available(), reason="oneDNN is not available in this torch build")
def test_fused_linears_take_the_onednn_kernel():
    plain, fused = tiny_qwen2(), tiny_qwen2()
    fuse_projections(fused)
    use_onednn_linears(plain)
    use_onednn_linears(fused)
    assert isinstance(fused.model.layers[0].mlp.gate_up_proj, OneDNNLinear)
    w = plain.model.layers[1].mlp.up_proj.weight
    assert torch.equal(fused.model.layers[1].mlp.up_proj.weight, w), "a slice unpacks its rows of the packed weight"
    inputs = _tree_inputs(plain.config.vocab_size)
    for a, b in zip(_logits(plain, *inputs), _logits(fused, *inputs)):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not int8_available(), reason="no quantized engine in this torch build")
def test_int8_fused_equals_int8_plain_bit_for_bit():
    """One activation scale a call, the same for the fused call as for each member's (same
    input), per-channel weight scales and int32 accumulation: the same numbers exactly."""
    plain, fused = tiny_qwen2(), tiny_qwen2()
    fuse_projections(fused)
    quantize_int8_dynamic(plain)
    quantize_int8_dynamic(fused)
    assert "Linear" in type(fused.model.layers[0].self_attn.qkv_proj).__name__
    inputs = _tree_inputs(plain.config.vocab_size)
    for a, b in zip(_logits(plain, *inputs), _logits(fused, *inputs)):
        assert torch.equal(a, b)
    assert fused.model.layers[0].self_attn.v_proj.weight.shape == plain.model.layers[0].self_attn.v_proj.weight().shape


def test_loader_fuses_on_cpu_unless_told_not_to(tiny_model_dir):
    assert fused_groups(load_causal_lm(str(tiny_model_dir), "float32", "cpu")) > 0
    assert fused_groups(load_causal_lm(str(tiny_model_dir), "float32", "cpu", fuse=False)) == 0
    assert fused_groups(load_causal_lm(str(tiny_model_dir), "float32", "cpu", fast_kernels=False)) == 0
    assert fused_groups(load_causal_lm(str(tiny_model_dir), "float32", "cpu", fast_kernels=False, fuse=True)) > 0
    # draft models: fused on CPU (before int8 quantization), kept apart per layout in the loader's cache
    int8 = load_draft_model(str(tiny_model_dir), "float32", quant="int8", progress=False)
    plain = load_draft_model(str(tiny_model_dir), "float32", quant="int8", progress=False, fuse=False)
    assert fused_groups(int8) > 0 and fused_groups(plain) == 0 and draft_numerics(int8) == draft_numerics(plain) == "int8"


@pytest.mark.parametrize("method", ["pld", "draft-tree"])
def test_greedy_on_fused_models_equals_plain_decoding_on_the_plain_one(method):
    plain, fused, draft = tiny_qwen2(), tiny_qwen2(), tiny_qwen2(layers=1, seed=5)
    fuse_projections(fused)
    fuse_projections(draft)
    prompt = "w5 w6 w7 w5 w6 w8 w9 w5 w6 w7"
    want = SpecDecoder(plain, tiny_tokenizer(), method="ar").generate(prompt, max_new_tokens=24).tokens
    extra = {"draft_model": draft} if method == "draft-tree" else {}
    got = SpecDecoder(fused, tiny_tokenizer(), method=method, **extra).generate(prompt, max_new_tokens=24).tokens
    assert got == want
