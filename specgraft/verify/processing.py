"""Turn target logits into the distribution that plain sampling draws from, and draw from it.

Plain (``ar``) sampling and every sampling verifier call the same two functions, so a
speculative step draws each token from exactly the distribution plain decoding would use:

    probs = target_probs(logits_row, sampling)   # temperature -> top-k -> top-p
    token = sample_token(probs, generator)       # one torch.multinomial call

Greedy decoding (temperature 0) is an argmax and never calls these.

Ties at a top-k or top-p boundary are all kept, so the result depends only on the logit
values, never on token ids or on the stability of a sort. Example with temperature 1 and
logits ``[2, 1, 1, 0]``: ``top_k=2`` keeps tokens 0, 1 and 2 (1 and 2 tie for second place).
"""

from __future__ import annotations

import torch

from specgraft.config import SamplingConfig


def target_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """float32 probabilities after temperature, then top-k, then top-p (nucleus), over the last dim.

    - temperature: ``softmax(logits / temperature)``.
    - top-k: keep every token whose logit is >= the k-th largest (ties at the k-th place kept).
    - top-p: on the top-k-renormalised distribution, keep the smallest set of most likely
      tokens whose cumulative probability reaches ``top_p`` (plus tokens tied with the least
      likely kept one); the most likely token is always kept. Then renormalise.

    Example (temperature 1, ``top_p=0.7``): probs ``[0.5, 0.3, 0.2]`` -> cumulative
    ``[0.5, 0.8, 1.0]`` reaches 0.7 at the second token -> ``[0.625, 0.375, 0.0]``.
    """
    if sampling.greedy:
        raise ValueError("target_probs is for sampling; temperature 0 (greedy) decodes with argmax")
    # [..., V]
    scaled = logits.float() / sampling.temperature
    vocab = scaled.shape[-1]
    top_k = sampling.top_k if 0 < sampling.top_k < vocab else 0
    if top_k:
        # [..., 1]
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    # [..., V]
    probs = torch.softmax(scaled, dim=-1)
    if sampling.top_p < 1.0:
        probs = _nucleus(probs, sampling.top_p, top_k)
    return probs


#: First number of candidates the nucleus search sorts; doubled until the nucleus fits.
NUCLEUS_START = 64


def _nucleus(probs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Keep tokens at least as likely as the one where the descending cumulative sum reaches top_p.

    The boundary is found among the largest probabilities only: the ``k`` largest (``k = 64``,
    doubled until their cumulative sum reaches ``top_p`` in every row, or the vocabulary is
    covered), instead of sorting the whole vocabulary (152k entries for Qwen2.5) at every
    visited node. The result is the same as a full sort's: the boundary is the value at the
    first place where the cumulative sum reaches ``top_p``, which lies inside the ``k``
    largest once their sum reaches it, and every token tied with it is kept by the comparison
    below whether it was among the ``k`` or not. With top-k on (``top_k > 0``) the ``k`` largest
    are already all candidates. :func:`_nucleus_sorted` is the full-sort twin.
    """
    vocab = probs.shape[-1]
    k = top_k if top_k else min(NUCLEUS_START, vocab)
    while True:
        # [..., k], descending
        ordered = torch.topk(probs, k, dim=-1).values
        cumulative = ordered.cumsum(dim=-1)
        if top_k or k == vocab or bool((cumulative[..., -1] >= top_p).all()):
            break
        k = min(2 * k, vocab)
    return _cut_at(probs, ordered, cumulative, top_p)


def _nucleus_sorted(probs: torch.Tensor, top_p: float, top_k: int) -> torch.Tensor:
    """Plain twin of :func:`_nucleus`: sort the top-k (or the whole vocabulary) once."""
    ordered = torch.topk(probs, top_k, dim=-1).values if top_k else torch.sort(probs, dim=-1, descending=True).values
    return _cut_at(probs, ordered, ordered.cumsum(dim=-1), top_p)


def _cut_at(probs: torch.Tensor, ordered: torch.Tensor, cumulative: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token below the value where ``cumulative`` first reaches ``top_p``; renormalise."""
    # [..., 1]: place of the first token whose inclusive cumulative sum reaches top_p
    reach = (cumulative < top_p).sum(dim=-1, keepdim=True).clamp_(max=ordered.shape[-1] - 1)
    # [..., 1]
    boundary = ordered.gather(-1, reach)
    # [..., V]
    kept = probs.masked_fill(probs < boundary, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def sample_token(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token from a probability row ``[V]`` with ``torch.multinomial``.

    The number of values drawn from ``generator`` depends only on the row's length and dtype,
    so two code paths that make the same calls on the same rows stay in lockstep.
    Example: ``sample_token(torch.tensor([0.0, 1.0, 0.0]), g) == 1``.
    """
    if probs.dim() != 1:
        raise ValueError(f"sample_token takes one row [V], got shape {tuple(probs.shape)}")
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


def draw_uniforms(generator: torch.Generator | None, n: int) -> torch.Tensor:
    """``n`` uniform draws in ``[0, 1)`` (float64, on the generator's device), for accept/reject decisions."""
    device = generator.device if generator is not None else torch.device("cpu")
    return torch.rand(n, dtype=torch.float64, generator=generator, device=device)
