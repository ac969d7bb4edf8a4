"""Corpora for datastores: JSONL records, plain text files and directories of source files.

* ``*.jsonl``: one document per record: its ``response``, else ``output``, else ``text``, else its
  ``turns`` joined by blank lines (a datastore holds answers, so a record's prompt is only used
  when it has nothing else). Records with none of them are skipped; a line that is not JSON is a
  ``ValueError`` naming the file and line.
* any other file: one document, the whole file as UTF-8 text.
* a directory: its files whose names end with one of ``suffixes`` (default ``.py``), recursively,
  in sorted path order, without following symbolic links and skipping folders named in
  ``skip_dirs`` (default ``__pycache__``, ``.git``); a file given by name is read whatever its suffix.

Files that cannot be read, contain a NUL byte or are not UTF-8 (binary files) are skipped and
counted. Example::

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.jsonl").write_text('{"turns": ["q"], "response": "r1"}\\n{"output": "r2"}\\n')
    >>> reader = CorpusReader([d / "a.jsonl"])
    >>> [doc.text for doc in reader]
    ['r1', 'r2']
    >>> reader.sources[0]["documents"], reader.sources[0]["files"]
    (2, 1)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CorpusReader", "Document", "ExcludeFilter", "corpus_files", "normalise", "record_text"]

JSONL_FIELDS = ("response", "output", "text")
DEFAULT_SUFFIXES = (".py",)
DEFAULT_SKIP_DIRS = ("__pycache__", ".git")


@dataclass(frozen=True)
class Document:
    text: str
    source: str
    """The file it came from (with ``:LINE`` for a JSONL record)."""
    prompt: str = ""
    """A JSONL record's ``turns`` joined by blank lines (``""`` otherwise): not indexed, but a
    record whose prompt is a benchmark prompt is dropped with it."""


def _joined_turns(record: dict[str, Any]) -> str:
    turns = record.get("turns")
    return "\n\n".join(t for t in turns if isinstance(t, str)) if isinstance(turns, list) else ""


def record_text(record: dict[str, Any]) -> str | None:
    """A JSONL record's document: ``response``, else ``output``, else ``text``, else the joined
    ``turns``; None when it has none of them (or only empty ones).

    >>> record_text({"turns": ["a", "b"], "output": ""})
    'a\\n\\nb'
    """
    for field in JSONL_FIELDS:
        value = record.get(field)
        if isinstance(value, str) and value:
            return value
    turns = record.get("turns")
    if isinstance(turns, list) and any(isinstance(t, str) and t for t in turns):
        return "\n\n".join(t for t in turns if isinstance(t, str) and t)
    return None


def corpus_files(
    path: str | os.PathLike[str], suffixes: Sequence[str] = DEFAULT_SUFFIXES, skip_dirs: Sequence[str] = DEFAULT_SKIP_DIRS
) -> list[Path]:
    """``[path]`` for a file; for a directory its files ending with one of ``suffixes``, found
    recursively without following links, skipping folders named in ``skip_dirs``, sorted by path."""
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ValueError(f"corpus {str(path)!r} does not exist")
    found: list[Path] = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs)
        found += [Path(root) / f for f in files if f.endswith(tuple(suffixes))]
    return sorted(found, key=lambda p: p.relative_to(path).as_posix())


class CorpusReader:
    """Iterates the documents of ``paths`` (files or directories), once.

    ``max_bytes`` caps the bytes read: reading stops before the first file that would take the
    total past it (files come in a fixed order, so a capped corpus is the same every time) and
    ``truncated`` is set. After iterating, ``sources`` describes each path for a manifest:
    ``{"path", "kind", "files", "skipped_files", "bytes", "sha256", "documents"}``, where
    ``sha256`` is the file's hash, or for a directory the hash of the lines
    ``"<relative path> <file sha256>"`` of the files read.
    """

    def __init__(
        self,
        paths: Iterable[str | os.PathLike[str]],
        suffixes: Sequence[str] = DEFAULT_SUFFIXES,
        skip_dirs: Sequence[str] = DEFAULT_SKIP_DIRS,
        max_bytes: int | None = None,
    ) -> None:
        self.paths = [Path(p) for p in paths]
        if not self.paths:
            raise ValueError("no corpus given")
        for p in self.paths:
            if not p.exists():
                raise ValueError(f"corpus {str(p)!r} does not exist")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.suffixes = tuple(suffixes)
        self.skip_dirs = tuple(skip_dirs)
        self.max_bytes = max_bytes
        self.bytes_read = 0
        self.truncated = False
        self.sources: list[dict[str, Any]] = []

    def __iter__(self) -> Iterator[Document]:
        for path in self.paths:
            if self.truncated:
                break
            yield from self._read_path(path)

    def _read_path(self, path: Path) -> Iterator[Document]:
        is_dir = path.is_dir()
        stats: dict[str, Any] = {
            "path": str(path.resolve()), "kind": "directory" if is_dir else "file",
            "files": 0, "skipped_files": 0, "bytes": 0, "sha256": "", "documents": 0,
        }
        self.sources.append(stats)
        listing = hashlib.sha256()
        for file in corpus_files(path, self.suffixes, self.skip_dirs):
            try:
                data = file.read_bytes()
            except OSError:
                stats["skipped_files"] += 1
                continue
            if self.max_bytes is not None and self.bytes_read + len(data) > self.max_bytes:
                self.truncated = True
                break
            texts = _file_documents(file, data)
            if texts is None:
                stats["skipped_files"] += 1
                continue
            digest = hashlib.sha256(data).hexdigest()
            listing.update(f"{file.relative_to(path).as_posix() if is_dir else file.name} {digest}\n".encode())
            if not is_dir:
                stats["sha256"] = digest
            stats["files"] += 1
            stats["bytes"] += len(data)
            self.bytes_read += len(data)
            for source, text, prompt in texts:
                stats["documents"] += 1
                yield Document(text, source, prompt)
        if is_dir:
            stats["sha256"] = listing.hexdigest()


def _file_documents(file: Path, data: bytes) -> list[tuple[str, str, str]] | None:
    """``(source, text, prompt)`` of each document of a file; None for a binary (NUL byte, not UTF-8) file."""
    if b"\0" in data:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if file.suffix != ".jsonl":
        return [(str(file), text, "")] if text else []
    docs = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"corpus {str(file)!r} line {i} is not JSON: {e}") from e
        doc = record_text(record) if isinstance(record, dict) else None
        if doc is not None:
            docs.append((f"{file}:{i}", doc, _joined_turns(record)))
    return docs


def normalise(text: str) -> str:
    """Whitespace runs folded to one space, ends stripped, lower case.

    >>> normalise("  Def  F(x):\\n\\treturn x ")
    'def f(x): return x'
    """
    return " ".join(text.split()).lower()


class ExcludeFilter:
    """Tells whether a document overlaps one of ``texts`` (benchmark prompts, which must not be in
    a datastore): after :func:`normalise`, the document contains the first ``prefix_chars``
    (200) characters of a text, or a text contains the whole document. Texts and documents shorter
    than ``min_chars`` (32) normalised characters take no part (``"def f(x):"`` is in many files
    without being a copy of a prompt).

    A text's prefix can only be in a document that has the prefix's longest whole word, so each
    document is searched only for the prefixes whose word it has (one set intersection instead of
    one scan per prompt).

    >>> f = ExcludeFilter(["Write a function that returns the sum of two numbers, please."])
    >>> f("# write a function that returns the sum of two numbers, please.\\ndef add(a, b): ...")
    True
    >>> f("write a function that returns the product of two numbers")
    False
    """

    def __init__(self, texts: Iterable[str], prefix_chars: int = 200, min_chars: int = 32) -> None:
        self.min_chars = min_chars
        self.texts = [t for t in dict.fromkeys(normalise(t) for t in texts) if len(t) >= min_chars]
        self.joined = "\0".join(self.texts)
        self.longest = max((len(t) for t in self.texts), default=0)
        self.by_word: dict[str, list[str]] = {}
        self.always: list[str] = []
        """Prefixes with no whole word to anchor on, searched in every document."""
        for text in self.texts:
            prefix = text[:prefix_chars]
            # the first and last words may be cut off within a longer word of the document
            inner = prefix.split(" ")[1:-1]
            if inner:
                self.by_word.setdefault(max(inner, key=len), []).append(prefix)
            else:
                self.always.append(prefix)

    def __len__(self) -> int:
        return len(self.texts)

    def __call__(self, document: str) -> bool:
        doc = normalise(document)
        if len(doc) < self.min_chars:
            return False
        if len(doc) <= self.longest and doc in self.joined:
            return True
        if any(prefix in doc for prefix in self.always):
            return True
        for word in self.by_word.keys() & set(doc.split(" ")):
            if any(prefix in doc for prefix in self.by_word[word]):
                return True
        return False
