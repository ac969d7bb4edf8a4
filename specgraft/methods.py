"""The method registry: a method name -> the drafters and composer that make it.

Adding a method means adding an entry here (and its drafter/composer modules), never editing
the engine.

>>> sorted(METHODS)
['ar', 'pld', 'recycling']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from specgraft.composers.base import Composer, MergeComposer
from specgraft.drafters.base import Drafter
from specgraft.drafters.pld import PLDConfig, PLDDrafter
from specgraft.drafters.recycling import RecyclingConfig, RecyclingDrafter, SuccessorMatrix


@dataclass(frozen=True)
class MethodOptions:
    """Per-method knobs. Unused fields are ignored by methods that don't read them."""

    pld: PLDConfig = field(default_factory=PLDConfig)
    recycling: RecyclingConfig = field(default_factory=RecyclingConfig)
    recycling_state: str | None = None
    """``.npz`` successor matrix to start from (``specgraft warmup`` writes one)."""


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str
    build: Callable[[int, MethodOptions], tuple[list[Drafter], Composer]]


def _ar(vocab: int, opts: MethodOptions) -> tuple[list[Drafter], Composer]:
    return [], MergeComposer()


def _pld(vocab: int, opts: MethodOptions) -> tuple[list[Drafter], Composer]:
    return [PLDDrafter(opts.pld)], MergeComposer()


def _recycling(vocab: int, opts: MethodOptions) -> tuple[list[Drafter], Composer]:
    matrix = None
    if opts.recycling_state:
        matrix = SuccessorMatrix.load(Path(opts.recycling_state), vocab_size=vocab)
    return [RecyclingDrafter(vocab, opts.recycling, matrix)], MergeComposer()


METHODS: dict[str, MethodSpec] = {
    "ar": MethodSpec("ar", "plain autoregressive decoding through the same adapter (the baseline)", _ar),
    "pld": MethodSpec("pld", "prompt lookup: copies of earlier spans of prompt + output, branches as a tree", _pld),
    "recycling": MethodSpec(
        "recycling", "Token Recycling: top-k successor matrix refreshed from the target's logits, static template", _recycling
    ),
}


def get_method(name: str) -> MethodSpec:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def method_names() -> Sequence[str]:
    return sorted(METHODS)

