"""The prompts and the plain greedy reference of the losslessness checks."""

from __future__ import annotations

import random

import torch


def make_prompts(n: int = 50, vocab: int = 96) -> list[tuple[list[int], bool]]:
    """``n`` prompts ``(tokens, repetitive)``, every other one a repeated unit (so drafts are really accepted)."""
    rng = random.Random(1234)
    prompts = []
    for i in range(n):
        if i % 2 == 0:
            unit = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 6))]
            p = (unit * 12)[: rng.randint(12, 40)]
            prompts.append((p, True))
        else:
            prompts.append(([rng.randrange(3, vocab) for _ in range(rng.randint(1, 30))], False))
    return prompts


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Exactly ``n`` tokens of Hugging Face's plain greedy ``generate`` (no EOS stop): the reference."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt], device=model.device), attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=model.device),
            max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()
