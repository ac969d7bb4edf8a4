"""Corpora for warm-up and calibration: JSONL records (``turns`` + ``response``) or text files,
grouped by task, split into warm-up and held-out records, with benchmark prompts dropped."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specgraft.suites import DATA_DIR, SUITES, read_prompt_file, resolve_alpaca_path


def read_corpus(path: str | Path, limit: int | None = None) -> list[tuple[str, str]]:
    """``(prompt, response)`` pairs from a JSONL file (``turns`` + ``response``) or a text file."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"corpus file {str(path)!r} does not exist")
    records: list[tuple[str, str]] = []
    if path.suffix == ".jsonl":
        with path.open() as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                turns = rec.get("turns") or [""]
                records.append((str(turns[0]), str(rec.get("response", ""))))
                if limit is not None and len(records) >= limit:
                    break
    else:
        records.append(("", path.read_text()))
    if not records:
        raise ValueError(f"corpus file {str(path)!r} has no records")
    return records


@dataclass(frozen=True)
class CorpusRecord:
    prompt: str
    response: str
    task: str
    """The record's task field, else the corpus file's stem."""


def read_task_corpus(path: str | Path, task_field: str = "task") -> list[CorpusRecord]:
    """Records of a corpus read as :func:`read_corpus` does (JSONL ``turns`` +
    ``response``, or one text file), each with its task: the ``task_field`` value when the
    record has one, else the file's stem."""
    path = Path(path)
    if path.suffix != ".jsonl":
        return [CorpusRecord(p, r, path.stem) for p, r in read_corpus(path)]
    tasks: list[str] = []
    with path.open() as f:
        for line in f:
            if line.strip():
                value = json.loads(line).get(task_field)
                tasks.append(str(value) if value not in (None, "") else path.stem)
    return [CorpusRecord(p, r, t) for (p, r), t in zip(read_corpus(path), tasks, strict=True)]


def split_corpus(
    groups: dict[str, list[CorpusRecord]], limit: int, prompts: int
) -> tuple[list[CorpusRecord], list[CorpusRecord]]:
    """Per group (a corpus file, or a task): of its first ``limit + prompts`` records, the last
    ``prompts`` are held out for decoding, the others warm the matrix up. ``ValueError`` when a
    group has fewer than ``prompts`` records plus one to warm up with (unless ``limit`` is 0).

    >>> recs = [CorpusRecord(str(i), "", "t") for i in range(5)]
    >>> warm, held = split_corpus({"t": recs}, limit=2, prompts=2)
    >>> [r.prompt for r in warm], [r.prompt for r in held]
    (['0', '1'], ['2', '3'])
    """
    warm: list[CorpusRecord] = []
    held_out: list[CorpusRecord] = []
    need = prompts + min(limit, 1)
    for name, records in groups.items():
        records = records[: limit + prompts]
        if len(records) < need:
            raise ValueError(f"{name!r} has {len(records)} records; need at least {need} (--prompts {prompts}, --limit {limit})")
        warm += records[: len(records) - prompts]
        held_out += records[len(records) - prompts :]
    return warm, held_out


def benchmark_turns(extra: list[str]) -> set[str]:
    """Every turn (stripped) of the packaged benchmark suites, of EAGLE's alpaca set when it is
    found, and of the ``extra`` prompt files: corpus records with one of these prompts are dropped.
    (Two AlpacaEval records, for instance, are MT-bench questions.)"""
    paths = [DATA_DIR / name for name in SUITES.values()]
    alpaca = resolve_alpaca_path(None)
    if alpaca is not None:
        paths.append(alpaca)
    paths += [Path(p) for p in extra]
    return {turn.strip() for path in paths for prompt in read_prompt_file(path, path.stem) for turn in prompt.turns}
