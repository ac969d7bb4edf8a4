"""Pooling benchmark rows per (method, task) and overall: the numbers the report and plots show.

See :mod:`specgraft.bench.report` for the definitions (speedup, decode speedup, MAT, agreement).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from specgraft.agreement import agreement
from specgraft.bench.records import AR_END, ResultRow
from specgraft.bench.repetition import SelfRepetition

OVERALL = "overall"
#: llama.cpp's own plain decoding (the ``llamacpp`` peer): every row of a run where it ran is
#: also compared with it, in time and in tokens.
LLAMACPP_PLAIN = "llamacpp"
PHASES = ("prefill", "draft", "forward", "verify", "commit", "observe")


@dataclass
class Cell:
    """One method on one task (or ``overall``), pooled over its generations."""

    method: str
    task: str
    peer: bool
    generations: int = 0
    new_tokens: int = 0
    steps: int | None = 0
    time_s: float = 0.0
    # ar's (and hf's) time over the same generations, for the speedup ratios
    ar_time_s: float = 0.0
    hf_time_s: float | None = 0.0
    # prefill time of this method and of ar (None for peers), for the decode-only speedup
    prefill_s: float | None = 0.0
    ar_prefill_s: float = 0.0
    exact: int = 0
    exact_own: int = 0
    """Peers: outputs equal to their own engine's plain output (``agreement_hf``)."""
    fraction_equal_sum: float = 0.0
    first_divergence: int | None = None
    plain_time_s: float | None = None
    """``llamacpp``'s time over the same generations, when it ran on all of them."""
    exact_plain: int = 0
    """Outputs equal to ``llamacpp``'s (llama.cpp's one-row plain decoding) on the same input."""
    fraction_equal_plain_sum: float = 0.0
    tokens_per_step: Counter = field(default_factory=Counter)
    proposed_by_source: Counter = field(default_factory=Counter)
    accepted_by_source: Counter = field(default_factory=Counter)
    phase_s: Counter = field(default_factory=Counter)

    @property
    def mat(self) -> float | None:
        return self.new_tokens / self.steps if self.steps else None

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.time_s if self.time_s > 0 else 0.0

    @property
    def speedup(self) -> float | None:
        return self.ar_time_s / self.time_s if self.time_s > 0 and self.ar_time_s > 0 else None

    @property
    def speedup_hf(self) -> float | None:
        return self.hf_time_s / self.time_s if self.time_s > 0 and self.hf_time_s else None

    @property
    def speedup_plain(self) -> float | None:
        """``llamacpp`` time / this method's time over the same generations."""
        return self.plain_time_s / self.time_s if self.time_s > 0 and self.plain_time_s else None

    @property
    def mean_fraction_equal_plain(self) -> float:
        return self.fraction_equal_plain_sum / self.generations if self.generations else 0.0

    @property
    def decode_speedup(self) -> float | None:
        """Speedup with both prefills taken out: (ar time - ar prefill) / (time - prefill)."""
        if self.prefill_s is None:
            return None
        mine, base = self.time_s - self.prefill_s, self.ar_time_s - self.ar_prefill_s
        return base / mine if mine > 0 and base > 0 else None

    @property
    def mean_fraction_equal(self) -> float:
        return self.fraction_equal_sum / self.generations if self.generations else 0.0

    def add(
        self, row: ResultRow, ar: ResultRow | None, hf: ResultRow | None, ar_end: ResultRow | None = None,
        plain: ResultRow | None = None,
    ) -> None:
        """Pool ``row``; its baseline is ``ar`` (the mean of ``ar`` and ``ar_end`` when bracketed);
        ``plain``: the ``llamacpp`` row of the same input, when that peer ran."""
        assert ar is not None, f"no ar row for prompt {row.prompt_id!r} turn {row.turn}"
        bases = [ar] if ar_end is None else [ar, ar_end]
        if plain is None or (self.generations and self.plain_time_s is None):
            self.plain_time_s = None
        else:
            self.plain_time_s = (self.plain_time_s or 0.0) + plain.time_s
            same = agreement(row.tokens, plain.tokens)
            self.exact_plain += same.exact
            self.fraction_equal_plain_sum += same.fraction_equal
        self.generations += 1
        self.new_tokens += row.new_tokens
        self.time_s += row.time_s
        self.ar_time_s += sum(b.time_s for b in bases) / len(bases)
        self.ar_prefill_s += sum((b.time_breakdown_s or {}).get("prefill", 0.0) for b in bases) / len(bases)
        if row.time_breakdown_s is None or self.prefill_s is None:
            self.prefill_s = None
        else:
            self.prefill_s += row.time_breakdown_s["prefill"]
        if hf is None or self.hf_time_s is None:
            self.hf_time_s = None
        else:
            self.hf_time_s += hf.time_s
        if row.steps is None or self.steps is None:
            self.steps = None
        else:
            self.steps += row.steps
        self.exact += bool(row.agreement["exact"])
        self.exact_own += bool(row.agreement_hf and row.agreement_hf["exact"])
        self.fraction_equal_sum += row.agreement["fraction_equal"]
        first = row.agreement["first_divergence"]
        if first is not None:
            self.first_divergence = first if self.first_divergence is None else min(self.first_divergence, first)
        for k, v in (row.tokens_per_step or {}).items():
            self.tokens_per_step[int(k)] += v
        self.proposed_by_source.update(row.proposed_by_source or {})
        self.accepted_by_source.update(row.accepted_by_source or {})
        for k, v in (row.time_breakdown_s or {}).items():
            self.phase_s[k] += v


@dataclass
class Summary:
    methods: list[str]
    tasks: list[str]
    # (method, task) -> Cell; task OVERALL pools every task
    cells: dict[tuple[str, str], Cell]
    # task -> pooled self-repetition of the ar outputs (OVERALL included)
    ceiling: dict[str, SelfRepetition]
    # task -> number of distinct prompts
    prompts: dict[str, int]
    sessions: list[str]
    # task -> ar-end time / ar time of every bracketed generation (OVERALL included; empty if none)
    drift: dict[str, list[float]] = field(default_factory=dict)
    # task -> pooled self-repetition with the run's datastores (a run with --datastore; OVERALL included)
    ceiling_ds: dict[str, SelfRepetition] = field(default_factory=dict)

    def cell(self, method: str, task: str) -> Cell | None:
        return self.cells.get((method, task))


def own_plain(method: str) -> str:
    """A peer's own engine's plain run, its ``vs own plain`` baseline: ``vllm`` for the vLLM
    peers, ``llamacpp`` (llama-cpp-python, one row per decode) for the llama.cpp peers, ``hf``
    (Hugging Face ``generate``) for the others.

    >>> own_plain("vllm-ngram"), own_plain("hf-pld"), own_plain("llama-lookup"), own_plain("llamacpp-pld")
    ('vllm', 'hf', 'llamacpp', 'llamacpp')
    """
    if method == "vllm" or method.startswith("vllm-"):
        return "vllm"
    if method == LLAMACPP_PLAIN or method.startswith(("llamacpp-", "llama-")):
        return LLAMACPP_PLAIN
    return "hf"


def summarize(rows: Sequence[ResultRow]) -> Summary:
    """Pool rows per (method, task) and overall; speedups pair each row with ``ar`` (and its own
    engine's plain run, :func:`own_plain`) on the same (prompt, turn), measured in the row's own session.

    A resumed session that adds methods to an input measures its baselines again
    (:func:`specgraft.bench.runner.to_measure`), so an input may hold several ``ar`` rows: each
    row pairs with the one of its session (the first one if its session has none), and a
    method's cell pools only the first row of each input.
    """
    first: dict[tuple[str, int, str], ResultRow] = {}
    by_session: dict[tuple[str, int, str, str], ResultRow] = {}
    for r in rows:
        first.setdefault(r.key, r)
        by_session.setdefault((*r.key, r.session), r)

    def base(r: ResultRow, method: str) -> ResultRow | None:
        return by_session.get((r.prompt_id, r.turn, method, r.session)) or first.get((r.prompt_id, r.turn, method))

    methods = list(dict.fromkeys(r.method for r in rows if r.method != AR_END))
    if "ar" in methods:
        methods = ["ar", *[m for m in methods if m != "ar"]]
    tasks = list(dict.fromkeys(r.task for r in rows))
    cells: dict[tuple[str, str], Cell] = {}
    drift: dict[str, list[float]] = {}
    for r in rows:
        ar = base(r, "ar")
        if r.method == AR_END:
            if ar is not None and ar.time_s > 0:
                for task in (r.task, OVERALL):
                    drift.setdefault(task, []).append(r.time_s / ar.time_s)
            continue
        if first[r.key] is not r:
            continue
        hf, ar_end, plain = base(r, own_plain(r.method)), base(r, AR_END), base(r, LLAMACPP_PLAIN)
        for task in (r.task, OVERALL):
            cell = cells.setdefault((r.method, task), Cell(r.method, task, r.peer))
            cell.add(r, ar, hf, ar_end, plain)
    ceiling, ceiling_ds = {}, {}
    for task in [*tasks, OVERALL]:
        ars = [r for r in first.values() if r.method == "ar" and (task == OVERALL or r.task == task)]
        parts = [SelfRepetition(**r.self_repetition) for r in ars if r.self_repetition]
        if parts:
            ceiling[task] = SelfRepetition.pool(parts)
        parts = [SelfRepetition(**r.self_repetition_ds) for r in ars if r.self_repetition_ds]
        if parts and len(parts) == len(ars):  # every input of the task, or none
            ceiling_ds[task] = SelfRepetition.pool(parts)
    prompts = {t: len({r.prompt_id for r in rows if r.task == t}) for t in tasks}
    prompts[OVERALL] = len({r.prompt_id for r in rows})
    sessions = list(dict.fromkeys(r.session for r in rows))
    return Summary(methods, tasks, cells, ceiling, prompts, sessions, drift, ceiling_ds)


def common_rows(rows: Sequence[ResultRow]) -> list[ResultRow]:
    """The rows of the inputs (prompt, turn) that every method in ``rows`` ran.

    A resumed run may add methods on some prompts only; speedups of two methods are comparable only
    on the same inputs, so the report adds an overall table over these.

    >>> from types import SimpleNamespace as R
    >>> rows = [R(prompt_id=p, turn=0, method=m) for p, m in [("a", "ar"), ("a", "x"), ("b", "ar")]]
    >>> [(r.prompt_id, r.method) for r in common_rows(rows)]
    [('a', 'ar'), ('a', 'x')]
    """
    methods = {r.method for r in rows}
    ran: dict[tuple[str, int], set[str]] = {}
    for r in rows:
        ran.setdefault((r.prompt_id, r.turn), set()).add(r.method)
    return [r for r in rows if ran[(r.prompt_id, r.turn)] == methods]
