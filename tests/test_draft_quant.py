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
from specgraft.models.quant import draft_numerics, int8_available, resolve_draft_quant

from tests.conftest import tiny_llama
from tests.test_greedy_lossless import hf_greedy

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 40, 41, 42, 9, 40, 41], [3, 17, 88, 23, 61, 4, 70, 12, 33]]


@pytest.mark.parametrize("quant", ["int8", "bf16", "fp16"])
@pytest.mark.parametrize("method", ["draft-tree", "graft"])
def test_quantized_draft_output_equals_plain_decoding(tiny_model_dir, method, quant):
    model = tiny_llama()  # the checkpoint saved in tiny_model_dir: the draft is the target, cheaper
    target = HFTarget(model)
    options = MethodOptions(graft=GraftOptions(draft_model=tiny_model_dir, draft_dtype="float32", draft_quant=quant))
    drafters, composer = METHODS[method].build(target, options)
    assert draft_numerics(drafters[0].lm.model) == {"int8": "int8", "bf16": "bfloat16", "fp16": "float16"}[quant]
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
    assert kinds == {DynamicLinear}, kinds
    assert int8.lm_head.out_features == int8.config.vocab_size
    fp32 = load_draft_model(tiny_model_dir, "float32", "cpu", progress=False, quant="none")
    assert fp32 is not int8 and draft_numerics(fp32) == "float32"
    assert load_draft_model(tiny_model_dir, "float32", "cpu", progress=False, quant="int8") is int8, "loaded once per numerics"


def test_resolve_draft_quant():
    assert resolve_draft_quant("auto", "cpu") == ("int8" if int8_available() else "none"), "int8 drafts: 1.40x against 1.12x"
    assert resolve_draft_quant("auto", "cuda") == "bf16"
    assert resolve_draft_quant("none", "cpu") == "none"
    with pytest.raises(ValueError, match="int8 runs on CPU only"):
        resolve_draft_quant("int8", "cuda")
    with pytest.raises(ValueError, match="unknown draft quantization 'int4'; choose one of auto, none, int8, bf16, fp16"):
        GraftOptions(draft_quant="int4")


def test_docstring_examples():
    import doctest

    import specgraft.models.quant

    result = doctest.testmod(specgraft.models.quant)
    assert result.attempted > 0 and result.failed == 0


def test_resume_of_a_run_recorded_before_draft_quant(tmp_path):
    """A run.json from before --draft-quant: without a draft model it resumes as it did; with one,
    its draft ran in the target's dtype, so only --draft-quant none resumes it."""
    import json

    from specgraft.bench import BenchConfig
    from specgraft.bench.runner import RUN_FILE, _check_resume

    def old_run(**kw):
        cfg = BenchConfig(model="m", out=str(tmp_path), methods="pld", **kw)
        config = {k: v for k, v in cfg.comparable().items() if k != "resolved_draft_quant"}
        (tmp_path / RUN_FILE).write_text(json.dumps({"config": config}))
        return cfg

    _check_resume(tmp_path, old_run())
    old_run(draft_model="d")
    with pytest.raises(ValueError, match="resolved_draft_quant: 'none' before, 'int8' now"):
        _check_resume(tmp_path, BenchConfig(model="m", out=str(tmp_path), methods="pld", draft_model="d", draft_quant="int8"))
    _check_resume(tmp_path, BenchConfig(model="m", out=str(tmp_path), methods="pld", draft_model="d", draft_quant="none"))
    if int8_available():  # auto is int8 on CPU since then: an old fp32-draft run is not resumed by it
        with pytest.raises(ValueError, match="'none' before, 'int8' now"):
            _check_resume(tmp_path, BenchConfig(model="m", out=str(tmp_path), methods="pld", draft_model="d"))
