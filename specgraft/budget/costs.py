"""Cost tables: measured seconds of one target forward over ``B x n`` rows, and where to find them.

``specgraft profile --model M`` measures a table (:mod:`specgraft.budget.profile`); default budgets
(:mod:`specgraft.budget.defaults`), the batch policy (:mod:`specgraft.budget.policy`) and the
cost-aware tree cuts (``row_cost``) read it. :func:`find_cost_table` prefers one the user measured
(the cache directory), then a shipped one (``specgraft/data/costs/``) for the same model, device
type, CPU kind (:func:`~specgraft.machine.cpu_kind`) and thread count, then one for any CPU kind;
:func:`resolve_cost_table` is the one place a ``--cost-table`` value becomes a table path.
Imports no torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specgraft import machine

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "data" / "costs"


@dataclass
class CostTable:
    """Measured seconds of one target forward over ``batch x rows`` new rows (after ``context``
    cached tokens), on one device; interpolated linearly in rows, and in batch size between
    measured sizes (extrapolated from the last two beyond them).

    >>> t = CostTable("m", "cpu", {1: {1: 0.3, 9: 0.5}, 2: {1: 0.35, 9: 0.8}})
    >>> round(t.cost(1, 5), 3), round(t.cost(2, 1), 3), round(t.cost(4, 1), 3)
    (0.4, 0.35, 0.45)
    """

    model: str
    device: str
    # batch size -> rows per sequence -> seconds
    seconds: dict[int, dict[int, float]]
    context: int = 512
    threads: int | None = None
    dtype: str = ""
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.seconds = {int(b): {int(n): float(s) for n, s in row.items()} for b, row in self.seconds.items()}
        if not self.seconds or any(not row for row in self.seconds.values()):
            raise ValueError("a cost table needs at least one measured forward per batch size")

    def _rows_cost(self, batch: int, rows: float) -> float:
        return interpolate(self.seconds[batch], rows)

    def cost(self, batch: int, rows: float) -> float:
        """Seconds of one forward of ``batch`` sequences x ``rows`` rows each."""
        sizes = sorted(self.seconds)
        if batch in self.seconds:
            return self._rows_cost(batch, rows)
        return interpolate({b: self._rows_cost(b, rows) for b in sizes}, batch)

    def row_cost(self, batch: int = 1, max_rows: int = 16) -> float:
        """Cost of one more verified row per sequence, as a fraction of a one-row forward of
        ``batch`` sequences: the slope of a least-squares line through the measured forwards of
        up to ``max_rows`` rows, over the line's value at one row (what
        :func:`specgraft.tree.paths.cost_aware_subset` reads). A line, not the measured points
        themselves: single measurements wobble by a few percent (the shipped 1.5B CPU table has
        4 rows at 541 ms and 8 at 563 ms), and a per-node decision should not follow the wobble.

        >>> CostTable("m", "cpu", {1: {1: 0.3, 5: 0.4, 9: 0.5}}).row_cost()  # 0.025 s a row / 0.3 s
        0.083333
        """
        rows = sorted({n for row in self.seconds.values() for n in row if n <= max_rows})
        if len(rows) < 2:
            raise ValueError(f"a row cost needs forwards of two or more row counts up to {max_rows}")
        xs = np.array(rows, dtype=np.float64)
        ys = np.array([self.cost(batch, n) for n in rows], dtype=np.float64)
        slope, intercept = np.polyfit(xs, ys, 1)
        return round(max(0.0, float(slope)) / float(intercept + slope), 6)

    def step_costs(self, batch: int = 1, max_rows: int = 32) -> tuple[float, ...]:
        """What verifying 1, 2, ..., ``max_rows`` rows per sequence costs, in one-row forwards of
        ``batch`` sequences: the measured points themselves (interpolated between measured row
        counts), for a backend whose costs are far from :meth:`row_cost`'s line
        (:func:`specgraft.tree.paths.cost_aware_subset`'s ``step_costs``).

        >>> CostTable("m", "llamacpp", {1: {1: 0.1, 2: 0.138, 4: 0.142}}).step_costs(max_rows=4)
        (1.0, 1.38, 1.4, 1.42)
        """
        one = self.cost(batch, 1)
        return tuple(round(self.cost(batch, n) / one, 4) for n in range(1, max_rows + 1))

    def to_json(self) -> dict:
        return {
            "model": self.model, "device": self.device, "context": self.context, "threads": self.threads, "dtype": self.dtype,
            "seconds": {str(b): {str(n): s for n, s in sorted(row.items())} for b, row in sorted(self.seconds.items())},
            "meta": self.meta,
        }

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "CostTable":
        try:
            data = json.loads(Path(path).read_text())
            return cls(
                model=data["model"], device=data["device"], seconds=data["seconds"], context=data.get("context", 512),
                threads=data.get("threads"), dtype=data.get("dtype", ""), meta=data.get("meta", {}),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"{path} is not a specgraft cost table ({e})") from e


def interpolate(points: dict[int, float], x: float) -> float:
    """Piecewise-linear through ``points``, extended linearly past the last two (and flat below the first)."""
    xs = sorted(points)
    if len(xs) == 1 or x <= xs[0]:
        return points[xs[0]]
    for lo, hi in zip(xs, xs[1:]):
        if x <= hi:
            return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
    lo, hi = xs[-2], xs[-1]
    return points[hi] + (points[hi] - points[lo]) * (x - hi) / (hi - lo)


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
    for this CPU's kind first (``kind``: ``"auto"`` = :func:`~specgraft.machine.cost_kinds`, e.g.
    ``amx`` then ``avx512`` for an AMX build of llama.cpp; None = no kind); one measured at
    ``threads`` threads first, else one at another thread count (on a CPU the shape of the
    costs, which is what the budget choice reads, changes little with it)."""
    if not on_cpu(device):
        kinds: list[str] = []
    else:
        kinds = machine.cost_kinds(device) if kind == "auto" else [kind] if kind else []
    places = [(user_cost_dir(), None), *[(SHIPPED_DIR, k) for k in kinds], (SHIPPED_DIR, None)]
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


def resolve_cost_table(value: str | None, model: str, device: str, threads: int | None) -> str | None:
    """A ``--cost-table`` value as a table path: ``auto`` -> the table :func:`find_cost_table`
    gives for ``model`` on ``device`` (a target's ``cost_device``) at ``threads``, or None when
    there is none; ``none`` / None -> None; a path -> itself, checked (``ValueError`` for one that
    is not a cost table).

    >>> resolve_cost_table("none", "m", "cpu", 2) is None, resolve_cost_table("auto", "no-such-model", "cpu", 2) is None
    (True, True)
    """
    if value in (None, "none"):
        return None
    if value == "auto":
        found = find_cost_table(model, device, threads)
        return str(found) if found is not None else None
    CostTable.load(value)
    return value
