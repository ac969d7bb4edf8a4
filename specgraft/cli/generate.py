"""`specgraft generate | demo`: generate text with a method, streaming it, optionally against plain decoding."""

from __future__ import annotations

import json
from typing import Optional, Sequence

import typer
from rich.console import Console

from specgraft.agreement import agreement
from specgraft.config import SEED_LIMIT
from specgraft.methods import (
    METHODS, GraftOptions, MethodOptions, default_method, derived_budget, get_method, method_names, with_sampled_drafts,
)

# plain text: summaries start with `[method]`, which rich would take for markup
err = Console(stderr=True, highlight=False, markup=False)
out = Console(highlight=False)

DEMO_MODEL = "smollm2-135m-instruct"
DEMO_PROMPT = (
    "Here is a Python function:\n\n"
    "```python\n"
    "def moving_average(values, window):\n"
    "    result = []\n"
    "    for i in range(len(values) - window + 1):\n"
    "        chunk = values[i:i + window]\n"
    "        result.append(sum(chunk) / window)\n"
    "    return result\n"
    "```\n\n"
    "Repeat the function exactly, then add a docstring to it."
)


def draft_quant_option() -> typer.models.OptionInfo:
    """``--draft-quant``, as ``generate``, ``bench`` and ``calibrate`` take it (``models/quant.py``)."""
    return typer.Option(
        "auto", "--draft-quant",
        help="Numerics of the draft model only (outputs stay the target's): auto (int8 on CPU, bf16 on a GPU), "
        "int8, int8-tensor (one activation scale per call, for comparisons), bf16, fp16 or none (the draft in --dtype).",
    )


#: dtypes whose batched and single-row kernels round differently (``agreement_note``).
REDUCED_PRECISION = ("bfloat16", "float16")


def resolve_dtype(dtype: str, device: str) -> str:
    """``--dtype`` as a run uses it, ``auto`` resolved for ``--device`` (float32 on a CPU,
    bfloat16 on a GPU: ``models.hf.parse_dtype``): what every summary prints, never ``auto``.
    ``ValueError`` for an unknown dtype or device.

    >>> resolve_dtype("bfloat16", "cpu")
    'bfloat16'
    """
    from specgraft.models.hf import parse_dtype, resolve_device

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


def agreement_note(fraction: float, dtype: str, backend: str = "hf", strict: bool = False) -> Optional[str]:
    """The line ``--compare`` adds when agreement with plain decoding is below 100% in a
    reduced-precision dtype, or on llama.cpp outside strict mode: why, and how to get equality.
    None otherwise: in float32 (and in strict mode) anything below 100% is a bug, and nothing is
    printed that could explain it away.

    >>> agreement_note(0.875, "bfloat16")[:35]
    'agreement below 100% in bfloat16: b'
    >>> agreement_note(0.875, "float32") is None, agreement_note(1.0, "bfloat16") is None
    (True, True)
    >>> agreement_note(0.9, "qwen2 1B Q4_K - Medium", backend="llamacpp")[:42]
    'agreement below 100% on llama.cpp: its ker'
    """
    if fraction >= 1.0:
        return None
    if backend == "llamacpp":
        if strict:
            return None
        return (
            "agreement below 100% on llama.cpp: its kernels compute a row differently by batch size, so near-tied tokens "
            "can flip; --strict gives token-for-token equality with its plain decoding"
        )
    if dtype not in REDUCED_PRECISION:
        return None
    return (
        f"agreement below 100% in {dtype}: batched and single-row kernels round differently, so near-tied tokens can flip; "
        "--dtype float32 gives token-for-token equality"
    )


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


def run_generate(
    prompt: str,
    model: str,
    method: Optional[str] = None,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: Optional[int] = None,
    dtype: str = "auto",
    budget: Optional[int] = None,
    chat: Optional[bool] = None,
    compare: bool = False,
    as_json: bool = False,
    stop: Sequence[str] = (),
    options: Optional[MethodOptions] = None,
    threads: Optional[int] = None,
    device: str = "auto",
    backend: str = "auto",
    strict: bool = False,
) -> dict:
    """Generate (streaming unless ``as_json``), print the summary and return it as a dict.

    ``backend``: ``auto``, ``hf`` or ``llamacpp`` (:mod:`specgraft.models.backends`); ``strict``:
    the llama.cpp backend's strict mode (``LlamaCppTarget``).

    ``method=None`` is ``default_method(options)``: ``draft-tree`` with a draft model, else
    ``pld``. ``budget=None`` uses the method's default budget (for draft-model methods, the budget
    of ``options.graft.preset``); the summary's ``config`` records the one used. ``chat=None``
    applies the chat template when the tokenizer has one (:func:`chat_mode`).
    """
    from specgraft.api import SpecDecoder
    from specgraft.models.backends import resolve_backend
    from specgraft.models.hf import resolve_device

    options = options if options is not None else MethodOptions()
    method = method if method is not None else default_method(options)
    get_method(method)
    backend = resolve_backend(backend, model)
    device = resolve_device(device)
    resolve_model_dtype(dtype, str(device), backend)
    if backend == "llamacpp" and device.type != "cpu":
        raise ValueError(f"--device {device}: the llama.cpp backend runs on the CPU here")
    set_threads(threads)
    config = SpecDecoder.make_config(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, budget=budget, stop=stop
    )
    if not prompt:
        raise ValueError("the prompt is empty")
    dec = SpecDecoder.from_pretrained(
        model, method=method, dtype=dtype, device=device, options=options, progress=not as_json, backend=backend, threads=threads,
        strict=strict,
    )
    chat = chat_mode(dec, chat, model)
    ids = dec.encode(prompt, chat=chat)
    dec.engine.check_prompt(ids)
    baseline = dec.with_method("ar") if compare else None
    if compare:
        # warm-up both paths so neither pays for first-call allocation
        warm = SpecDecoder.make_config(max_new_tokens=4, budget=budget)
        baseline.generate(ids, config=warm)
        dec.generate(ids, config=warm)
    if as_json:
        result = dec.generate(ids, config=config)
    else:
        for piece in dec.stream(ids, config=config):
            out.print(piece, end="", markup=False, soft_wrap=True)
        out.print()
        result = dec.last_output
    stats = result.stats
    summary = {
        "text": result.text,
        "new_tokens": stats.new_tokens,
        "steps": stats.steps,
        "mat": round(stats.mat, 4),
        "tokens_per_s": round(stats.tokens_per_s, 3),
        "method": method,
        "config": result.config | {"model": model, "chat": chat},
        "stats": stats.to_dict(),
    }
    if compare:
        base = baseline.generate(ids, config=config)
        same = agreement(result.tokens, base.tokens)
        summary["speedup"] = round(base.stats.total_s / stats.total_s, 4) if stats.total_s > 0 else None
        summary["agreement"] = round(same.fraction_equal, 4)
        summary["first_divergence"] = same.first_divergence
        summary["baseline_tokens_per_s"] = round(base.stats.tokens_per_s, 3)
    if as_json:
        print(json.dumps(summary))
    else:
        used = summary["config"]["generation"]["budget"]
        origin = ""
        if budget is None:
            derived = derived_budget(method, dec.options)
            if derived is not None:
                origin = f" ({derived.describe()})"
            elif METHODS[method].needs_draft_model:
                origin = f" (preset {options.graft.preset})"
        resolved = summary["config"]
        line = (
            f"[{method}] budget {used} nodes{origin}, {stats.new_tokens} tokens in {stats.steps} steps, "
            f"MAT {stats.mat:.2f} (bonus token included), {stats.tokens_per_s:.2f} tok/s, overhead {100 * stats.overhead_fraction:.1f}% of step time, "
            f"threads {resolved['threads']}, {resolved['device']}, {resolved['dtype']}"
            + (f" on llama.cpp{' (strict)' if strict else ''}" if backend == "llamacpp" else "")
            + f", {prompt_format(chat)}"
        )
        err.print(line, soft_wrap=True)  # one line however narrow the terminal (and in logs)
        acc = stats.acceptance_by_source()
        if acc:
            err.print("acceptance by source: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in acc.items()))
        if compare:
            div = "identical" if summary["first_divergence"] is None else f"first divergence at token {summary['first_divergence']}"
            err.print(
                f"[ar] {summary['baseline_tokens_per_s']:.2f} tok/s -> speedup {summary['speedup']:.2f}x, "
                f"agreement {100 * summary['agreement']:.1f}% ({div})", soft_wrap=True,
            )
            note = agreement_note(same.fraction_equal, resolved["dtype"], backend, strict)
            if note is not None:
                err.print(note, soft_wrap=True)
    return summary


def _method_help() -> str:
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
RECYCLING_STATE = typer.Option(None, help="Successor matrix .npz from `specgraft warmup` (recycling).")
DRAFT_MODEL = typer.Option(
    None, "--draft-model", help="Draft model sharing the target's tokenizer (draft-tree, graft*): catalog name, directory or hub id."
)
CALIBRATION = typer.Option(
    None, "--calibration", help="Calibration JSON from `specgraft calibrate` (thresholds + warmed-up matrix of the graft variants)."
)
PRESET = typer.Option(
    "cpu", "--preset",
    help="Draft tree preset: cpu (depth 4, top-k 2, budget 8; draft-tree 16 with long chains: past 8 nodes only confident ones) "
    "or gpu (depth 8, top-k 10, budget 60); without --budget its budget is used.",
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
LEARNING = typer.Option("request", help="request (default) or shared: see `specgraft.drafters.base.Learning`.")
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
    """What a run's cost tables are filed under (``batch.profile.table_name``): ``llamacpp`` on
    that backend, else the resolved torch device.

    >>> cost_device("cpu"), cost_device("auto", "llamacpp")
    ('cpu', 'llamacpp')
    """
    if backend == "llamacpp":
        return "llamacpp"
    from specgraft.models.hf import resolve_device

    return str(resolve_device(device))


def row_cost_value(value: Optional[str], model: str, device: str, threads: Optional[int], backend: str = "hf") -> Optional[float]:
    """``--row-cost`` resolved (``auto`` from the cost table), with one line on stderr saying where from."""
    if value is None or value == "none":
        return None
    import torch

    from specgraft.batch.profile import resolve_row_cost

    cost, source = resolve_row_cost(value, model, cost_device(device, backend), threads or torch.get_num_threads())
    if value == "auto":
        err.print(f"--row-cost {source}" + (f": {cost}" if cost is not None else "; pruning at min_prob"))
    return cost


def method_options(
    model: str,
    dtype: str,
    *,
    draft_model: Optional[str],
    calibration: Optional[str],
    preset: str,
    draft_depth: Optional[int],
    draft_top_k: Optional[int],
    recycling_state: Optional[str],
    learning: str,
    datastore: Optional[list[str]],
    reader_shape: Optional[str],
    sample_drafts_at: Optional[float] = None,
    draft_quant: str = "auto",
    row_cost: Optional[float] = None,
    cost_table: Optional[str] = "auto",
    draft_extend: Optional[int] = None,
    draft_stop_min: Optional[float] = None,
    draft_row_cost: Optional[float] = None,
    draft_copy_ahead: Optional[int] = None,
) -> MethodOptions:
    """The :class:`MethodOptions` of the options above; ``sample_drafts_at``: sample draft children
    at this temperature (``--sample-drafts``); ``draft_quant``: the draft model's numerics."""
    from specgraft.methods.reader import reader_config

    graft = GraftOptions(
        draft_model=draft_model, draft_dtype=dtype, draft_quant=draft_quant, preset=preset, depth=draft_depth, top_k=draft_top_k,
        extend=draft_extend, stop_min=draft_stop_min, row_cost=draft_row_cost, copy_ahead=draft_copy_ahead, calibration=calibration,
    )
    if sample_drafts_at is not None:
        graft = with_sampled_drafts(graft, sample_drafts_at)
    return MethodOptions(
        recycling_state=recycling_state, graft=graft, learning=learning, datastores=split_paths(datastore),
        reader=reader_config(reader_shape, model, draft_model, preset), row_cost=row_cost, cost_table=cost_table_value(cost_table),
    )


def resolve_cost_table(value: Optional[str], model: str, device: str, threads: Optional[int], backend: str = "hf") -> Optional[str]:
    """``--cost-table`` resolved now, for a run that records its budgets before loading the
    model (the bench): ``auto`` -> the table ``find_cost_table`` gives, or None. One line on
    stderr says which."""
    value = cost_table_value(value)
    if value != "auto":
        return value
    import torch

    from specgraft.batch.profile import find_cost_table
    from specgraft.models.hf import resolve_device

    found = find_cost_table(model, cost_device(device, backend), threads or torch.get_num_threads())
    err.print(f"--cost-table auto: default budgets derived from {found.name}" if found else "--cost-table auto: no cost table for this "
              "model and device (specgraft profile writes one); fixed default budgets", soft_wrap=True)
    return str(found) if found else None


def cost_table_value(value: Optional[str]) -> Optional[str]:
    """``--cost-table``: ``auto`` (resolved when the model is loaded), ``none`` -> None, or a
    path, checked now so a bad one fails before any model loads.

    >>> cost_table_value("auto"), cost_table_value("none")
    ('auto', None)
    """
    if value in (None, "none"):
        return None
    if value == "auto":
        return value
    from specgraft.batch.budget import CostTable

    CostTable.load(value)
    return value


def generate(
    prompt: str = typer.Argument(..., help="The prompt text."),
    model: str = MODEL,
    method: Optional[str] = typer.Option(None, help=_method_help()),
    max_new_tokens: int = typer.Option(128, help="Stop after this many new tokens."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass, in (0, 1]."),
    top_k: int = typer.Option(0, help="Keep the k most likely tokens (0 = off)."),
    seed: Optional[int] = SEED,
    dtype: str = DTYPE,
    budget: Optional[int] = typer.Option(None, help="Tree nodes verified per step (default: the method's default budget, printed)."),
    chat: Optional[bool] = CHAT,
    compare: bool = typer.Option(
        False, "--compare",
        help="Also run plain decoding; report speedup and agreement (100% in float32; in bfloat16 near-tied tokens can flip).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming."),
    stop: list[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
    recycling_state: Optional[str] = RECYCLING_STATE,
    draft_model: Optional[str] = DRAFT_MODEL,
    calibration: Optional[str] = CALIBRATION,
    preset: str = PRESET,
    sample_drafts: bool = typer.Option(
        False, "--sample-drafts",
        help="Sample draft children at --temperature (> 0) and verify by rejection sampling (draft-tree, graft*); exact like the default.",
    ),
    draft_depth: Optional[int] = DRAFT_DEPTH,
    draft_top_k: Optional[int] = DRAFT_TOP_K,
    draft_extend: Optional[int] = DRAFT_EXTEND,
    draft_stop_min: Optional[float] = DRAFT_STOP_MIN,
    draft_row_cost: Optional[float] = DRAFT_ROW_COST,
    draft_copy_ahead: Optional[int] = DRAFT_COPY_AHEAD,
    draft_quant: str = draft_quant_option(),
    threads: Optional[int] = THREADS,
    device: str = DEVICE,
    learning: str = LEARNING,
    datastore: Optional[list[str]] = DATASTORE,
    reader_shape: Optional[str] = READER_SHAPE,
    row_cost: Optional[str] = ROW_COST,
    cost_table: str = COST_TABLE,
    backend: str = BACKEND,
    strict: bool = STRICT,
) -> None:
    """Generate text with a speculative method, streaming it; a summary line on stderr names the method, budget, dtype and prompt format."""
    from specgraft.models.backends import resolve_backend

    backend = resolve_backend(backend, model)
    dtype = resolve_model_dtype(dtype, device, backend)  # the draft model's too: recorded resolved, never "auto"
    options = method_options(
        model, dtype, draft_model=draft_model, calibration=calibration, preset=preset, draft_depth=draft_depth,
        draft_top_k=draft_top_k, recycling_state=recycling_state, learning=learning, datastore=datastore,
        reader_shape=reader_shape, sample_drafts_at=temperature if sample_drafts else None, draft_quant=draft_quant,
        row_cost=row_cost_value(row_cost, model, device, threads, backend), cost_table=cost_table, draft_extend=draft_extend,
        draft_stop_min=draft_stop_min, draft_row_cost=draft_row_cost, draft_copy_ahead=draft_copy_ahead,
    )
    run_generate(
        prompt, model, method, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        dtype=dtype, budget=budget, chat=chat, compare=compare, as_json=as_json, stop=stop, options=options,
        threads=threads, device=device, backend=backend, strict=strict,
    )


def split_paths(values: Optional[list[str]]) -> tuple[str, ...]:
    """``--datastore a --datastore b,c`` -> ``("a", "b", "c")``.

    >>> split_paths(["a", "b,c"]), split_paths(None)
    (('a', 'b', 'c'), ())
    """
    return tuple(p for v in values or () for p in v.split(",") if p)


#: The demo's dtype: the one where every method's output equals plain decoding token for token,
#: so ``--compare``'s 100% agreement is the demo's point. No ``--dtype`` option.
DEMO_DTYPE = "float32"


def demo(
    method: str = typer.Option("pld", help="A method without a draft model: " + ", ".join(
        name for name in method_names() if not METHODS[name].needs_draft_model) + "."),
    max_new_tokens: int = typer.Option(96, help="Stop after this many new tokens."),
) -> None:
    """SmolLM2-135M Instruct on a copy-heavy prompt in float32, compared with plain decoding (equal token for token)."""
    if get_method(method).needs_draft_model:
        raise ValueError(f"the demo runs without a draft model, so not {method!r}; use `specgraft generate --draft-model ...`")
    err.print(f"specgraft demo: {DEMO_MODEL}, method {method}, {DEMO_DTYPE}, greedy, {max_new_tokens} new tokens")
    run_generate(DEMO_PROMPT, DEMO_MODEL, method, max_new_tokens=max_new_tokens, dtype=DEMO_DTYPE, chat=None, compare=True)
