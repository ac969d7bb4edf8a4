"""A draft head over part of the vocabulary (``--draft-vocab``, ``models/draft_head.py``).

The head's logits equal the full head's on the kept tokens and are ``-inf`` elsewhere, in every
numerics the draft comes in (fp32 plain, oneDNN-packed, int8); the model object is never
changed; greedy outputs equal plain decoding and the draft proposes kept tokens only. Sampled
drafts from such a head are draft rows with ``-inf`` outside a support, which the exact
enumeration of ``test_sampling_exact.py`` already proves lossless (its draft tables keep a random
support per row)."""

from __future__ import annotations

import pytest
import torch

from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import METHODS, GraftOptions, MethodOptions
from specgraft.methods.graft import build_graft_method
from specgraft.models.draft_head import SubsetHead, draft_adapter, frequent_ids, special_ids
from specgraft.models.hf import HFTarget
from specgraft.models.kernels import use_onednn_linears
from specgraft.models.quant import quantize_int8_dynamic

from tests.conftest import TINY_MODELS, tiny_llama
from tests.stubs import begin
from tests.test_draft_tree import assert_batch_equals_plain, perturbed
from tests.test_greedy_lossless import hf_greedy, make_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("kernel", ["plain", "onednn", "int8"])
def test_subset_head_equals_the_full_head_on_its_tokens(kernel):
    model = tiny_llama()
    if kernel == "onednn":
        use_onednn_linears(model)
    elif kernel == "int8":
        quantize_int8_dynamic(model)
    vocab = model.config.vocab_size
    ids = frequent_ids(vocab, 40, always=[vocab - 1])
    head = SubsetHead(model, ids)
    hidden = torch.randn(2, 3, model.config.hidden_size)
    with torch.inference_mode():
        full = model.get_output_embeddings()(hidden).float()
        part = head(hidden)
    assert part.shape == full.shape and part.dtype == torch.float32
    keep = torch.zeros(vocab, dtype=torch.bool)
    keep[ids] = True
    assert torch.isneginf(part[..., ~keep]).all()
    # int8: the subset head re-quantizes the same rows per channel, so it matches the int8 head closely
    tol = {"plain": 1e-5, "onednn": 1e-4, "int8": 0.05}[kernel]
    torch.testing.assert_close(part[..., keep], full[..., keep], atol=tol, rtol=tol)


def test_draft_adapter_leaves_the_model_alone_and_keeps_the_special_tokens():
    model = tiny_llama()
    model.generation_config.eos_token_id = [2, model.config.vocab_size - 3]
    head_before = model.get_output_embeddings()
    assert draft_adapter(model, 0) is model and draft_adapter(model, model.config.vocab_size) is model
    adapter = draft_adapter(model, 16)
    assert isinstance(adapter, HFTarget) and model.get_output_embeddings() is head_before, "peers share the model"
    assert special_ids(model) == sorted({1, 2, model.config.vocab_size - 3} | ({model.config.pad_token_id} if model.config.pad_token_id is not None else set()))
    assert adapter.vocab_size == model.config.vocab_size
    assert adapter.lm_head.ids.tolist() == [*range(16), model.config.vocab_size - 3]
    with pytest.raises(ValueError, match="at least one token"):
        frequent_ids(10, 0)
    with pytest.raises(ValueError, match="non-empty subset"):
        SubsetHead(model, torch.tensor([model.config.vocab_size]))
    with pytest.raises(ValueError, match="draft_vocab must be an integer >= 0"):
        GraftOptions(draft_vocab=-1)


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_draft_tree_with_a_narrow_draft_head_equals_plain_decoding(arch):
    """Half the vocabulary dropped from the draft's head: the draft proposes only kept tokens,
    greedy outputs (single and batched) equal plain decoding."""
    model = TINY_MODELS[arch]()
    draft = perturbed(model, scale=0.02)
    target = HFTarget(model)
    keep = model.config.vocab_size // 2
    drafters, composer = build_graft_method("draft-tree", target, GraftOptions(draft_vocab=keep), draft_model=draft)
    assert isinstance(drafters[0].lm.lm_head, SubsetHead)
    engine = SpecEngine(target, drafters, composer, method="draft-tree")
    config = GenerationConfig(max_new_tokens=24, budget=8)
    allowed = set(drafters[0].lm.lm_head.ids.tolist())
    proposed = accepted = 0
    for prompt, _ in make_prompts(12, model.config.vocab_size):
        seq = engine.start(prompt, config)
        tokens: list[int] = []
        while not seq.done:
            tokens += engine.step(seq)
        engine.finish(seq)
        assert tokens == hf_greedy(model, prompt, 24), f"{arch}: diverged on {prompt}"
        proposed += seq.stats.proposed_by_source.get("draft", 0)
        accepted += seq.stats.accepted_by_source.get("draft", 0)
    assert accepted > 0
    assert_batch_equals_plain(engine, model, [p for p, _ in make_prompts(4, model.config.vocab_size)], config)
    # every drafted token is a kept one
    state = begin(drafters[0], [1, 2, 3])
    pool = drafters[0].draft_pool(state, [5, 6, 7, 8])
    assert set(pool.tokens) <= allowed
    drafters[0].end(state)


def test_reader_and_registry_build_the_narrow_head(tiny_model_dir):
    model = tiny_llama()
    options = MethodOptions(graft=GraftOptions(draft_model=tiny_model_dir, draft_dtype="float32", draft_quant="int8", draft_vocab=32))
    for method in ("draft-tree", "graft-prune", "reader"):
        drafters, _ = METHODS[method].build(HFTarget(model), options)
        assert isinstance(drafters[0].lm.lm_head, SubsetHead), method
