"""Measure a model's :class:`~specgraft.batch.budget.CostTable`: one forward of ``B x n`` rows.

``specgraft profile --model M`` runs :func:`measure_costs` and writes the table; the batch
engine's :class:`~specgraft.batch.budget.AdaptiveBudget` reads it to choose each batch size's
budget. Shipped tables for the catalog models measured on the project's 2-core CPUs live in
``specgraft/data/costs/``: ``<model>-cpu-t2.json`` from an AVX2 Zen 3 and
``<model>-cpu-avx512-t2.json`` from an AVX-512 Zen 5, whose extra rows cost far less (16 rows of
the 1.5B: 2.1x one row against 1.45x), so the budgets they give differ (README, *Default budgets
from the cost table*). :func:`find_cost_table` prefers one the user measured (the cache
directory, which holds this machine's), then a shipped one for the same model, device type,
CPU kind (:func:`~specgraft.machine.cpu_kind`) and thread count, then one for any CPU kind.

Every slot is prefilled with ``context`` tokens, then each ``(B, n)`` forward feeds ``n`` chain
rows to each of ``B`` slots and is discarded, so every measurement sees the same cache. Sizes are
interleaved across repetitions (a drift of the machine's speed spreads over all of them), the
first round is a warm-up, and the median is kept. Example::

    table = measure_costs(HFTarget(model), batch_sizes=(1, 2, 4), rows=(1, 4, 8), context=256)
    table.cost(4, 8)          # seconds of one forward of 4 x 8 rows
"""

from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from specgraft import machine
from specgraft.batch.budget import CostTable
from specgraft.models.graphs import replays_graphs
from specgraft.models.hf import HFTarget, synchronize

if TYPE_CHECKING:
    from specgraft.models.llamacpp import LlamaCppTarget

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "costs"


def user_cost_dir() -> Path:
    return Path(os.environ.get("SPECGRAFT_CACHE", Path.home() / ".cache" / "specgraft")) / "costs"


def on_cpu(device: str) -> bool:
    """Whether a cost device runs on the CPU (its tables carry a CPU kind and thread count).

    >>> on_cpu("cpu"), on_cpu("llamacpp"), on_cpu("cuda:0")
    (True, True, False)
    """
    return device.startswith("cpu") or device == "llamacpp"


def table_name(model: str, device: str, threads: int | None, kind: str | None = None) -> str:
    """File name of a model's table: ``<model>-<device type>[-<CPU kind>][-t<threads>].json``
    (a CPU kind only in the names of shipped tables: :func:`~specgraft.machine.cpu_kind`).

    >>> table_name("/x/qwen2.5-coder-1.5b-instruct", "cpu", 2)
    'qwen2.5-coder-1.5b-instruct-cpu-t2.json'
    >>> table_name("qwen2.5-coder-1.5b-instruct", "cpu", 2, kind="avx512")
    'qwen2.5-coder-1.5b-instruct-cpu-avx512-t2.json'
    >>> table_name("qwen2.5-coder-1.5b-instruct", "llamacpp", 2, kind="avx512")
    'qwen2.5-coder-1.5b-instruct-llamacpp-avx512-t2.json'

    ``device`` is a target's ``cost_device``: its torch device, or ``llamacpp`` for the llama.cpp
    backend (on the CPU: its own kernels cost rows differently from torch's).
    """
    base = Path(model.rstrip("/")).name or model
    cpu = on_cpu(device)
    return f"{base}-{device.split(':')[0]}" + (f"-{kind}" if cpu and kind else "") + (f"-t{threads}" if cpu and threads else "") + ".json"


def find_cost_table(model: str, device: str, threads: int | None = None, kind: str | None = "auto") -> Path | None:
    """The table to use for ``model`` on ``device``: the user's measured one, else a shipped one,
    for this CPU's kind first (``kind``: ``"auto"`` = :func:`~specgraft.machine.cpu_kind`; None = no kind); one
    measured at ``threads`` threads first, else one at another thread count (on a CPU the shape
    of the costs, which is what the budget choice reads, changes little with it)."""
    kind = (machine.cpu_kind() if kind == "auto" else kind) if on_cpu(device) else None
    shipped = [(SHIPPED_DIR, kind)] if kind else []
    places = [(user_cost_dir(), None), *shipped, (SHIPPED_DIR, None)]
    for folder, k in places:
        exact = folder / table_name(model, device, threads, k)
        if exact.is_file():
            return exact
    for folder, k in places:
        pattern = table_name(model, device, None, k)[: -len(".json")] + "-t*.json"
        found = sorted(folder.glob(pattern)) if folder.is_dir() else []
        if found:
            return found[0]
    return None


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
    return {"cpu": machine.cpu_model(), "cpu_id": machine.cpu_id(), "cpu_kind": machine.cpu_kind()}


def resolve_row_cost(value: str | float | None, model: str, device: str, threads: int | None = None) -> tuple[float | None, str]:
    """``--row-cost``: ``none`` / None (the fixed ``min_prob`` cut), a number, or ``auto`` (the
    row cost of the cost table :func:`find_cost_table` gives for ``model`` on ``device``, batch
    size 1). Returns the value and where it came from, for the run's summary line.

    >>> resolve_row_cost("0.05", "m", "cpu"), resolve_row_cost(None, "m", "cpu")
    ((0.05, 'given'), (None, 'none'))
    >>> resolve_row_cost("auto", "no-such-model", "cpu")
    (None, 'auto: no cost table for no-such-model on cpu (specgraft profile writes one)')
    """
    if value is None or value == "none":
        return None, "none"
    if value != "auto":
        try:
            cost = float(value)
        except ValueError:
            raise ValueError(f"--row-cost takes a number >= 0, auto or none, got {value!r}") from None
        if not cost >= 0.0:
            raise ValueError(f"--row-cost must be >= 0, got {cost}")
        return cost, "given"
    path = find_cost_table(model, device, threads)
    if path is None:
        return None, f"auto: no cost table for {Path(model.rstrip('/')).name} on {device} (specgraft profile writes one)"
    return CostTable.load(path).row_cost(1), f"auto: {path.name}"
