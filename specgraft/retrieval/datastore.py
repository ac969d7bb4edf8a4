"""Long-term retrieval: a suffix array over a tokenised corpus (READER 4.2), memory-mapped.

A datastore directory holds three files:

* ``tokens.npy``: ``# [n] int32``, the token ids of every document, each document followed by
  :data:`SEPARATOR` (``-1``). Keys are token ids (``>= 0``), so no key ever matches across a
  document boundary and a document's last token has no continuation.
* ``suffix_array.npy``: ``# [n] int32`` (``int64`` when ``n >= 2**31``): the start positions of
  the suffixes of ``tokens`` in lexicographic order (signed comparison, so ``-1`` sorts before
  every token; a shorter suffix sorts before its extensions), built by ``pydivsufsort``.
* ``manifest.json``: format version, tokenizer name and vocabulary hash (:func:`vocab_hash`),
  vocabulary size, corpus files with sha256 and sizes, document and token counts, build seconds
  and library versions. ``specgraft datastore info DIR`` prints it.

Lookup is a binary search for the range of suffixes that start with the key: all occurrences of
the key sit in one contiguous range of the suffix array, sorted by what follows the key. Example
over the single document ``[5, 6, 5, 7, 5, 6]``::

    >>> ds = Datastore.from_documents([[5, 6, 5, 7, 5, 6]])
    >>> ds.tokens.tolist()
    [5, 6, 5, 7, 5, 6, -1]
    >>> c = ds.next_tokens([5])           # 5 is followed by 6 twice and by 7 once
    >>> c.tokens.tolist(), c.counts.tolist(), c.matched
    ([6, 7], [2, 1], 1)
    >>> ds.next_tokens([9, 7, 5]).tokens.tolist()   # back off: [9, 7, 5] -> [7, 5]
    [6]
    >>> ds.next_tokens([5, 6]).matched    # [5, 6] occurs twice but is followed only by 5 and the separator
    2
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specgraft.retrieval.continuations import Continuations

__all__ = [
    "FORMAT_VERSION",
    "SEPARATOR",
    "Datastore",
    "build_suffix_array",
    "join_documents",
    "load_datastores",
    "vocab_hash",
]

SEPARATOR = -1
"""Follows every document in ``tokens.npy``; never a key token, never returned as a continuation."""

FORMAT_VERSION = 1
FORMAT_NAME = "specgraft-datastore"
TOKENS_FILE = "tokens.npy"
SUFFIX_ARRAY_FILE = "suffix_array.npy"
MANIFEST_FILE = "manifest.json"


def vocab_hash(tokenizer: Any) -> str:
    """``"sha256:<hex>"`` of the tokenizer's vocabulary: ``json.dumps`` of the sorted
    ``(token, id)`` items of ``tokenizer.get_vocab()`` (added tokens included).

    The vocabulary, not ``tokenizer.json``'s bytes: the same tokenizer saved by another library
    version writes a different file but maps every token to the same id, which is all a datastore
    of token ids depends on.

    >>> class Toy:
    ...     def get_vocab(self): return {"b": 1, "a": 0}
    >>> vocab_hash(Toy())[:15]
    'sha256:4b4543fe'
    """
    items = sorted(tokenizer.get_vocab().items(), key=lambda kv: (kv[1], kv[0]))
    return "sha256:" + hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def join_documents(documents: Iterable[Sequence[int]]) -> np.ndarray:
    """``# [n] int32``: the documents' token ids, each followed by :data:`SEPARATOR`.

    >>> join_documents([[1, 2], [3]]).tolist()
    [1, 2, -1, 3, -1]
    """
    parts: list[np.ndarray] = []
    sep = np.array([SEPARATOR], np.int32)
    for doc in documents:
        arr = np.asarray(doc, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() > np.iinfo(np.int32).max):
            raise ValueError(f"token ids must be in [0, 2**31), got {int(arr.min())}..{int(arr.max())}")
        parts += [arr.astype(np.int32), sep]
    return np.concatenate(parts) if parts else np.zeros(0, np.int32)


def build_suffix_array(tokens: np.ndarray) -> np.ndarray:
    """``# [n]``: suffix start positions in lexicographic order (signed ids), by ``pydivsufsort``.

    ``pydivsufsort`` sorts integer arrays by viewing them as big-endian fixed-width bytes and
    keeping the suffixes that start on a token boundary (the same order as comparing ids). The
    result is ``int32`` below ``2**31`` tokens, else ``int64``.

    >>> build_suffix_array(np.array([2, 1, 2, 1], np.int32)).tolist()   # [1] < [1,2,1] < [2,1] < [2,1,2,1]
    [3, 1, 2, 0]
    """
    from pydivsufsort import divsufsort

    if tokens.ndim != 1:
        raise ValueError(f"tokens must be 1-D, got shape {tokens.shape}")
    if len(tokens) == 0:
        return np.zeros(0, np.int32)
    sa = divsufsort(np.ascontiguousarray(tokens))
    dtype = np.int32 if len(tokens) < 2**31 else np.int64
    return sa.astype(dtype, copy=False)


class Datastore:
    """A token corpus with its suffix array; :meth:`next_tokens` ranks what followed a key.

    ``max_key_len`` caps the key (its last ``max_key_len`` tokens are used); ``sample_cap`` caps
    the occurrences counted per lookup (see :meth:`next_tokens`).
    """

    def __init__(
        self,
        tokens: np.ndarray,
        suffix_array: np.ndarray,
        manifest: dict[str, Any] | None = None,
        path: str | os.PathLike[str] | None = None,
        max_key_len: int = 8,
        sample_cap: int = 4096,
    ) -> None:
        if max_key_len < 1:
            raise ValueError(f"max_key_len must be >= 1, got {max_key_len}")
        if sample_cap < 1:
            raise ValueError(f"sample_cap must be >= 1, got {sample_cap}")
        assert len(tokens) == len(suffix_array), f"{len(tokens)} tokens vs {len(suffix_array)} suffixes"
        self.tokens = tokens
        self.suffix_array = suffix_array
        self.manifest = manifest or {}
        self.path = None if path is None else Path(path)
        self.max_key_len = max_key_len
        self.sample_cap = sample_cap
        # memoryviews: indexing and slicing them costs a fraction of numpy's per-call overhead,
        # which dominates a binary search of ~25 steps
        self._tok = _int_view(tokens)
        self._sa = _int_view(suffix_array)
        # plain ndarray views: slicing a np.memmap costs several microseconds of bookkeeping
        self._tokens_np = tokens.view(np.ndarray)
        self._sa_np = suffix_array.view(np.ndarray)
        self._heads: dict[tuple[int, ...], tuple[int, int]] = {}
        """:meth:`key_range` of the one- and two-token keys asked for so far: every search
        starts from its key's two-token range. Cleared when it reaches ``_CACHE_ENTRIES``."""
        self._counted: dict[tuple[int, int, int], Continuations] = {}
        """Counts of the ranges larger than ``_CACHED_RANGE`` asked for so far, by
        ``(matched, lo, hi)``: frequent short keys (a newline, an indent) come back at most
        steps and their counting is most of a lookup's cost. Cleared before it would hold more
        than ``_CACHE_TOKENS`` continuations or ``_CACHE_ENTRIES`` ranges."""
        self._counted_tokens = 0

    def __len__(self) -> int:
        """Tokens, separators included."""
        return len(self.tokens)

    def __repr__(self) -> str:
        where = f" at {str(self.path)!r}" if self.path else ""
        return f"Datastore({len(self)} tokens{where})"

    # -- construction ------------------------------------------------------------------

    @classmethod
    def from_documents(cls, documents: Iterable[Sequence[int]], **kw: Any) -> "Datastore":
        """An in-memory datastore over tokenised documents (tests, experiments)."""
        tokens = join_documents(documents)
        return cls(tokens, build_suffix_array(tokens), **kw)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        tokenizer: Any = None,
        vocab_hash: str | None = None,
        max_key_len: int = 8,
        sample_cap: int = 4096,
    ) -> "Datastore":
        """Memory-map a datastore directory written by :func:`specgraft.retrieval.build.build_datastore`.

        With ``tokenizer`` (or its ``vocab_hash``), a datastore built with another vocabulary is
        refused. Any missing, unparseable, truncated or inconsistent file is a one-line
        ``ValueError`` naming it.
        """
        path = Path(path)
        manifest = read_manifest(path)
        expected = _vocab_hash_of(tokenizer) if tokenizer is not None else vocab_hash
        if expected is not None and manifest["vocab_hash"] != expected:
            raise ValueError(
                f"datastore {str(path)!r} was built with tokenizer {manifest.get('tokenizer')!r} "
                f"({manifest['vocab_hash'][:19]}...), not with this one ({expected[:19]}...); rebuild it with "
                "`specgraft datastore build --model <this model>`"
            )
        n = manifest["token_count"]
        tokens = _load_array(path / TOKENS_FILE, np.dtype(np.int32), n)
        suffix_array = _load_array(path / SUFFIX_ARRAY_FILE, np.dtype(manifest["suffix_array_dtype"]), n)
        return cls(tokens, suffix_array, manifest, path=path, max_key_len=max_key_len, sample_cap=sample_cap)

    # -- lookup ------------------------------------------------------------------------

    def _lower_bound(self, key: list[int], lo: int, hi: int) -> int:
        """First index in ``[lo, hi)`` whose suffix's first ``len(key)`` tokens are ``>= key``."""
        tok, sa, n = self._tok, self._sa, len(key)
        while lo < hi:
            mid = (lo + hi) >> 1
            p = sa[mid]
            if tok[p : p + n].tolist() < key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _upper_bound(self, key: list[int], lo: int, hi: int) -> int:
        """First index in ``[lo, hi)`` whose suffix's first ``len(key)`` tokens are ``> key``."""
        tok, sa, n = self._tok, self._sa, len(key)
        while lo < hi:
            mid = (lo + hi) >> 1
            p = sa[mid]
            if tok[p : p + n].tolist() <= key:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _followed_range(self, key: list[int], lo: int, hi: int) -> tuple[int, int]:
        """:meth:`key_range` of ``key`` searched within ``[lo, hi)``, which must hold it."""
        lo = self._lower_bound(key + [0], lo, hi)
        # an absent key costs one search: the first suffix >= key + [0] does not start with key
        p = self._sa[lo] if lo < hi else 0
        if lo == hi or self._tok[p : p + len(key)].tolist() != key:
            return lo, lo
        return lo, self._upper_bound(key, lo + 1, hi)

    def _head_range(self, head: tuple[int, ...]) -> tuple[int, int]:
        r = self._heads.get(head)
        if r is None:
            lo, hi = (0, len(self._sa)) if len(head) == 1 else self._head_range(head[:1])
            r = self._followed_range(list(head), lo, hi) if lo < hi else (lo, lo)
            if len(self._heads) >= _CACHE_ENTRIES:
                self._heads.clear()
            self._heads[head] = r
        return r

    def key_range(self, key: Sequence[int]) -> tuple[int, int]:
        """``[lo, hi)``: the suffix-array indices of the occurrences of ``key`` that are followed by
        a token (not the separator). Within a key's range suffixes are sorted by what follows it,
        and the separator (``-1``) sorts first, so those occurrences start at the first suffix
        ``>= key + [0]`` and end where the key's range ends. They also hold every occurrence of
        every extension of ``key``, so a key's search starts from its first two tokens' range.

        >>> Datastore.from_documents([[4, 5, 4]]).key_range([4])   # suffixes [-1] [4 -1] [4 5 4 -1] [5 4 -1]
        (2, 3)
        """
        key = [int(t) for t in key]
        assert key, "the key is empty"
        lo, hi = self._head_range(tuple(key[:2]))
        if len(key) <= 2 or lo == hi:
            return lo, hi
        return self._followed_range(key, lo, hi)

    def next_tokens(self, key: Sequence[int]) -> Continuations:
        """Continuations of the longest suffix of ``key`` (at most ``max_key_len`` tokens) that is
        followed by a token somewhere in the corpus; empty (``matched == 0``) when none is.

        The longest such suffix is found by searching over its length (lengths 1, 2, 4, ... then
        bisection): if a suffix of length ``m`` occurs with a continuation, so does every shorter
        one. This is READER's backoff (drop the key's first token while it is absent) in about
        log2(matched length) + 1 range searches.

        A range of more than ``sample_cap`` occurrences is counted on ``sample_cap`` evenly spaced
        occurrences and each count scaled by ``range / sample_cap``. Suffixes in a key's range are
        sorted by what follows the key, so each continuation token is one contiguous block and an
        evenly spaced sample (a deterministic systematic sample) hits a block of ``c`` occurrences
        ``c * sample_cap / range`` times up to one: unbiased in expectation over the sampling
        phase, and within one sample step of exact for every block. A token that follows in fewer
        than ``range / sample_cap`` occurrences can be missed; it would rank below every sampled one.
        """
        if isinstance(key, np.ndarray):
            key = key.tolist()
        key = [int(t) for t in key[max(0, len(key) - self.max_key_len) :]]
        best = (0, 0, 0)  # (matched length, lo, hi) of the longest suffix known to match
        fail = len(key) + 1  # the shortest suffix length known not to match
        # gallop (1, 2, 4, ...) then bisect: most keys match only 1-2 tokens of a datastore, so
        # this takes fewer searches than bisecting 1..max_key_len from the middle
        m = 1
        while best[0] + 1 < fail:
            lo, hi = self.key_range(key[len(key) - m :])
            if lo < hi:
                best = (m, lo, hi)
                m = 2 * m if 2 * m < fail else (m + fail) >> 1
            else:
                fail = m
                m = (best[0] + fail) >> 1
        matched, lo, hi = best
        if matched == 0:
            return Continuations.empty()
        return self._count(matched, lo, hi)

    def _count(self, matched: int, lo: int, hi: int) -> Continuations:
        """Continuations of the key whose followed occurrences are suffix-array indices ``[lo, hi)``."""
        if hi - lo <= _CACHED_RANGE:
            return self._count_range(matched, lo, hi)
        c = self._counted.get((matched, lo, hi))
        if c is None:
            c = self._count_range(matched, lo, hi)
            c.tokens.flags.writeable = c.counts.flags.writeable = False  # shared: callers must not edit them
            if self._counted_tokens + len(c) > _CACHE_TOKENS or len(self._counted) >= _CACHE_ENTRIES:
                self._counted.clear()
                self._counted_tokens = 0
            self._counted[(matched, lo, hi)] = c
            self._counted_tokens += len(c)
        return c

    def _count_range(self, matched: int, lo: int, hi: int) -> Continuations:
        """The followers of a range come out sorted by token (see :meth:`key_range`), so counting
        is finding runs, and a stable sort by count keeps ties in token order."""
        size = hi - lo
        if size <= _SMALL_RANGE:
            tok = self._tok
            runs: dict[int, int] = {}
            for p in self._sa[lo:hi].tolist():
                t = tok[p + matched]
                runs[t] = runs.get(t, 0) + 1
            ranked = sorted(runs.items(), key=lambda kv: -kv[1])
            return Continuations(
                np.fromiter((t for t, _ in ranked), np.int64, len(ranked)),
                np.fromiter((n for _, n in ranked), np.int64, len(ranked)),
                matched,
            )
        if size <= self.sample_cap:
            positions = self._sa_np[lo:hi]
        else:
            positions = self._sa_np[lo + (np.arange(self.sample_cap) * size) // self.sample_cap]
        followers = self._tokens_np[positions + matched]
        starts = np.flatnonzero(followers[1:] != followers[:-1]) + 1
        tokens = followers[np.concatenate(([0], starts))].astype(np.int64)
        counts = np.diff(np.concatenate(([0], starts, [len(followers)]))).astype(np.int64)
        if size > self.sample_cap:
            counts = (counts * size + self.sample_cap // 2) // self.sample_cap
        order = np.argsort(-counts, kind="stable")
        return Continuations(tokens[order], counts[order], matched)


_SMALL_RANGE = 24
"""Ranges up to this many occurrences are counted in Python: cheaper than numpy's call overhead."""
_CACHED_RANGE = 24
"""Counts of larger ranges are cached (see ``Datastore._counted``)."""
_CACHE_TOKENS = 1 << 20
"""The count cache is cleared before it holds more continuations than this (16 MB of arrays)."""
_CACHE_ENTRIES = 1 << 16
"""Each cache is cleared when it reaches this many keys."""


def _int_view(arr: np.ndarray) -> memoryview:
    """A memoryview of native ints over ``arr``'s buffer (numpy's may say ``<i``, which
    memoryview cannot index)."""
    arr = np.ascontiguousarray(arr)
    assert arr.dtype.kind == "i" and arr.dtype.isnative, arr.dtype
    return memoryview(arr).cast("B").cast({4: "i", 8: "q"}[arr.dtype.itemsize])


def _vocab_hash_of(tokenizer: Any) -> str:
    return tokenizer if isinstance(tokenizer, str) else vocab_hash(tokenizer)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


_MANIFEST_FIELDS = {
    "format": str,
    "format_version": int,
    "tokenizer": str,
    "vocab_hash": str,
    "vocab_size": int,
    "separator": int,
    "token_count": int,
    "documents": int,
    "suffix_array_dtype": str,
}


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The parsed, checked ``manifest.json`` of datastore directory ``path`` (``ValueError`` naming
    the file otherwise)."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"datastore {str(path)!r} is not a directory")
    file = path / MANIFEST_FILE
    if not file.is_file():
        raise ValueError(f"datastore {str(path)!r} has no {MANIFEST_FILE} (not a datastore, or its build did not finish)")
    try:
        manifest = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"datastore manifest {str(file)!r} is unreadable: {_one_line(e)}") from e
    if not isinstance(manifest, dict):
        raise ValueError(f"datastore manifest {str(file)!r} is not a JSON object")
    for field, kind in _MANIFEST_FIELDS.items():
        if not isinstance(manifest.get(field), kind):
            raise ValueError(f"datastore manifest {str(file)!r} lacks {field!r} ({kind.__name__})")
    if manifest["format"] != FORMAT_NAME or manifest["format_version"] != FORMAT_VERSION:
        raise ValueError(
            f"datastore manifest {str(file)!r} is format {manifest['format']!r} version {manifest['format_version']}; "
            f"this specgraft reads {FORMAT_NAME!r} version {FORMAT_VERSION}"
        )
    if manifest["separator"] != SEPARATOR:
        raise ValueError(f"datastore manifest {str(file)!r} has separator {manifest['separator']}, expected {SEPARATOR}")
    if manifest["suffix_array_dtype"] not in ("int32", "int64"):
        raise ValueError(f"datastore manifest {str(file)!r} has suffix_array_dtype {manifest['suffix_array_dtype']!r}")
    return manifest


def _load_array(file: Path, dtype: np.dtype, length: int) -> np.ndarray:
    """``np.load(file, mmap_mode="r")`` checked for dtype and length (``ValueError`` naming the file)."""
    if not file.is_file():
        raise ValueError(f"datastore file {str(file)!r} is missing")
    try:
        arr = np.load(file, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"datastore file {str(file)!r} is truncated or corrupt: {_one_line(e)}") from e
    if arr.dtype != dtype or arr.ndim != 1 or len(arr) != length:
        raise ValueError(
            f"datastore file {str(file)!r} holds {arr.dtype}{list(arr.shape)}; its manifest says {dtype}[{length}]"
        )
    return arr


def load_datastores(
    paths: Iterable[str | os.PathLike[str]], tokenizer: Any, max_key_len: int = 8, sample_cap: int = 4096
) -> list[Datastore]:
    """:meth:`Datastore.load` for each path, each checked against ``tokenizer`` (a tokenizer, or
    its :func:`vocab_hash`; hashed once for all paths)."""
    expected = _vocab_hash_of(tokenizer)
    return [Datastore.load(p, vocab_hash=expected, max_key_len=max_key_len, sample_cap=sample_cap) for p in paths]
