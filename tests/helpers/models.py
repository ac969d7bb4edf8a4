"""Tiny randomly initialised fp32 models built from configs (no downloads, seconds to build),
their tokenizer, and the twins tests build from them."""

from __future__ import annotations

import copy

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


def save_draft(path, vocab: int = TINY_VOCAB) -> str:
    """A one-layer tiny Llama with the tiny tokenizer: a draft model for ``tiny_model_dir`` (when ``vocab`` matches).

    Llama, not Qwen2: loading a tokenizer beside a Qwen2 config adds ``<|endoftext|>``, so the
    vocabularies would differ."""
    tiny_llama(vocab=vocab, seed=5, layers=1).save_pretrained(path)
    tiny_tokenizer(vocab).save_pretrained(path)
    return str(path)


def perturbed(model: torch.nn.Module, scale: float = 0.1, seed: int = 7) -> torch.nn.Module:
    """A draft model: ``model`` with Gaussian noise of ``scale`` x each tensor's std added."""
    draft = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.device) * p.std() * scale)
    return draft


def packed_twin(model):
    """A copy of ``model`` on the packed grouped-query attention (``specgraft_sdpa``)."""
    from specgraft.models.attention import PACKED_SDPA, register_packed_sdpa

    register_packed_sdpa()
    twin = copy.deepcopy(model)
    twin.set_attn_implementation(PACKED_SDPA)
    return twin
