"""`specgraft generate | demo`: generate text with a method, streaming it, optionally against plain decoding."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Optional, Sequence

import typer

from specgraft.agreement import agreement
from specgraft.cli.options import (
    BACKEND, CALIBRATION, CHAT, COST_TABLE, DATASTORE, DEMO_MODEL, DEVICE, DRAFT_COPY_AHEAD, DRAFT_DEPTH, DRAFT_EXTEND, DRAFT_MODEL,
    DRAFT_ROW_COST, DRAFT_STOP_MIN, DRAFT_TOP_K, DTYPE, LEARNING, MODEL, PRESET, READER_SHAPE, RECYCLING_STATE, REDUCED_PRECISION, ROW_COST,
    SAMPLE_DRAFTS, SEED, STRICT, THREADS, chat_mode, draft_quant_option, err, method_help, method_options, out, prompt_format, resolve_model_dtype,
    row_cost_value, set_threads,
)
from specgraft.methods import METHODS, MethodOptions, default_method, derived_budget, get_method, method_names

if TYPE_CHECKING:
    from specgraft.types import GenerationStats


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


def step_time_shares(stats: GenerationStats) -> str:
    """Where the decoding steps' time went: the target's forwards, drafting (a draft model's
    forwards, lookups) and the rest (verification rule, commit, budget policy).

    >>> from specgraft.types import GenerationStats
    >>> step_time_shares(GenerationStats(method="draft-tree", forward_s=6.2, draft_s=3.6, verify_s=0.1, commit_s=0.1))
    'step time 62% target forwards, 36% drafting, 2% other'
    """
    steps_s = stats.forward_s + stats.overhead_s
    if steps_s <= 0:
        return "no decoding step"
    other = stats.overhead_s - stats.draft_s
    return f"step time {100 * stats.forward_s / steps_s:.0f}% target forwards, {100 * stats.draft_s / steps_s:.0f}% drafting, {100 * other / steps_s:.0f}% other"


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
    from specgraft.models.device import resolve_device

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
            f"MAT {stats.mat:.2f} (bonus token included), {stats.tokens_per_s:.2f} tok/s, {step_time_shares(stats)}, "
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


def generate(
    prompt: str = typer.Argument(..., help="The prompt text."),
    model: str = MODEL,
    method: Optional[str] = typer.Option(None, help=method_help()),
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
    sample_drafts: bool = SAMPLE_DRAFTS,
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
