"""Methods that need no draft model: ``ar``, ``pld``, ``recycling``, ``ptd``, ``adapld`` (build functions of
the registry, ``methods/registry.py``). Drafters are imported when a method is built, so that
the CLI's start-up imports no torch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specgraft.composers.base import Composer
    from specgraft.drafters.base import Drafter
    from specgraft.methods.options import MethodOptions
    from specgraft.models.base import TargetModel


def build_ar(target: TargetModel, opts: MethodOptions, draft_model: Any = None) -> tuple[list[Drafter], Composer]:
    from specgraft.composers.base import MergeComposer

    return [], MergeComposer()


def build_pld(target: TargetModel, opts: MethodOptions, draft_model: Any = None) -> tuple[list[Drafter], Composer]:
    from specgraft.composers.base import MergeComposer
    from specgraft.drafters.base import Learning
    from specgraft.drafters.pld import PLDDrafter

    config = opts.pld if opts.row_cost is None else replace(opts.pld, row_cost=opts.row_cost)
    config = config if opts.step_costs is None else replace(config, step_costs=opts.step_costs)
    return [PLDDrafter(config, Learning(opts.learning))], MergeComposer()


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


#: AdaPLD and its ablations (AdaPLD paper Table 4; PLD+ = reranked lexical anchors, main copy only):
#: name -> (summary, fields of ``AdaPLDConfig`` to change).
ADAPLD_METHODS: dict[str, tuple[str, dict[str, Any]]] = {
    "adapld": ("AdaPLD: lexical-first anchors with semantic fallback, hidden-state reranking, copy + branches + successors", {}),
    "adapld-full": ("AdaPLD verifying the paper's whole tree (no estimated-acceptance pruning)", {"min_prob": 0.0}),
    "adapld-rerank-only": ("PLD+: hidden-state reranking of lexical anchors, main copy only (AdaPLD ablation)",
                           {"fallback": False, "branches": False, "successors": False}),
    "adapld-no-fallback": ("AdaPLD without the semantic fallback (lexical anchors only)", {"fallback": False}),
    "adapld-no-branches": ("AdaPLD without branch and successor drafting", {"branches": False, "successors": False}),
    "adapld-no-successor": ("AdaPLD without successor drafting", {"successors": False}),
}


def build_adapld(variant: str, target: TargetModel, opts: MethodOptions, draft_model: Any = None) -> tuple[list[Drafter], Composer]:
    from specgraft.composers.base import MergeComposer
    from specgraft.drafters import adapld
    from specgraft.drafters.base import Learning

    config = replace(opts.adapld, **ADAPLD_METHODS[variant][1])
    if opts.row_cost is not None and config.min_prob > 0:  # adapld-full verifies the whole tree
        config = replace(config, row_cost=opts.row_cost)
    if opts.step_costs is not None and config.min_prob > 0:
        config = replace(config, step_costs=opts.step_costs)
    return [adapld.build_adapld(target, config, Learning(opts.learning))], MergeComposer()
