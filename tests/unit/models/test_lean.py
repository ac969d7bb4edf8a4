"""The lean decoder forward (``models/lean.py``) gives Hugging Face's hidden states bit for bit."""

import pytest
import torch

from specgraft.models.attention import register_packed_sdpa
from specgraft.models.fusion import fuse_projections
from specgraft.models.hf import HFTarget
from specgraft.models.kernels import use_onednn_linears
from specgraft.models.lean import LeanDecoder, lean_by_default, lean_decoder, unsupported_reason
from specgraft.models.quant import quantize_int8_dynamic
from specgraft.types import PrefillRequest

from tests.helpers.models import TINY_MODELS, TINY_VOCAB


def variant(name: str, kind: str, layers: int = 3):
    """A tiny model as a loader would leave it: ``plain``, ``fused`` (+ packed attention),
    ``int8`` (fused, int8 linears: the CPU draft), ``onednn`` (fused, oneDNN linears: the CPU target)."""
    model = TINY_MODELS[name](layers=layers)
    if kind != "plain":
        fuse_projections(model)
        model.config._attn_implementation = register_packed_sdpa()
    if kind == "int8":
        quantize_int8_dynamic(model)
    if kind == "onednn":
        use_onednn_linears(model)
    return model


def run(target: HFTarget, hidden_layer: int) -> list[torch.Tensor]:
    """Every kind of forward the engine makes, on two slots; everything they return."""
    g = torch.Generator().manual_seed(0)
    out = []
    a, b = target.allocate(), target.allocate()
    for slot, n in ((a, 11), (b, 7)):
        pre = target.prefill(slot, torch.randint(3, TINY_VOCAB, (n,), generator=g).tolist(),
                             PrefillRequest(topk=3, hidden=True, hidden_layer=hidden_layer, final_hidden=True))
        out += [pre.topk, pre.hidden, pre.final_hidden]
    # a chain one row at a time (the draft's extension), then a tree with hidden states (a verify pass)
    for i in range(3):
        out.append(target.forward_rows(a, [5 + i], [i - 1]).logits)
    tree = target.forward_rows(a, [7, 8, 9, 10], [2, 3, 3, 4], output_hidden=True, hidden_layer=hidden_layer)
    out += [tree.logits, tree.hidden]
    target.commit(a, [0, 1, 2, 3, 5])
    # a batch: slot b with no pending rows, slot a with several; then batched one-row forwards
    for res in target.forward_batch([b, a], [[4, 5, 6], [7]], [[-1, 0, 0], [-1]], output_hidden=True, hidden_layer=hidden_layer):
        out += [res.logits, res.hidden]
    target.discard(a)
    target.discard(b)
    for res in target.forward_batch([a, b], [[11], [12]], [[-1], [-1]]):
        out.append(res.logits)
    return out


@pytest.mark.parametrize("kind", ["plain", "fused", "int8", "onednn"])
@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_lean_forward_equals_hugging_face_bit_for_bit(name, kind):
    model = variant(name, kind)
    hf, lean = HFTarget(model, lean=False), HFTarget(model, lean=True)
    assert hf.lean is None and isinstance(lean.lean, LeanDecoder)
    for layer in (1, 2, None):
        for x, y in zip(run(hf, layer), run(lean, layer), strict=True):
            assert torch.equal(x, y), (name, kind, layer)


def test_lean_by_default_on_cpu_only(monkeypatch):
    model = TINY_MODELS["qwen2"]()
    assert lean_by_default("cpu") and not lean_by_default("cuda")
    assert isinstance(HFTarget(model).lean, LeanDecoder)
    monkeypatch.setenv("SPECGRAFT_LEAN", "0")
    assert HFTarget(model).lean is None


def test_unsupported_models_keep_hugging_face():
    model = TINY_MODELS["llama"]()
    assert unsupported_reason(model.model) is None
    assert lean_decoder(model) is None and "LlamaForCausalLM is not one of" in unsupported_reason(model)
    layer = model.model.layers[0]
    layer.__class__ = type("PatchedLayer", (type(layer),), {})  # a subclass may change the forward
    assert unsupported_reason(model.model) == "LlamaModel has layers of another class"
    assert HFTarget(model, lean=True).lean is None
    with pytest.raises(ValueError, match="no lean forward for this model"):
        LeanDecoder(model.model)
    model = TINY_MODELS["llama"]()
    model.config._attn_implementation = "eager"
    assert unsupported_reason(model.model) == "LlamaModel uses attention 'eager'" and HFTarget(model).lean is None
    model.config.layer_types = ["sliding_attention", "full_attention"]  # HFTarget refuses these already
    assert unsupported_reason(model.model) == "LlamaModel has sliding-window layers"

