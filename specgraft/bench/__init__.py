"""Benchmark harness: every method side by side with plain decoding and Hugging Face generate.

    from specgraft.bench import BenchConfig, run_benchmark
    report_path = run_benchmark(BenchConfig(model="smollm2-135m-instruct", suite="humaneval:2", out="bench-out"))

Nothing in the library imports this package; it sits beside the CLI. Names are imported on
first use, so ``from specgraft.cli.bench import bench`` does not load torch at CLI start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> submodule that defines it
_EXPORTS = {
    "Agreement": "specgraft.agreement",
    "agreement": "specgraft.agreement",
    "SUITES": "specgraft.suites",
    "BenchPrompt": "specgraft.suites",
    "Suite": "specgraft.suites",
    "load_suite": "specgraft.suites",
    "SelfRepetition": "repetition",
    "self_repetition": "repetition",
    "summarize": "summary",
    "write_report": "report",
    "BenchConfig": "config",
    "run_benchmark": "runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specgraft.bench' has no attribute {name!r}")
    module = _EXPORTS[name]
    return getattr(importlib.import_module(module if "." in module else f"specgraft.bench.{module}"), name)
