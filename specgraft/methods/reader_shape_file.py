"""READER's tree-shape file: what ``specgraft tune`` writes (:mod:`specgraft.calibration.reader_shape`)
and ``--reader-shape`` reads (:func:`specgraft.methods.reader.reader_config`).

A JSON object with ``"format": "specgraft-reader-shape"``, the ``identity`` it was tuned for
(target, draft model, preset) and a ``shape``: the three searched sizes and, optionally, other
``ReaderConfig`` fields written by hand, e.g. ``benchmarks/experiments/rag-cite/reader-deep.json``.
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


def load_shape(path: str | Path, identity: dict[str, Any] | None = None) -> dict[str, int]:
    """The shape in a ``specgraft tune`` file; ``ValueError`` when it is not one or was made for
    another target, draft model or preset than ``identity``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"reader shape {str(path)!r} cannot be read: {e}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a READER shape file (`specgraft tune` writes one)")
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
