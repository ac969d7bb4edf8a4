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
