"""The oneDNN linear swap computes what nn.Linear computes (its plain twin)."""

import pytest
import torch

from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import MethodOptions, get_method
from specgraft.models.device import parse_dtype
from specgraft.models.hf import HFTarget
from specgraft.models.kernels import OneDNNLinear, auto_dtype, onednn_available, use_onednn_linears

from tests.helpers.models import tiny_llama, tiny_qwen2

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
    assert auto_dtype("cpu") == "float32"  # exact by default, whatever the CPU's bf16 support
    assert parse_dtype("auto") == torch.float32


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_padded_small_inputs_equal_the_plain_linear(rows):
    """``min_rows``: an input of fewer rows is padded with zero rows to that many; each real row
    comes out as in a genuine input of ``min_rows`` rows, and close to ``nn.Linear``."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 80)
    fast = OneDNNLinear(lin)
    fast.min_rows = 4
    x = torch.randn(rows, 48)
    out = fast(x)
    assert out.shape == (rows, 80)
    torch.testing.assert_close(out, lin(x), rtol=1e-5, atol=1e-5)
    full = torch.cat([x, torch.randn(4 - rows, 48)])
    fast.min_rows = 1
    assert torch.equal(out, fast(full)[:rows]), "a row's output does not depend on the other rows"
    assert fast(torch.randn(0, 48)).shape == (0, 80)


def test_small_input_rows_from_the_cost_table_and_greedy_equals_plain(tmp_path):
    """The decoder pads where its table says a few rows cost less than one; greedy output of a
    swapped, padded tiny model still equals the plain one."""
    import json

    from specgraft.api import SpecDecoder
    from specgraft.budget.costs import CostTable
    from specgraft.models.kernels import set_min_rows, small_input_rows

    from tests.helpers.lossless import hf_greedy, make_prompts

    model = tiny_llama()
    plain = [hf_greedy(model, p, 12) for p, _ in make_prompts(4, model.config.vocab_size)]
    use_onednn_linears(model)
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"model": "m", "device": "cpu", "seconds": {"1": {"1": 0.35, "2": 0.38, "4": 0.30, "8": 0.36}}}))
    dec = SpecDecoder(model, None, method="pld", options=MethodOptions(cost_table=str(table)))
    assert dec.small_input_rows == 4 and all(m.min_rows == 4 for m in model.modules() if isinstance(m, OneDNNLinear))
    assert dec.resolved_config(GenerationConfig())["small_input_rows"] == 4
    for (prompt, _), want in zip(make_prompts(4, model.config.vocab_size), plain):
        assert dec.engine.generate_ids(prompt, GenerationConfig(max_new_tokens=12, budget=8, stop_on_eos=False)) == want
    assert small_input_rows(CostTable("m", "cpu", {1: {1: 0.3, 4: 0.5}})) == 1, "4 rows dearer: no padding"
    assert set_min_rows(model, 1) > 0
    with pytest.raises(ValueError, match="rows must be >= 1"):
        set_min_rows(model, 0)


def test_gpu_forwards_leave_out_cudnn_attention():
    """On CUDA our forwards run under :func:`attention_backends`, which drops cuDNN's SDPA (it
    builds a plan per new key length: 3.8 s of attention in a 64-token generation on an H200);
    elsewhere torch chooses. The flags are global, so this runs without a GPU."""
    from specgraft.models.device import attention_backends

    flags = (torch.backends.cuda.cudnn_sdp_enabled, torch.backends.cuda.mem_efficient_sdp_enabled, torch.backends.cuda.math_sdp_enabled)
    before = [f() for f in flags]
    assert before[0], "torch enables cuDNN attention by default"
    with attention_backends(torch.device("cuda")):
        assert [f() for f in flags] == [False, True, True]
    assert [f() for f in flags] == before, "the flags come back after the forward"
    with attention_backends(torch.device("cpu")):
        assert [f() for f in flags] == before



def test_release_freed_memory(monkeypatch):
    import ctypes
    import sys

    from specgraft.models import loading as hf

    try:
        glibc = hasattr(ctypes.CDLL("libc.so.6"), "malloc_trim")
    except OSError:
        glibc = False
    buffer = torch.ones(16 * 2**20)  # 64 MiB, touched, then freed
    del buffer
    assert hf.release_freed_memory() is (sys.platform.startswith("linux") and glibc)
    monkeypatch.setattr(hf.sys, "platform", "darwin")
    assert hf.release_freed_memory() is False, "no glibc: nothing done"
