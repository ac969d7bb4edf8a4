"""READER's tree-shape file: what ``specgraft tune`` writes (:mod:`specgraft.calibration.reader_shape`)
and ``--reader-shape`` reads (:func:`specgraft.methods.reader.reader_config`).

A JSON object with ``"format": "specgraft-reader-shape"``, the ``identity`` it was tuned for
(target, draft model, preset) and a ``shape``: the three searched sizes and, optionally, other
``ReaderConfig`` fields written by hand, e.g. ``benchmarks/experiments/rag-cite/reader-deep.json``.
A file tuned for several batch sizes (``specgraft tune --batch-size 1,4,8``) also holds
``by_batch``: batch size -> ``{"budget": nodes, ...}`` (:func:`load_batch_budgets`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FORMAT = "specgraft-reader-shape"
#: What ``specgraft tune`` searches and writes.
SHAPE_KEYS = ("draft_nodes", "d_search", "d_deep")
#: Other ``ReaderConfig`` fields a shape file may set (written by hand: ``tune`` keeps them at
#: their defaults).
OPTIONAL_KEYS = ("deepen_depth", "key_len", "min_match", "search_nodes", "width")


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"reader shape {str(path)!r} cannot be read: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a READER shape file (`specgraft tune` writes one)")
    return data


def load_batch_budgets(path: str | Path) -> dict[int, int]:
    """Batch size -> the budget ``specgraft tune --batch-size`` found best there (0: plain
    decoding); empty for a file tuned at one batch size.

    >>> import tempfile, os
    >>> f = os.path.join(tempfile.mkdtemp(), "s.json")
    >>> _ = open(f, "w").write(json.dumps({"format": FORMAT, "shape": {}, "by_batch": {"1": {"budget": 9}, "8": {"budget": 0}}}))
    >>> load_batch_budgets(f)
    {1: 9, 8: 0}
    """
    path = Path(path)
    by_batch = _read(path).get("by_batch") or {}
    try:
        budgets = {int(b): int(entry["budget"]) for b, entry in by_batch.items()}
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"reader shape {str(path)!r} has a malformed by_batch table") from None
    if any(b < 1 or n < 0 for b, n in budgets.items()):
        raise ValueError(f"reader shape {str(path)!r}: by_batch needs batch sizes >= 1 and budgets >= 0, got {budgets}")
    return budgets


def load_shape(path: str | Path, identity: dict[str, Any] | None = None) -> dict[str, int]:
    """The shape in a ``specgraft tune`` file; ``ValueError`` when it is not one or was made for
    another target, draft model or preset than ``identity``."""
    path = Path(path)
    data = _read(path)
    if identity is not None:
        made = data.get("identity", {})
        diff = [f"{k} {made.get(k)!r} (now {v!r})" for k, v in identity.items() if made.get(k) != v]
        if diff:
            raise ValueError(f"reader shape {str(path)!r} was tuned for another setup: " + ", ".join(diff))
    shape = data["shape"]
    unknown = sorted(set(shape) - set(SHAPE_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise ValueError(f"reader shape {str(path)!r} has unknown fields {unknown}; known: {', '.join(SHAPE_KEYS + OPTIONAL_KEYS)}")
    return {k: int(shape[k]) for k in SHAPE_KEYS} | {k: int(shape[k]) for k in OPTIONAL_KEYS if k in shape}
