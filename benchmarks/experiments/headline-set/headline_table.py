"""The headline tables of benchmarks/RESULTS.md from a headline run's results.jsonl.

    python benchmarks/experiments/headline-set/headline_table.py benchmarks/experiments/headline-set/xeon-amx

Prints two markdown tables: every method and peer over all generations (speedup over `ar`, decode
speedup, MAT, tokens/s, outputs equal to `ar`), and the speedup per task for every method.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specgraft.bench.records import RESULTS_FILE, read_rows
from specgraft.bench.summary import OVERALL, common_rows, summarize


def fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def main(out: str) -> None:
    summary = summarize(common_rows(read_rows(Path(out) / RESULTS_FILE)))
    methods = [m for m in summary.methods if m != "ar-end"]
    print("| method | speedup vs `ar` | decode speedup | MAT | tokens/s | equal to `ar` |")
    print("|---|---|---|---|---|---|")
    for m in methods:
        c = summary.cell(m, OVERALL)
        if c is None:
            continue
        name = f"`{m}`" + (" (HF)" if c.peer else "")
        print(
            f"| {name} | {fmt(c.speedup, '.2f', 'x')} | {fmt(c.decode_speedup if not c.peer else None, '.2f', 'x')} "
            f"| {fmt(c.mat)} | {c.tokens_per_s:.2f} | {c.exact}/{c.generations} |"
        )
    print()
    shown = [m for m in methods if m != "ar"]
    print("| task (generations) | " + " | ".join(f"`{m}`" for m in shown) + " |")
    print("|---|" + "---|" * len(shown))
    for task in [*summary.tasks, OVERALL]:
        cells = [summary.cell(m, task) for m in shown]
        best = max((c.speedup or 0) for c in cells if c is not None)
        gens = next(c.generations for c in cells if c is not None)
        row = []
        for c in cells:
            s = fmt(c.speedup if c else None, ".2f", "x")
            row.append(f"**{s}**" if c is not None and c.speedup == best else s)
        print(f"| {task} ({gens}) | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
