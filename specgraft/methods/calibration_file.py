"""The Graft calibration file (``specgraft calibrate`` writes it, :mod:`specgraft.calibration`):
thresholds per variant, the warmed-up matrix beside it, and what made them.

``save_calibration(cal, "graft.json")`` writes the JSON and the matrix next to it (``graft.npz``);
:func:`load_calibration` reads both back and raises ``ValueError`` for a missing, unreadable or
inconsistent file. ``draft`` records the depth, top-k and budget the thresholds belong to;
:mod:`specgraft.methods.graft` refuses to apply them to other ones.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specgraft.drafters.recycling import SuccessorMatrix

FORMAT = "specgraft-graft-calibration"
VERSION = 1
#: Variants whose thresholds a calibration holds.
CALIBRATED_VARIANTS = ("graft", "graft-prune")


@dataclass
class Calibration:
    checkpoints: tuple[int, ...]
    """Pruning depths the thresholds belong to."""
    thresholds: dict[str, tuple[float, ...]]
    """``tau_d`` per checkpoint, per calibrated variant (``graft``, ``graft-prune``)."""
    matrix: SuccessorMatrix
    """The warmed-up successor matrix."""
    draft: dict[str, Any] = field(default_factory=dict)
    """Draft settings used: depth, top_k, budget, preset."""
    costs: dict[str, float] = field(default_factory=dict)
    """Measured ``draft_forward_s`` and ``verify_s``."""
    report: dict[str, Any] = field(default_factory=dict)
    """Per variant: predicted tokens/s for the chosen and the dense policy, stage shares, steps."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Models, corpus, dtype: what produced the file."""
    thresholds_by_task: dict[str, dict[str, tuple[float, ...]]] = field(default_factory=dict)
    """Per calibrated variant, per task subset: ``tau_d`` fitted on that subset's steps only
    (``calibrate --by-task``; the Table 11 analogue). Reported, never applied."""

    def thresholds_for(self, variant: str) -> tuple[float, ...]:
        if variant not in self.thresholds:
            raise ValueError(
                f"this calibration has thresholds for {sorted(self.thresholds)}, not {variant!r} "
                f"(specgraft calibrate --method {variant}; without --method it calibrates both)"
            )
        return self.thresholds[variant]


def matrix_path(json_path: str | Path) -> Path:
    return Path(json_path).with_suffix(".npz")


def save_calibration(cal: Calibration, path: str | Path) -> Path:
    """Write ``path`` (JSON) and the matrix beside it (same name, ``.npz``); returns the JSON path."""
    path = Path(path)
    if path.suffix == ".npz":
        raise ValueError(f"give the calibration a .json name, not {str(path)!r} (the matrix is written as .npz beside it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    cal.matrix.save(matrix_path(path))
    data = {
        "format": FORMAT,
        "version": VERSION,
        "checkpoints": list(cal.checkpoints),
        "thresholds": {k: list(v) for k, v in cal.thresholds.items()},
        "thresholds_by_task": {v: {t: list(taus) for t, taus in by.items()} for v, by in cal.thresholds_by_task.items()},
        "matrix": matrix_path(path).name,
        "vocab_size": cal.matrix.vocab_size,
        "k": cal.matrix.k,
        "draft": cal.draft,
        "costs": cal.costs,
        "report": cal.report,
        "meta": cal.meta,
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def load_calibration(path: str | Path, vocab_size: int | None = None) -> Calibration:
    """Read a calibration written by :func:`save_calibration`; ``ValueError`` on any problem."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"calibration file {str(path)!r} does not exist; write one with `specgraft calibrate`")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"calibration file {str(path)!r} is not valid JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a specgraft Graft calibration file (no \"format\": {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ValueError(
            f"calibration file {str(path)!r} has version {data.get('version')!r}; this specgraft reads version {VERSION}"
        )
    missing = [key for key in ("checkpoints", "thresholds", "matrix") if key not in data]
    if missing:
        raise ValueError(f"calibration file {str(path)!r} lacks {', '.join(missing)}")
    try:
        checkpoints = tuple(int(d) for d in data["checkpoints"])
        thresholds = {str(k): tuple(float(t) for t in v) for k, v in dict(data["thresholds"]).items()}
        by_task = {
            str(v): {str(t): tuple(float(x) for x in taus) for t, taus in dict(by).items()}
            for v, by in dict(data.get("thresholds_by_task", {})).items()
        }
    except (TypeError, ValueError) as e:
        raise ValueError(f"calibration file {str(path)!r} has malformed checkpoints or thresholds ({e})") from e
    named = [(repr(v), taus) for v, taus in thresholds.items()]
    named += [(f"{v!r} on task {t!r}", taus) for v, by in by_task.items() for t, taus in by.items()]
    for name, taus in named:
        if len(taus) != len(checkpoints) or any(not 0.0 <= t <= 1.0 for t in taus):
            raise ValueError(
                f"calibration file {str(path)!r}: thresholds of {name} must be {len(checkpoints)} values in [0, 1], "
                f"got {list(taus)}"
            )
    mpath = path.parent / str(data["matrix"])
    if not mpath.is_file():
        raise ValueError(f"successor matrix {str(mpath)!r} of calibration {str(path)!r} does not exist")
    try:
        matrix = SuccessorMatrix.load(mpath)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, ValueError) as e:
        raise ValueError(f"successor matrix {str(mpath)!r} of calibration {str(path)!r} is unreadable ({e})") from e
    if vocab_size is not None and matrix.vocab_size != vocab_size:
        raise ValueError(
            f"calibration {str(path)!r} has a successor matrix for {matrix.vocab_size} tokens "
            f"but the model's vocabulary is {vocab_size}"
        )
    return Calibration(
        checkpoints=checkpoints,
        thresholds=thresholds,
        matrix=matrix,
        draft=dict(data.get("draft", {})),
        costs=dict(data.get("costs", {})),
        report=dict(data.get("report", {})),
        meta=dict(data.get("meta", {})),
        thresholds_by_task=by_task,
    )


def thresholds_table(cal: Calibration, variant: str) -> str:
    """Markdown table of ``variant``'s thresholds per task subset (the paper's Table 11): one row
    per checkpoint, one column per task, the range across tasks, and the pooled thresholds.

    >>> cal = Calibration((0, 1), {"graft": (0.3, 0.1)}, SuccessorMatrix(4, 2),
    ...                   thresholds_by_task={"graft": {"code": (0.35, 0.1), "chat": (0.25, 0.05)}})
    >>> print(thresholds_table(cal, "graft"))
    | gate | code | chat | range | pooled |
    |---|---|---|---|---|
    | d0 | 0.350 | 0.250 | 0.100 | 0.300 |
    | d1 | 0.100 | 0.050 | 0.050 | 0.100 |
    """
    by_task = cal.thresholds_by_task.get(variant, {})
    tasks = list(by_task)
    lines = ["| gate | " + " | ".join([*tasks, "range", "pooled"]) + " |", "|" + "---|" * (len(tasks) + 3)]
    for j, d in enumerate(cal.checkpoints):
        values = [by_task[t][j] for t in tasks]
        spread = f"{max(values) - min(values):.3f}" if values else "-"
        cells = [f"{v:.3f}" for v in values] + [spread, f"{cal.thresholds_for(variant)[j]:.3f}"]
        lines.append(f"| d{d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
