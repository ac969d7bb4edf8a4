"""READER's tree shape for this machine (READER Appendix F): measure, then search.

1. **Costs**: the target's verify pass for ``0 .. K`` nodes (:func:`~specgraft.calibration.costs.measure_verify_s`)
   and the drafting time per step (the draft model's forwards plus retrieval, from the run).
2. **Acceptance per slot**: READER runs greedily with an over-provisioned *seed* shape on tuning
   prompts disjoint from the benchmarks. Every node of a step belongs to a *slot*: the ``i``-th
   draft node in best-first order (``draft:i``), the ``k``-th token of the widening path
   (``widen:k``), the ``k``-th of the deepening path (``deep:k``). Greedy verification accepts a
   node iff its token path is a prefix of the target's own continuation, whatever else is in the
   tree, so one seed run says for every slot and step whether the slot would have been accepted.
3. **Search**: a shape ``(draft_nodes, d_search, d_deep)`` keeps the first slots of each kind (a
   prefix-closed subtree, as the paper's leaf pruning keeps). Its predicted tokens per step is
   the mean over the recorded steps of 1 + the longest accepted slot path it keeps; its step
   time ``t_draft + t_verify(nodes)``. The shape with the most predicted tokens/s wins; the grid
   is small enough to evaluate whole (the paper's golden-section search is for when each point
   must be benchmarked). A step verifies the nodes it *has* of each kind, not the shape's
   nominal count: ``draft-tree``'s cut (READER's draft tree, ``methods/reader.py``) keeps 1-16
   draft nodes a step, and a retrieved path can be shorter than its depth, so the step time of
   a shape is ``t_draft + mean over steps of t_verify(min(a, a_step) + min(b, b_step) +
   min(c, c_step))`` with the step's own counts (``SlotRecord.sizes``; files written before
   them are costed at the nominal count).

The result is a JSON file (``specgraft tune``) that ``generate`` and ``bench`` take with
``--reader-shape``; it is refused for another target, draft model or preset. The prediction
assumes the trajectory of the seed run (teacher forcing on the target's own outputs) and the
nominal node count (retrieved tokens that merge with draft nodes save a row in practice).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from specgraft.methods.reader_shape_file import FORMAT, OPTIONAL_KEYS, SHAPE_KEYS, load_shape

__all__ = ["FORMAT", "OPTIONAL_KEYS", "SHAPE_KEYS", "ShapeChoice", "SlotRecord", "load_shape", "predict", "save_shape", "search_shape"]


@dataclass
class SlotRecord:
    """Per recorded step: for each slot, the length of its path if it was accepted, else 0."""

    draft: list[list[int]] = field(default_factory=list)
    widen: list[list[int]] = field(default_factory=list)
    deep: list[list[int]] = field(default_factory=list)
    draft_s: list[float] = field(default_factory=list)
    sizes: list[tuple[int, int, int]] = field(default_factory=list)
    """Per recorded step: how many draft nodes, widening and deepening tokens it had."""

    def add(self, draft_paths: Sequence[tuple[int, ...]], widen: Sequence[int], deep_prefix: Sequence[int], deep: Sequence[int],
            accepted: Sequence[int], draft_s: float, seed: tuple[int, int, int]) -> None:
        """One step: the draft's token paths in best-first order, the two retrieved paths and the
        accepted tokens (without the bonus)."""
        acc = tuple(accepted)

        def ok(path: Sequence[int]) -> int:
            return len(path) if tuple(path) == acc[: len(path)] else 0

        n_draft, n_widen, n_deep = seed
        self.draft.append([ok(p) for p in draft_paths[:n_draft]] + [0] * max(0, n_draft - len(draft_paths)))
        self.widen.append([ok(widen[: k + 1]) if k < len(widen) else 0 for k in range(n_widen)])
        self.deep.append([ok([*deep_prefix, *deep[: k + 1]]) if k < len(deep) else 0 for k in range(n_deep)])
        self.draft_s.append(draft_s)
        self.sizes.append((len(draft_paths), len(widen), len(deep)))

    def mean_verify_s(self, verify_s: Sequence[float], draft_nodes: int, d_search: int, d_deep: int) -> float:
        """Mean verify time per step of a shape: each step costs the nodes it had of each kind, at
        most the shape's (the nominal count where the record has no sizes).

        >>> rec = SlotRecord(draft=[[1], [0]], widen=[[0], [0]], deep=[[], []], draft_s=[0, 0], sizes=[(3, 0, 0), (1, 1, 0)])
        >>> rec.mean_verify_s([0.1 * n for n in range(8)], 2, 1, 0)  # step 1: 2 + 0 nodes, step 2: 1 + 1
        0.2
        """
        if len(self.sizes) != len(self.draft):
            return verify_s[draft_nodes + d_search + d_deep]
        return float(np.mean([verify_s[min(draft_nodes, a) + min(d_search, b) + min(d_deep, c)] for a, b, c in self.sizes]))

    def mean_tokens(self, draft_nodes: int, d_search: int, d_deep: int) -> float:
        """Predicted tokens per step (bonus included) of a shape."""
        best = np.zeros(len(self.draft))
        for rows, n in ((self.draft, draft_nodes), (self.widen, d_search), (self.deep, d_deep)):
            if n:
                best = np.maximum(best, np.asarray(rows)[:, :n].max(axis=1))
        return float(1.0 + best.mean()) if len(best) else 1.0

    def acceptance(self) -> dict[str, list[float]]:
        """alpha per slot: how often each slot's node was accepted."""
        return {kind: (np.asarray(rows) > 0).mean(axis=0).round(4).tolist() if rows else []
                for kind, rows in (("draft", self.draft), ("widen", self.widen), ("deep", self.deep))}


@dataclass(frozen=True)
class ShapeChoice:
    draft_nodes: int
    d_search: int
    d_deep: int
    predicted_tokens_per_step: float
    predicted_step_s: float

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.predicted_tokens_per_step / self.predicted_step_s


def search_shape(record: SlotRecord, verify_s: Sequence[float], seed: tuple[int, int, int], min_draft: int = 1) -> list[ShapeChoice]:
    """Every shape within ``seed``, best predicted tokens/s first. ``verify_s[n]`` is a verify pass
    of ``n`` nodes (the root's row included in every pass)."""
    t_draft = float(np.mean(record.draft_s)) if record.draft_s else 0.0
    out = []
    for a in range(min_draft, seed[0] + 1):
        for b in range(seed[1] + 1):
            for c in range(seed[2] + 1):
                n = a + b + c
                if n >= len(verify_s):
                    continue
                out.append(ShapeChoice(a, b, c, record.mean_tokens(a, b, c), t_draft + record.mean_verify_s(verify_s, a, b, c)))
    return sorted(out, key=lambda s: (-s.predicted_tokens_per_s, s.draft_nodes + s.d_search + s.d_deep))


def save_shape(path: str | Path, identity: dict[str, Any], choice: ShapeChoice, record: SlotRecord, verify_s: Sequence[float],
               seed: tuple[int, int, int], extra: dict[str, Any]) -> Path:
    path = Path(path)
    data = {
        "format": FORMAT,
        "identity": identity,
        "shape": {"draft_nodes": choice.draft_nodes, "d_search": choice.d_search, "d_deep": choice.d_deep},
        "predicted": {**asdict(choice), "tokens_per_s": round(choice.predicted_tokens_per_s, 4)},
        "seed_shape": {"draft_nodes": seed[0], "d_search": seed[1], "d_deep": seed[2]},
        "acceptance": record.acceptance(),
        "verify_s": [round(t, 5) for t in verify_s],
        "draft_s": round(float(np.mean(record.draft_s)), 5) if record.draft_s else 0.0,
        "steps": len(record.draft),
        "record": {"draft": record.draft, "widen": record.widen, "deep": record.deep, "draft_s": [round(t, 5) for t in record.draft_s],
                   "sizes": [list(x) for x in record.sizes]},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def predict(path: str | Path, draft_nodes: int, d_search: int, d_deep: int) -> ShapeChoice:
    """The prediction a ``specgraft tune`` file makes for any shape within its seed (to compare
    with a measured run of that shape)."""
    data = json.loads(Path(path).read_text())
    rec = data["record"]
    record = SlotRecord(rec["draft"], rec["widen"], rec["deep"], rec["draft_s"], [tuple(x) for x in rec.get("sizes", [])])
    seed = data["seed_shape"]
    if draft_nodes > seed["draft_nodes"] or d_search > seed["d_search"] or d_deep > seed["d_deep"]:
        raise ValueError(f"shape ({draft_nodes}, {d_search}, {d_deep}) is outside the tuned seed shape {seed}")
    return ShapeChoice(draft_nodes, d_search, d_deep, record.mean_tokens(draft_nodes, d_search, d_deep),
                       float(np.mean(record.draft_s)) + record.mean_verify_s(data["verify_s"], draft_nodes, d_search, d_deep))
