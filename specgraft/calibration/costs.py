"""What a verify pass costs on this machine, by node count (the calibration's cost model).

A CPU pays a few percent of a decode step per extra row of a verify pass, a GPU almost nothing
up to tens of rows; thresholds and tree shapes are chosen from these measured times, never
from constants. Timings are synchronised on CUDA (``models.base.synchronize``).
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

from specgraft.models.base import TargetModel
from specgraft.models.base import synchronize


def measure_verify_s(target: TargetModel, prompt: Sequence[int], budget: int, reps: int = 3, batch: int = 1) -> list[float]:
    """Median wall time of a verify forward of ``n`` nodes after ``prompt``, for ``n = 0 .. budget``
    (chains; the shape does not change the cost). With ``batch > 1``, of ``batch`` sequences
    verifying ``n`` nodes each in one forward (every sequence holds ``prompt``: what a step of
    the batch engine costs). Sizes are interleaved across repetitions so a drift of the
    machine's speed spreads over all of them; every pass is discarded, so each one sees the same
    cache. The first round is a warm-up and is not counted.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    slots: list[int] = []
    try:
        for _ in range(batch):
            slots.append(target.allocate())
            target.prefill(slots[-1], list(prompt[:-1]))
        root = int(prompt[-1])
        times: list[list[float]] = [[] for _ in range(budget + 1)]
        for rep in range(reps + 1):
            for n in range(budget + 1):
                rows, parents = [root] * (n + 1), list(range(-1, n))
                synchronize(target.device)
                t0 = time.perf_counter()
                target.forward_batch(slots, [rows] * batch, [parents] * batch)
                synchronize(target.device)
                elapsed = time.perf_counter() - t0
                for slot in slots:
                    target.discard(slot)
                if rep:
                    times[n].append(elapsed)
    finally:
        for slot in slots:
            target.release(slot)
    return [statistics.median(t) for t in times]
