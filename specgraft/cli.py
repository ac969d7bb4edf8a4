"""`specgraft generate | demo | models | warmup | calibrate | bench`: the command line.

Every failure a user can cause (bad value, unknown method, missing file, a model that cannot be
pulled or loaded) prints one line ``error: ...`` on stderr and exits with status 2; no tracebacks.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Optional, Sequence

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Lossless speculative decoding for Hugging Face causal LMs.")
models_app = typer.Typer(no_args_is_help=True, help="List and pull the offline model catalog.")
app.add_typer(models_app, name="models")

from specgraft.bench.cli import bench, report  # noqa: E402  (these three import no torch: CLI start-up stays fast)
from specgraft.calibrate_cli import calibrate  # noqa: E402
from specgraft.methods import METHODS, MethodOptions, get_method, method_names  # noqa: E402
from specgraft.methods_graft import GraftOptions, with_sampled_drafts  # noqa: E402

app.command()(bench)
app.command()(report)
app.command()(calibrate)

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


def agreement(a: list[int], b: list[int]) -> tuple[float, int | None]:
    """Fraction of positions where ``a`` equals the reference ``b``, and the first divergence.

    >>> agreement([1, 2, 3], [1, 2, 4])
    (0.6666666666666666, 2)
    """
    n = max(len(a), len(b))
    if n == 0:
        return 1.0, None
    same = sum(x == y for x, y in zip(a, b))
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    return same / n, first


def _set_threads(threads: Optional[int]) -> None:
    import torch

    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)


def run_generate(
    prompt: str,
    model: str,
    method: str,
    *,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: Optional[int] = None,
    dtype: str = "auto",
    budget: Optional[int] = None,
    chat: bool = False,
    compare: bool = False,
    as_json: bool = False,
    stop: Sequence[str] = (),
    options: Optional[MethodOptions] = None,
    threads: Optional[int] = None,
) -> dict:
    """Generate (streaming unless ``as_json``), print the summary and return it as a dict.

    ``budget=None`` uses the method's default budget (for draft-model methods, the budget of
    ``options.graft.preset``); the summary's ``config`` records the one used.
    """
    from specgraft.api import SpecDecoder
    from specgraft.models.hf import parse_dtype

    get_method(method)
    parse_dtype(dtype)
    _set_threads(threads)
    config = SpecDecoder.make_config(
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, budget=budget, stop=stop
    )
    if not prompt:
        raise ValueError("the prompt is empty")
    options = options if options is not None else MethodOptions()
    dec = SpecDecoder.from_pretrained(model, method=method, dtype=dtype, options=options, progress=not as_json)
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
        frac, first = agreement(result.tokens, base.tokens)
        summary["speedup"] = round(base.stats.total_s / stats.total_s, 4) if stats.total_s > 0 else None
        summary["agreement"] = round(frac, 4)
        summary["first_divergence"] = first
        summary["baseline_tokens_per_s"] = round(base.stats.tokens_per_s, 3)
    if as_json:
        print(json.dumps(summary))
    else:
        used = summary["config"]["generation"]["budget"]
        origin = f" (preset {options.graft.preset})" if budget is None and METHODS[method].needs_draft_model else ""
        line = (
            f"[{method}] budget {used} nodes{origin}, {stats.new_tokens} tokens in {stats.steps} steps, "
            f"MAT {stats.mat:.2f} (bonus token included), {stats.tokens_per_s:.2f} tok/s, overhead {100 * stats.overhead_fraction:.1f}% of step time, "
            f"threads {summary['config']['threads']}"
        )
        err.print(line)
        acc = stats.acceptance_by_source()
        if acc:
            err.print("acceptance by source: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in acc.items()))
        if compare:
            div = "identical" if summary["first_divergence"] is None else f"first divergence at token {summary['first_divergence']}"
            err.print(
                f"[ar] {summary['baseline_tokens_per_s']:.2f} tok/s -> speedup {summary['speedup']:.2f}x, "
                f"agreement {100 * summary['agreement']:.1f}% ({div})"
            )
    return summary


def _method_help() -> str:
    needs = [name for name in method_names() if METHODS[name].needs_draft_model]
    free = [name for name in method_names() if not METHODS[name].needs_draft_model]
    return f"{', '.join(free)}; with --draft-model also {', '.join(needs)}."


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="The prompt text."),
    model: str = typer.Option(DEMO_MODEL, "--model", "-m", help="Catalog name, local directory or Hugging Face id."),
    method: str = typer.Option("recycling", help=_method_help()),
    max_new_tokens: int = typer.Option(128, help="Stop after this many new tokens."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_p: float = typer.Option(1.0, help="Nucleus sampling mass, in (0, 1]."),
    top_k: int = typer.Option(0, help="Keep the k most likely tokens (0 = off)."),
    seed: Optional[int] = typer.Option(None, help="Sampling seed."),
    dtype: str = typer.Option("auto", help="auto (float32 on CPUs without native bf16), bfloat16 or float32; the draft model's too."),
    budget: Optional[int] = typer.Option(None, help="Tree nodes verified per step (default: the method's default budget, printed)."),
    chat: bool = typer.Option(False, "--chat", help="Apply the tokenizer's chat template."),
    compare: bool = typer.Option(False, "--compare", help="Also run plain decoding; report speedup and agreement."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming."),
    stop: list[str] = typer.Option([], "--stop", help="Stop string (repeatable)."),
    recycling_state: Optional[str] = typer.Option(None, help="Successor matrix .npz from `specgraft warmup` (recycling)."),
    draft_model: Optional[str] = typer.Option(
        None, "--draft-model", help="Draft model sharing the target's tokenizer (draft-tree, graft*): catalog name, directory or hub id."
    ),
    calibration: Optional[str] = typer.Option(
        None, "--calibration", help="Calibration JSON from `specgraft calibrate` (thresholds + warmed-up matrix of the graft variants)."
    ),
    preset: str = typer.Option(
        "cpu", "--preset",
        help="Draft tree preset: cpu (depth 4, top-k 2, budget 8) or gpu (depth 8, top-k 10, budget 60); without --budget its budget is used.",
    ),
    sample_drafts: bool = typer.Option(
        False, "--sample-drafts",
        help="Sample draft children at --temperature (> 0) and verify by rejection sampling (draft-tree, graft*); exact like the default.",
    ),
    draft_depth: Optional[int] = typer.Option(None, "--draft-depth", help="Draft forwards per step (default: the preset's)."),
    draft_top_k: Optional[int] = typer.Option(None, "--draft-top-k", help="Children per expanded draft node (default: the preset's)."),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: torch's choice)."),
) -> None:
    """Generate text with a speculative method, streaming it."""
    graft = GraftOptions(
        draft_model=draft_model, draft_dtype=dtype, preset=preset, depth=draft_depth, top_k=draft_top_k, calibration=calibration
    )
    if sample_drafts:
        graft = with_sampled_drafts(graft, temperature, seed)
    run_generate(
        prompt, model, method, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        dtype=dtype, budget=budget, chat=chat, compare=compare, as_json=as_json, stop=stop,
        options=MethodOptions(recycling_state=recycling_state, graft=graft), threads=threads,
    )


@app.command()
def demo(
    method: str = typer.Option("recycling", help="ar, pld or recycling."),
    max_new_tokens: int = typer.Option(96),
    dtype: str = typer.Option("auto", help="auto, bfloat16 or float32."),
) -> None:
    """SmolLM2-135M Instruct on a copy-heavy prompt, compared with plain decoding."""
    err.print(f"specgraft demo: {DEMO_MODEL}, method {method}, {dtype}, greedy, {max_new_tokens} new tokens, chat template")
    run_generate(DEMO_PROMPT, DEMO_MODEL, method, max_new_tokens=max_new_tokens, dtype=dtype, chat=True, compare=True)


@models_app.command("list")
def models_list(cache_dir: Optional[str] = typer.Option(None, help="Model cache (default: $SPECGRAFT_CACHE or ~/.cache/specgraft/models).")) -> None:
    """Show the catalog and what is already pulled."""
    from rich.table import Table

    from specgraft.models.catalog import list_models, model_dir

    table = Table()
    table.add_column("name", no_wrap=True)
    for col in ("architecture", "params", "size (GGUF)", "pulled"):
        table.add_column(col)
    table.add_column("path", overflow="fold")
    for entry, pulled in list_models(cache_dir):
        table.add_row(
            entry.name, entry.architecture, str(getattr(entry, "params", "")), f"{entry.bytes / 1e6:.0f} MB",
            "yes" if pulled else "no", str(model_dir(entry.name, cache_dir)) if pulled else "",
        )
    out.print(table)


@models_app.command("pull")
def models_pull(
    name: str = typer.Argument(..., help="Catalog name (see `specgraft models list`)."),
    cache_dir: Optional[str] = typer.Option(None, help="Model cache directory."),
) -> None:
    """Download, check and convert a catalog model once."""
    from specgraft.models.catalog import get_entry, pull

    get_entry(name)
    path = pull(name, cache_dir=cache_dir, progress=True)
    out.print(f"{name}: {path}")


@app.command()
def warmup(
    model: str = typer.Option(..., "--model", "-m", help="Target model."),
    corpus: str = typer.Option(..., help="JSONL with `turns` and optionally `response`, or a plain text file."),
    out_path: str = typer.Option(..., "--out", help="Where to write the successor matrix (.npz)."),
    limit: int = typer.Option(200, help="Corpus records to read."),
    dtype: str = typer.Option("auto"),
    chat: bool = typer.Option(True, help="Wrap records in the chat template (prompt + response)."),
    k: int = typer.Option(8, help="Successors per token."),
) -> None:
    """Fill a Token Recycling successor matrix from a corpus, for `--recycling-state`."""
    from specgraft.api import SpecDecoder
    from specgraft.drafters.recycling import SuccessorMatrix
    from specgraft.warmup import read_corpus, warm_up_matrix

    texts = read_corpus(corpus, limit=limit)
    dec = SpecDecoder.from_pretrained(model, method="ar", dtype=dtype)
    matrix = SuccessorMatrix(dec.target.vocab_size, k)
    t0 = time.perf_counter()
    rows = warm_up_matrix(dec.target, dec.tokenizer, texts, matrix, chat=chat, progress=True)
    matrix.save(out_path)
    err.print(f"filled {rows} rows from {len(texts)} records in {time.perf_counter() - t0:.1f}s -> {out_path}")


def main() -> None:
    try:
        app(standalone_mode=False)
    except (ValueError, OSError) as e:
        # OSError: missing or unwritable files, and models that cannot be pulled or loaded
        # (ModelLoadError: catalog.load_errors names the model); transformers' messages span
        # several lines, so whitespace is folded to print one line however narrow the terminal
        err.print("error: " + " ".join(str(e).split()), soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as e:  # click usage errors carry their own exit code
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Exit):
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
