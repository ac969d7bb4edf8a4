"""A draft model's output head over part of the vocabulary (FR-Spec's frequency-ranked drafting).

A draft forward reads every weight of the draft once, and the output head is a large share of
them where the vocabulary is large: Qwen2.5's 151,936 x 896 head is 28% of the 0.5B draft's
bytes (136M of 494M parameters), the same in int8. Drafting needs the likely tokens only, so
:class:`SubsetHead` computes the logits of ``ids`` (the draft's most frequent tokens plus the
tokenizer's special ones) and gives every other token ``-inf``: a draft distribution that puts
no mass outside ``ids`` (Zhao et al., 2025, FR-Spec: "Accelerating Large-Vocabulary Language
Models via Frequency-Ranked Speculative Sampling").

Lossless either way: the target verifies every drafted token, so a token the draft cannot
propose is only a token it does not propose. Greedy outputs stay the target's; sampled drafts
(``--sample-drafts``) are drawn from the restricted distribution, whose probabilities are what
recursive rejection sampling is given (0 outside ``ids``), so the output distribution stays the
target's too.

Which tokens: :func:`frequent_ids` ranks a byte-level BPE vocabulary by id, which is the order
its merges were learned in, most frequent pairs first (GPT-2, Llama 3 and Qwen2 number their
tokens that way); FR-Spec counts tokens over a corpus instead. Measured for Qwen2.5 on the
catalog's plain (`ar`) outputs in ``benchmarks/`` (2,946 tokens of Spec-Bench and HumanEval
answers): ids below 32,768 cover 93% of the output tokens, below 65,536 98.2%; the answers'
prompt tokens and the special tokens add more (``benchmarks/RESULTS.md``, *Draft head over part
of the vocabulary*).

Worked example: a 10-token vocabulary, ``ids = [0, 1, 2, 9]``; the head computes 4 logits per
row and scatters them, so row logits ``[2.0, 0.5, -1.0, 3.0]`` become
``[2.0, 0.5, -1.0, -inf, -inf, -inf, -inf, -inf, -inf, 3.0]``.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


def frequent_ids(vocab_size: int, keep: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The sorted token ids a draft head over ``keep`` tokens computes: ids ``0 .. keep - 1``
    (a BPE vocabulary's most frequent, module docstring) and every id of ``always`` (the special
    tokens: an end-of-turn token must stay draftable). ``keep >= vocab_size`` keeps them all.

    >>> frequent_ids(10, 3, always=[9, 1]).tolist()
    [0, 1, 2, 9]
    >>> frequent_ids(10, 0)
    Traceback (most recent call last):
    ValueError: a draft head needs at least one token, got keep=0
    """
    if keep < 1:
        raise ValueError(f"a draft head needs at least one token, got keep={keep}")
    extra = sorted({int(t) for t in always if keep <= int(t) < vocab_size})
    return torch.tensor([*range(min(keep, vocab_size)), *extra], dtype=torch.long)


def head_weight(model: nn.Module) -> torch.Tensor:
    """The output head's ``[V, H]`` weight in floating point, whatever its kernel: the input
    embedding when they are tied (the original values, not the head's int8 copy), else the head's
    weight (a oneDNN-packed linear unpacks it; an int8 one is dequantized)."""
    head = model.get_output_embeddings()
    tied = getattr(model.config.get_text_config(decoder=True), "tie_word_embeddings", False)
    if tied:
        return model.get_input_embeddings().weight.detach()
    weight = head.weight() if callable(head.weight) else head.weight  # dynamic int8 linears: a method
    return (weight.dequantize() if weight.is_quantized else weight).detach()


class SubsetHead(nn.Module):
    """An output head that computes the logits of ``ids`` only and ``-inf`` for every other token.

    Built from ``model``'s head (:func:`head_weight`) in the same numerics as that head: int8
    when the head is a dynamically quantized linear, oneDNN-packed fp32 when it is packed, else a
    plain linear. ``forward`` maps ``[..., H]`` hidden states to ``[..., V]`` float32 logits, so
    every consumer of full-vocabulary logits works unchanged (module docstring: example).
    """

    def __init__(self, model: nn.Module, ids: torch.Tensor):
        super().__init__()
        from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

        from specgraft.models.kernels import OneDNNLinear

        head = model.get_output_embeddings()
        weight = head_weight(model)
        self.vocab_size = int(weight.shape[0])
        ids = torch.as_tensor(ids, dtype=torch.long)
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"draft head ids must be a non-empty subset of [0, {self.vocab_size})")
        bias = head.bias() if callable(getattr(head, "bias", None)) else getattr(head, "bias", None)
        sub = nn.Linear(weight.shape[1], ids.numel(), bias=bias is not None, device=weight.device, dtype=torch.float32)
        with torch.no_grad():
            sub.weight.copy_(weight[ids.to(weight.device)].float())
            if bias is not None:
                sub.bias.copy_(bias.detach()[ids.to(bias.device)].float())
        if isinstance(head, DynamicLinear):
            from specgraft.models.quant import quantize_int8_dynamic

            box = nn.Sequential(sub)
            quantize_int8_dynamic(box)
            sub = box[0]
        else:
            sub = sub.to(weight.dtype)
            if isinstance(head, OneDNNLinear):
                sub = OneDNNLinear(sub)
        self.head = sub
        self.out_features = self.vocab_size
        self.register_buffer("ids", ids.to(weight.device), persistent=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        part = self.head(hidden).float()
        full = part.new_full((*part.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.ids] = part
        return full


def special_ids(model: nn.Module) -> list[int]:
    """Token ids a draft head always keeps: the model's BOS, EOS (all of them) and pad ids from its
    config and generation config, so the draft can still propose the end of an answer.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> special_ids(LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, bos_token_id=1, eos_token_id=2)))
    [1, 2]
    """
    ids: set[int] = set()
    for config in (model.config, getattr(model, "generation_config", None)):
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(config, name, None) if config is not None else None
            for t in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(t, int) and t >= 0:
                    ids.add(t)
    return sorted(ids)


def draft_adapter(model: nn.Module, keep: int) -> nn.Module:
    """What a drafter drafts with: ``model`` itself when ``keep`` is 0 or covers the vocabulary,
    else an :class:`~specgraft.models.hf.HFTarget` over it whose head computes ``keep`` tokens
    (:func:`frequent_ids` + :func:`special_ids`). ``model`` is not changed (peers share it)."""
    from specgraft.models.hf import HFTarget

    vocab = int(model.get_output_embeddings().out_features)
    if keep == 0 or keep >= vocab:
        return model
    return HFTarget(model, head=SubsetHead(model, frequent_ids(vocab, keep, special_ids(model))))
