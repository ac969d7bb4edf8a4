"""Which hidden layer reranks AdaPLD's anchors best: PLD+'s sweep (AdaPLD Table 6).

On held-out texts (prompt + a reference answer, disjoint from the benchmark prompts), at every
answer position ``t`` whose token occurred at two or more earlier positions, each layer ``l``
picks the anchor ``a`` whose preceding hidden state (after ``x_{a-1}``) is closest in cosine to
the one after ``x_{t-1}``; the score is how many tokens of the copy ``x_{a+1} ..`` equal the
text's own continuation ``x_{t+1} ..`` (the main copy's accepted length, at most ``max_copy``).
The best layer has the largest mean; the most recent anchor (PLD's rule) is the baseline.

One forward per text gives every layer's states, so the sweep costs a prefill per text::

    result = sweep(model, [tokenizer(text).input_ids for text in texts])
    result.best_layer, result.mean_by_layer[result.best_layer], result.mean_recent
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch


@dataclass
class SweepResult:
    mean_by_layer: dict[int, float]
    """Mean accepted copy length of the reranked anchor, per layer (1 .. num_layers - 1)."""
    mean_recent: float
    """The same with the most recent anchor (no reranking)."""
    mean_oracle: float
    """The same with the best candidate in hindsight (the ceiling of any reranking)."""
    positions: int
    """Positions with two or more candidates that were scored."""
    per_text: list[int] = field(default_factory=list)

    @property
    def best_layer(self) -> int:
        return max(self.mean_by_layer, key=lambda layer: (self.mean_by_layer[layer], -layer))


def copy_lengths(tokens: np.ndarray, t: int, cands: np.ndarray, max_copy: int) -> np.ndarray:
    """For each anchor ``a``: how many of ``x_{a+1..}`` equal ``x_{t+1..}`` (copying stops at ``x_t``).

    >>> copy_lengths(np.array([1, 2, 3, 1, 2, 4]), 3, np.array([0]), 30).tolist()
    [1]
    """
    out = np.zeros(len(cands), dtype=np.int64)
    for i, a in enumerate(cands.tolist()):
        k = 0
        while k < max_copy and a + 1 + k <= t and t + 1 + k < len(tokens) and tokens[a + 1 + k] == tokens[t + 1 + k]:
            k += 1
        out[i] = k
    return out


@torch.inference_mode()
def sweep(model, texts: Sequence[Sequence[int]], answer_starts: Sequence[int] | None = None, max_copy: int = 30) -> SweepResult:
    """Score every decoder layer of ``model`` (a Hugging Face causal LM) on ``texts`` (token ids);
    positions before ``answer_starts[i]`` (the prompt) are memory only, not scored."""
    layers = int(model.config.get_text_config(decoder=True).num_hidden_layers)
    sums = np.zeros(layers, dtype=np.float64)
    recent = oracle = 0.0
    positions = 0
    per_text = []
    device = next(model.parameters()).device
    for i, toks in enumerate(texts):
        tokens = np.asarray(toks, dtype=np.int64)
        out = model.get_decoder()(input_ids=torch.as_tensor(tokens[None], device=device), output_hidden_states=True)
        # [layers + 1, T, H] -> unit vectors, layers 1 .. layers - 1 (the last entry is after the final norm)
        states = torch.stack(out.hidden_states[1:layers]).float()[:, 0]
        states = (states / states.norm(dim=-1, keepdim=True).clamp_min(1e-12)).cpu().numpy()
        start = max(2, answer_starts[i] if answer_starts is not None else 2)
        scored = 0
        for t in range(start, len(tokens) - 1):
            cands = np.flatnonzero(tokens[1:t] == tokens[t]) + 1  # j >= 1: a preceding state exists
            if len(cands) < 2:
                continue
            lengths = copy_lengths(tokens, t, cands, max_copy)
            # [layers - 1, n]: cosine of each candidate's preceding state with the query's
            scores = np.einsum("lnh,lh->ln", states[:, cands - 1], states[:, t - 1])
            # the last maximum: the most recent candidate on ties
            best = len(cands) - 1 - np.argmax(scores[:, ::-1], axis=1)
            sums[1:] += lengths[best]
            recent += lengths[-1]
            oracle += lengths.max()
            scored += 1
        positions += scored
        per_text.append(scored)
    n = max(positions, 1)
    return SweepResult(
        mean_by_layer={layer: float(sums[layer] / n) for layer in range(1, layers)},
        mean_recent=recent / n,
        mean_oracle=oracle / n,
        positions=positions,
        per_text=per_text,
    )
