"""The benchmark's tiny byte-level models, its config for them, and the checks every run's rows pass.

The tiny model reads a byte-level tokenizer (259 ids: 3 specials + 256 bytes), so the real
prompt sets encode without unknown tokens and texts round-trip exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specgraft.bench import BenchConfig

MAX_NEW = 8
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def byte_tokenizer():
    """Byte-level BPE with no merges: one token per byte, ids 3..258; <pad>=0, <s>=1, </s>=2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2}
    vocab.update({ch: 3 + i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny(path: Path, layers: int, seed: int) -> str:
    """A tiny random Llama over the byte tokenizer, saved with it at ``path``."""
    torch.manual_seed(seed)
    tokenizer = byte_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
        bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )
    cfg._attn_implementation = "sdpa"
    LlamaForCausalLM(cfg).eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def config(target: str, out: Path, **kw) -> BenchConfig:
    """A quick benchmark config on ``target``: ``MAX_NEW`` tokens, float32, one thread, no bracketing."""
    base = dict(
        model=target, out=str(out), max_new_tokens=MAX_NEW, dtype="float32", threads=1, warmup_tokens=2, progress=False, bracket=False
    )
    return BenchConfig.from_dict(base | kw)


def check_rows_consistent(rows) -> None:
    """What every run's rows hold: one row per key and session, consistent counts, ``ar``'s exactness."""
    # a (prompt, turn, method) row is written once per session (a later session measures baselines again)
    keys = [(*r.key, r.session) for r in rows]
    assert len(keys) == len(set(keys)), "a (prompt, turn, method) row was written twice in one session"
    assert all(r.method in ("ar", "ar-end", "hf") for r in rows if sum(x.key == r.key for x in rows) > 1)
    for r in rows:
        assert r.new_tokens == len(r.tokens) <= MAX_NEW
        assert r.time_s > 0 and r.config["max_new_tokens"] == MAX_NEW
        assert r.environment["torch_threads"] == 1 and r.environment["dtype"] == "float32" and r.environment["cpu_model"]
        if r.peer:
            assert r.steps is None and r.mat is None and r.tokens_per_step is None
            assert r.agreement_hf is not None
        else:
            hist = {int(k): v for k, v in r.tokens_per_step.items()}
            assert sum(k * v for k, v in hist.items()) == r.new_tokens
            assert sum(hist.values()) == r.steps
            assert r.mat == pytest.approx(r.new_tokens / r.steps, abs=1e-4)
            assert set(r.time_breakdown_s) >= {"draft", "forward", "verify", "commit", "total"}
            if r.method == "ar":
                assert r.steps == r.new_tokens and r.agreement["exact"]
                assert r.self_repetition["response_tokens"] == r.new_tokens
            # greedy verification is lossless: in fp32 our methods reproduce ar token for token
            assert r.agreement["exact"], r
    # mt-bench turn 2 is conditioned on ar's own first answer
    for r in rows:
        if r.turn == 1 and r.method == "ar":
            first = next(x for x in rows if x.prompt_id == r.prompt_id and x.turn == 0 and x.method == "ar")
            assert r.prompt_tokens > first.prompt_tokens + first.new_tokens
