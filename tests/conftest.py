"""Tiny randomly initialised fp32 models built from configs (no downloads, seconds to build)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

TINY_VOCAB = 96


def tiny_llama(vocab: int = TINY_VOCAB, seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg).eval()


def tiny_qwen2(vocab: int = TINY_VOCAB, seed: int = 1, layers: int = 2) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True,
    )
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg).eval()


TINY_MODELS = {"llama": tiny_llama, "qwen2": tiny_qwen2}


@pytest.fixture(params=sorted(TINY_MODELS))
def tiny_model(request):
    return TINY_MODELS[request.param]()


def tiny_tokenizer(vocab: int = TINY_VOCAB):
    """A word-level tokenizer over ``w3 .. w{vocab-1}`` plus specials, with a trivial chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<s>": 1, "</s>": 2}
    words.update({f"w{i}": i for i in range(3, vocab)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}w3 {% endif %}"
    return fast


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny Llama with its tokenizer: loadable by path like any Hugging Face model."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    tiny models are dominated by thread hand-offs on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def no_draft_tree_cut(request, monkeypatch):
    """A tiny random model's distributions are flat (a draft node's path probability is a few
    percent), so ``draft-tree``'s cost-aware cut (the cpu preset's ``long_row_cost``) would
    verify no node at all and every draft-tree test would pass without testing the tree. Tests
    run with the preset's cut off; a test of the cut gives ``row_cost`` itself, and one marked
    ``preset_cut`` sees the shipped preset."""
    if request.node.get_closest_marker("preset_cut"):
        return
    import dataclasses

    from specgraft.drafters.draft_model import config

    presets = {name: dataclasses.replace(p, long_row_cost=None) for name, p in config.PRESETS.items()}
    monkeypatch.setattr(config, "PRESETS", presets)
