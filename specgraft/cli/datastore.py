"""`specgraft datastore build | generate | info`: READER's long-term retrieval datastores (suffix arrays),
and corpora of the target's own answers to build them from."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console

# the same consoles as the other commands', made here so this module imports nothing heavy
err = Console(stderr=True, highlight=False, markup=False)
out = Console(highlight=False)

datastore_app = typer.Typer(no_args_is_help=True, help="Build and inspect retrieval datastores (suffix arrays over corpora).")


def exclude_prompts(spec: str) -> list[str]:
    """Every user turn of the suites in ``spec`` (``all``: every bundled suite; ``none``: nothing;
    else comma-separated suite names or prompt JSONL files, as ``--suite`` takes them)."""
    from specgraft.suites import SUITES, load_suite

    if spec.strip() == "none":
        return []
    names = list(SUITES) if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    # per-suite counts (`spec-bench:3`) are dropped: every prompt of a suite is excluded
    suite = load_suite([name.split(":")[0] for name in names])
    return [turn for prompt in suite.prompts for turn in prompt.turns]


def load_tokenizer(model: str, cache_dir: Optional[str] = None):
    """The tokenizer of a catalog model (pulled on first use), a local model or tokenizer
    directory, or a hub id; no weights are loaded."""
    from transformers import AutoTokenizer

    from specgraft.models.resolve import load_errors, resolve_model

    path = resolve_model(model, cache_dir=cache_dir, progress=True)
    with load_errors(model, role="tokenizer of"):
        return AutoTokenizer.from_pretrained(path)


@datastore_app.command("build")
def datastore_build(
    model: str = typer.Option(..., "--model", "-m", help="Catalog name, local model or tokenizer directory, or hub id: only its tokenizer is loaded."),
    corpus: list[str] = typer.Option(..., "--corpus", help="A JSONL file, text file or directory (repeatable)."),
    out_dir: str = typer.Option(..., "--out", help="Datastore directory to create."),
    exclude_suite: str = typer.Option(
        "all", help="Drop documents overlapping these suites' prompts: `all` (every bundled suite, and EAGLE's alpaca set when found), `none`, or comma-separated suite names / prompt JSONL files."
    ),
    suffix: list[str] = typer.Option([".py"], "--suffix", help="File name endings read in directories (repeatable)."),
    skip_dir: list[str] = typer.Option(["__pycache__", ".git"], "--skip-dir", help="Folder names skipped in directories (repeatable)."),
    max_mb: Optional[float] = typer.Option(None, "--max-mb", help="Stop reading before the file that would pass this many MB of corpus."),
    force: bool = typer.Option(False, "--force", help="Replace an existing datastore at --out."),
    cache_dir: Optional[str] = typer.Option(None, help="Model cache (default: $SPECGRAFT_CACHE or ~/.cache/specgraft/models)."),
) -> None:
    """Tokenise corpora with a model's tokenizer and write a memory-mappable suffix-array datastore."""
    from specgraft.retrieval.build import build_datastore

    from pathlib import Path

    # fail on bad arguments before loading anything
    if max_mb is not None and max_mb <= 0:
        raise ValueError(f"--max-mb must be > 0, got {max_mb}")
    for path in corpus:
        if not Path(path).exists():
            raise ValueError(f"corpus {path!r} does not exist")
    if Path(out_dir).exists() and not force:
        raise ValueError(f"{out_dir!r} already exists (pass --force to replace it)")
    prompts = exclude_prompts(exclude_suite)
    tokenizer = load_tokenizer(model, cache_dir)
    manifest = build_datastore(
        tokenizer, corpus, out_dir, exclude_texts=prompts, progress=True, tokenizer_name=model,
        suffixes=tuple(suffix), skip_dirs=tuple(skip_dir),
        max_bytes=None if max_mb is None else int(max_mb * 1e6), overwrite=force,
    )
    err.print(f"{manifest['documents']} documents, {manifest['token_count']} tokens -> {out_dir}")


@datastore_app.command("generate")
def datastore_generate(
    model: str = typer.Option(..., "--model", "-m", help="The target model whose answers the datastore will hold."),
    prompts: list[str] = typer.Option(..., "--prompts", help="Prompt suite or JSONL file (id, task, turns[, chat]), as --suite takes it; `FILE:N` keeps the first N per task (repeatable)."),
    out_path: str = typer.Option(..., "--out", help="Answers JSONL to write, or to resume (prompts already in it are skipped)."),
    method: Optional[str] = typer.Option(
        None, help="Any method: greedy answers are plain decoding's tokens whichever method runs, so pick the fastest "
        "(default: pld, or draft-tree with --draft-model).",
    ),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="Draft model, for the methods that need one."),
    max_new_tokens: int = typer.Option(128, help="Tokens per answer (fewer when EOS comes first)."),
    exclude_suite: str = typer.Option("all", help="Refuse prompts overlapping these suites' prompts (as `datastore build --exclude-suite`)."),
    dtype: str = typer.Option("auto", help="auto, bfloat16 or float32 (the target's; answers in float32 are exact)."),
    draft_quant: str = typer.Option("auto", "--draft-quant", help="The draft model's numerics (auto: int8 on CPU); outputs stay the target's."),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: torch's choice)."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
    cache_dir: Optional[str] = typer.Option(None, help="Model cache (default: $SPECGRAFT_CACHE or ~/.cache/specgraft/models)."),
) -> None:
    """Answer prompts with the target (greedy, first turns) into a JSONL corpus for `datastore build`.

    READER builds its datastore from "many responses, ideally produced by the base model"; e.g.
    `specgraft datastore generate -m qwen2.5-coder-1.5b-instruct --prompts benchmarks/answer_prompts.jsonl
    --out answers.jsonl --draft-model qwen2.5-coder-0.5b-instruct`, then
    `specgraft datastore build -m qwen2.5-coder-1.5b-instruct --corpus answers.jsonl --out DIR`.
    """
    from specgraft.cli.options import method_options, set_threads
    from specgraft.methods import default_method, get_method
    from specgraft.retrieval.answers import generate_answers
    from specgraft.retrieval.corpus import ExcludeFilter
    from specgraft.suites import load_suite

    # fail on bad arguments before loading anything
    if method is not None:
        get_method(method)
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    suite = load_suite(prompts)
    excluded = exclude_prompts(exclude_suite)
    exclude = ExcludeFilter(excluded) if excluded else None
    set_threads(threads)
    from specgraft.api import SpecDecoder

    options = method_options(model, dtype, draft_model=draft_model, draft_quant=draft_quant)
    method = method if method is not None else default_method(options)
    get_method(method).check(options)  # a missing draft model, before the target loads
    decoder = SpecDecoder.from_pretrained(model, method=method, dtype=dtype, device=device, options=options, cache_dir=cache_dir)
    config = SpecDecoder.make_config(max_new_tokens=max_new_tokens)
    err.print(f"{len(suite.prompts)} prompts, {max_new_tokens} tokens each, method {method} -> {out_path}")
    run = generate_answers(decoder, suite.prompts, out_path, config, exclude=exclude, extra={"model": model, "method": method})
    if run.excluded:
        err.print(f"refused {len(run.excluded)} prompts overlapping --exclude-suite {exclude_suite}: {', '.join(run.excluded[:5])}"
                  + (" ..." if len(run.excluded) > 5 else ""))
    err.print(f"{run.written} answers written ({run.new_tokens} tokens, {run.tokens_per_s:.1f} tokens/s), "
              f"{run.skipped} already in {out_path}")


@datastore_app.command("info")
def datastore_info(
    path: str = typer.Argument(..., help="A datastore directory."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
) -> None:
    """Check a datastore (manifest, array lengths and types) and print its manifest and sizes."""
    import json
    from pathlib import Path

    from rich.table import Table

    from specgraft.retrieval import Datastore

    ds = Datastore.load(path)
    m = ds.manifest
    if as_json:
        out.print_json(json.dumps(m))
        return
    table = Table(show_header=False)
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
    for field in ("format", "format_version", "tokenizer", "vocab_hash", "vocab_size", "documents", "excluded_documents", "token_count", "truncated", "created"):
        table.add_row(field, str(m.get(field, "")))
    for source in m.get("corpus", []):
        table.add_row(
            "corpus", f"{source['path']} ({source['kind']}: {source['files']} files, {source['bytes'] / 1e6:.1f} MB, "
            f"{source['documents']} documents, sha256 {source['sha256'][:16]}...)",
        )
    seconds = m.get("build_seconds", {})
    table.add_row("build seconds", ", ".join(f"{k} {v}" for k, v in seconds.items()))
    table.add_row("libraries", ", ".join(f"{k} {v}" for k, v in m.get("library_versions", {}).items()))
    for file in sorted(Path(path).iterdir()):
        table.add_row("file", f"{file.name}: {file.stat().st_size / 1e6:.1f} MB")
    out.print(table)
