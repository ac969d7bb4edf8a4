"""A draft model in cheaper numerics (``--draft-quant``): the target's output never changes.

The draft is the target's own tiny checkpoint, so a draft in exact numerics would accept almost
everything; in int8 / bf16 / fp16 it drafts slightly differently, and greedy outputs must still
equal plain decoding token for token."""

import pytest
import torch
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import METHODS, GraftOptions, MethodOptions
from specgraft.models.hf import HFTarget
from specgraft.models.kernels import OneDNNLinear
from specgraft.models.loading import load_draft_model
from specgraft.models import quant as quant_module
from specgraft.models.quant import RowGroupedDynamicLinear, draft_numerics, int8_available, resolve_draft_quant

from tests.helpers.lossless import hf_greedy
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 40, 41, 42, 9, 40, 41], [3, 17, 88, 23, 61, 4, 70, 12, 33]]


@pytest.mark.parametrize("quant", ["int8", "int8-tensor", "bf16", "fp16"])
@pytest.mark.parametrize("method", ["draft-tree", "graft"])
def test_quantized_draft_output_equals_plain_decoding(tiny_model_dir, method, quant, monkeypatch):
    # every band its own group, so that the int8 draft's prefill (and any feed of 4+ rows) is
    # quantized in several groups here, as real models' attention sinks make it
    monkeypatch.setattr(quant_module, "GROUP_RATIO", 1.05)
    monkeypatch.setattr(quant_module, "GROUP_MIN_ROWS", 4)
    model = tiny_llama()  # the checkpoint saved in tiny_model_dir: the draft is the target, cheaper
    target = HFTarget(model)
    options = MethodOptions(graft=GraftOptions(draft_model=tiny_model_dir, draft_dtype="float32", draft_quant=quant))
    drafters, composer = METHODS[method].build(target, options)
    numerics = {"int8": "int8", "int8-tensor": "int8", "bf16": "bfloat16", "fp16": "float16"}[quant]
    assert draft_numerics(drafters[0].lm.model) == numerics
    engine = SpecEngine(target, drafters, composer, method=method)
    accepted = 0
    for prompt in PROMPTS:
        seq = engine.start(prompt, GenerationConfig(max_new_tokens=16, budget=8))
        tokens = []
        while not seq.done:
            tokens += engine.step(seq)
        engine.finish(seq)
        assert tokens == hf_greedy(model, prompt, 16), f"{method} with a {quant} draft, prompt {prompt}"
        accepted += seq.stats.accepted_by_source.get("draft", 0)
    assert accepted > 0, "the cheaper draft still drafts what the target accepts"


def test_int8_draft_linears_are_quantized_not_repacked(tiny_model_dir):
    """Quantization comes before the oneDNN swap, which leaves quantized linears alone; an fp32
    draft gets the swap as before."""
    int8 = load_draft_model(tiny_model_dir, "float32", "cpu", progress=False, quant="int8")
    kinds = {type(m) for m in int8.modules() if isinstance(m, (torch.nn.Linear, OneDNNLinear, DynamicLinear))}
    assert kinds == {RowGroupedDynamicLinear}, kinds
    per_call = load_draft_model(tiny_model_dir, "float32", "cpu", progress=False, quant="int8-tensor")
    assert {type(m) for m in per_call.modules() if isinstance(m, DynamicLinear)} == {DynamicLinear}
    assert per_call is not int8 and draft_numerics(per_call) == "int8"
    assert int8.lm_head.out_features == int8.config.vocab_size
    fp32 = load_draft_model(tiny_model_dir, "float32", "cpu", progress=False, quant="none")
    assert fp32 is not int8 and draft_numerics(fp32) == "float32"
    assert load_draft_model(tiny_model_dir, "float32", "cpu", progress=False, quant="int8") is int8, "loaded once per numerics"


def _int8_linear(in_features=48, out_features=40, seed=0):
    torch.manual_seed(seed)
    return RowGroupedDynamicLinear.from_float(quant_module._with_qconfig(torch.nn.Linear(in_features, out_features)))


@pytest.mark.skipif(not int8_available(), reason="no quantized CPU engine")
def test_row_groups_equal_the_fused_op_on_each_group_alone():
    """The grouped linear's plain twin: each scale group through torch.ao's op by itself. Rows
    over 8x the median row's magnitude leave the bulk, grouped by band [8^k, 8^(k+1)) of that
    ratio; a row's result is exactly its group's, bit for bit, and leading dimensions are kept."""
    linear = _int8_linear()
    packed = linear._packed_params._packed_params
    torch.manual_seed(1)
    x = torch.randn(2, 12, 48)
    peak = torch.full((2, 12, 1), 2.0)  # each row's max |x| (the median's: 2) ...
    peak[0, 0, 0], peak[1, 3, 0], peak[1, 7, 0] = 1500.0, 100.0, 120.0  # ... but an attention-sink-like row (750x: band 3), two of band 1 (50x, 60x)
    x = x / x.abs().amax(-1, keepdim=True) * peak
    y = linear(x)
    assert y.shape == (2, 12, 40)
    rows, out = x.reshape(24, 48), y.reshape(24, 40)
    groups = quant_module.scale_groups(rows.abs().amax(-1))
    assert [g.tolist() for g in groups] == [[i for i in range(24) if i not in (0, 15, 19)], [15, 19], [0]]
    for index in groups:
        assert torch.equal(out[index], quant_module._linear_dynamic(rows[index], packed)), index.tolist()
    # the ordinary rows are quantized with their own scale, not the sink's
    exact = rows @ linear.weight().dequantize().T + linear.bias()
    ordinary = groups[0]
    one_scale = quant_module._linear_dynamic(rows, packed)
    assert (out[ordinary] - exact[ordinary]).abs().max() * 10 < (one_scale[ordinary] - exact[ordinary]).abs().max()


@pytest.mark.skipif(not int8_available(), reason="no quantized CPU engine")
def test_row_groups_leave_short_and_uniform_inputs_to_one_call():
    """Under GROUP_MIN_ROWS rows (tree layers, one-row decode), or rows all in one band, the
    result is torch.ao's module's, bit for bit."""
    linear = _int8_linear()
    plain = DynamicLinear.from_float(quant_module._with_qconfig(torch.nn.Linear(48, 40)))
    plain.set_weight_bias(linear.weight(), linear.bias())
    torch.manual_seed(2)
    short = torch.randn(quant_module.GROUP_MIN_ROWS - 1, 48)
    short[0] *= 1000.0
    uniform = torch.rand(40, 48) + 1.0  # every row's max |x| in [1, 2]: band 0
    for x in (short, uniform, torch.randn(1, 1, 48)):
        assert torch.equal(linear(x), plain(x))
    assert len(quant_module.scale_groups(uniform.abs().amax(-1))) == 1


def test_resolve_draft_quant():
    assert resolve_draft_quant("auto", "cpu") == ("int8" if int8_available() else "none"), "int8 drafts: 1.40x against 1.12x"
    assert resolve_draft_quant("auto", "cuda") == "bf16"
    assert resolve_draft_quant("none", "cpu") == "none"
    with pytest.raises(ValueError, match="int8 runs on CPU only"):
        resolve_draft_quant("int8", "cuda")
    with pytest.raises(ValueError, match="unknown draft quantization 'int4'; choose one of auto, none, int8, int8-tensor, bf16, fp16"):
        GraftOptions(draft_quant="int4")


def test_resume_of_a_run_recorded_before_draft_quant(tmp_path):
    """A run.json from before --draft-quant: without a draft model it resumes as it did; with one,
    its draft ran in the target's dtype, so only --draft-quant none resumes it."""
    import json

    from specgraft.bench import BenchConfig
    from specgraft.bench.config import RUN_FILE
    from specgraft.bench.session import check_resume as _check_resume
    from specgraft.methods.settings import MethodSettings

    def old_run(**kw):
        cfg = BenchConfig.from_dict(dict(model="m", out=str(tmp_path), methods="pld", **kw))
        config = {k: v for k, v in cfg.comparable().items() if k != "resolved_draft_quant"}
        (tmp_path / RUN_FILE).write_text(json.dumps({"config": config}))
        return cfg

    _check_resume(tmp_path, old_run())
    old_run(draft_model="d")
    with pytest.raises(ValueError, match="resolved_draft_quant: 'none' before, 'int8' now"):
        _check_resume(tmp_path, BenchConfig(model="m", out=str(tmp_path), methods="pld", settings=MethodSettings(draft_model="d", draft_quant="int8")))
    _check_resume(tmp_path, BenchConfig(model="m", out=str(tmp_path), methods="pld", settings=MethodSettings(draft_model="d", draft_quant="none")))
    if int8_available():  # auto is int8 on CPU since then: an old fp32-draft run is not resumed by it
        with pytest.raises(ValueError, match="'none' before, 'int8' now"):
            _check_resume(tmp_path, BenchConfig(model="m", out=str(tmp_path), methods="pld", settings=MethodSettings(draft_model="d")))
