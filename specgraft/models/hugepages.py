"""Back a model's large buffers (weights, KV cache) with transparent huge pages.

A CPU decoding step streams every weight once. With 4 KiB pages a 1 GB model spans 250,000
pages, and the TLB misses cost more under a hypervisor, where each miss walks two page tables.
With 2 MiB pages there are 500 of them. Linux in THP ``madvise`` mode (a common default) gives
huge pages only to the regions a process asks for, and llama.cpp and torch allocate their
buffers with ``malloc`` and do not ask. :func:`advise_huge_pages` asks for them: for every
anonymous, writable mapping of at least ``min_bytes`` in ``/proc/self/smaps`` it calls
``madvise(MADV_HUGEPAGE)``, then, where the mapping holds resident 4 KiB pages,
``madvise(MADV_COLLAPSE)`` (Linux 6.1+), which moves them into huge pages now instead of leaving
that to ``khugepaged``. Nothing changes numerically: only the page size under the same bytes.
The collapse copies every page (2-4 s for a 1 GB model on two cores); a llama.cpp built by
``python -m specgraft.models.llamacpp_build --install`` asks for huge pages when it allocates its
buffers (``llamacpp_huge_pages.inc``), so their pages are huge from the start and the collapse
finds little left to do (0.2-0.5 s for the 1.5B Q4_K_M).

Measured (a 2-core VM, THP ``madvise``, llama.cpp, Qwen2.5-Coder-1.5B Q4_K_M, 128 one-row
steps): 13.1-13.4 tokens/s with 4 KiB pages, 16.7-17.2 tokens/s with the weights in huge pages
(``benchmarks/experiments/llamacpp/NOTES.md``). Where THP is ``never``, on another OS, or on a
kernel without ``MADV_COLLAPSE`` it does what it can and reports it; it never raises.

>>> report = advise_huge_pages(min_bytes=1 << 40)  # no mapping is that large
>>> report.advised_bytes
0
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20

#: Mappings smaller than this are left alone: model weights and KV caches are hundreds of MB.
MIN_BYTES = 32 << 20

#: ``SPECGRAFT_HUGE_PAGES=0`` turns the advice off (to measure without it).
ENV = "SPECGRAFT_HUGE_PAGES"


@dataclass(frozen=True)
class HugePageReport:
    """What :func:`advise_huge_pages` did: bytes of the mappings it advised, and the process's
    anonymous memory in huge pages before and after (``AnonHugePages`` of ``smaps_rollup``)."""

    advised_bytes: int = 0
    huge_before: int = 0
    huge_after: int = 0
    seconds: float = 0.0
    note: str = ""

    def __str__(self) -> str:
        if self.note:
            return f"huge pages: {self.note}"
        return (
            f"huge pages: {self.advised_bytes >> 20} MiB advised, {self.huge_before >> 20} -> {self.huge_after >> 20} MiB "
            f"in huge pages ({self.seconds:.1f} s)"
        )


def enabled() -> bool:
    """Whether the advice is on: Linux, THP not ``never``, and ``SPECGRAFT_HUGE_PAGES`` not ``0``."""
    if not sys.platform.startswith("linux") or os.environ.get(ENV, "1") == "0":
        return False
    return thp_mode() not in ("never", None)


@contextlib.contextmanager
def huge_pages_asked(on: bool) -> Iterator[None]:
    """Within the block, a llama.cpp built by :mod:`specgraft.models.llamacpp_build` asks for
    huge pages as it allocates (``llamacpp_huge_pages.inc`` reads ``SPECGRAFT_HUGE_PAGES`` at
    each allocation) only if ``on``; with ``on`` the environment is left as it is.

    >>> with huge_pages_asked(False):
    ...     os.environ[ENV]
    '0'
    """
    if on:
        yield
        return
    before = os.environ.get(ENV)
    os.environ[ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def program_env(env: dict[str, str] | None = None, on: bool | None = None) -> dict[str, str]:
    """The environment (default: this process's) for a program that allocates a model with
    ``malloc`` (llama.cpp's own tools), asking glibc (2.35+) to advise huge pages for its large
    allocations as :func:`advise_huge_pages` does here; unchanged when the advice is off
    (``on``: default :func:`enabled`).

    >>> program_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, on=True)["GLIBC_TUNABLES"]
    'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1'
    >>> program_env({}, on=False)
    {}
    """
    env = dict(os.environ if env is None else env)
    if enabled() if on is None else on:
        tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t and not t.startswith("glibc.malloc.hugetlb=")]
        env["GLIBC_TUNABLES"] = ":".join([*tunables, "glibc.malloc.hugetlb=1"])
    return env


def thp_mode() -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    chosen = [word[1:-1] for word in text.split() if word.startswith("[")]
    return chosen[0] if chosen else None


def anon_huge_bytes() -> int:
    """The process's anonymous memory in huge pages (``AnonHugePages``), 0 where unknown."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass(frozen=True)
class Mapping:
    """One anonymous mapping of the process: where it starts, its length, and (from ``smaps``)
    how much of it is resident and how much of that in huge pages (None: not known)."""

    start: int
    length: int
    resident: int | None = None
    huge: int | None = None
    heap: bool = False
    """Whether it is the ``brk`` heap (``[heap]``)."""

    @property
    def needs_collapse(self) -> bool:
        """Whether the mapping holds more memory in 4 KiB pages than its unaligned edges can: not
        where the memory is untouched (its first touch takes huge pages once advised) or already
        huge (a llama.cpp that asked for them when it allocated: ``llamacpp_huge_pages.inc``)."""
        if self.resident is None or self.huge is None:
            return True
        # the parts before the first and after the last 2 MiB boundary cannot be huge pages
        interior = max(0, (self.start + self.length) // HUGE_PAGE * HUGE_PAGE - -(-self.start // HUGE_PAGE) * HUGE_PAGE)
        return self.resident - self.huge > self.length - interior


def large_anonymous_mappings(smaps: str, min_bytes: int = MIN_BYTES) -> list[Mapping]:
    """Every private, writable, anonymous mapping of at least ``min_bytes`` in a
    ``/proc/<pid>/smaps`` text (a ``maps`` text gives the same mappings, their residency unknown).

    >>> smaps = '''7f0000000000-7f0040000000 rw-p 00000000 00:00 0
    ... Rss:              524288 kB
    ... AnonHugePages:    520192 kB
    ... 7f0040000000-7f0040001000 rw-p 00000000 00:00 0
    ... 7f0050000000-7f0090000000 r--p 00000000 08:01 42  /models/m.gguf
    ... 55d000000000-55d004000000 rw-p 00000000 00:00 0   [heap]
    ... Rss:               65536 kB
    ... AnonHugePages:         0 kB
    ... 7ffd00000000-7ffd04000000 rw-p 00000000 00:00 0   [stack]'''
    >>> [(hex(m.start), m.length >> 20, m.resident >> 20, m.huge >> 20, m.needs_collapse) for m in large_anonymous_mappings(smaps)]
    [('0x7f0000000000', 1024, 512, 508, True), ('0x55d000000000', 64, 64, 0, True)]
    >>> [m.heap for m in large_anonymous_mappings(smaps)]
    [False, True]
    >>> edges = Mapping(start=(1 << 30) + (1 << 20), length=148 << 20, resident=148 << 20, huge=146 << 20)
    >>> edges.needs_collapse  # 1 MiB before the first 2 MiB boundary, 1 MiB after the last
    False
    >>> large_anonymous_mappings("7f0000000000-7f0040000000 rw-p 00000000 00:00 0")[0].needs_collapse
    True
    """
    out: list[Mapping] = []
    inside = False  # whether the field lines that follow belong to the last mapping kept
    for line in smaps.splitlines():
        fields = line.split()
        if _MAPPING_LINE.match(line):
            inside = False
            name = fields[5] if len(fields) > 5 else ""
            if not fields[1].startswith("rw") or not fields[1].endswith("p") or name not in ("", "[heap]"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if end - start >= min_bytes:
                out.append(Mapping(start, end - start, heap=name == "[heap]"))
                inside = True
        elif inside and len(fields) >= 2 and fields[0] in _SMAPS_FIELDS:
            out[-1] = replace(out[-1], **{_SMAPS_FIELDS[fields[0]]: int(fields[1]) * 1024})
    return out


#: A mapping's first line in ``maps`` / ``smaps``: its address range, permissions, offset...
_MAPPING_LINE = re.compile(r"[0-9a-f]+-[0-9a-f]+\s+\S{4}\s")

#: The ``smaps`` fields :class:`Mapping` keeps (kB).
_SMAPS_FIELDS = {"Rss:": "resident", "AnonHugePages:": "huge"}


@functools.lru_cache(maxsize=1)
def _madvise():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = libc.madvise
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(min_bytes: int = MIN_BYTES, heap: bool = True) -> HugePageReport:
    """Ask for huge pages under every large anonymous mapping of this process and collapse them
    now (module docstring). Call it after a model's buffers are allocated and filled.

    ``heap=False`` leaves the ``brk`` heap alone: glibc serves allocations under its mmap
    threshold (at most 32 MiB) from there, so a model whose weights are a few large buffers of
    their own (llama.cpp's) has only the interpreter's and the tokenizer's objects on the heap, and
    collapsing those costs ~0.5-1 s for nothing a decoding step reads. (The arenas glibc gives
    other threads are anonymous mappings too, and are advised like any other.)"""
    if not enabled():
        return HugePageReport(note="off" if os.environ.get(ENV) == "0" else f"not available (THP {thp_mode() or 'unknown'})")
    try:
        mappings = [m for m in large_anonymous_mappings(Path("/proc/self/smaps").read_text(), min_bytes) if heap or not m.heap]
        madvise = _madvise()
    except (OSError, AttributeError) as e:
        return HugePageReport(note=f"not available ({e})")
    t0 = time.perf_counter()
    before = anon_huge_bytes()
    advised = 0
    for mapping in mappings:
        start, length = mapping.start, mapping.length
        if madvise(start, length, MADV_HUGEPAGE) != 0:
            continue
        advised += length
        if not mapping.needs_collapse:
            continue
        # one huge page at a time: the kernel stops a ranged collapse at the first page it cannot
        # take (a mapping merged with one it may not collapse), which would leave the rest in
        # 4 KiB pages. Best effort: EINVAL before Linux 6.1, EAGAIN when memory is short.
        first = -(-start // HUGE_PAGE) * HUGE_PAGE
        for address in range(first, start + length - HUGE_PAGE + 1, HUGE_PAGE):
            madvise(address, HUGE_PAGE, MADV_COLLAPSE)
    return HugePageReport(advised, before, anon_huge_bytes(), time.perf_counter() - t0)
