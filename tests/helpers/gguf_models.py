"""Tiny random GGUF models for the llama.cpp backend's tests, written with the ``gguf`` package.

A Llama-architecture model of a few hundred kilobytes (2 layers, hidden 64, 4 query heads over
2 key/value heads, a 96-token vocabulary of byte tokens), float32 or with its matrices in a
llama.cpp quantization (``Q8_0``). llama.cpp loads it like any GGUF; the tests only feed token
ids, so the vocabulary needs no merges.

Example::

    path = write_tiny_gguf(tmp_path / "tiny.gguf", qtype="Q8_0")
    target = LlamaCppTarget(path, threads=1)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tiny_gguf(
    path: str | Path,
    vocab: int = 96,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 128,
    context: int = 1024,
    seed: int = 0,
    qtype: str | None = None,
) -> Path:
    """Write a random Llama GGUF to ``path`` and return it; ``qtype`` (e.g. ``"Q8_0"``) quantizes
    its matrices whose rows are whole blocks (the norms stay float32)."""
    import gguf

    rng = np.random.default_rng(seed)
    quant = None if qtype is None else getattr(gguf.GGMLQuantizationType, qtype)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", *(f"<0x{i:02X}>" for i in range(vocab - 3))])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([2, 3, 3] + [6] * (vocab - 3))  # unknown, control x2, bytes
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)

    def tensor(name: str, *shape: int, scale: float = 0.2) -> None:
        values = (rng.standard_normal(shape) * scale).astype(np.float32)
        if quant is not None and len(shape) == 2 and shape[-1] % 32 == 0:
            packed = gguf.quants.quantize(values, quant)
            writer.add_tensor(name, packed, raw_shape=packed.shape, raw_dtype=quant)
        else:
            writer.add_tensor(name, values)

    head_dim = hidden // heads
    tensor("token_embd.weight", vocab, hidden, scale=1.0)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", hidden)
        tensor(f"blk.{i}.ffn_norm.weight", hidden)
        tensor(f"blk.{i}.attn_q.weight", hidden, hidden)
        tensor(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        tensor(f"blk.{i}.attn_output.weight", hidden, hidden)
        tensor(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_up.weight", ffn, hidden)
        tensor(f"blk.{i}.ffn_down.weight", hidden, ffn)
    tensor("output_norm.weight", hidden)
    tensor("output.weight", vocab, hidden, scale=1.0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
