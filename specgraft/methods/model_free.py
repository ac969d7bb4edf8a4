"""Methods that need no draft model: ``ar``, ``pld``, ``recycling``, ``ptd`` (build functions of
the registry, ``methods/registry.py``). Drafters are imported when a method is built, so that
the CLI's start-up imports no torch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specgraft.composers.base import Composer
    from specgraft.drafters.base import Drafter
    from specgraft.methods.registry import MethodOptions
    from specgraft.models.base import TargetModel


def build_ar(target: TargetModel, opts: MethodOptions, draft_model: Any = None) -> tuple[list[Drafter], Composer]:
    from specgraft.composers.base import MergeComposer

    return [], MergeComposer()


def build_pld(target: TargetModel, opts: MethodOptions, draft_model: Any = None) -> tuple[list[Drafter], Composer]:
    from specgraft.composers.base import MergeComposer
    from specgraft.drafters.base import Learning
    from specgraft.drafters.pld import PLDDrafter

    return [PLDDrafter(opts.pld, Learning(opts.learning))], MergeComposer()


def build_recycling(target: TargetModel, opts: MethodOptions, draft_model: Any = None) -> tuple[list[Drafter], Composer]:
    from specgraft.composers.base import MergeComposer
    from specgraft.drafters.base import Learning
    from specgraft.drafters.recycling import RecyclingDrafter, SuccessorMatrix

    matrix = None
    if opts.recycling_state:
        matrix = SuccessorMatrix.load(Path(opts.recycling_state), vocab_size=target.vocab_size)
    return [RecyclingDrafter(target.vocab_size, opts.recycling, matrix, Learning(opts.learning))], MergeComposer()


def build_ptd(target: TargetModel, opts: MethodOptions, draft_model: Any = None) -> tuple[list[Drafter], Composer]:
    from specgraft.composers.base import MergeComposer
    from specgraft.drafters.ptd import PTDDrafter

    return [PTDDrafter(opts.ptd)], MergeComposer()
