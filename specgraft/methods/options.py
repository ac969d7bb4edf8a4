"""What a method is built with: :class:`MethodOptions`, the per-method knobs every run records
(each drafter's config, the Graft/READER options, datastores, row cost, cost table, learning).

Plain frozen data, importable without torch (the CLI builds one at start-up); each drafter's
config is created on first use by a factory that imports its module.

Example::

    >>> from specgraft.methods.options import MethodOptions
    >>> opts = MethodOptions(row_cost=0.1, datastores=["ds"])
    >>> opts.row_cost, opts.datastores, opts.learning
    (0.1, ('ds',), 'request')
    >>> MethodOptions(learning="forever")
    Traceback (most recent call last):
    ...
    ValueError: learning must be one of request, shared, got 'forever'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from specgraft.config import check_step_costs
from specgraft.methods.graft import GraftOptions

if TYPE_CHECKING:
    from specgraft.drafters.adapld import AdaPLDConfig
    from specgraft.drafters.pld import PLDConfig
    from specgraft.drafters.ptd import PTDConfig
    from specgraft.drafters.reader_retrieval import ReaderConfig
    from specgraft.drafters.recycling import RecyclingConfig

#: ``MethodOptions.learning`` values (``drafters.base.Learning``; no torch import here).
LEARNING = ("request", "shared")


def _pld_config() -> PLDConfig:
    from specgraft.drafters.pld import PLDConfig

    return PLDConfig()


def _adapld_config() -> AdaPLDConfig:
    from specgraft.drafters.adapld import AdaPLDConfig

    return AdaPLDConfig()


def _reader_config() -> ReaderConfig:
    from specgraft.drafters.reader_retrieval import ReaderConfig

    return ReaderConfig()


def _ptd_config() -> PTDConfig:
    from specgraft.drafters.ptd import PTDConfig

    return PTDConfig()


def _recycling_config() -> RecyclingConfig:
    from specgraft.drafters.recycling import RecyclingConfig

    return RecyclingConfig()


@dataclass(frozen=True)
class MethodOptions:
    """Per-method knobs: plain data, printed with every run. Unused fields are ignored by
    methods that don't read them."""

    pld: PLDConfig = field(default_factory=_pld_config)
    recycling: RecyclingConfig = field(default_factory=_recycling_config)
    recycling_state: str | None = None
    """``.npz`` successor matrix to start from (``specgraft warmup`` writes one)."""
    ptd: PTDConfig = field(default_factory=_ptd_config)
    """Width and depth limits, budget share and seed of PTD's perturbation draft tree."""
    adapld: AdaPLDConfig = field(default_factory=_adapld_config)
    """AdaPLD's copy length, branch width, semantic threshold and reranking layer (its variants
    switch components off, ``methods/model_free.py``)."""
    graft: GraftOptions = field(default_factory=GraftOptions)
    """Draft model, preset and calibration of ``draft-tree``, the Graft variants and READER."""
    reader: ReaderConfig = field(default_factory=_reader_config)
    """READER's tree shape: draft nodes, widening and deepening depths, search key length."""
    datastores: tuple[str, ...] = ()
    """Datastore directories (``specgraft datastore build``) that READER searches besides the
    trie of the sequence's own context; shared and read-only."""
    row_cost: float | None = None
    """Cost of one more verified row as a fraction of a one-row target step
    (``CostTable.row_cost``, ``--row-cost``): when set, ``pld`` and the AdaPLD methods cut their
    best-first trees where expected tokens per unit of cost peaks instead of at ``min_prob``
    alone (``tree.paths.cost_aware_subset``); it overrides ``pld.row_cost`` and ``adapld.row_cost``."""
    step_costs: tuple[float, ...] | None = None
    """Measured cost of verifying 1, 2, 3, ... rows in one-row forwards (``CostTable.step_costs``):
    when set, ``pld``'s and the AdaPLD methods' cut weighs the trees by it instead of by
    ``row_cost``'s line; it overrides ``pld.step_costs`` and ``adapld.step_costs``. The llama.cpp
    backend sets it from its cost table by default (``TargetModel.dear_rows``)."""
    cost_table: str | None = "auto"
    """Cost table (``specgraft profile``) that default budgets are derived from
    (``budget/defaults.py``): a path; ``"auto"``, resolved by :class:`~specgraft.api.SpecDecoder`
    and the bench to the measured or shipped table of the model on its device
    (``budget.costs.find_cost_table``), or None when there is none; None keeps the fixed
    ``DEFAULT_BUDGETS``. A generation that gives a budget uses it whatever this says."""
    learning: str = "request"
    """What a request learns (PLD's copy rates, the successor matrix of ``recycling`` and the
    Graft variants) is dropped at its end (``request``: every request starts from the shared
    state, nothing of one user's text reaches another's drafts) or kept for later requests
    (``shared``: opt-in, for one party's workload); see ``drafters/base.py``."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "datastores", tuple(str(p) for p in self.datastores))
        if self.recycling_state is not None and not Path(self.recycling_state).is_file():
            raise ValueError(f"recycling state {self.recycling_state!r} does not exist")
        if self.row_cost is not None and not self.row_cost >= 0.0:
            raise ValueError(f"row_cost must be >= 0, got {self.row_cost}")
        if self.step_costs is not None:
            object.__setattr__(self, "step_costs", tuple(float(c) for c in self.step_costs))
        check_step_costs(self.step_costs)
        if self.learning not in LEARNING:
            raise ValueError(f"learning must be one of {', '.join(LEARNING)}, got {self.learning!r}")
