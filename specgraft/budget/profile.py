"""Measure a model's :class:`~specgraft.budget.costs.CostTable`: one forward of ``B x n`` rows.

Every slot is prefilled with ``context`` tokens, then each ``(B, n)`` forward feeds ``n`` chain
rows to each of ``B`` slots and is discarded, so every measurement sees the same cache. Sizes are
interleaved across repetitions (a drift of the machine's speed spreads over all of them), the
first round is a warm-up, and the median is kept. Shipped tables for the catalog models measured
on the project's 2-core CPUs live in ``specgraft/data/costs/``: ``<model>-cpu-t2.json`` from an
AVX2 Zen 3, ``<model>-cpu-avx512-t2.json`` from an AVX-512 Zen 5, whose extra rows cost far less
(16 rows of the 1.5B: 2.1x one row against 1.45x), and ``<model>-llamacpp-avx512-t2.json`` for the
llama.cpp backend. Example::

    table = measure_costs(HFTarget(model), batch_sizes=(1, 2, 4), rows=(1, 4, 8), context=256)
    table.cost(4, 8)          # seconds of one forward of 4 x 8 rows
"""

from __future__ import annotations

import random
import statistics
import time
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from specgraft import machine
from specgraft.budget.costs import CostTable, on_cpu
from specgraft.models.graphs import replays_graphs
from specgraft.models.base import synchronize
from specgraft.models.hf import HFTarget

if TYPE_CHECKING:
    from specgraft.models.llamacpp import LlamaCppTarget


@torch.inference_mode()
def measure_costs(
    target: HFTarget | LlamaCppTarget,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    rows: Sequence[int] = (1, 2, 4, 8, 16, 32),
    context: int = 512,
    reps: int = 3,
    progress: Callable[[str], None] | None = None,
) -> CostTable:
    """Median seconds of a forward of ``B x n`` rows after ``context`` cached tokens per slot."""
    if not batch_sizes or not rows or min(batch_sizes) < 1 or min(rows) < 1:
        raise ValueError(f"batch sizes and rows must be >= 1, got {list(batch_sizes)} and {list(rows)}")
    if context + max(rows) > target.max_positions:
        raise ValueError(f"context {context} + {max(rows)} rows exceed the context window of {target.max_positions}")
    rng = random.Random(0)
    vocab = target.vocab_size
    slots = [target.allocate() for _ in range(max(batch_sizes))]
    try:
        target.reserve(context + max(rows))
        for i, slot in enumerate(slots):
            if progress:
                progress(f"prefill slot {i + 1}/{len(slots)} ({context} tokens)")
            target.prefill(slot, [rng.randrange(vocab) for _ in range(context)])
        times: dict[tuple[int, int], list[float]] = {(b, n): [] for b in batch_sizes for n in rows}
        for rep in range(reps + 1):
            if progress:
                progress(f"round {rep}/{reps}" + (" (warm-up)" if rep == 0 else ""))
            for b in batch_sizes:
                for n in rows:
                    batch = slots[:b]
                    tokens = [[rng.randrange(vocab) for _ in range(n)] for _ in batch]
                    parents = [list(range(-1, n - 1))] * b
                    synchronize(target.device)
                    t0 = time.perf_counter()
                    target.forward_batch(batch, tokens, parents)
                    synchronize(target.device)
                    elapsed = time.perf_counter() - t0
                    for slot in batch:
                        target.discard(slot)
                    if rep:
                        times[(b, n)].append(elapsed)
    finally:
        for slot in slots:
            target.release(slot)
    seconds: dict[int, dict[int, float]] = {b: {n: statistics.median(times[(b, n)]) for n in rows} for b in batch_sizes}
    return CostTable(
        model=target.name, device=target.cost_device, seconds=seconds, context=context, threads=target.threads,
        dtype=str(target.dtype).replace("torch.", ""),
        # forwards replayed as CUDA graphs (``models/graphs.py``) cost a fraction of eager ones on a GPU
        meta={"reps": reps, "measured": time.strftime("%Y-%m-%d %H:%M"), "cuda_graphs": replays_graphs(target), **_machine(target)},
    )


def _machine(target: HFTarget | LlamaCppTarget) -> dict:
    """What the table was measured on, for a CPU: its ``cpu_id`` (vendor, family, model, vector
    extension) and the kind :func:`find_cost_table` files shipped tables under."""
    if not on_cpu(target.cost_device):
        return {}
    kind = next(iter(machine.cost_kinds(target.cost_device)), None)
    return {"cpu": machine.cpu_model(), "cpu_id": machine.cpu_id(), "cpu_kind": kind}


