"""Building a datastore directory from corpora: read, drop benchmark overlaps, tokenise, sort, write.

Example (``tok`` any Hugging Face fast tokenizer)::

    manifest = build_datastore(tok, ["responses.jsonl", "src/"], "ds/", exclude_texts=prompts)
    ds = Datastore.load("ds/", tokenizer=tok)

The directory appears complete or not at all: everything is written to a hidden sibling folder
that is renamed into place at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from specgraft.retrieval.corpus import DEFAULT_SKIP_DIRS, DEFAULT_SUFFIXES, CorpusReader, Document, ExcludeFilter
from specgraft.retrieval.datastore import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST_FILE,
    SEPARATOR,
    SUFFIX_ARRAY_FILE,
    TOKENS_FILE,
    build_suffix_array,
    join_documents,
    vocab_hash,
)

__all__ = ["build_datastore", "tokenize_documents"]

BATCH_CHARS = 1 << 20
"""Characters of text per tokenizer call: large enough for the fast tokenizer's threads."""


def tokenize_documents(tokenizer: Any, texts: Sequence[str], progress: bool = True) -> list[np.ndarray]:
    """Token ids (``int32`` arrays: a fraction of the memory of lists of Python ints) of each
    text, without special tokens, in batches of about ``BATCH_CHARS`` characters (a ``rich``
    progress bar over characters when ``progress``)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    batches: list[list[str]] = [[]]
    size = 0
    for text in texts:
        if size >= BATCH_CHARS:
            batches.append([])
            size = 0
        batches[-1].append(text)
        size += len(text)
    ids: list[np.ndarray] = []
    columns = (TextColumn("tokenising"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), TimeRemainingColumn())
    with Progress(*columns, disable=not progress, transient=True) as bar:
        task = bar.add_task("tokenising", total=sum(len(t) for t in texts))
        for batch in batches:
            if batch:
                # verbose=False: documents longer than the model's context are fine here
                encoded = tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]
                ids += [np.asarray(doc, dtype=np.int32) for doc in encoded]
            bar.advance(task, sum(len(t) for t in batch))
    assert len(ids) == len(texts), f"{len(ids)} tokenised of {len(texts)} documents"
    return ids


def build_datastore(
    tokenizer: Any,
    files: Iterable[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    exclude_texts: Iterable[str] = (),
    progress: bool = True,
    *,
    tokenizer_name: str | None = None,
    suffixes: Sequence[str] = DEFAULT_SUFFIXES,
    skip_dirs: Sequence[str] = DEFAULT_SKIP_DIRS,
    max_bytes: int | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Write a datastore of the documents of ``files`` (see :mod:`specgraft.retrieval.corpus` for
    the formats, ``suffixes``, ``skip_dirs`` and ``max_bytes``) to ``out_dir``; returns its manifest.

    Documents that overlap one of ``exclude_texts`` (benchmark prompts: see
    :class:`~specgraft.retrieval.corpus.ExcludeFilter` for the rule), and JSONL records whose
    prompt does, are dropped and counted.
    ``tokenizer_name`` is recorded in the manifest (default: ``tokenizer.name_or_path``).
    ``out_dir`` must not exist unless ``overwrite``.

    ``tokenizer`` is a Hugging Face tokenizer or any object with ``get_vocab()`` and
    ``tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]``.
    """
    from rich.console import Console

    console = Console(stderr=True, quiet=not progress)
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ValueError(f"{str(out_dir)!r} already exists (pass overwrite / --force to replace it)")
    t0 = time.perf_counter()
    reader = CorpusReader(files, suffixes=suffixes, skip_dirs=skip_dirs, max_bytes=max_bytes)
    exclude = ExcludeFilter(exclude_texts)
    kept: list[Document] = []
    excluded = 0
    for doc in reader:
        if exclude(doc.text) or (doc.prompt and exclude(doc.prompt)):
            excluded += 1
        else:
            kept.append(doc)
    if not kept:
        raise ValueError(f"no documents left to index in {', '.join(str(p) for p in reader.paths)}")
    t_read = time.perf_counter()
    console.print(
        f"read {len(kept)} documents ({reader.bytes_read / 1e6:.1f} MB) in {t_read - t0:.1f}s; "
        f"{excluded} dropped for overlapping {len(exclude)} benchmark prompts"
        + ("; stopped at the --max-mb cap" if reader.truncated else "")
    )
    ids = tokenize_documents(tokenizer, [d.text for d in kept], progress=progress)
    tokens = join_documents(ids)
    del ids
    t_tok = time.perf_counter()
    console.print(f"tokenised {len(tokens) - len(kept)} tokens in {t_tok - t_read:.1f}s ({(len(tokens) - len(kept)) / max(t_tok - t_read, 1e-9):,.0f} tokens/s)")
    suffix_array = build_suffix_array(tokens)
    t_sa = time.perf_counter()
    console.print(f"suffix array of {len(tokens)} positions in {t_sa - t_tok:.1f}s")
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "tokenizer": tokenizer_name or str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__),
        "vocab_hash": vocab_hash(tokenizer),
        "vocab_size": len(tokenizer.get_vocab()),
        "separator": SEPARATOR,
        "token_count": int(len(tokens)),
        "documents": len(kept),
        "excluded_documents": excluded,
        "exclude_texts": len(exclude),
        "corpus": reader.sources,
        "suffixes": list(suffixes),
        "max_bytes": max_bytes,
        "truncated": reader.truncated,
        "tokens_dtype": str(tokens.dtype),
        "suffix_array_dtype": str(suffix_array.dtype),
        "build_seconds": {
            "read": round(t_read - t0, 3), "tokenize": round(t_tok - t_read, 3), "suffix_array": round(t_sa - t_tok, 3),
        },
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "library_versions": _versions(),
    }
    _write(out_dir, tokens, suffix_array, manifest, overwrite, t0)
    console.print(f"wrote {str(out_dir)!r} in {manifest['build_seconds']['total']:.1f}s")
    return manifest


def _versions() -> dict[str, str]:
    versions = {}
    for name in ("specgraft", "numpy", "pydivsufsort", "tokenizers", "transformers"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def _write_json(file: Path, data: dict[str, Any]) -> None:
    tmp = file.with_name(file.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, file)


def _write(
    out_dir: Path, tokens: np.ndarray, suffix_array: np.ndarray, manifest: dict[str, Any], overwrite: bool, t0: float
) -> None:
    """Write the three files to a hidden sibling folder, then rename it to ``out_dir`` (replacing
    an existing one only when ``overwrite``). The manifest, written last, gets the write and
    total seconds (since ``t0``)."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        np.save(tmp / TOKENS_FILE, tokens)
        np.save(tmp / SUFFIX_ARRAY_FILE, suffix_array)
        seconds = manifest["build_seconds"]
        seconds["write"] = round(time.perf_counter() - t0 - sum(seconds.values()), 3)
        seconds["total"] = round(time.perf_counter() - t0, 3)
        _write_json(tmp / MANIFEST_FILE, manifest)
        if out_dir.exists():
            if not overwrite:
                raise ValueError(f"{str(out_dir)!r} already exists (pass overwrite / --force to replace it)")
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
