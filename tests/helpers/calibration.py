"""A Graft calibration (thresholds, matrix, draft settings) and a synthetic calibration corpus."""

from __future__ import annotations

import numpy as np

from specgraft.calibration import Calibration
from specgraft.drafters.draft_model import PRESETS
from specgraft.drafters.recycling import SuccessorMatrix


def make_calibration(vocab: int = 96) -> Calibration:
    """A calibration for the cpu preset over a ``vocab``-token successor matrix."""
    matrix = SuccessorMatrix(vocab, k=8)
    rng = np.random.default_rng(1)
    matrix.table[:] = np.stack([rng.permutation(vocab)[:8] for _ in range(vocab)])
    return Calibration(
        checkpoints=PRESETS["cpu"].checkpoints,
        thresholds={"graft": (0.1, 0.2, 0.3), "graft-prune": (0.0, 0.05, 0.5)},
        matrix=matrix,
        draft={"depth": PRESETS["cpu"].depth, "top_k": PRESETS["cpu"].top_k, "budget": PRESETS["cpu"].budget},
        costs={"draft_forward_s": 0.01, "verify_s": 0.03},
        meta={"model": "tiny"},
    )


def corpus_records(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` (prompt, response) records in the tiny tokenizer's words, each response a repeated unit."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        unit = " ".join(f"w{t}" for t in rng.integers(3, 96, size=rng.integers(2, 5)))
        out.append((f"w{rng.integers(3, 96)} w{rng.integers(3, 96)}", " ".join([unit] * 6)))
    return out
