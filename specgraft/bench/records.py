"""One JSONL row per (prompt id, turn, method), appended as the run goes.

A row is self-contained: it carries the resolved config and the environment it was measured in,
so a resumed run (``--resume``), whose rows come from several processes, stays auditable.
Counts follow :class:`~specgraft.types.GenerationStats`: ``new_tokens`` includes the EOS that
ended a generation, ``mat`` = ``new_tokens / steps`` counts the bonus token, and
``tokens_per_step`` maps tokens per step (accepted + bonus) to a number of steps, so
``sum(k * n) == new_tokens`` and ``sum(n) == steps``. Peers (HF ``generate``) have ``steps``,
``mat``, ``tokens_per_step`` and the time breakdown set to None.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from specgraft.files import drop_partial_last_line

RESULTS_FILE = "results.jsonl"
#: Method name of the second ``ar`` run on the same input (the runner's ``bracket`` option).
AR_END = "ar-end"


@dataclass
class ResultRow:
    prompt_id: str
    task: str
    suite: str
    turn: int
    """0-based turn; turn k > 0 is conditioned on ``ar``'s own answers to turns < k."""
    method: str
    peer: bool
    chat: bool
    session: str
    """Id of the process run that measured this row (a resumed run has several)."""
    prompt_tokens: int
    new_tokens: int
    time_s: float
    tokens_per_s: float
    # [new_tokens]
    tokens: list[int]
    text: str
    agreement: dict[str, Any]
    """Against ``ar`` on the same input: exact, first_divergence, fraction_equal."""
    steps: int | None = None
    mat: float | None = None
    tokens_per_step: dict[str, int] | None = None
    proposed_by_source: dict[str, int] | None = None
    accepted_by_source: dict[str, int] | None = None
    time_breakdown_s: dict[str, float] | None = None
    """prefill, draft, forward, verify, commit, observe, total (engine clock)."""
    agreement_hf: dict[str, Any] | None = None
    """Peers only: against their own engine's plain output (HF plain ``generate`` for ``hf-*``,
    plain vLLM for ``vllm-*``)."""
    self_repetition: dict[str, int] | None = None
    """``ar`` only: READER's counts (response_tokens, advances) over this input and output."""
    self_repetition_ds: dict[str, int] | None = None
    """``ar`` only, in a run with ``--datastore``: the same counts when a match may also lie in
    the run's datastores (READER Table 1's "W/ DS")."""
    round_times_s: list[float] | None = None
    """A run with ``--rounds N`` (N > 1): each round's time; ``time_s`` is their mean."""
    config: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.prompt_id, self.turn, self.method)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ResultRow":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def append_row(path: Path, row: ResultRow) -> None:
    """Append one row and flush it to disk, so an interrupted run loses nothing finished."""
    with path.open("a", encoding="utf-8") as f:
        f.write(row.to_json() + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_rows(path: Path, repair: bool = False) -> list[ResultRow]:
    """All rows of a results file.

    A run killed mid-write can leave a last line without its newline; with ``repair`` that
    line is cut off the file (:func:`drop_partial_last_line`; it is re-measured), otherwise it
    is an error like any other malformed line.
    """
    if not path.exists():
        return []
    if repair:
        drop_partial_last_line(path)
    raw = path.read_text(encoding="utf-8")
    lines = raw.split("\n")
    if lines.pop():  # "" when the file ends with a newline
        raise ValueError(f"{path}: the last line is incomplete (an interrupted run?); resume to repair it")
    rows: list[ResultRow] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(ResultRow.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}:{lineno}: not a result row ({e})") from None
    return rows

