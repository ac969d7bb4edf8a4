"""Registry entries for the draft-model tree and Graft's variants (``methods.METHODS`` lists them).

``MethodOptions`` carries a :class:`GraftOptions` (plain, JSON-able data: a run prints it). The
draft model is named there (catalog name, local directory or Hugging Face id), or passed
already loaded: ``SpecDecoder`` loads it once (on the target's device) and hands it to every
decoder made with ``with_method``, and the benchmark passes the model it loaded for
``hf-assisted``. Each drafter has its own cache slots over the shared weights.

    >>> sorted(GRAFT_METHODS)
    ['draft-tree', 'graft', 'graft-fixed', 'graft-prune', 'graft-root', 'graft-tail']

Building by hand, with a model already loaded::

    target = HFTarget(target_model)
    drafters, composer = build_graft_method("graft", target, GraftOptions(calibration="c.json"), draft_model=model)
    engine = SpecEngine(target, drafters, composer, method="graft")

This module is imported by the registry, which the CLI reads at start-up: torch, transformers
and the drafter modules are imported where they are used, not here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from specgraft.methods.calibration_file import Calibration
    from specgraft.composers.graft import GraftComposer
    from specgraft.drafters.base import Drafter
    from specgraft.drafters.draft_model import DraftTreeConfig
    from specgraft.models.base import TargetModel

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
    """dtype the draft model is loaded in (``auto``: float32 on CPUs, bfloat16 on GPUs, see
    ``models/kernels.py``); it is always loaded on the target's device."""
    draft_quant: str = "auto"
    """Numerics of the draft model only (the target is never changed, so outputs are too):
    ``int8`` (dynamic quantization of its linears, CPU), ``bf16``, ``fp16``, ``none`` (``draft_dtype``),
    or ``auto``: int8 on CPU, bf16 on a GPU (``models/quant.py``; measured in the README)."""
    preset: str = "cpu"
    """``cpu`` (depth 4, top-k 2, checkpoints 0/1/2, budget 8; ``draft-tree`` 16 with long chains,
    :func:`long_chains`) or ``gpu`` (the paper: depth 8,
    top-k 10, checkpoints 0/1/5, budget 60); see ``PRESETS`` in ``drafters/draft_model/``. A
    generation that gives no budget verifies the preset's (:func:`preset_budget`)."""
    depth: int | None = None
    """Override the preset's draft depth (draft forwards per step)."""
    top_k: int | None = None
    """Override the preset's top-k."""
    expand: int | None = None
    """Override the nodes the tree expands per layer (``DraftTreeConfig.expand``; the preset's
    when None, and ``top_k`` when the preset gives none)."""
    extend: int | None = None
    """Override the preset's extension: one-row draft forwards that continue the best path past
    the depth while the draft stays confident (``DraftTreeConfig.extend``; 0 = off). A value given
    here also turns off ``draft-tree``'s long chains (:func:`long_chains`)."""
    extend_min: float | None = None
    """Override the path probability an extension needs to continue (``DraftTreeConfig.extend_min``)."""
    stop_min: float | None = None
    """Override the path probability below which the tree stops drafting deeper layers
    (``DraftTreeConfig.stop_min``; 0 = always the full depth)."""
    extend_adapt: bool | None = None
    """Override whether each sequence's extension adapts to its accepted chains (``DraftTreeConfig.extend_adapt``)."""
    tree_budget: int | None = None
    """Override the nodes a step keeps by path score alone when its budget is larger; past it
    only confident nodes (``DraftTreeConfig.tree_budget``; None: the preset's ``budget`` where
    :func:`long_chains` applies, else no such cut)."""
    row_cost: float | None = None
    """Override the cost-aware cut of the tree's kept nodes: one more verified row's cost as a
    fraction of a step that verifies none (``DraftTreeConfig.row_cost``; 0 = no cut; None: the
    preset's ``long_row_cost`` where :func:`long_chains` applies, else no cut)."""
    copy_ahead: int | None = None
    """Override the rows an extension forward guesses from the context (``DraftTreeConfig.copy_ahead``;
    0 = off; None = the preset's): the same chains in fewer draft forwards where the answer copies."""
    calibration: str | None = None
    """Calibration JSON from ``specgraft calibrate`` (thresholds + warmed-up successor matrix)."""
    thresholds: tuple[float, ...] | None = None
    """Override ``tau_d`` per checkpoint (else the calibration's, else the preset's uncalibrated defaults)."""
    sample_drafts: bool = False
    """In sampling generations, draw draft children i.i.d. from the draft distribution (shaped
    by the generation's temperature, top-k and top-p) so that they are verified by rejection
    sampling (more accepted tokens than sample-and-match, equally exact). Greedy decoding
    never reads draft probabilities and drafts the top-k; :func:`with_sampled_drafts` refuses it."""
    seed: int = 0
    """Offset of the draft sampler's seed from the generation's sampling seed (sampled drafts
    only; a generation without a seed gets a fresh random draft seed)."""

    def __post_init__(self) -> None:
        from specgraft.drafters.draft_model import get_preset
        from specgraft.models.quant import check_draft_quant

        get_preset(self.preset)
        check_draft_quant(self.draft_quant)
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0 (an offset from the sampling seed), got {self.seed!r}")
        for name in ("depth", "top_k"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.extend is not None and (not isinstance(self.extend, int) or self.extend < 0):
            raise ValueError(f"extend must be an integer >= 0, got {self.extend!r}")
        if self.row_cost is not None and not self.row_cost >= 0.0:
            raise ValueError(f"row_cost must be >= 0 (0 = no cut), got {self.row_cost!r}")
        if self.copy_ahead is not None and (not isinstance(self.copy_ahead, int) or self.copy_ahead < 0):
            raise ValueError(f"copy_ahead must be an integer >= 0 (0 = off), got {self.copy_ahead!r}")
        if self.thresholds is not None:
            object.__setattr__(self, "thresholds", tuple(float(t) for t in self.thresholds))


#: What each variant does (Graft section 4 and its ablations): whether the drafter stops at
#: calibrated checkpoints, where retrieved nodes hang, and which drafted/retrieved split a step
#: uses (:class:`~specgraft.composers.graft.GraftConfig`).
GRAFT_BEHAVIOUR: dict[str, dict[str, Any]] = {
    "draft-tree": {"gated": False, "retrieval": None, "split": "checkpoint"},
    "graft-prune": {"gated": True, "retrieval": None, "split": "checkpoint"},
    "graft-fixed": {"gated": False, "retrieval": "root", "split": "fixed"},
    "graft-root": {"gated": False, "retrieval": "root", "split": "branch"},
    "graft-tail": {"gated": False, "retrieval": "tail", "split": "branch"},
    "graft": {"gated": True, "retrieval": "root", "split": "checkpoint"},
}


def graft_config(variant: str, **fields: Any):
    """The :class:`~specgraft.composers.graft.GraftConfig` of ``variant`` (``fields`` override
    the others, e.g. ``k``); ``ValueError`` for an unknown variant.

    >>> c = graft_config("graft-tail", k=4)
    >>> c.gated, c.retrieval, c.fixed, c.k
    (False, 'tail', 2, 4)
    """
    from specgraft.composers.graft import GraftConfig

    if variant not in GRAFT_BEHAVIOUR:
        raise ValueError(f"unknown Graft variant {variant!r}; choose one of {', '.join(GRAFT_BEHAVIOUR)}")
    return GraftConfig(variant=variant, **GRAFT_BEHAVIOUR[variant], **fields)


def long_chains(variant: str, options: GraftOptions) -> bool:
    """Whether ``variant`` drafts long chains (*Long chains* in ``drafters/draft_model/``): its
    preset has a ``long_budget``, it is ``draft-tree`` (the ungated tree; the Graft variants
    share their budget with gates and retrieval, calibrated at ``budget``) and ``options`` set
    no extension of their own (an explicit ``extend`` drafts the plain tree of that extension).

    >>> long_chains("draft-tree", GraftOptions()), long_chains("graft", GraftOptions()), long_chains("draft-tree", GraftOptions(extend=8))
    (True, False, False)
    """
    from specgraft.drafters.draft_model import get_preset

    return variant == "draft-tree" and get_preset(options.preset).long_budget is not None and options.extend is None


def preset_budget(options: GraftOptions, method: str | None = None) -> int:
    """Nodes verified per step by ``draft-tree`` and the Graft variants when the generation
    gives no budget: the preset's (``PRESETS[name].budget``; ``long_budget`` for ``draft-tree``
    where the preset has one, past ``budget`` confident nodes only).

    >>> preset_budget(GraftOptions()), preset_budget(GraftOptions(), "draft-tree"), preset_budget(GraftOptions(preset="gpu"), "draft-tree")
    (8, 16, 60)
    """
    from specgraft.drafters.draft_model import get_preset

    preset = get_preset(options.preset)
    return preset.long_budget if method is not None and long_chains(method, options) else preset.budget


def with_sampled_drafts(options: GraftOptions, temperature: float) -> GraftOptions:
    """``options`` drafting by sampling (``--sample-drafts``) for a generation at ``temperature``;
    each sequence's draft sampler is seeded from the generation's sampling seed
    (``DraftModelDrafter.begin``).

    >>> with_sampled_drafts(GraftOptions(), 0.7).sample_drafts
    True
    >>> with_sampled_drafts(GraftOptions(), 0.0)
    Traceback (most recent call last):
    ValueError: --sample-drafts needs --temperature > 0: greedy decoding verifies by argmax and never reads draft probabilities
    """
    if not temperature > 0:
        raise ValueError(
            "--sample-drafts needs --temperature > 0: greedy decoding verifies by argmax and never reads draft probabilities"
        )
    return replace(options, sample_drafts=True)


def reads_calibration(variant: str) -> bool:
    """Whether ``variant`` uses a calibration: its thresholds (gated variants) or its warmed-up
    successor matrix (retrieval variants). ``draft-tree`` has neither and ignores the file."""
    config = graft_config(variant)
    return config.gated or config.retrieval is not None


def require_draft_model(variant: str, options: GraftOptions, draft_model: nn.Module | None) -> None:
    if draft_model is None and not options.draft_model:
        raise ValueError(f"method {variant!r} needs a draft model (--draft-model) sharing the target's tokenizer")


def check_graft_options(variant: str, options: GraftOptions, draft_model: nn.Module | None = None) -> None:
    """What can be checked before any model is loaded: a draft model is given or named, and
    the calibration file (if ``variant`` reads one) is readable and, if ``variant`` takes its
    thresholds from it, made for this run's draft settings. ``ValueError`` otherwise."""
    from specgraft.methods.calibration_file import load_calibration

    require_draft_model(variant, options, draft_model)
    if options.calibration and reads_calibration(variant):
        calibration = load_calibration(options.calibration)
        if uses_calibrated_thresholds(variant, options):
            check_calibration_draft(options, calibration)


def uses_calibrated_thresholds(variant: str, options: GraftOptions) -> bool:
    """Whether ``variant`` gates on the calibration file's thresholds (gated, file given, no override)."""
    return graft_config(variant).gated and bool(options.calibration) and options.thresholds is None


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
    from specgraft.methods.calibration_file import load_calibration

    if uses_calibrated_thresholds(variant, options):
        check_calibration_draft(options, load_calibration(options.calibration), budget)


#: A calibration's recorded ``draft_quant`` -> what its draft computed in (``none``: the draft's
#: dtype, float32 wherever calibrations have been made so far: CPUs)
_QUANT_NUMERICS = {"int8": "int8", "int8-tensor": "int8", "bf16": "bfloat16", "fp16": "float16", "none": "float32"}


def calibration_numerics_warning(calibration: Calibration, numerics: str, path: str | None = None) -> str | None:
    """A one-line warning when ``calibration`` was measured with a draft in other numerics than
    ``numerics`` (:func:`~specgraft.models.quant.draft_numerics` of this run's draft), else None.

    A warning, not an error: outputs stay the target's whatever the thresholds, but they were fitted
    to that draft's confidences and its cost per forward, both of which change with its numerics
    (an int8 draft is ~2.4x cheaper than fp32 on this CPU). Files from before ``--draft-quant``
    record none and were made with a float32 draft.

    >>> from types import SimpleNamespace
    >>> cal = SimpleNamespace(meta={"draft_quant": "int8"})  # a Calibration's meta, as calibrate writes it
    >>> calibration_numerics_warning(cal, "int8") is None
    True
    >>> print(calibration_numerics_warning(cal, "float32", "c.json"))
    warning: calibration 'c.json' was fitted with an int8 draft, this run drafts in float32: its thresholds may not fit; calibrate with --draft-quant none
    """
    made = calibration.meta.get("draft_quant") or "none"
    made_numerics = _QUANT_NUMERICS.get(made, made)
    if made_numerics == numerics:
        return None
    flag = {v: k for k, v in _QUANT_NUMERICS.items()}.get(numerics, numerics)
    return (
        f"warning: calibration {path or ''!r} was fitted with an {made_numerics} draft, this run drafts in {numerics}: "
        f"its thresholds may not fit; calibrate with --draft-quant {flag}"
    )


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


def draft_tree_config(
    variant: str, options: GraftOptions, checkpoints: tuple[int, ...] = (), thresholds: tuple[float, ...] | None = None
) -> DraftTreeConfig:
    """The draft tree ``variant`` drafts under ``options``: the preset's shape with ``options``'
    overrides, and for ``draft-tree`` the preset's long chains and their cost-aware cut
    (:func:`long_chains`); ``checkpoints`` and ``thresholds`` are a gated variant's. READER
    drafts with ``draft-tree``'s (``methods/reader.py``).

    >>> c = draft_tree_config("draft-tree", GraftOptions())
    >>> (c.depth, c.top_k, c.extend, c.tree_budget, c.row_cost, c.copy_ahead)
    (4, 2, 12, 8, 0.05, 7)
    >>> c = draft_tree_config("graft", GraftOptions())
    >>> (c.extend, c.tree_budget, c.row_cost)
    (8, None, None)
    """
    from specgraft.drafters.draft_model import DraftTreeConfig, get_preset

    preset = get_preset(options.preset)
    long = long_chains(variant, options)
    return DraftTreeConfig(
        depth=options.depth or preset.depth,
        top_k=options.top_k or preset.top_k,
        expand=preset.expand if options.expand is None else options.expand,
        extend=(preset.long_extend or preset.extend if long else preset.extend) if options.extend is None else options.extend,
        **({} if options.extend_min is None else {"extend_min": options.extend_min}),
        stop_min=preset.stop_min if options.stop_min is None else options.stop_min,
        **({} if options.extend_adapt is None else {"extend_adapt": bool(options.extend_adapt)}),
        tree_budget=(preset.budget if long else None) if options.tree_budget is None else options.tree_budget,
        row_cost=(preset.long_row_cost if long else None) if options.row_cost is None else options.row_cost or None,
        copy_ahead=preset.copy_ahead if options.copy_ahead is None else options.copy_ahead,
        checkpoints=checkpoints,
        thresholds=thresholds,
        sample=options.sample_drafts,
        seed=options.seed,
    )


def build_graft_method(
    variant: str,
    target: TargetModel,
    options: GraftOptions,
    draft_model: nn.Module | None = None,
    target_tokenizer: PreTrainedTokenizerBase | None = None,
    learning: str = "request",
) -> tuple[list[Drafter], GraftComposer]:
    """Drafters and composer of ``variant`` (one of ``GRAFT_METHODS``) for ``target``.

    ``draft_model`` is used when given, else ``options.draft_model`` is loaded on the target's
    device; pass the target's tokenizer as ``target_tokenizer`` so that loading checks the two
    vocabularies map every token to the same id (:func:`~specgraft.models.loading.load_draft_model`).
    Without it only the vocabulary sizes are compared. ``MethodSpec.build`` has no tokenizer to
    pass, so :class:`~specgraft.api.SpecDecoder` loads the draft model itself, with the check,
    before building. ``learning`` is ``MethodOptions.learning`` (the successor matrix's policy).
    """
    from specgraft.methods.calibration_file import load_calibration
    from specgraft.composers.graft import GraftComposer, GraftConfig, StagePlanner
    from specgraft.drafters.base import Learning
    from specgraft.drafters.draft_model import DraftModelDrafter, get_preset
    from specgraft.drafters.graft_retrieval import GraftRetrieval
    from specgraft.drafters.recycling import SuccessorMatrix
    from specgraft.models.loading import load_draft_model

    if variant not in GRAFT_BEHAVIOUR:
        raise ValueError(f"unknown Graft variant {variant!r}; choose one of {', '.join(GRAFT_BEHAVIOUR)}")
    vocab = target.vocab_size
    if draft_model is None:
        require_draft_model(variant, options, draft_model)
        draft_model = load_draft_model(
            options.draft_model, options.draft_dtype, target.device, target_tokenizer=target_tokenizer, quant=options.draft_quant
        )
    preset = get_preset(options.preset)
    calibration = None
    if options.calibration and reads_calibration(variant):
        calibration = load_calibration(options.calibration, vocab_size=vocab)
        if uses_calibrated_thresholds(variant, options):
            import sys

            from specgraft.models.quant import draft_numerics

            warning = calibration_numerics_warning(calibration, draft_numerics(draft_model), options.calibration)
            if warning:
                print(warning, file=sys.stderr)
    k = calibration.matrix.k if calibration is not None else GraftConfig().k
    config = graft_config(variant, k=k)
    checkpoints = preset.checkpoints[: len(config.draft_shares)]
    thresholds = gate_thresholds(variant, options, calibration) if config.gated else None
    draft_config = draft_tree_config(variant, options, checkpoints if config.gated else (), thresholds)
    drafters: list[Drafter] = [DraftModelDrafter(draft_model, draft_config, target_vocab=vocab)]
    planner = StagePlanner(config)
    if config.retrieval is not None:
        # graft-tail fills its template in the composer from this drafter's (per-sequence) matrix
        matrix = calibration.matrix if calibration is not None else SuccessorMatrix(vocab, k)
        drafters.append(GraftRetrieval(vocab, planner, matrix, Learning(learning)))
    return drafters, GraftComposer(config, planner)


def build_from_method_options(
    variant: str, target: TargetModel, options: Any, draft_model: nn.Module | None = None
) -> tuple[list[Drafter], GraftComposer]:
    """``MethodSpec.build`` for a Graft variant: reads ``options.graft`` (a :class:`GraftOptions`)."""
    return build_graft_method(variant, target, options.graft, draft_model, learning=options.learning)
