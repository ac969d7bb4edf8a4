"""One contract for every benchmarked method: token ids in, :class:`MethodRun` out.

Like Spec-Bench's ``forward_func``, but typed: our registry methods and the Hugging Face peers
(:mod:`specgraft.bench.peers`) are called the same way, and the runner times the call itself
with ``time.perf_counter()`` around generation only (no tokenization or detokenization).

Example::

    ours = SpecgraftMethod(decoder.with_method("pld"), GenerationConfig(max_new_tokens=32))
    run = ours.run([1, 5, 6, 7])          # MethodRun(tokens=[...], time_s=0.12, stats=GenerationStats)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from specgraft.api import SpecDecoder
from specgraft.config import GenerationConfig
from specgraft.models.base import synchronize
from specgraft.types import GenerationStats


def until_eos(tokens: list[int], eos_ids: Sequence[int]) -> list[int]:
    """``tokens`` up to and including the first of ``eos_ids`` (all of them without one).

    >>> until_eos([5, 2, 0, 0], [2]), until_eos([5, 6], [2]), until_eos([5, 2], [])
    ([5, 2], [5, 6], [5, 2])
    """
    stop = set(eos_ids)
    return next((tokens[: i + 1] for i, t in enumerate(tokens) if t in stop), tokens)


@dataclass
class MethodRun:
    """What one generation produced."""

    # [new_tokens]: new token ids, EOS included when it ended generation
    tokens: list[int]
    time_s: float
    """Wall time of the generation call (prefill included), ``time.perf_counter()``."""
    stats: GenerationStats | None = None
    """Step statistics; None for peers, whose steps are not observable from outside."""
    config: dict[str, Any] = field(default_factory=dict)


class BenchMethod(Protocol):
    name: str
    is_peer: bool

    def run(self, ids: Sequence[int]) -> MethodRun: ...

    def resolved_config(self) -> dict[str, Any]: ...


class SpecgraftMethod:
    """A method from :mod:`specgraft.methods`, run through its :class:`SpecEngine` on token ids.

    The engine is timed rather than :meth:`SpecDecoder.generate`, whose text streaming
    detokenizes after every step and would charge plain decoding (one token per step) more
    detokenization than a speculative method.
    """

    is_peer = False

    def __init__(self, decoder: SpecDecoder, config: GenerationConfig):
        self.decoder = decoder
        # the engine gets a number: no budget means the method's default
        self.config = decoder.resolve(config)
        self.name = decoder.method

    def run(self, ids: Sequence[int]) -> MethodRun:
        ids = list(ids)
        self.decoder.engine.check_prompt(ids)
        device = self.decoder.target.device
        synchronize(device)
        t0 = time.perf_counter()
        tokens = self.decoder.engine.generate_ids(ids, self.config)
        synchronize(device)
        elapsed = time.perf_counter() - t0
        stats = self.decoder.engine.last_stats
        assert stats.new_tokens == len(tokens), f"{self.name}: stats count {stats.new_tokens} tokens, got {len(tokens)}"
        return MethodRun(tokens=tokens, time_s=elapsed, stats=stats, config=self.resolved_config())

    def resolved_config(self) -> dict[str, Any]:
        return self.decoder.resolved_config(self.config)


def with_max_new_tokens(config: GenerationConfig, n: int) -> GenerationConfig:
    """The same config with another ``max_new_tokens`` (for warm-up runs)."""
    return dataclasses.replace(config, max_new_tokens=n)
