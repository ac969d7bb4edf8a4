"""The method knobs as a user gives them: :class:`MethodSettings`, one record of the flags
``generate``, ``serve``, ``datastore generate`` and ``bench`` share, that a bench run records in
``run.json`` and that resolves to the :class:`~specgraft.methods.options.MethodOptions` methods are
built with.

Settings hold what was asked (a shape file's path, a calibration's path, ``sample_drafts``);
options hold what it resolves to for a model, a dtype and a temperature (the loaded
``ReaderConfig``, draft children shaped by the temperature). Each field names its flag, so the
command line that reproduces a run comes from the record (:meth:`MethodSettings.flags`).

Example::

    >>> s = MethodSettings(draft_model="qwen2.5-coder-0.5b-instruct", draft_extend=8, datastores=["ds"])
    >>> s.flags()
    ['--draft-model', 'qwen2.5-coder-0.5b-instruct', '--draft-extend', '8', '--datastore', 'ds', '--cost-table', 'none']
    >>> s.options("qwen2.5-coder-1.5b-instruct", dtype="float32").graft.extend
    8
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from specgraft.methods.graft import GraftOptions, with_sampled_drafts
from specgraft.methods.options import LEARNING, MethodOptions
from specgraft.methods.reader import reader_config


def _flag(name: str, **extra: Any) -> dict[str, Any]:
    return {"flag": name, **extra}


@dataclass(frozen=True)
class MethodSettings:
    """Per-method knobs as flags and paths; every field is recorded with a bench run and compared
    when one is resumed (``bench.session.check_resume``)."""

    draft_model: str | None = field(default=None, metadata=_flag("--draft-model"))
    """Draft model (same tokenizer as the target) of ``draft-tree``, the Graft variants, READER
    and the ``hf-assisted`` / ``llama-speculative`` peers."""
    draft_quant: str = field(default="auto", metadata=_flag("--draft-quant"))
    """The draft model's numerics (``GraftOptions.draft_quant``)."""
    preset: str = field(default="cpu", metadata=_flag("--preset"))
    """Draft tree preset (``cpu`` or ``gpu``, ``drafters/draft_model/``)."""
    calibration: str | None = field(default=None, metadata=_flag("--calibration"))
    """Calibration JSON from ``specgraft calibrate`` for the Graft variants."""
    draft_depth: int | None = field(default=None, metadata=_flag("--draft-depth"))
    """Draft forwards per step (``GraftOptions.depth``); None = the preset's."""
    draft_top_k: int | None = field(default=None, metadata=_flag("--draft-top-k"))
    """Children per expanded draft node (``GraftOptions.top_k``); None = the preset's."""
    draft_extend: int | None = field(default=None, metadata=_flag("--draft-extend"))
    """Extension forwards past the depth (``GraftOptions.extend``); None = the preset's."""
    draft_stop_min: float | None = field(default=None, metadata=_flag("--draft-stop-min"))
    """Early stop of the draft tree (``GraftOptions.stop_min``); None = the preset's."""
    draft_row_cost: float | None = field(default=None, metadata=_flag("--draft-row-cost"))
    """Cost-aware cut of ``draft-tree``'s nodes (``GraftOptions.row_cost``); None = the preset's."""
    draft_copy_ahead: int | None = field(default=None, metadata=_flag("--draft-copy-ahead"))
    """Rows an extension forward guesses from the context (``GraftOptions.copy_ahead``); None = the preset's."""
    sample_drafts: bool = field(default=False, metadata=_flag("--sample-drafts"))
    """Sample draft children at the generation's temperature and verify them by rejection
    sampling (``GraftOptions.sample_drafts``; sampling only)."""
    recycling_state: str | None = field(default=None, metadata=_flag("--recycling-state"))
    """Successor matrix (.npz from ``specgraft warmup``) Token Recycling starts from."""
    learning: str = field(default="request", metadata=_flag("--learning"))
    """``request`` or ``shared`` (``MethodOptions.learning``)."""
    datastores: tuple[str, ...] = field(default=(), metadata=_flag("--datastore"))
    """Datastore directories the reader methods search (``MethodOptions.datastores``)."""
    reader_shape: str | None = field(default=None, metadata=_flag("--reader-shape"))
    """READER's tree shape file from ``specgraft tune`` (default: ``ReaderConfig``'s)."""
    row_cost: float | None = field(default=None, metadata=_flag("--row-cost"))
    """Relative cost of a verified row for ``pld``'s and AdaPLD's cost-aware pruning
    (``MethodOptions.row_cost``; the CLI resolves ``--row-cost auto`` from the cost table)."""
    cost_table: str | None = field(default=None, metadata=_flag("--cost-table", always=True))
    """Cost table the default budgets are derived from (``MethodOptions.cost_table``): a path,
    ``"auto"`` (resolved when a decoder loads) or None for the fixed defaults."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "datastores", tuple(str(p) for p in self.datastores))
        if self.learning not in LEARNING:
            raise ValueError(f"learning must be one of {', '.join(LEARNING)}, got {self.learning!r}")

    def options(self, model: str, dtype: str = "auto", temperature: float = 0.0) -> MethodOptions:
        """What the methods are built with for ``model`` (a shape file is checked against it),
        the draft model in ``dtype``, sampled drafts shaped by ``temperature``; ``ValueError``
        for what the options refuse (e.g. ``sample_drafts`` at temperature 0)."""
        graft = GraftOptions(
            draft_model=self.draft_model, draft_dtype=dtype, draft_quant=self.draft_quant, preset=self.preset, depth=self.draft_depth,
            top_k=self.draft_top_k, extend=self.draft_extend, stop_min=self.draft_stop_min, row_cost=self.draft_row_cost,
            copy_ahead=self.draft_copy_ahead, calibration=self.calibration,
        )
        if self.sample_drafts:
            graft = with_sampled_drafts(graft, temperature)
        return MethodOptions(
            recycling_state=self.recycling_state, graft=graft, learning=self.learning, datastores=self.datastores,
            reader=reader_config(self.reader_shape, model, self.draft_model, self.preset), row_cost=self.row_cost,
            cost_table=self.cost_table,
        )

    def flags(self) -> list[str]:
        """The command-line flags that give these settings (defaults left out; a repeated flag
        for each datastore; ``--cost-table none`` for no table, since the CLI's default is ``auto``)."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            value, flag = getattr(self, f.name), f.metadata["flag"]
            if isinstance(value, bool):
                out += [flag] if value else []
            elif isinstance(value, tuple):
                for item in value:
                    out += [flag, str(item)]
            elif value != f.default:
                out += [flag, str(value)]
            elif f.metadata.get("always"):
                out += [flag, "none" if value is None else str(value)]
        return out

    def record(self) -> dict[str, Any]:
        """The fields as ``run.json`` stores them (lists for tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The field names, e.g. to split a flat record into settings and the rest."""
        return tuple(f.name for f in dataclasses.fields(cls))
