"""The method registry: a method name -> the drafters and composer that make it.

Adding a method means adding an entry here (its build function, its default budget) and its
drafter/composer modules, never editing the engine.

>>> method_names()  # doctest: +NORMALIZE_WHITESPACE
['adapld', 'adapld-full', 'adapld-no-branches', 'adapld-no-fallback', 'adapld-no-successor', 'adapld-rerank-only',
 'ar', 'draft-tree', 'graft', 'graft-fixed', 'graft-prune', 'graft-root', 'graft-tail', 'pld', 'ptd', 'reader', 'reader-search',
 'reader-trie', 'reader-widen', 'recycling']
>>> METHODS["graft"].default_budget, METHODS["graft"].needs_draft_model
(8, True)

The CLI reads this module at start-up (``--method`` help), so it imports no torch: each build
function imports its drafters when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import specgraft.methods.model_free as model_free
from specgraft.methods.graft import (
    GRAFT_METHODS, build_from_method_options, check_calibration_budget, check_graft_options, require_draft_model,
)
from specgraft.methods.options import MethodOptions
from specgraft.methods.reader import READER_METHODS, build_reader, needs_draft_model, reader_shape, reads_datastores

if TYPE_CHECKING:
    from torch import nn

    from specgraft.composers.base import Composer
    from specgraft.drafters.base import Drafter
    from specgraft.models.base import TargetModel

#: Nodes verified per step when the user gives no budget and no cost table applies, and the
#: anchor a derived budget moves from (``budget/defaults.py``); every run records the budget
#: it used.
#: Measured on the 2-core AVX2 host (fp32, prepacked oneDNN linears), where a 1.5B verify pass
#: costs ~0.37 s for one row, 0.42 s for 2, 0.55 s for 4, 0.64 s for 8 and 0.85 s for 16, so a
#: node pays only if the target accepts it more than ~10% of the time.
#:
#: - ``pld``: 16, a cap. It proposes only nodes whose estimated acceptance is >= 0.1
#:   (``PLDConfig.min_prob``), so long copies may run deep and weak matches cost one row or none;
#:   a teacher-forced simulation over held-out outputs predicted the same speed at caps 8-24.
#: - ``recycling``: 4. Its template is the budget's most promising nodes (``tree/templates.py``).
#:   On held-out prompts with a warmed-up matrix (64 tokens), budget 4 reached MAT 1.14 / 1.73 /
#:   1.33 on mt_bench / summarization / math against 1.07 / 1.42 / 1.21 at budget 2, in about the
#:   same time; the row-cost model rates budgets 2-4 alike.
#: - ``ptd``: 8 (mt_bench 0.94x, MAT 1.25; 0.87x at 4, 0.78x at 12).
#: - draft-model methods: their preset's budget (cpu: 8, ``drafters/draft_model/``); ``draft-tree``
#:   its preset's ``long_budget`` (cpu: 16, a cap: past 8 nodes only confident ones, *Long chains*).
#:
#: On a GPU, where verifying 60 nodes costs about one step, pass the papers' budgets
#: (``--preset gpu`` for the draft-model methods).
DEFAULT_BUDGETS: dict[str, int] = {
    "ar": 1,  # no drafters: the budget is never used
    "pld": 16,
    "recycling": 4,
    "ptd": 8,
    "draft-tree": 16,
    "graft-prune": 8,
    "graft-fixed": 8,
    "graft-root": 8,
    "graft-tail": 8,
    "graft": 8,
    # AdaPLD proposes only nodes with estimated acceptance >= 0.1, like pld: the budget is a cap
    "adapld": 16,
    "adapld-rerank-only": 16,
    "adapld-no-fallback": 16,
    "adapld-no-branches": 16,
    "adapld-no-successor": 16,
    # the paper's whole tree: a 30-token copy, 8 branches, 8 successors
    "adapld-full": 46,
    # READER's B_tokens: draft-tree's 16 draft nodes (cpu preset) + a 6-token widening + a 2-token
    # deepening path (ReaderConfig; retrieved rows are cheap to draft but cost verify rows like any
    # other); fixed_budget computes them from the run's preset and --reader-shape
    "reader": 24,
    "reader-widen": 22,
    "reader-trie": 24,
    # retrieval only: a retrieved tree of 16 nodes
    "reader-search": 16,
}

#: ablation -> the method whose measured gains stand for its own (``MethodSpec.gains_from``): the
#: AdaPLD ablations propose subsets of AdaPLD's tree, the Graft ablations Graft's
GAINS_FROM = {
    "adapld-rerank-only": "adapld", "adapld-no-fallback": "adapld", "adapld-no-branches": "adapld",
    "adapld-no-successor": "adapld", "graft-fixed": "graft", "graft-root": "graft", "graft-tail": "graft",
}

Build = Callable[..., "tuple[list[Drafter], Composer]"]


@dataclass(frozen=True)
class MethodSpec:
    name: str
    summary: str
    build: Build
    """``build(target, options, draft_model=None) -> (drafters, composer)``: ``target`` is the
    loaded :class:`~specgraft.models.base.TargetModel` (its vocabulary, device, embeddings);
    ``draft_model`` an already loaded draft model (methods with ``needs_draft_model``; the
    others ignore it)."""
    default_budget: int
    """Nodes verified per step when the user gives no budget (see ``DEFAULT_BUDGETS``)."""
    needs_draft_model: bool = False
    """Whether the method drafts with a separate model (``--draft-model``)."""
    needs_hidden_states: bool = False
    """Whether its drafters read the target's hidden states and input embeddings (AdaPLD's
    semantic fallback and reranking), which only the ``hf`` backend returns."""
    reads_datastores: bool = False
    """Whether it searches ``MethodOptions.datastores`` (READER's variants with a datastore)."""
    gains_from: str | None = None
    """The method whose measured budget gains (``specgraft/data/budget_gains.json``) stand for this
    one's: the AdaPLD ablations read AdaPLD's (they propose subsets of its tree), the Graft
    ablations Graft's; None: its own (or none measured)."""
    budget_check: Callable[[MethodOptions, int], None] | None = None
    """``ValueError`` for a budget the method cannot run at under these options (a gated Graft
    variant whose calibrated thresholds were fitted at another budget); None: any budget."""

    def check_budget(self, options: MethodOptions, budget: int) -> None:
        """``ValueError`` when the method cannot verify ``budget`` nodes under ``options``."""
        if self.budget_check is not None:
            self.budget_check(options, budget)

    def check_backend(self, backend: str) -> None:
        """``ValueError`` when the method cannot run on ``backend`` (``hf`` or ``llamacpp``).

        >>> METHODS["adapld"].check_backend("llamacpp")
        Traceback (most recent call last):
        ...
        ValueError: method 'adapld' reads the target's hidden states and input embeddings, which the llama.cpp backend does not return; use --backend hf
        """
        if backend != "hf" and self.needs_hidden_states:
            raise ValueError(
                f"method {self.name!r} reads the target's hidden states and input embeddings, which the llama.cpp backend "
                "does not return; use --backend hf"
            )

    def check(self, options: MethodOptions, draft_model: nn.Module | None = None) -> None:
        """``ValueError`` for what ``options`` lack before any model is loaded (e.g. a draft model)."""
        if self.name in READER_METHODS:
            if self.needs_draft_model:
                require_draft_model(self.name, options.graft, draft_model)
            if reads_datastores(self.name):
                from specgraft.retrieval.datastore import read_manifest

                for path in options.datastores:
                    read_manifest(path)  # ValueError naming a missing or broken datastore
        elif self.needs_draft_model:
            check_graft_options(self.name, options.graft, draft_model)


def _spec(name: str, summary: str, build: Build, **capabilities: Any) -> MethodSpec:
    return MethodSpec(name, summary, build, DEFAULT_BUDGETS[name], **capabilities)


def _graft_budget_check(variant: str) -> Callable[[MethodOptions, int], None]:
    return lambda options, budget: check_calibration_budget(variant, options.graft, budget)


METHODS: dict[str, MethodSpec] = {
    spec.name: spec
    for spec in (
        _spec("ar", "plain autoregressive decoding through the same adapter (the baseline)", model_free.build_ar),
        _spec("pld", "prompt lookup: copies of earlier spans of prompt + output, branches as a tree", model_free.build_pld),
        _spec(
            "recycling", "Token Recycling: top-k successor matrix refreshed from the target's logits, static template",
            model_free.build_recycling,
        ),
        _spec(
            "ptd", "Progressive Tree Drafting: the target drafts for itself from a perturbation tree fed in the same pass",
            model_free.build_ptd,
        ),
        *(
            _spec(name, summary, partial(model_free.build_adapld, name), needs_hidden_states=True, gains_from=GAINS_FROM.get(name))
            for name, (summary, _) in model_free.ADAPLD_METHODS.items()
        ),
        *(
            _spec(name, summary, partial(build_from_method_options, name), needs_draft_model=True, budget_check=_graft_budget_check(name),
                  gains_from=GAINS_FROM.get(name))
            for name, summary in GRAFT_METHODS.items()
        ),
        *(
            _spec(name, summary, partial(build_reader, name), needs_draft_model=needs_draft_model(name), reads_datastores=reads_datastores(name))
            for name, (summary, _, _) in READER_METHODS.items()
        ),
    )
}
assert set(METHODS) == set(DEFAULT_BUDGETS), f"default budgets for {sorted(DEFAULT_BUDGETS)}, methods {sorted(METHODS)}"


def register(spec: MethodSpec) -> MethodSpec:
    """Add a method to the registry (a plugin's, or a test's toy method) and return it; every
    command, the API and the registry-wide tests (``tests/lossless/test_lossless_registry.py``) then know
    it. ``ValueError`` for a name already taken."""
    if spec.name in METHODS:
        raise ValueError(f"method {spec.name!r} is already registered")
    METHODS[spec.name] = spec
    DEFAULT_BUDGETS[spec.name] = spec.default_budget
    return spec


def unregister(name: str) -> None:
    """Remove a method :func:`register` added (``KeyError`` for an unknown one)."""
    del METHODS[name]
    del DEFAULT_BUDGETS[name]


def get_method(name: str) -> MethodSpec:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(sorted(METHODS))}")
    return METHODS[name]


def default_method(options: MethodOptions, draft_model: Any = None) -> str:
    """The method a run uses when it names none: ``draft-tree`` when a draft model is given
    (``options.graft.draft_model``, or an already loaded ``draft_model``), else ``pld``.

    Neither needs warm-up state: ``pld`` drafts from the prompt and output alone (``recycling``,
    the earlier default, measured 0.98x plain decoding with a cold successor matrix on the 2-core
    CPU, below ``pld``), and ``draft-tree`` is the plain draft-model tree (no calibration file).

    >>> from specgraft.methods import GraftOptions
    >>> default_method(MethodOptions()), default_method(MethodOptions(graft=GraftOptions(draft_model="qwen2.5-coder-0.5b-instruct")))
    ('pld', 'draft-tree')
    """
    has_draft = draft_model is not None or options.graft.draft_model is not None
    return "draft-tree" if has_draft else "pld"


def method_budget(name: str, options: MethodOptions) -> int:
    """Nodes verified per step when a generation gives no budget: the budget derived from
    ``options.cost_table`` (:func:`derived_budget`) where that applies; else READER's tree shape
    (``options.reader.budget``), a Graft variant's preset budget, else ``DEFAULT_BUDGETS``.

    >>> fixed = MethodOptions(cost_table=None)
    >>> method_budget("graft", fixed), method_budget("reader", fixed), method_budget("pld", fixed)
    (8, 24, 16)
    """
    derived = derived_budget(name, options)
    if derived is not None:
        return derived.budget
    return fixed_budget(name, options)


def fixed_budget(name: str, options: MethodOptions) -> int:
    """The budget a method verifies without a cost table (the hand-fitted defaults)."""
    spec = get_method(name)
    if name in READER_METHODS:
        return reader_shape(name, options).budget
    if spec.needs_draft_model:
        from specgraft.methods.graft import preset_budget

        return preset_budget(options.graft, name)
    return spec.default_budget


#: Prompt lookup: each step proposes only the nodes whose estimated acceptance passes the cut,
#: so the budget is a cap that binds on long, confident copies, the steps where extra rows pay
#: most. A cap derived from gains averaged over prompts without such copies cuts them: on the
#: 2-core Zen 3, input-guided prompts ran 15% slower with ``pld`` at the derived 4 than at 16 and
#: 26% slower with ``adapld`` at 2 (``benchmarks/RESULTS.md``, "Prompt lookup keeps its cap").
PROMPT_LOOKUP_METHODS = frozenset({"pld", *model_free.ADAPLD_METHODS})


def derived_budget(name: str, options: MethodOptions):
    """:class:`~specgraft.budget.defaults.DerivedBudget` of ``name`` from
    ``options.cost_table``, or None where the fixed default applies: no table (None, or
    ``"auto"`` not resolved yet), prompt lookup (``PROMPT_LOOKUP_METHODS``: its cut decides the
    rows of each step), no measured gains for the method (``ar``, READER), or a
    draft-model method whose tree differs from the one the gains were measured with (another
    preset, depth, top-k, extension or early stop) or that gates on a Graft calibration fitted at the preset's budget."""
    spec = get_method(name)
    if options.cost_table in (None, "auto") or name in READER_METHODS:
        return None

    from specgraft.budget.costs import CostTable
    from specgraft.budget.acceptance import budget_gains, gains_meta
    from specgraft.budget.defaults import derive_budget

    if name in PROMPT_LOOKUP_METHODS:
        CostTable.load(options.cost_table)  # a broken table is an error, whatever the method
        return None

    if spec.needs_draft_model:
        from specgraft.drafters.draft_model import get_preset
        from specgraft.methods.graft import long_chains

        g, meta = options.graft, gains_meta()
        preset = get_preset(g.preset)
        extend = preset.extend if g.extend is None else g.extend
        stop_min = preset.stop_min if g.stop_min is None else g.stop_min
        if g.calibration or g.depth or g.top_k or g.preset != meta.get("preset", "cpu") or extend != meta.get("extend", 0):
            return None
        if long_chains(name, g):
            return None  # long chains: its budget is a cap on confident nodes, not a row count the gains measured
        if stop_min != meta.get("stop_min", 0.0) or (preset.expand if g.expand is None else g.expand) != meta.get("expand"):
            return None
    return derive_budget(
        name, CostTable.load(options.cost_table), gains=budget_gains(name, spec.gains_from), table=Path(options.cost_table).name,
        anchor=fixed_budget(name, options),
    )


def method_names() -> Sequence[str]:
    return sorted(METHODS)


def build_method(name: str, target: TargetModel, options: MethodOptions | None = None, draft_model: Any = None):
    """``(drafters, composer)`` of method ``name`` for ``target`` (``options`` None: the defaults;
    not a default argument, whose construction would import every drafter, and torch, with this
    module)."""
    return get_method(name).build(target, options if options is not None else MethodOptions(), draft_model)
