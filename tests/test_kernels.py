"""The oneDNN linear swap computes what nn.Linear computes (its plain twin)."""

import pytest
import torch

from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import MethodOptions, get_method
from specgraft.models.hf import HFTarget, parse_dtype
from specgraft.models.kernels import OneDNNLinear, auto_dtype, onednn_available, use_onednn_linears

from tests.conftest import tiny_llama

pytestmark = pytest.mark.skipif(not onednn_available(), reason="oneDNN is not available in this torch build")


@pytest.mark.parametrize("rows", [1, 2, 5, 33])
def test_onednn_linear_equals_linear(rows):
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80)
    fast = OneDNNLinear(lin)
    x = torch.randn(2, rows, 48)
    torch.testing.assert_close(fast(x), lin(x), rtol=1e-5, atol=1e-5)
    assert fast.weight is lin.weight


def test_swapped_model_decodes_the_same():
    plain = tiny_llama()
    fast = tiny_llama()
    assert use_onednn_linears(fast) > 0
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
