"""Registry entries for the draft-model tree and Graft's variants (``methods.METHODS`` lists them).

``MethodOptions`` carries a :class:`GraftOptions` (plain, JSON-able data: a run prints it). The
draft model is named there (catalog name, local directory or Hugging Face id), or passed
already loaded: ``SpecDecoder`` loads it once and hands it to every decoder made with
``with_method``, and the benchmark passes the model it loaded for ``hf-assisted``. Each drafter
keeps its own KV cache over the shared weights.

    >>> sorted(GRAFT_METHODS)
    ['draft-tree', 'graft', 'graft-fixed', 'graft-prune', 'graft-root', 'graft-tail']

Building by hand, with a model already loaded::

    drafters, composer = build_graft_method("graft", target_vocab, GraftOptions(calibration="c.json"), draft_model=model)
    engine = SpecEngine(HFTarget(target_model), drafters, composer, method="graft")

This module is imported by the registry, which the CLI reads at start-up: torch, transformers
and the drafter modules are imported where they are used, not here.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from specgraft.calibrate import Calibration
    from specgraft.composers.graft import GraftComposer
    from specgraft.drafters.base import Drafter

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
    """Draft model: catalog name, local directory or Hugging Face id; must share the target's
    vocabulary. A loaded model passed as ``draft_model`` (``SpecDecoder``, ``MethodSpec.build``) is used instead."""
    draft_dtype: str = "auto"
    """dtype the draft model is loaded in (``auto``: float32 on CPUs without native bf16, see ``models/kernels.py``)."""
    device: str = "cpu"
    """Device the draft model is loaded on (the target's)."""
    preset: str = "cpu"
    """``cpu`` (depth 4, top-k 2, checkpoints 0/1/2, budget 8) or ``gpu`` (the paper: depth 8,
    top-k 10, checkpoints 0/1/5, budget 60); see ``PRESETS`` in ``drafters/draft_model.py``. A
    generation that gives no budget verifies the preset's (:func:`preset_budget`)."""
    depth: int | None = None
    """Override the preset's draft depth (draft forwards per step)."""
    top_k: int | None = None
    """Override the preset's top-k."""
    calibration: str | None = None
    """Calibration JSON from ``specgraft calibrate`` (thresholds + warmed-up successor matrix)."""
    thresholds: tuple[float, ...] | None = None
    """Override ``tau_d`` per checkpoint (else the calibration's, else the preset's uncalibrated defaults)."""
    sample_drafts: bool = False
    """Draw draft children i.i.d. from the draft distribution so sampling can use rejection
    sampling (more accepted tokens than sample-and-match, equally exact). Greedy decoding
    (temperature 0) never reads the draft probabilities; :func:`with_sampled_drafts` refuses it."""
    draft_temperature: float = 1.0
    """Temperature of the draft distribution (match the sampling temperature when sampling drafts)."""
    seed: int = 0
    """Seed of the draft sampler (sampling drafts only); keep it different from the sampling seed,
    so the draft's and the verifier's random streams are not the same numbers."""

    def __post_init__(self) -> None:
        from specgraft.drafters.draft_model import get_preset

        get_preset(self.preset)
        for name in ("depth", "top_k"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not (math.isfinite(self.draft_temperature) and self.draft_temperature > 0):
            raise ValueError(f"draft_temperature must be > 0, got {self.draft_temperature!r}")
        if self.thresholds is not None:
            object.__setattr__(self, "thresholds", tuple(float(t) for t in self.thresholds))


def preset_budget(options: GraftOptions) -> int:
    """Nodes verified per step by ``draft-tree`` and the Graft variants when the generation
    gives no budget: the preset's (``PRESETS[name].budget``).

    >>> preset_budget(GraftOptions()), preset_budget(GraftOptions(preset="gpu"))
    (8, 60)
    """
    from specgraft.drafters.draft_model import get_preset

    return get_preset(options.preset).budget


def with_sampled_drafts(options: GraftOptions, temperature: float, seed: int | None = None) -> GraftOptions:
    """``options`` drafting by sampling at the sampling ``temperature`` (``--sample-drafts``), the
    draft sampler seeded with ``seed + 1`` (``seed`` None: 0), never the sampling seed itself.

    >>> o = with_sampled_drafts(GraftOptions(), 0.7, seed=3)
    >>> o.sample_drafts, o.draft_temperature, o.seed
    (True, 0.7, 4)
    >>> with_sampled_drafts(GraftOptions(), 0.0)
    Traceback (most recent call last):
    ValueError: --sample-drafts needs --temperature > 0: greedy decoding verifies by argmax and never reads draft probabilities
    """
    if not temperature > 0:
        raise ValueError(
            "--sample-drafts needs --temperature > 0: greedy decoding verifies by argmax and never reads draft probabilities"
        )
    return replace(options, sample_drafts=True, draft_temperature=float(temperature), seed=0 if seed is None else seed + 1)


# Loaded draft models by (path, dtype, device), alive while a drafter uses them.
_loaded_models: "weakref.WeakValueDictionary[tuple[str, str, str], nn.Module]" = weakref.WeakValueDictionary()


def load_draft_model(
    name: str,
    dtype: str = "auto",
    device: str = "cpu",
    progress: bool = True,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
) -> nn.Module:
    """Load (or reuse, while loaded) a draft model by catalog name, directory or hub id, with the
    same loader and CPU kernels as the target (:func:`specgraft.models.hf.load_causal_lm`).

    With ``target_tokenizer``, the draft model's tokenizer must have the same vocabulary
    (``ValueError`` otherwise): equal vocabulary sizes alone would let two tokenizers that
    number their tokens differently pass. Without it, only the sizes are compared (when the
    drafter is built). A model that cannot be pulled or loaded raises
    :class:`~specgraft.models.catalog.ModelLoadError` naming it.
    """
    from transformers import AutoConfig

    from specgraft.models.catalog import load_errors, resolve_model
    from specgraft.models.hf import load_causal_lm, parse_dtype

    resolved = parse_dtype(dtype, device)
    path = resolve_model(name, progress=progress)
    with load_errors(name, "draft model"):
        AutoConfig.from_pretrained(path)  # cheap: "not a model" before the tokenizer check says something vaguer
    if target_tokenizer is not None:
        check_same_vocabulary(name, path, target_tokenizer)
    key = (str(path), str(resolved), str(device))
    model = _loaded_models.get(key)
    if model is None:
        with load_errors(name, "draft model"):
            model = load_causal_lm(path, resolved, device)
        _loaded_models[key] = model
    return model


def check_same_vocabulary(name: str, path: str, target_tokenizer: PreTrainedTokenizerBase) -> None:
    """``ValueError`` unless the tokenizer stored at ``path`` (draft model ``name``) maps every
    token to the same id as ``target_tokenizer``."""
    from transformers import AutoTokenizer

    try:
        draft_tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"draft model {name!r} has no tokenizer to compare with the target's ({e})") from e
    if draft_tokenizer.get_vocab() != target_tokenizer.get_vocab():
        raise ValueError(f"draft model {name!r} has a different vocabulary from the target's; it must use the target's tokenizer")


def reads_calibration(variant: str) -> bool:
    """Whether ``variant`` uses a calibration: its thresholds (gated variants) or its warmed-up
    successor matrix (retrieval variants). ``draft-tree`` has neither and ignores the file."""
    from specgraft.composers.graft import GraftConfig

    config = GraftConfig(variant=variant)
    return config.gated or config.retrieval is not None


def require_draft_model(variant: str, options: GraftOptions, draft_model: nn.Module | None) -> None:
    if draft_model is None and not options.draft_model:
        raise ValueError(f"method {variant!r} needs a draft model (--draft-model) sharing the target's tokenizer")


def check_graft_options(variant: str, options: GraftOptions, draft_model: nn.Module | None = None) -> None:
    """What can be checked before any model is loaded: a draft model is given or named, and
    the calibration file (if ``variant`` reads one) is readable and, if ``variant`` takes its
    thresholds from it, made for this run's draft settings. ``ValueError`` otherwise."""
    from specgraft.calibrate import load_calibration

    require_draft_model(variant, options, draft_model)
    if options.calibration and reads_calibration(variant):
        calibration = load_calibration(options.calibration)
        if uses_calibrated_thresholds(variant, options):
            check_calibration_draft(options, calibration)


def uses_calibrated_thresholds(variant: str, options: GraftOptions) -> bool:
    """Whether ``variant`` gates on the calibration file's thresholds (gated, file given, no override)."""
    from specgraft.composers.graft import GraftConfig

    return GraftConfig(variant=variant).gated and bool(options.calibration) and options.thresholds is None


def run_draft_settings(options: GraftOptions) -> dict[str, Any]:
    """Checkpoints, depth and top-k a Graft variant drafts with under ``options`` (preset + overrides)."""
    from specgraft.composers.graft import GraftConfig
    from specgraft.drafters.draft_model import get_preset

    preset = get_preset(options.preset)
    return {
        "checkpoints": tuple(preset.checkpoints[: len(GraftConfig().draft_shares)]),
        "depth": options.depth or preset.depth,
        "top_k": options.top_k or preset.top_k,
    }


def check_calibration_draft(options: GraftOptions, calibration: Calibration, budget: int | None = None) -> None:
    """``ValueError`` unless ``calibration``'s thresholds were fitted for the checkpoints, draft
    depth and top-k of this run (and its ``budget``, when given): thresholds tuned for one tree
    shape and budget do not carry over to another, so applying them would be silently wrong.
    An error rather than a warning: a warning scrolls past in a benchmark log, and the fix is
    cheap (calibrate with the same ``--preset``/``--budget``, or pass explicit thresholds)."""
    run = run_draft_settings(options)
    made = {"checkpoints": tuple(calibration.checkpoints), **{key: calibration.draft.get(key) for key in ("depth", "top_k")}}
    if budget is not None:
        run["budget"], made["budget"] = budget, calibration.draft.get("budget")
    # files that do not record a setting are only checked on the ones they do
    wrong = [key for key in run if made.get(key) is not None and made[key] != run[key]]
    if wrong:
        raise ValueError(
            f"calibration {options.calibration!r} was made for "
            + ", ".join(f"{key} {made[key]}" for key in wrong)
            + f", but this run (preset {options.preset!r}) uses "
            + ", ".join(f"{key} {run[key]}" for key in wrong)
            + "; calibrate with the run's --preset/--budget (specgraft calibrate), or give thresholds explicitly"
        )


def check_calibration_budget(variant: str, options: GraftOptions, budget: int) -> None:
    """``ValueError`` when ``variant`` would gate on a calibration's thresholds at a budget other
    than the one they were fitted at. Building a method does not know the budget (it is chosen
    per generation), so the code that resolves a run's budget calls this."""
    from specgraft.calibrate import load_calibration

    if uses_calibrated_thresholds(variant, options):
        check_calibration_draft(options, load_calibration(options.calibration), budget)


def gate_thresholds(variant: str, options: GraftOptions, calibration: Calibration | None) -> tuple[float, ...]:
    """``tau_d`` of a gated variant: ``options.thresholds``, else the calibration's (checked
    against this run's draft settings), else the preset's uncalibrated defaults, with a one-line
    warning on stderr."""
    import sys

    from specgraft.drafters.draft_model import get_preset

    if options.thresholds is not None:
        return options.thresholds
    if calibration is not None:
        check_calibration_draft(options, calibration)
        return calibration.thresholds_for(variant)
    preset = get_preset(options.preset)
    print(
        f"warning: {variant} uses the {options.preset} preset's uncalibrated thresholds {preset.thresholds} "
        "(no calibration file); `specgraft calibrate` fits them to this machine",
        file=sys.stderr,
    )
    return preset.thresholds


def build_graft_method(
    variant: str,
    vocab: int,
    options: GraftOptions,
    draft_model: nn.Module | None = None,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
) -> tuple[list[Drafter], GraftComposer]:
    """Drafters and composer of ``variant`` (one of ``GRAFT_METHODS``) for a target with ``vocab`` tokens.

    ``draft_model`` is used when given, else ``options.draft_model`` is loaded; pass the
    target's tokenizer as ``target_tokenizer`` so that loading checks the two vocabularies map
    every token to the same id (:func:`load_draft_model`). Without it only the vocabulary
    sizes are compared. ``MethodSpec.build`` has no tokenizer to pass, so
    :class:`~specgraft.api.SpecDecoder` loads the draft model itself, with the check, before building.
    """
    from specgraft.calibrate import load_calibration
    from specgraft.composers.graft import VARIANTS, GraftComposer, GraftConfig, GraftRetrieval, StagePlanner
    from specgraft.drafters.draft_model import DraftModelDrafter, DraftTreeConfig, get_preset
    from specgraft.drafters.recycling import SuccessorMatrix

    if variant not in VARIANTS:
        raise ValueError(f"unknown Graft variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if draft_model is None:
        require_draft_model(variant, options, draft_model)
        draft_model = load_draft_model(
            options.draft_model, options.draft_dtype, options.device, target_tokenizer=target_tokenizer
        )
    preset = get_preset(options.preset)
    calibration = None
    if options.calibration and reads_calibration(variant):
        calibration = load_calibration(options.calibration, vocab_size=vocab)
    k = calibration.matrix.k if calibration is not None else GraftConfig().k
    config = GraftConfig(variant=variant, k=k)
    checkpoints = preset.checkpoints[: len(config.draft_shares)]
    thresholds = gate_thresholds(variant, options, calibration) if config.gated else None
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


def build_from_method_options(
    variant: str, vocab: int, options: Any, draft_model: nn.Module | None = None
) -> tuple[list[Drafter], GraftComposer]:
    """``MethodSpec.build`` for a Graft variant: reads ``options.graft`` (a :class:`GraftOptions`)."""
    return build_graft_method(variant, vocab, options.graft, draft_model)
