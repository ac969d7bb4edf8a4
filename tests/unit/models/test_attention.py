"""Grouped-query attention packed instead of copied (``specgraft/models/attention.py``) against
``transformers``' ``sdpa``: the function alone, a tree forward, chunked prefill, Hugging Face's
``generate``, and greedy speculation, on the tiny GQA models (4 query heads over 2 key/value heads)."""

from __future__ import annotations


import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specgraft.api import SpecDecoder
from specgraft.config import GenerationConfig
from specgraft.models.attention import PACKED_SDPA, attention_implementation, packed_gqa_sdpa
from specgraft.models.hf import HFTarget
from specgraft.models.loading import check_tree_attention, load_causal_lm
from tests.helpers.models import TINY_MODELS, packed_twin, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


class Grouped(torch.nn.Module):
    num_key_value_groups = 3


def qkv(q: int, kv: int = 7, heads: int = 6, kv_heads: int = 2, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # what an attention layer hands over: query [b, H, q, d] as a transposed view, key/value [b, H_kv, kv, d]
    query = torch.randn(2, q, heads, d, generator=g).transpose(1, 2)
    return query, torch.randn(2, kv_heads, kv, d, generator=g), torch.randn(2, kv_heads, kv, d, generator=g)


def tree_mask(q: int, kv: int) -> torch.Tensor:
    """[1, 1, q, kv] additive: a committed prefix, then rows that see some of the earlier rows."""
    allowed = torch.ones(q, kv, dtype=torch.bool)
    allowed[:, kv - q :] = torch.eye(q, dtype=torch.bool) | (torch.arange(q)[None] == 0)
    return torch.zeros(q, kv).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]


@pytest.mark.parametrize("q", [1, 2, 5])
def test_packed_attention_equals_sdpa(q):
    query, key, value = qkv(q)
    for mask in (tree_mask(q, 7), tree_mask(q, 7) == 0, None):
        ours, _ = packed_gqa_sdpa(Grouped(), query, key, value, mask, scaling=0.3, is_causal=False)
        theirs, _ = sdpa_attention_forward(Grouped(), query, key, value, mask, scaling=0.3, is_causal=False)
        assert ours.shape == (2, q, 6, 8)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_a_per_head_mask_goes_to_sdpa_unchanged():
    query, key, value = qkv(3)
    mask = torch.randn(2, 6, 3, 7)  # one mask per query head: nothing to share across a group
    ours, _ = packed_gqa_sdpa(Grouped(), query, key, value, mask)
    theirs, _ = sdpa_attention_forward(Grouped(), query, key, value, mask)
    assert torch.equal(ours, theirs)


def test_loaders_use_it_on_cpu_only(tiny_model_dir):
    assert attention_implementation(torch.device("cpu")) == PACKED_SDPA
    assert attention_implementation(torch.device("cuda")) == "sdpa"
    model = load_causal_lm(tiny_model_dir, "float32")
    assert model.config._attn_implementation == PACKED_SDPA
    check_tree_attention(model)  # accepted as a tree-mask attention
    dec = SpecDecoder.from_pretrained(tiny_model_dir, method="ar", dtype="float32", progress=False)
    assert dec.resolved_config(GenerationConfig())["attention"] == PACKED_SDPA  # recorded with every run


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_tree_forward_and_chunked_prefill_equal_sdpa(name, monkeypatch):
    from transformers import AttentionInterface

    model = TINY_MODELS[name]()
    twin = packed_twin(model)
    rows = []

    def counted(module, query, *args, **kwargs):
        rows.append(query.shape[2])
        return packed_gqa_sdpa(module, query, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, PACKED_SDPA, counted)
    assert twin.config._attn_implementation == PACKED_SDPA and model.config._attn_implementation == "sdpa"
    prompt = [5 + (7 * i) % 80 for i in range(23)]
    logits = []
    for m in (model, twin):
        target = HFTarget(m, prefill_chunk=6)  # chunks after the first attend to a committed prefix
        slot = target.allocate()
        target.prefill(slot, prompt)
        # a tree of 6 rows: two branches under the root row
        out = target.forward_rows(slot, [9, 10, 11, 12, 13, 14], [-1, 0, 0, 1, 2, 4])
        logits.append(out.logits)
    assert set(rows) == {5, 6}  # the twin ran the packed attention: prefill chunks of 6, 6, 6, 5 rows and the 6-row tree
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-5)
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))


def test_hf_generate_and_greedy_speculation_unchanged():
    model = TINY_MODELS["qwen2"]()
    twin = packed_twin(model)
    ids = torch.tensor([[5, 9, 17, 33, 5, 9, 17]])
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kw), twin.generate(ids, **kw))  # HF's own masks, via the mask interface
    tok = tiny_tokenizer()
    ar = SpecDecoder(model, tok, method="ar").generate(ids[0].tolist(), config=GenerationConfig(max_new_tokens=40))
    draft = TINY_MODELS["llama"](seed=3)
    for method in ("pld", "draft-tree"):
        kwargs = {"draft_model": draft} if method == "draft-tree" else {}
        out = SpecDecoder(twin, tok, method=method, **kwargs).generate(ids[0].tolist(), config=GenerationConfig(max_new_tokens=40))
        assert out.tokens == ar.tokens, method
