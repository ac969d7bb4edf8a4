"""Registry entries for the draft-model tree and Graft's variants (merged into ``methods.METHODS``).

``MethodOptions`` carries a :class:`GraftOptions` (plain, JSON-able data: a run prints it). The
draft model is named there (catalog name, local directory or Hugging Face id) and loaded when a
method is built; decoders built while one is alive share its weights (each drafter keeps its
own KV cache), so ``with_method`` and benchmarks over several variants load it once.

    >>> sorted(GRAFT_METHODS)
    ['draft-tree', 'graft', 'graft-fixed', 'graft-prune', 'graft-root', 'graft-tail']

Building by hand, with a model already loaded::

    drafters, composer = build_graft_method("graft", target_vocab, GraftOptions(calibration="c.json"), draft_model=model)
    engine = SpecEngine(HFTarget(target_model), drafters, composer, method="graft")
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import nn

from specgraft.composers.graft import VARIANTS, GraftComposer, GraftConfig, GraftRetrieval, StagePlanner
from specgraft.drafters.base import Drafter
from specgraft.drafters.draft_model import DraftModelDrafter, DraftTreeConfig, get_preset
from specgraft.drafters.recycling import SuccessorMatrix

GRAFT_METHODS: dict[str, str] = {
    "draft-tree": "dense draft-model tree (EAGLE-2 style: top-k expansion by path score, best K nodes); needs --draft-model",
    "graft-prune": "Graft without retrieval: confidence checkpoints stop drafting, released slots stay empty",
    "graft-fixed": "Graft without pruning: fixed draft/retrieval split every step, retrieval at the root",
    "graft-root": "no pruning; a small retrieved branch at the root takes slots from the draft tree (Graft(ROOT))",
    "graft-tail": "no pruning; a small retrieved branch hangs from the end of the best draft path (Graft(TAIL))",
    "graft": "Graft: prune at calibrated confidence checkpoints, graft successor-matrix retrieval into the released slots",
}


@dataclass(frozen=True)
class GraftOptions:
    """Knobs of ``draft-tree`` and the Graft variants (``MethodOptions.graft``)."""

    draft_model: str | None = None
    """Draft model: catalog name, local directory or Hugging Face id; must share the target's vocabulary."""
    draft_dtype: str = "auto"
    """dtype the draft model is loaded in (``auto``: float32 on CPUs without native bf16, see ``models/kernels.py``)."""
    device: str = "cpu"
    """Device the draft model is loaded on (the target's)."""
    preset: str = "cpu"
    """``cpu`` (depth 4, top-k 6, checkpoints 0/1/2, for budget 24) or ``gpu`` (the paper: depth 8, top-k 10, 0/1/5, budget 60)."""
    depth: int | None = None
    """Override the preset's draft depth (draft forwards per step)."""
    top_k: int | None = None
    """Override the preset's top-k."""
    calibration: str | None = None
    """Calibration JSON from ``specgraft calibrate`` (thresholds + warmed-up successor matrix)."""
    thresholds: tuple[float, ...] | None = None
    """Override ``tau_d`` per checkpoint (else the calibration's, else the preset's uncalibrated defaults)."""
    sample_drafts: bool = False
    """Draw draft children i.i.d. from the draft distribution so sampling can use rejection sampling."""
    draft_temperature: float = 1.0
    """Temperature of the draft distribution (match the sampling temperature when sampling drafts)."""
    seed: int = 0
    """Seed of the draft sampler (sampling drafts only)."""

    def __post_init__(self) -> None:
        get_preset(self.preset)
        for name in ("depth", "top_k"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not (math.isfinite(self.draft_temperature) and self.draft_temperature > 0):
            raise ValueError(f"draft_temperature must be > 0, got {self.draft_temperature!r}")
        if self.thresholds is not None:
            object.__setattr__(self, "thresholds", tuple(float(t) for t in self.thresholds))


# Loaded draft models by (path, dtype, device), alive while a drafter uses them.
_loaded_models: "weakref.WeakValueDictionary[tuple[str, str, str], nn.Module]" = weakref.WeakValueDictionary()


def load_draft_model(name: str, dtype: str = "auto", device: str = "cpu", progress: bool = True) -> nn.Module:
    """Load (or reuse, while loaded) a draft model by catalog name, directory or hub id, with the
    same loader and CPU kernels as the target (:func:`specgraft.models.hf.load_causal_lm`)."""
    from specgraft.models.catalog import resolve_model
    from specgraft.models.hf import load_causal_lm, parse_dtype

    resolved = parse_dtype(dtype, device)
    path = resolve_model(name, progress=progress)
    key = (str(path), str(resolved), device)
    model = _loaded_models.get(key)
    if model is None:
        model = load_causal_lm(path, resolved, device)
        _loaded_models[key] = model
    return model


def build_graft_method(
    variant: str, vocab: int, options: GraftOptions, draft_model: nn.Module | None = None
) -> tuple[list[Drafter], GraftComposer]:
    """Drafters and composer of ``variant`` (one of ``GRAFT_METHODS``) for a target with ``vocab`` tokens.

    ``draft_model`` is used when given, else ``options.draft_model`` is loaded.
    """
    from specgraft.calibrate import load_calibration

    if variant not in VARIANTS:
        raise ValueError(f"unknown Graft variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if draft_model is None:
        if not options.draft_model:
            raise ValueError(f"method {variant!r} needs a draft model (--draft-model) sharing the target's tokenizer")
        draft_model = load_draft_model(options.draft_model, options.draft_dtype, options.device)
    preset = get_preset(options.preset)
    calibration = load_calibration(options.calibration, vocab_size=vocab) if options.calibration else None
    k = calibration.matrix.k if calibration is not None else GraftConfig().k
    config = GraftConfig(variant=variant, k=k)
    checkpoints = preset.checkpoints[: len(config.draft_shares)]
    thresholds = None
    if config.gated:
        if calibration is not None and tuple(calibration.checkpoints) != tuple(checkpoints):
            raise ValueError(
                f"calibration {options.calibration!r} was made for checkpoints {calibration.checkpoints}, "
                f"but preset {options.preset!r} uses {checkpoints}"
            )
        if options.thresholds is not None:
            thresholds = options.thresholds
        elif calibration is not None:
            thresholds = calibration.thresholds_for(variant)
        else:
            thresholds = preset.thresholds
    draft_config = DraftTreeConfig(
        depth=options.depth or preset.depth,
        top_k=options.top_k or preset.top_k,
        checkpoints=checkpoints if config.gated else (),
        thresholds=thresholds,
        sample=options.sample_drafts,
        temperature=options.draft_temperature,
        seed=options.seed,
    )
    drafters: list[Drafter] = [DraftModelDrafter(draft_model, draft_config, target_vocab=vocab)]
    planner = StagePlanner(config)
    matrix = calibration.matrix if calibration is not None else SuccessorMatrix(vocab, k)
    if config.retrieval is not None:
        # graft-tail fills its template in the composer, but the matrix learns through this drafter
        drafters.append(GraftRetrieval(vocab, planner, matrix))
    return drafters, GraftComposer(config, planner, matrix)


def build_from_method_options(variant: str, vocab: int, options: Any) -> tuple[list[Drafter], GraftComposer]:
    """``MethodSpec.build`` for a Graft variant: reads ``options.graft`` (a :class:`GraftOptions`)."""
    return build_graft_method(variant, vocab, options.graft)


def register_graft_methods(methods: dict) -> None:
    """Add ``draft-tree`` and the Graft variants to a ``{name: MethodSpec}`` registry."""
    from specgraft.methods import MethodSpec

    for name, summary in GRAFT_METHODS.items():
        methods[name] = MethodSpec(name, summary, partial(build_from_method_options, name))
