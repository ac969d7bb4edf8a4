"""Huge pages under large anonymous buffers: collapsed where the kernel can, bytes unchanged."""

import platform
import re

import numpy as np
import pytest

from specgraft.models import hugepages


def test_a_large_buffer_moves_to_huge_pages_with_its_bytes():
    if not hugepages.enabled():
        pytest.skip(f"transparent huge pages unavailable here (THP {hugepages.thp_mode()})")
    release = tuple(int(x) for x in re.findall(r"\d+", platform.release())[:2])
    if release < (6, 1):
        pytest.skip(f"MADV_COLLAPSE needs Linux 6.1+, this is {platform.release()}")
    start = hugepages.anon_huge_bytes()
    data = np.random.default_rng(0).integers(0, 255, size=96 << 20, dtype=np.uint8)  # an anonymous mapping
    copy = data.copy()
    report = hugepages.advise_huge_pages(min_bytes=64 << 20)
    assert report.advised_bytes >= data.nbytes and not report.note
    # THP "always" gives the buffer huge pages from the start, "madvise" only after the collapse
    assert report.huge_after - start >= 64 << 20, report
    assert np.array_equal(data, copy), "the page size changes, the bytes do not"


def test_off_when_asked(monkeypatch):
    monkeypatch.setenv(hugepages.ENV, "0")
    report = hugepages.advise_huge_pages()
    assert not hugepages.enabled() and report.advised_bytes == 0 and str(report) == "huge pages: off"
    assert "GLIBC_TUNABLES" not in hugepages.program_env({})


def test_the_collapse_skips_the_heap_and_mappings_already_huge(monkeypatch):
    """Every mapping is advised; only those holding resident 4 KiB pages are collapsed, one huge
    page at a time; ``heap=False`` leaves the heap out."""
    H = hugepages.HUGE_PAGE
    mappings = [
        hugepages.Mapping(start=100 * H, length=8 * H, resident=8 * H, huge=0),  # 4 KiB pages
        hugepages.Mapping(start=200 * H, length=8 * H, resident=8 * H, huge=8 * H),  # huge already
        hugepages.Mapping(start=300 * H, length=8 * H, resident=0, huge=0),  # untouched
        hugepages.Mapping(start=400 * H, length=8 * H, resident=8 * H, huge=0, heap=True),
    ]
    calls = []

    def madvise(address, length, advice):
        calls.append((address // H, length // H, advice))
        return 0

    monkeypatch.setattr(hugepages, "enabled", lambda: True)
    monkeypatch.setattr(hugepages, "large_anonymous_mappings", lambda smaps, min_bytes: mappings)
    monkeypatch.setattr(hugepages, "_madvise", lambda: madvise)

    def advised_and_collapsed(heap):
        calls.clear()
        report = hugepages.advise_huge_pages(heap=heap)
        advised = [(a, n) for a, n, advice in calls if advice == hugepages.MADV_HUGEPAGE]
        collapsed = [a for a, n, advice in calls if advice == hugepages.MADV_COLLAPSE]
        assert report.advised_bytes == sum(n for _, n in advised) * H
        return advised, collapsed

    advised, collapsed = advised_and_collapsed(heap=False)
    assert advised == [(100, 8), (200, 8), (300, 8)] and collapsed == list(range(100, 108))
    advised, collapsed = advised_and_collapsed(heap=True)
    assert advised[-1] == (400, 8) and collapsed == [*range(100, 108), *range(400, 408)]
