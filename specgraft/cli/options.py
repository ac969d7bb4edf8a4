"""The options every command shares, declared once: the model and its backend, device, dtype,
threads, chat template, seed, draft model and tree knobs, datastores, cost tables; and the
helpers that resolve them (``auto`` resolved before anything loads, so every summary prints what
ran). ``generate``, ``serve``, ``bench``, ``calibrate``, ``datastore`` and ``tune`` import them from
here. Imports no torch at start-up.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from specgraft.config import SEED_LIMIT
from specgraft.methods import METHODS, MethodOptions, method_names
from specgraft.methods.settings import MethodSettings


# plain text: summaries start with `[method]`, which rich would take for markup
err = Console(stderr=True, highlight=False, markup=False)


out = Console(highlight=False)


DEMO_MODEL = "smollm2-135m-instruct"


def draft_quant_option() -> typer.models.OptionInfo:
    """``--draft-quant``, as ``generate``, ``bench`` and ``calibrate`` take it (``models/quant.py``)."""
    return typer.Option(
        "auto", "--draft-quant",
        help="Numerics of the draft model only (outputs stay the target's): auto (int8 on CPU, bf16 on a GPU; on the "
        "llama.cpp backend q4_0), int8, int8-tensor (one activation scale per call, for comparisons), bf16, fp16 or none "
        "(the draft in --dtype, or its GGUF as it is); q4_0 or q8_0 requantize a GGUF draft (llama.cpp backend).",
    )


#: dtypes whose batched and single-row kernels round differently (``agreement_note``).
REDUCED_PRECISION = ("bfloat16", "float16")


def resolve_dtype(dtype: str, device: str) -> str:
    """``--dtype`` as a run uses it, ``auto`` resolved for ``--device`` (float32 on a CPU,
    bfloat16 on a GPU: ``models.device.parse_dtype``): what every summary prints, never ``auto``.
    ``ValueError`` for an unknown dtype or device.

    >>> resolve_dtype("bfloat16", "cpu")
    'bfloat16'
    """
    from specgraft.models.device import parse_dtype, resolve_device

    return str(parse_dtype(dtype, resolve_device(device))).removeprefix("torch.")


def chat_mode(decoder, chat: Optional[bool], model: str) -> bool:
    """``--chat/--no-chat`` resolved for ``decoder``'s tokenizer: ``None`` (neither given) is the
    chat template when the tokenizer has one (instruct models), else raw text; ``--chat`` without a
    template is a ``ValueError``."""
    if chat and not decoder.has_chat_template:
        raise ValueError(f"--chat: the tokenizer of {model!r} has no chat template; drop --chat to send the prompt as raw text")
    return decoder.uses_chat(chat)


def prompt_format(chat: bool) -> str:
    """How a summary names the prompt's format.

    >>> prompt_format(True), prompt_format(False)
    ('chat template', 'raw text')
    """
    return "chat template" if chat else "raw text"


def resolve_model_dtype(dtype: str, device: str, backend: str) -> str:
    """``--dtype`` for the backend a run uses: resolved for torch (:func:`resolve_dtype`) on
    ``hf``; on ``llamacpp`` the GGUF's own quantization computes, so only ``auto`` is taken (and
    kept: the summary then prints the quantization).

    >>> resolve_model_dtype("auto", "cpu", "llamacpp")
    'auto'
    """
    if backend == "hf":
        return resolve_dtype(dtype, device)
    if dtype != "auto":
        raise ValueError(f"--dtype {dtype}: the llama.cpp backend computes in the GGUF's own quantization; drop --dtype")
    return dtype


def set_threads(threads: Optional[int]) -> None:
    import torch

    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def method_help() -> str:
    needs = [name for name in method_names() if METHODS[name].needs_draft_model]
    free = [name for name in method_names() if not METHODS[name].needs_draft_model]
    return f"{', '.join(free)}; with --draft-model also {', '.join(needs)}. Default: pld, or draft-tree with --draft-model."


# options shared with `specgraft serve`: the model, device and method options
MODEL = typer.Option(DEMO_MODEL, "--model", "-m", help="Catalog name, local directory, Hugging Face id or .gguf file.")


BACKEND = typer.Option(
    "auto", "--backend",
    help="hf (transformers on torch; exact in float32), llamacpp (the GGUF through llama.cpp: several times faster on a CPU; "
    "a .gguf file or a catalog name; needs the llamacpp extra) or auto (llamacpp for a .gguf file, else hf).",
)


STRICT = typer.Option(
    False, "--strict",
    help="llama.cpp: compute every row in one kernel class (padded forwards) so every method equals this backend's own "
    "plain decoding token for token; slower, for checking.",
)


DTYPE = typer.Option(
    "auto", help="auto (float32 on a CPU, bfloat16 on a GPU; the resolved dtype is printed), float32 (exact: equal to plain "
    "decoding token for token), bfloat16 or float16; the draft model's too.",
)


CHAT = typer.Option(
    None, "--chat/--no-chat",
    help="Send the prompt through the tokenizer's chat template (--chat; an error without one) or as raw text (--no-chat). "
    "Default: the chat template when the tokenizer has one (instruct models).",
)


CHAT_RECORDS = typer.Option(
    None, "--chat/--no-chat",
    help="Wrap records (prompt + response) in the tokenizer's chat template (--chat; an error without one) or not "
    "(--no-chat). Default: the chat template when the tokenizer has one (instruct models).",
)


def check_seed(seed: Optional[int]) -> Optional[int]:
    """``--seed``'s check: an integer in ``[0, 2**63)`` (``config.SEED_LIMIT``, as
    ``SamplingConfig`` takes it); a usage error naming the value otherwise."""
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise typer.BadParameter(f"{seed} is not in [0, 2**63)")
    return seed


SEED = typer.Option(None, callback=check_seed, help="Sampling seed, an integer in [0, 2**63) (default: a fresh one).")


THREADS = typer.Option(None, help="torch threads (default: torch's choice).")


DEVICE = typer.Option("auto", help="auto (cuda when available, else cpu), cpu, cuda or cuda:N; the draft model's too.")


RECYCLING_STATE = typer.Option(None, "--recycling-state", help="Successor matrix .npz from `specgraft warmup` (recycling).")


DRAFT_MODEL = typer.Option(
    None, "--draft-model",
    help="Draft model sharing the target's tokenizer (draft-tree, graft*, reader*; the bench's hf-assisted and llama-speculative): "
    "catalog name, directory or hub id.",
)


CALIBRATION = typer.Option(
    None, "--calibration", help="Calibration JSON from `specgraft calibrate` (thresholds + warmed-up matrix of the graft variants)."
)


PRESET = typer.Option(
    "cpu", "--preset",
    help="Draft tree preset: cpu (depth 4, top-k 2, budget 8; draft-tree 16 with long chains: past 8 nodes only confident ones) "
    "or gpu (depth 8, top-k 10, budget 60); without --budget its budget is used.",
)


SAMPLE_DRAFTS = typer.Option(
    False, "--sample-drafts",
    help="Sample draft children at --temperature (> 0) and verify by rejection sampling (draft-tree, graft*); exact like the default.",
)


DRAFT_DEPTH = typer.Option(None, "--draft-depth", help="Draft forwards per step (default: the preset's).")


DRAFT_TOP_K = typer.Option(None, "--draft-top-k", help="Children per expanded draft node (default: the preset's).")


DRAFT_EXTEND = typer.Option(
    None, "--draft-extend",
    help="Most one-row draft forwards continuing the best draft path past the depth while the draft stays confident "
    "(default: the preset's, 12 for draft-tree's long chains, which a given value turns off; 0 = off).",
)


DRAFT_STOP_MIN = typer.Option(
    None, "--draft-stop-min",
    help="The draft tree stops drafting deeper layers when its best new path's draft probability is below this "
    "(default: the preset's; 0 = always the full depth).",
)


DRAFT_ROW_COST = typer.Option(
    None, "--draft-row-cost",
    help="draft-tree: cut each step's kept nodes, best first, where expected tokens per unit of cost peak, a verified row "
    "costing this fraction of a step that verifies none (target one-row forward plus drafting); default: the preset's, "
    "0.05 on cpu (with long chains); 0 = no cut.",
)


DRAFT_COPY_AHEAD = typer.Option(
    None, "--draft-copy-ahead",
    help="Each draft-tree extension forward also feeds up to this many tokens copied from an earlier occurrence of the "
    "path's last n-gram, keeping those the draft agrees with: the same chains in fewer draft forwards (default: the "
    "preset's; 0 = off).",
)


LEARNING = typer.Option(
    "request", "--learning",
    help="request (default): every request starts from the shared drafter state (priors, --recycling-state); shared: what "
    "each request learns carries over to the next (outputs never change; speed then depends on request order).",
)


DATASTORE = typer.Option(None, "--datastore", help="Datastore directory for reader (repeat or comma list; `specgraft datastore build`).")


READER_SHAPE = typer.Option(None, "--reader-shape", help="READER tree shape from `specgraft tune`.")


COST_TABLE = typer.Option(
    "auto", "--cost-table",
    help="Cost table JSON (`specgraft profile`) that default budgets are derived from: the budget with the best predicted "
    "tokens/s on this device, from its measured forward costs and each method's measured gains per budget. auto = the "
    "table measured for this model, device and threads (yours, else a shipped one; fixed defaults when there is none); "
    "none = the fixed defaults. --budget overrides either.",
)


ROW_COST = typer.Option(
    None, "--row-cost",
    help="pld and adapld*: cut each tree where expected tokens per unit of verify cost peak, a verified row costing this "
    "fraction of a one-row step; auto = from the cost table of this model, device and threads (`specgraft profile`, or "
    "the shipped one); default none: the fixed estimated-acceptance cut (min_prob 0.1).",
)


def cost_device(device: str, backend: str = "hf") -> str:
    """What a run's cost tables are filed under (``budget.costs.table_name``): ``llamacpp`` on
    that backend, else the resolved torch device.

    >>> cost_device("cpu"), cost_device("auto", "llamacpp")
    ('cpu', 'llamacpp')
    """
    if backend == "llamacpp":
        return "llamacpp"
    from specgraft.models.device import resolve_device

    return str(resolve_device(device))


def row_cost_value(value: Optional[str], model: str, device: str, threads: Optional[int], backend: str = "hf") -> Optional[float]:
    """``--row-cost`` resolved (``auto`` from the cost table), with one line on stderr saying where from."""
    if value is None or value == "none":
        return None
    import torch

    from specgraft.budget.costs import resolve_row_cost

    cost, source = resolve_row_cost(value, model, cost_device(device, backend), threads or torch.get_num_threads())
    if value == "auto":
        err.print(f"--row-cost {source}" + (f": {cost}" if cost is not None else "; pruning at min_prob"))
    return cost


def method_options(
    model: str,
    dtype: str,
    *,
    datastore: Optional[list[str]] = None,
    sample_drafts_at: Optional[float] = None,
    cost_table: Optional[str] = "auto",
    **settings,
) -> MethodOptions:
    """The :class:`MethodOptions` of the shared options: ``settings`` are
    :class:`~specgraft.methods.settings.MethodSettings` fields (``draft_model``, ``preset``,
    ``draft_extend``, ...); ``datastore``: the ``--datastore`` values (repeated or comma lists);
    ``sample_drafts_at``: sample draft children at this temperature (``--sample-drafts``);
    ``cost_table``: ``--cost-table`` (``auto`` is resolved when the model loads)."""
    resolved = MethodSettings(
        datastores=split_paths(datastore), sample_drafts=sample_drafts_at is not None, cost_table=cost_table_value(cost_table), **settings
    )
    return resolved.options(model, dtype, sample_drafts_at or 0.0)


def resolve_cost_table(value: Optional[str], model: str, device: str, threads: Optional[int], backend: str = "hf") -> Optional[str]:
    """``--cost-table`` resolved now (``budget.costs.resolve_cost_table``), for a run that
    records its budgets before loading the model (the bench); one line on stderr says where
    ``auto`` led."""
    import torch

    from specgraft.budget.costs import resolve_cost_table as resolve

    found = resolve(value, model, cost_device(device, backend), threads or torch.get_num_threads())
    if value == "auto":
        err.print(f"--cost-table auto: default budgets derived from {Path(found).name}" if found else "--cost-table auto: no cost "
                  "table for this model and device (specgraft profile writes one); fixed default budgets", soft_wrap=True)
    return found


def cost_table_value(value: Optional[str]) -> Optional[str]:
    """``--cost-table`` checked before any model loads, ``auto`` kept for the decoder to resolve
    on its device (``budget.costs.resolve_cost_table`` does the rest).

    >>> cost_table_value("auto"), cost_table_value("none")
    ('auto', None)
    """
    if value == "auto":
        return value
    from specgraft.budget.costs import resolve_cost_table as resolve

    return resolve(value, "", "", None)


def int_list(text: str, what: str) -> list[int]:
    """A comma list of integers >= 1 (``--batch-sizes 1,4,8``); ``ValueError`` naming ``what`` otherwise.

    >>> int_list("1,4, 8", "--batch-sizes")
    [1, 4, 8]
    """
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be a comma list of integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{what} must be integers >= 1, got {text!r}")
    return values


def split_paths(values: Optional[list[str]]) -> tuple[str, ...]:
    """``--datastore a --datastore b,c`` -> ``("a", "b", "c")``.

    >>> split_paths(["a", "b,c"]), split_paths(None)
    (('a', 'b', 'c'), ())
    """
    return tuple(p for v in values or () for p in v.split(",") if p)
