"""`specgraft models list | pull` and `specgraft warmup`: the offline catalog and the matrix warm-up."""

from __future__ import annotations

import time
from typing import Optional

import typer

from specgraft.cli.options import CHAT_RECORDS, err, out

models_app = typer.Typer(no_args_is_help=True, help="List and pull the offline model catalog.")


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
    from specgraft.models.catalog import get_entry
    from specgraft.models.resolve import pull

    get_entry(name)
    path = pull(name, cache_dir=cache_dir, progress=True)
    out.print(f"{name}: {path}")


def warmup(
    model: str = typer.Option(..., "--model", "-m", help="Target model."),
    corpus: str = typer.Option(..., help="JSONL with `turns` and optionally `response`, or a plain text file."),
    out_path: str = typer.Option(..., "--out", help="Where to write the successor matrix (.npz)."),
    limit: int = typer.Option(200, help="Corpus records to read."),
    dtype: str = typer.Option("auto", help="auto (float32 on a CPU, bfloat16 on a GPU), float32, bfloat16 or float16."),
    chat: Optional[bool] = CHAT_RECORDS,
    k: int = typer.Option(8, help="Successors per token."),
    device: str = typer.Option("auto", help="auto (cuda when available, else cpu), cpu or cuda."),
) -> None:
    """Fill a Token Recycling successor matrix from a corpus, for `--recycling-state`."""
    from specgraft.api import SpecDecoder
    from specgraft.calibration.corpus import read_corpus
    from specgraft.cli.options import chat_mode, prompt_format
    from specgraft.calibration.warmup import warm_up_matrix
    from specgraft.drafters.recycling import SuccessorMatrix

    texts = read_corpus(corpus, limit=limit)
    dec = SpecDecoder.from_pretrained(model, method="ar", dtype=dtype, device=device)
    chat = chat_mode(dec, chat, model)
    matrix = SuccessorMatrix(dec.target.vocab_size, k)
    t0 = time.perf_counter()
    rows = warm_up_matrix(dec.target, dec.tokenizer, texts, matrix, chat=chat, progress=True)
    matrix.save(out_path)
    err.print(f"filled {rows} rows from {len(texts)} records ({prompt_format(chat)}) in {time.perf_counter() - t0:.1f}s -> {out_path}")
