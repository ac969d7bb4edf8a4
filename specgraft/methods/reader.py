"""READER and its ablations (``reader``, ``reader-widen``, ``reader-trie``): build functions.

READER = the ``draft-tree`` drafter, exactly as ``draft-tree`` drafts (the same
:func:`~specgraft.methods.graft.draft_tree_config`: the preset's shape, long chains with their
cost-aware cut and copy-ahead rows, and at most ``draft-tree``'s budget of nodes) +
:class:`~specgraft.drafters.reader_retrieval.ReaderRetrieval` (a trie per sequence, the
``--datastore`` suffix arrays shared) + :class:`~specgraft.composers.reader.ReaderComposer`,
which adds the retrieved widening and deepening paths to that tree. So READER's tree holds
``draft-tree``'s every step, and what READER adds over its base is the retrieval alone (the
paper's setting: a draft-model tree, widened and deepened). Until 2026-11-27 READER drafted a
bare depth-4 / top-k-2 tree of 8 nodes, which ``draft-tree`` had long outgrown on this CPU
(*READER on draft-tree's tree* in ``benchmarks/RESULTS.md``). The variants switch off deepening
(``reader-widen``) or the long-term datastore (``reader-trie``); ``draft-tree`` is the base.
``reader-search`` is the paper's retrieval-only setting ("Search + datastore"): no draft model,
a best-first tree retrieved from the trie and the datastores (``ReaderConfig.search_nodes``).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from specgraft.budget.policy import TunedBudget
    from specgraft.composers.reader import ReaderComposer
    from specgraft.drafters.base import Drafter
    from specgraft.drafters.reader_retrieval import ReaderConfig
    from specgraft.methods.options import MethodOptions
    from specgraft.models.base import TargetModel

#: name -> (summary, changes to ``ReaderConfig``, whether the datastores are read)
READER_METHODS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "reader": ("READER: draft-model tree widened by a retrieved path at the root and deepened from its best branch "
               "(trie of the context + --datastore suffix arrays)", {}, True),
    "reader-widen": ("READER without deepening (the widening path only)", {"d_deep": 0}, True),
    "reader-trie": ("READER without the long-term datastore (the short-term trie alone)", {}, False),
    "reader-search": ("READER's retrieval-only setting: a best-first tree retrieved from the trie and --datastore, no draft model",
                      {"draft_nodes": 0, "d_deep": 0}, True),
}

#: ``reader-search``'s tree when the shape (``--reader-shape``) sets no ``search_nodes``: 16 nodes,
#: up to 16 deep, no level answered on a one-token key (chosen a priori, not tuned)
RETRIEVAL_TREE = {"search_nodes": 16, "d_search": 16, "min_match": 2}


#: The READER variants ``specgraft tune`` fits: READER's three sizes, or the retrieved tree's.
TUNABLE = ("reader", "reader-search")


def reads_datastores(name: str) -> bool:
    return READER_METHODS[name][2]


def needs_draft_model(name: str) -> bool:
    """Whether READER variant ``name`` drafts with a model (every one but ``reader-search``)."""
    return READER_METHODS[name][1].get("draft_nodes") != 0


def reader_config(path: str | None, model: str, draft_model: str | None, preset: str):
    """READER's tree shape: the ``specgraft tune`` file at ``path`` (checked against the target,
    draft model and preset), else ``ReaderConfig``'s defaults."""
    from specgraft.drafters.reader_retrieval import ReaderConfig

    if path is None:
        return ReaderConfig()
    from specgraft.methods.reader_shape_file import load_shape

    return ReaderConfig(**load_shape(path, {"model": model, "draft_model": draft_model, "preset": preset}))


def tuned_policy(name: str, path: str | None) -> TunedBudget | None:
    """A :class:`~specgraft.budget.policy.TunedBudget` from the ``by_batch`` budgets of the shape
    file at ``path`` (``specgraft tune --batch-size``) for READER variant ``name``; None for
    another method, no file, or a file tuned at one batch size."""
    if path is None or name not in READER_METHODS:
        return None
    from specgraft.budget.policy import TunedBudget
    from specgraft.methods.reader_shape_file import load_batch_budgets

    budgets = load_batch_budgets(path)
    return TunedBudget(budgets) if budgets else None


def load_method_datastores(paths: tuple[str, ...], vocab_size: int, tokenizer: Any = None) -> list:
    """The datastores at ``paths``, each checked against ``tokenizer`` (its vocabulary hash) when
    given, else against the target's vocabulary size."""
    from specgraft.retrieval import Datastore, load_datastores

    if tokenizer is not None:
        stores = load_datastores(paths, tokenizer)
    else:
        stores = [Datastore.load(p) for p in paths]
    for store in stores:
        size = store.manifest.get("vocab_size")
        if size is not None and int(size) > vocab_size:
            raise ValueError(
                f"datastore {str(store.path)!r} was built with a tokenizer of {size} tokens, more than the target's {vocab_size}"
            )
    return stores


def build_reader(
    name: str, target: TargetModel, opts: MethodOptions, draft_model: nn.Module | None = None, tokenizer: Any = None
) -> tuple[list[Drafter], ReaderComposer]:
    from specgraft.composers.reader import ReaderComposer
    from specgraft.drafters.draft_model import DraftModelDrafter
    from specgraft.drafters.reader_retrieval import ReaderRetrieval
    from specgraft.methods.graft import draft_tree_config, require_draft_model
    from specgraft.models.loading import load_draft_model

    options = opts.graft
    config = reader_shape(name, opts)
    if draft_model is None and config.draft_nodes:
        require_draft_model(name, options, draft_model)
        draft_model = load_draft_model(options.draft_model, options.draft_dtype, target.device, quant=options.draft_quant)
    stores = []
    if reads_datastores(name):
        if opts.datastores:
            stores = load_method_datastores(tuple(opts.datastores), target.vocab_size, tokenizer)
        else:
            print(f"{name}: no --datastore given; retrieving from the short-term trie alone", file=sys.stderr)
    drafters: list[Drafter] = [ReaderRetrieval(config, stores)]
    if config.draft_nodes:
        model_drafter = DraftModelDrafter(draft_model, draft_tree_config("draft-tree", options), target_vocab=target.vocab_size, max_nodes=config.draft_nodes)
        drafters.insert(0, model_drafter)
    return drafters, ReaderComposer(config)


def reader_shape(name: str, opts: MethodOptions) -> ReaderConfig:
    """The tree shape of READER variant ``name`` under ``opts``: ``opts.reader`` with the
    variant's changes, its draft nodes (by default) ``draft-tree``'s budget for the preset; its
    ``budget`` is ``B_tokens``.

    >>> from specgraft.methods import GraftOptions, MethodOptions
    >>> [reader_shape(n, MethodOptions()).budget for n in ("reader", "reader-widen", "reader-search")]
    [24, 22, 16]
    >>> reader_shape("reader", MethodOptions(graft=GraftOptions(preset="gpu"))).budget
    68
    """
    from specgraft.methods.graft import preset_budget

    config = replace(opts.reader, **READER_METHODS[name][1])
    if not needs_draft_model(name) and config.search_nodes == 0:
        config = replace(config, **RETRIEVAL_TREE)
    return config.with_draft_nodes(preset_budget(opts.graft, "draft-tree"))
