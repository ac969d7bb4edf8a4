"""Test stand-ins: a table draft model with the adapter's slot protocol and logit tables for it, a
target that is only a vocabulary, an integer tokenizer, and drafter helpers."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.types import PrefillOutput, RowsOutput


class TableLM:
    """Draft-model stub (``drafters.draft_model.DraftLanguageModel``): the logits of a row are
    ``fn(path)`` for the row's full token path (committed tokens, then its pending ancestors).

    ``forwards`` counts ``forward_rows`` calls; ``last_paths`` are the paths of the rows the
    last call returned, in order (so a test can tell which row a draw is for).
    """

    def __init__(self, fn: Callable[[tuple[int, ...]], torch.Tensor], vocab_size: int, max_positions: int = 1 << 20):
        self.fn = fn
        self.vocab_size = vocab_size
        self.max_positions = max_positions
        self.device = torch.device("cpu")
        self.forwards = 0
        self.last_paths: list[tuple[int, ...]] = []
        self._committed: dict[int, list[int]] = {}
        self._pending: dict[int, list[tuple[int, ...]]] = {}
        self._rows: dict[tuple[int, ...], torch.Tensor] = {}

    def row(self, path: tuple[int, ...]) -> torch.Tensor:
        """``fn(path)``, computed once per path."""
        if path not in self._rows:
            self._rows[path] = self.fn(path)
        return self._rows[path]

    def allocate(self) -> int:
        slot = max(self._committed, default=-1) + 1
        self._committed[slot], self._pending[slot] = [], []
        return slot

    def release(self, slot: int) -> None:
        del self._committed[slot], self._pending[slot]

    def length(self, slot: int) -> int:
        return len(self._committed[slot])

    def prefill(self, slot: int, tokens: Sequence[int], request: Any = None) -> PrefillOutput:
        self._committed[slot] += [int(t) for t in tokens]
        return PrefillOutput()

    def forward_rows(self, slot: int, tokens, parent_rows, output_hidden: bool = False, hidden_layer=None) -> RowsOutput:
        self.forwards += 1
        pending = self._pending[slot]
        new = []
        for tok, parent in zip(torch.as_tensor(tokens).tolist(), torch.as_tensor(parent_rows).tolist(), strict=True):
            base = pending[parent] if parent >= 0 else tuple(self._committed[slot])
            pending.append(base + (int(tok),))
            new.append(pending[-1])
        self.last_paths = new
        return RowsOutput(logits=torch.stack([self.row(p) for p in new]))

    def commit(self, slot: int, keep_rows: Sequence[int]) -> None:
        pending = self._pending[slot]
        self._committed[slot] = list(pending[keep_rows[-1]]) if keep_rows else self._committed[slot]
        self._pending[slot] = []

    def discard(self, slot: int) -> None:
        self._pending[slot] = []

    def committed(self, slot: int) -> list[int]:
        return list(self._committed[slot])


def sampling_config(temperature: float = 1.0, **kw) -> GenerationConfig:
    """A generation config that samples (sampled drafts need one)."""
    return GenerationConfig(sampling=SamplingConfig(temperature=temperature, **kw))


def begin(drafter, prompt: Sequence[int], config: GenerationConfig = GenerationConfig(), prefill: PrefillOutput | None = None):
    """``drafter.begin`` for a prompt (no prefill outputs unless given); returns the state."""
    return drafter.begin(list(prompt), prefill if prefill is not None else PrefillOutput(), config)


# ---- logit tables for TableLM -----------------------------------------------------------------


def peaked_table(peak: float, vocab: int, low: int = 0, high: int | None = None) -> Callable[[tuple[int, ...]], torch.Tensor]:
    """Logits of a row: ``peak`` on one token of ``[low, high)``, the rest on a few others, all
    chosen by a hash of the row's last three tokens (so different rows differ)."""
    high = vocab if high is None else high

    def fn(path: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash(path[-3:]) % (1 << 31))
        perm = torch.randperm(high - low, generator=g)[:16] + low
        probs = torch.zeros(vocab, dtype=torch.float64)
        probs[perm[0]] = peak
        rest = torch.tensor([0.5**i for i in range(1, 16)], dtype=torch.float64)
        probs[perm[1:]] = (1 - peak) * rest / rest.sum()
        return probs.log().float()

    return fn


def random_table(vocab: int, seed: int) -> Callable[[tuple[int, ...]], torch.Tensor]:
    """Draft logits: a fixed random function of the last two tokens (like SyntheticTarget's)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(vocab, vocab, vocab, generator=g) * 1.5
    return lambda path: table[path[-2], path[-1]]


# ---- targets and tokenizers -------------------------------------------------------------------


class Vocab:
    """What building a Graft method reads of a target, for a stub draft model: its vocabulary and device."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.device = torch.device("cpu")


class IntTokenizer:
    """Text ``"5 9 4"`` -> ids ``[5, 9, 4]``: a datastore over token ids for the tiny models."""

    name_or_path = "ints"

    def __init__(self, vocab: int):
        self.vocab = vocab

    def get_vocab(self):
        return {str(i): i for i in range(self.vocab)}

    def __call__(self, texts, **kw):
        return {"input_ids": [[int(t) for t in text.split()] for text in texts]}
