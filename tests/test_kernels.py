"""The oneDNN linear swap computes what nn.Linear computes (its plain twin)."""

import pytest
import torch

from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import MethodOptions, get_method
from specgraft.models.hf import HFTarget, parse_dtype
from specgraft.models.kernels import OneDNNLinear, auto_dtype, onednn_available, use_onednn_linears

from tests.conftest import tiny_llama, tiny_qwen2

pytestmark = pytest.mark.skipif(not onednn_available(), reason="oneDNN is not available in this torch build")


@pytest.mark.parametrize("rows", [1, 2, 5, 33])
def test_onednn_linear_equals_linear(rows):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80)
    fast = OneDNNLinear(lin)
    x = torch.randn(2, rows, 48)
    torch.testing.assert_close(fast(x), lin(x), rtol=1e-5, atol=1e-5)
    assert torch.equal(fast.weight, lin.weight), "weight is unpacked from the only (packed) copy, exactly"
    assert "weight" not in dict(fast.named_parameters()), "no plain copy kept"


def test_onednn_linear_state_dict_round_trip():
    """state_dict sees an nn.Linear; loading one repacks the weight."""
    torch.manual_seed(0)
    lin, other = torch.nn.Linear(48, 80), torch.nn.Linear(48, 80)
    fast = OneDNNLinear(lin)
    assert fast.state_dict().keys() == lin.state_dict().keys()
    assert torch.equal(fast.state_dict()["weight"], lin.weight)
    fast.load_state_dict(other.state_dict())
    x = torch.randn(3, 48)
    torch.testing.assert_close(fast(x), other(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="Missing key"):
        fast.load_state_dict({"bias": other.bias})


def test_tied_output_embedding_keeps_the_shared_weight():
    """A tied lm_head keeps the embedding's parameter (the embedding gathers from it); untied
    linears keep only the packed copy, and the model's state_dict keys do not change."""
    model = tiny_qwen2()  # tie_word_embeddings=True
    keys = model.state_dict().keys()
    use_onednn_linears(model)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert isinstance(model.lm_head, OneDNNLinear)
    proj = model.model.layers[0].mlp.up_proj
    assert isinstance(proj, OneDNNLinear) and "weight" not in proj._parameters
    assert model.state_dict().keys() == keys


def test_swapped_model_decodes_the_same():
    plain = tiny_llama()
    fast = tiny_llama()
    assert use_onednn_linears(fast) > 0
    assert {k: torch.equal(v, plain.state_dict()[k]) for k, v in fast.state_dict().items()} == dict.fromkeys(plain.state_dict(), True)
    assert not any(type(m) is torch.nn.Linear for m in fast.modules())
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(fast(ids).logits, plain(ids).logits, rtol=1e-5, atol=1e-5)
    target = HFTarget(fast)
    drafters, composer = get_method("recycling").build(target, MethodOptions())
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    config = GenerationConfig(max_new_tokens=20, budget=8)
    out_fast = SpecEngine(target, drafters, composer).generate_ids(prompt, config)
    out_plain = SpecEngine(HFTarget(plain), [], None).generate_ids(prompt, config)
    assert out_fast == out_plain


def test_auto_dtype():
    assert auto_dtype("cuda") == "bfloat16"
    assert auto_dtype("cpu") in ("bfloat16", "float32")
    assert parse_dtype("auto") in (torch.bfloat16, torch.float32)
