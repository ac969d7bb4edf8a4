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
