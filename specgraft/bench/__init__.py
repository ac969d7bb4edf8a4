"""Benchmark harness: every method side by side with plain decoding and Hugging Face generate.

    from specgraft.bench import BenchConfig, run_benchmark
    report_path = run_benchmark(BenchConfig(model="smollm2-135m-instruct", suite="humaneval:2", out="bench-out"))

Nothing in the library imports this package; it sits beside the CLI. Names are imported on
first use, so ``from specgraft.bench.cli import bench`` does not load torch at CLI start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> submodule that defines it
_EXPORTS = {
    "Agreement": "compare",
    "agreement": "compare",
    "SUITES": "datasets",
    "BenchPrompt": "datasets",
    "Suite": "datasets",
    "load_suite": "datasets",
    "SelfRepetition": "repetition",
    "self_repetition": "repetition",
    "summarize": "report",
    "write_report": "report",
    "BenchConfig": "runner",
    "run_benchmark": "runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specgraft.bench' has no attribute {name!r}")
    return getattr(importlib.import_module(f"specgraft.bench.{_EXPORTS[name]}"), name)
