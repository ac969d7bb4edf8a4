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

**Per batch size** (the paper searches a shape for each; ``specgraft tune --batch-size 1,4,8``):
``B`` sequences step together in one forward whose trees are padded to the largest of them, so
a shape's step at ``B`` costs ``B x t_draft + T_B(max over the B sequences' nodes)``, with
``T_B`` measured at ``B`` (``measure_verify_s(batch=B)``) and the maximum the expected one over
``B`` recorded steps drawn independently (:func:`batch_step_s`); it emits ``B`` times the
tokens per step. Drafting is charged ``B`` times a single sequence's (retrieval runs sequence
by sequence; a draft model drafting for all in one forward per layer costs less, so the
prediction is conservative there). Plain decoding (``B / T_B(0)``) is the alternative: a batch
size where no shape beats it by :data:`SPECULATE_MARGIN` gets a budget of 0. What a batch size
applies is the budget, a cap on the tree's nodes: for ``reader-search`` that is exactly the
tuned tree (its best-first nodes); for ``reader`` the merged tree is cut to it in its parts'
order (``tree.build.merge_drafts``), not re-split into the batch size's three sizes, which
the file records beside the budget.

**Retrieval-only READER** (``reader-search``): its tree is the best-first retrieved tree, whose
first ``n`` nodes are the tree of ``n`` nodes (``retrieval/search.py``), so one seed run of
``search_nodes`` nodes records the slot ``search:i`` for every ``i`` (:class:`SearchRecord`), and
the search is over ``search_nodes`` alone (depth and keys as seeded).

The result is a JSON file (``specgraft tune``) that ``generate`` and ``bench`` take with
``--reader-shape``; it is refused for another target, draft model or preset. With several
batch sizes it also holds each one's budget (``by_batch``), which ``bench-serve`` and ``serve``
apply per batch size (:class:`~specgraft.budget.policy.TunedBudget`). The prediction
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

__all__ = [
    "FORMAT", "OPTIONAL_KEYS", "SHAPE_KEYS", "BatchTuning", "SearchRecord", "ShapeChoice", "SlotRecord", "batch_budget", "batch_step_s",
    "load_shape", "plain_choice", "predict", "save_shape", "search_shape", "search_tree_size",
]


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

    def mean_verify_s(self, verify_s: Sequence[float], draft_nodes: int, d_search: int, d_deep: int, batch: int = 1) -> float:
        """Mean verify time per step of a shape: each step costs the nodes it had of each kind, at
        most the shape's (the nominal count where the record has no sizes); ``batch > 1``: a
        forward of ``batch`` such steps (``verify_s`` measured at that batch size, :func:`batch_step_s`).

        >>> rec = SlotRecord(draft=[[1], [0]], widen=[[0], [0]], deep=[[], []], draft_s=[0, 0], sizes=[(3, 0, 0), (1, 1, 0)])
        >>> rec.mean_verify_s([0.1 * n for n in range(8)], 2, 1, 0)  # step 1: 2 + 0 nodes, step 2: 1 + 1
        0.2
        """
        if len(self.sizes) != len(self.draft):
            return verify_s[draft_nodes + d_search + d_deep]
        nodes = [min(draft_nodes, a) + min(d_search, b) + min(d_deep, c) for a, b, c in self.sizes]
        return batch_step_s(verify_s, nodes, batch)

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


@dataclass
class SearchRecord:
    """``reader-search``'s record: per step, for each node of the retrieved tree in best-first
    order (the slot ``search:i``), the length of its path if it was accepted, else 0.

    >>> rec = SearchRecord()
    >>> rec.add([(5,), (5, 9), (2,)], accepted=[5, 9, 1], draft_s=0.01, seed_nodes=4)
    >>> rec.nodes, rec.sizes, rec.mean_tokens(1), rec.mean_tokens(3)
    ([[1, 2, 0, 0]], [3], 2.0, 3.0)
    """

    nodes: list[list[int]] = field(default_factory=list)
    draft_s: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    """Per step: the nodes the retrieved tree had (fewer than the seed where retrieval ran dry)."""

    def add(self, paths: Sequence[tuple[int, ...]], accepted: Sequence[int], draft_s: float, seed_nodes: int) -> None:
        """One step: the retrieved tree's token paths, best first, and the accepted tokens (without the bonus)."""
        acc = tuple(accepted)
        slots = [len(p) if tuple(p) == acc[: len(p)] else 0 for p in paths[:seed_nodes]]
        self.nodes.append(slots + [0] * (seed_nodes - len(slots)))
        self.draft_s.append(draft_s)
        self.sizes.append(min(len(paths), seed_nodes))

    def mean_tokens(self, nodes: int) -> float:
        """Predicted tokens per step (bonus included) with a tree of ``nodes`` nodes."""
        if not self.nodes or nodes == 0:
            return 1.0
        return float(1.0 + np.asarray(self.nodes)[:, :nodes].max(axis=1).mean())

    def mean_verify_s(self, verify_s: Sequence[float], nodes: int, batch: int = 1) -> float:
        return batch_step_s(verify_s, [min(nodes, n) for n in self.sizes] or [0], batch)

    def acceptance(self) -> dict[str, list[float]]:
        return {"search": (np.asarray(self.nodes) > 0).mean(axis=0).round(4).tolist() if self.nodes else []}


def batch_step_s(verify_s: Sequence[float], nodes: Sequence[int], batch: int = 1) -> float:
    """Mean time of a forward verifying ``batch`` sequences whose trees have the recorded node
    counts ``nodes`` (``verify_s[n]``: ``batch`` sequences of ``n`` nodes, measured at that batch
    size). The forward pads every tree to the batch's largest, so a step costs the largest of
    ``batch`` recorded steps drawn independently: its expectation is exact, from the sorted
    costs ``c_1 <= .. <= c_m``, ``sum_k c_k ((k / m)^B - ((k - 1) / m)^B)``.

    >>> batch_step_s([1.0, 2.0, 3.0], [0, 2])            # one sequence: the mean
    2.0
    >>> batch_step_s([1.0, 2.0, 3.0], [0, 2], batch=2)   # two: 3.0 unless both drew 0 (1 in 4)
    2.5
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    costs = np.sort(np.asarray(verify_s, dtype=float)[np.asarray(nodes, dtype=int)])
    k = np.arange(1, len(costs) + 1) / len(costs)
    return float(np.sum(costs * (k**batch - (k - 1 / len(costs)) ** batch)))


@dataclass(frozen=True)
class ShapeChoice:
    draft_nodes: int
    d_search: int
    d_deep: int
    predicted_tokens_per_step: float
    """Per sequence, bonus included."""
    predicted_step_s: float
    """One step of the whole batch: drafting for every sequence and the forward."""
    search_nodes: int = 0
    """``reader-search``: nodes of the retrieved tree (``draft_nodes`` and ``d_deep`` are 0)."""
    batch: int = 1

    @property
    def nodes(self) -> int:
        """Nodes the shape verifies at most: the budget it asks for."""
        return self.draft_nodes + self.d_deep + (self.search_nodes or self.d_search)

    @property
    def predicted_tokens_per_s(self) -> float:
        return self.batch * self.predicted_tokens_per_step / self.predicted_step_s


#: A shape must predict this much more throughput than plain decoding at its batch size to be
#: given a budget there (the adaptive policy's margin, ``budget/adaptive.py``).
SPECULATE_MARGIN = 0.02


def plain_choice(verify_s: Sequence[float], batch: int = 1) -> ShapeChoice:
    """Plain decoding at ``batch``: no drafting, one token a step, ``verify_s[0]``."""
    return ShapeChoice(0, 0, 0, 1.0, float(verify_s[0]), batch=batch)


def search_shape(record: SlotRecord, verify_s: Sequence[float], seed: tuple[int, int, int], min_draft: int = 1,
                 batch: int = 1) -> list[ShapeChoice]:
    """Every shape within ``seed``, best predicted tokens/s first. ``verify_s[n]`` is a verify pass
    of ``n`` nodes (the root's row included in every pass), of ``batch`` sequences."""
    t_draft = batch * (float(np.mean(record.draft_s)) if record.draft_s else 0.0)
    out = []
    for a in range(min_draft, seed[0] + 1):
        for b in range(seed[1] + 1):
            for c in range(seed[2] + 1):
                n = a + b + c
                if n >= len(verify_s):
                    continue
                step_s = t_draft + record.mean_verify_s(verify_s, a, b, c, batch)
                out.append(ShapeChoice(a, b, c, record.mean_tokens(a, b, c), step_s, batch=batch))
    return sorted(out, key=lambda s: (-s.predicted_tokens_per_s, s.nodes))


def search_tree_size(record: SearchRecord, verify_s: Sequence[float], seed_nodes: int, d_search: int, batch: int = 1) -> list[ShapeChoice]:
    """``reader-search``: every tree size ``1 .. seed_nodes``, best predicted tokens/s first."""
    t_draft = batch * (float(np.mean(record.draft_s)) if record.draft_s else 0.0)
    out = [
        ShapeChoice(0, d_search, 0, record.mean_tokens(n), t_draft + record.mean_verify_s(verify_s, n, batch), search_nodes=n, batch=batch)
        for n in range(1, min(seed_nodes, len(verify_s) - 1) + 1)
    ]
    return sorted(out, key=lambda s: (-s.predicted_tokens_per_s, s.nodes))


def batch_budget(best: ShapeChoice, plain: ShapeChoice) -> int:
    """The budget a batch size gets: the best shape's nodes where it predicts at least
    :data:`SPECULATE_MARGIN` more than plain decoding there, else 0 (plain decoding).

    >>> batch_budget(ShapeChoice(0, 8, 0, 1.5, 1.2, search_nodes=6, batch=4), plain_choice([1.0], 4))
    6
    >>> batch_budget(ShapeChoice(0, 8, 0, 1.5, 1.5, search_nodes=6, batch=4), plain_choice([1.0], 4))
    0
    """
    return best.nodes if best.predicted_tokens_per_s > (1 + SPECULATE_MARGIN) * plain.predicted_tokens_per_s else 0


@dataclass(frozen=True)
class BatchTuning:
    """One batch size's outcome: the best shape there, plain decoding there, the costs measured."""

    best: ShapeChoice
    plain: ShapeChoice
    verify_s: Sequence[float]

    @property
    def budget(self) -> int:
        return batch_budget(self.best, self.plain)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget, "shape": shape_dict(self.best), "verify_s": [round(t, 5) for t in self.verify_s],
            "predicted_tokens_per_s": round(self.best.predicted_tokens_per_s, 4),
            "plain_tokens_per_s": round(self.plain.predicted_tokens_per_s, 4),
        }


def shape_dict(choice: ShapeChoice, extra: dict[str, int] | None = None) -> dict[str, int]:
    """The ``shape`` object of a file: the three searched sizes, ``search_nodes`` for ``reader-search``."""
    out = {"draft_nodes": choice.draft_nodes, "d_search": choice.d_search, "d_deep": choice.d_deep}
    if choice.search_nodes:
        out["search_nodes"] = choice.search_nodes
    return out | (extra or {})


def save_shape(path: str | Path, identity: dict[str, Any], choice: ShapeChoice, record: SlotRecord | SearchRecord, verify_s: Sequence[float],
               seed: tuple[int, int, int], extra: dict[str, Any], by_batch: dict[int, BatchTuning] | None = None,
               shape_extra: dict[str, int] | None = None) -> Path:
    """Write a shape file: ``choice`` as the shape, the record and costs it came from, and with
    ``by_batch`` each tuned batch size's budget (``shape_extra``: other ``ReaderConfig`` fields
    the tuning fixed, e.g. ``reader-search``'s ``min_match``)."""
    path = Path(path)
    if isinstance(record, SearchRecord):
        raw: dict[str, Any] = {"search": record.nodes, "sizes": record.sizes}
        steps = len(record.nodes)
    else:
        raw = {"draft": record.draft, "widen": record.widen, "deep": record.deep, "sizes": [list(x) for x in record.sizes]}
        steps = len(record.draft)
    data = {
        "format": FORMAT,
        "identity": identity,
        "shape": shape_dict(choice, shape_extra),
        "predicted": {**asdict(choice), "tokens_per_s": round(choice.predicted_tokens_per_s, 4)},
        "seed_shape": {"draft_nodes": seed[0], "d_search": seed[1], "d_deep": seed[2]},
        "acceptance": record.acceptance(),
        "verify_s": [round(t, 5) for t in verify_s],
        "draft_s": round(float(np.mean(record.draft_s)), 5) if record.draft_s else 0.0,
        "steps": steps,
        "record": raw | {"draft_s": [round(t, 5) for t in record.draft_s]},
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **extra,
    }
    if by_batch:
        data["by_batch"] = {str(b): t.to_dict() for b, t in sorted(by_batch.items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def predict(path: str | Path, draft_nodes: int, d_search: int, d_deep: int) -> ShapeChoice:
    """The prediction a ``specgraft tune`` file makes for any shape within its seed (to compare
    with a measured run of that shape)."""
    data = json.loads(Path(path).read_text())
    rec = data["record"]
    if "search" in rec:
        raise ValueError(f"{str(path)!r} tunes reader-search's retrieved tree, not the three sizes of READER's shape")
    record = SlotRecord(rec["draft"], rec["widen"], rec["deep"], rec["draft_s"], [tuple(x) for x in rec.get("sizes", [])])
    seed = data["seed_shape"]
    if draft_nodes > seed["draft_nodes"] or d_search > seed["d_search"] or d_deep > seed["d_deep"]:
        raise ValueError(f"shape ({draft_nodes}, {d_search}, {d_deep}) is outside the tuned seed shape {seed}")
    return ShapeChoice(draft_nodes, d_search, d_deep, record.mean_tokens(draft_nodes, d_search, d_deep),
                       float(np.mean(record.draft_s)) + record.mean_verify_s(data["verify_s"], draft_nodes, d_search, d_deep))
