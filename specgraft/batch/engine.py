"""Continuous batching over :class:`~specgraft.engine.SpecEngine`: many requests, one target
forward per step.

A :class:`BatchEngine` keeps a queue of waiting requests and at most ``max_batch`` running
sequences. Each :meth:`BatchEngine.step`:

1. drops cancelled requests (their slots are freed now, at the step boundary);
2. admits waiting requests while there is room: each is prefilled alone (its own forward) and
   then decodes with the others (one request into an empty batch that nothing else joins this
   step, none waiting or ``max_batch`` 1, starts as ``SpecEngine.start`` starts a single
   generation: its prompt fed in its first step's forward, where its drafters allow); one
   expected to decode plainly (the policy's ``speculating``), or whose remaining tokens cannot
   repay its drafters' optional prefill work (``prefill_pays``: Token Recycling's prompt
   top-k), skips that work;
3. runs one speculative step for every running sequence with one target forward
   (``SpecEngine.step_batch``: trees padded to one shape, per-sequence positions and masks,
   a draft model drafting for all of them in one forward per layer), each tree capped by the
   budget the :class:`~specgraft.budget.policy.BudgetPolicy` picks for this batch size
   (0 = plain decoding, when speculation would not pay; then at most one sequence *probes*,
   drafting to keep the policy's acceptance and drafting-time estimates current, in a
   forward of its own when that is cheaper); a sequence whose draft model would first have to
   prefill its prompt decodes plainly if the tokens it has left cannot pay that back
   (``BudgetPolicy.pays_back``); every target forward's shape and time, and every such
   catch-up, go back to the policy, which corrects its cost table with them, and so does the
   whole step's realized throughput (``BudgetPolicy.observe_step``: drafting that produced
   fewer tokens a second than plain steps at this batch size is stopped there);
4. returns one :class:`BatchEvent` per request that emitted tokens or finished; finished
   sequences leave (their slots are reused by the next admitted request).

Each sequence owns its cache slot, drafter states, sampling generator and stats, so its output
does not depend on what else is in the batch: greedy outputs equal single-sequence decoding
token for token (in float32). A seeded sampled request with deterministic drafts (every
method's default) draws one value from its own generator per emitted token, so it emits what
plain sampling with that seed emits alone, whatever budgets the policy picks. Sampled draft
children (``GraftOptions.sample_drafts``) draw their values and accept tests from the same
generator, so a seeded request reproduces its tokens only while its trees keep their sizes (a
fixed budget); under an adaptive budget its tokens can change, its law never does.

Example::

    batch = BatchEngine(engine, max_batch=4)
    ids = [batch.submit(p, GenerationConfig(max_new_tokens=32)) for p in prompts]
    outputs = batch.run_to_completion()        # request id -> BatchResult

Thread-safety: :meth:`submit` and :meth:`cancel` may be called from any thread while another
thread calls :meth:`step` (the server's event loop submits, its model thread steps).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Sequence

from specgraft.budget.policy import BudgetPolicy, FixedBudget, StepPlan
from specgraft.config import GenerationConfig
from specgraft.engine import SequenceState, SpecEngine
from specgraft.types import GenerationStats


@dataclass
class BatchEvent:
    """What one step did for one request."""

    request_id: str
    tokens: list[int]
    """Tokens emitted this step (maybe none)."""
    finished: bool = False
    finish_reason: str | None = None
    """``"stop"`` (EOS), ``"length"`` (``max_new_tokens`` or the context window), ``"cancelled"``,
    ``"error"`` (the request could not start: :attr:`error` says why)."""
    stats: GenerationStats | None = None
    """The request's stats (final when ``finished``)."""
    error: str | None = None


@dataclass
class BatchResult:
    """A finished request: every token it emitted and its stats."""

    request_id: str
    tokens: list[int]
    finish_reason: str | None
    stats: GenerationStats | None
    error: str | None = None


@dataclass
class BatchStepStats:
    """Counters over a batch engine's life (the server's ``/metrics`` reads them)."""

    steps: int = 0
    """Batched steps run (one target forward each; two for a split step)."""
    probe_steps: int = 0
    """Steps in which one sequence drafted while the batch decoded plainly (the policy's
    warm-up and exploration, :class:`~specgraft.budget.policy.StepPlan`)."""
    fused_steps: int = 0
    """Steps that fed a request's prompt (one started alone, fused as ``SpecEngine.start`` does):
    left out of what the policy learns of steps and forwards, and of :attr:`decode_by_batch`."""
    split_steps: int = 0
    """Steps run as two forwards, the drafting sequences apart from the plain ones
    (``BudgetPolicy.split_pays``)."""
    sequence_steps: int = 0
    """Sum over steps of the sequences in the step."""
    tokens: int = 0
    """Tokens emitted."""
    step_s: float = 0.0
    """Time in steps (prefills of admitted requests included)."""
    requests_started: int = 0
    plain_starts: int = 0
    """Requests started without their drafters' optional prefill work although it has a cost
    (expected to decode plainly, or too few tokens to repay it: ``BudgetPolicy.prefill_pays``)."""
    requests_finished: int = 0
    budget_by_batch: dict[int, int] = field(default_factory=dict)
    """The budget last used at each batch size."""
    decode_by_batch: dict[int, list[float]] = field(default_factory=dict)
    """Batch size -> ``[tokens, seconds]`` of the steps run with that many sequences, admissions
    and draft-model catch-ups left out: the work a budget policy's predicted tokens/s covers."""
    rows_fed: int = 0
    """Rows of the steps' target forwards (sequences x rows of the largest tree, padding included)."""
    rows_used: int = 0
    """Of those, the rows the sequences' trees (and roots) filled: ``1 - rows_used / rows_fed`` is
    the share of padding (:attr:`padding_share`)."""

    @property
    def padding_share(self) -> float:
        return 1.0 - self.rows_used / self.rows_fed if self.rows_fed else 0.0

    @property
    def mean_batch(self) -> float:
        return self.sequence_steps / self.steps if self.steps else 0.0


@dataclass
class _Request:
    request_id: str
    prompt: list[int]
    config: GenerationConfig


class QueueFull(RuntimeError):
    """:meth:`BatchEngine.submit` with ``max_queue`` requests already waiting."""


class BatchEngine:
    """Requests in, :class:`BatchEvent` s out; one :class:`SpecEngine` shared by every sequence."""

    def __init__(self, engine: SpecEngine, max_batch: int = 8, policy: BudgetPolicy | None = None, max_queue: int | None = None):
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        if max_queue is not None and max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        self.engine = engine
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.policy: BudgetPolicy = policy if policy is not None else FixedBudget()
        self.running: dict[str, SequenceState] = {}
        self.stats = BatchStepStats()
        self._waiting: deque[_Request] = deque()
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()

    # -- requests ------------------------------------------------------------------------------

    def submit(self, prompt: Sequence[int], config: GenerationConfig = GenerationConfig(), request_id: str | None = None) -> str:
        """Queue a request; it starts at a coming step. ``ValueError`` for a prompt the model
        cannot take (empty, longer than the context window), :class:`QueueFull` when
        ``max_queue`` requests wait already."""
        self.engine.check_prompt(prompt)
        with self._lock:
            if request_id is None:
                request_id = f"req-{next(self._ids)}"
            if request_id in self.running or any(r.request_id == request_id for r in self._waiting):
                raise ValueError(f"request id {request_id!r} is already in use")
            if self.max_queue is not None and len(self._waiting) >= self.max_queue:
                raise QueueFull(f"{len(self._waiting)} requests are waiting (max_queue={self.max_queue})")
            self._waiting.append(_Request(request_id, [int(t) for t in prompt], config))
        return request_id

    def cancel(self, request_id: str) -> None:
        """Stop a request at the next step boundary (its slot is freed then). Unknown or finished
        ids are ignored (a client may disconnect after its request ended)."""
        with self._lock:
            self._cancelled.add(request_id)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting or self.running)

    # -- steps ---------------------------------------------------------------------------------

    def step(self) -> list[BatchEvent]:
        """Cancel, admit, run one batched step, retire finished sequences (module docstring)."""
        t0 = time.perf_counter()
        events = self._cancel_and_admit()
        if self.running:
            ids = list(self.running)
            seqs = [self.running[i] for i in ids]
            # a step that feeds a fused start's prompt is mostly prefill: what the policy learns of
            # steps, forwards and decode rates leaves it out (as catch-ups)
            fused = any(s.unfilled for s in seqs)
            plan = self.policy.plan(len(seqs), [s.config.budget for s in seqs], keys=ids)
            self.stats.budget_by_batch[len(seqs)] = plan.cap if plan.cap is not None else max(s.config.budget for s in seqs)
            t_run = time.perf_counter()
            emitted = self._run_step(seqs, plan)
            run_s = time.perf_counter() - t_run - sum(s.last_catch_up[1] for s in seqs)
            n_emitted = sum(map(len, emitted))
            if not fused:
                self.policy.observe_step(len(seqs), any(s.last_budget > 0 for s in seqs), n_emitted, run_s)
                decode = self.stats.decode_by_batch.setdefault(len(seqs), [0, 0.0])
                decode[0] += n_emitted
                decode[1] += run_s
            self.stats.steps += 1
            self.stats.fused_steps += fused
            self.stats.sequence_steps += len(seqs)
            forwards = {} if fused else {id(s.last_forward): s.last_forward for s in seqs if s.last_forward is not None}
            for f in forwards.values():
                self.policy.observe_forward(f.batch, f.rows, f.seconds)
                self.stats.rows_fed += f.batch * f.rows
                self.stats.rows_used += f.used
            for rid, seq, tokens in zip(ids, seqs, emitted, strict=True):
                self.stats.tokens += len(tokens)
                self.policy.observe(len(seqs), seq.last_budget, seq.last_tree_nodes, seq.last_accepted, seq.last_draft_s, key=rid)
                if seq.last_catch_up[0]:
                    self.policy.observe_catch_up(*seq.last_catch_up)
                if seq.done:
                    events.append(self._retire(rid, tokens))
                elif tokens:
                    events.append(BatchEvent(rid, tokens, stats=seq.stats))
        self.stats.step_s += time.perf_counter() - t0
        return events

    def _pays_back(self, seq: SequenceState, batch: int, cap: int | None) -> bool:
        """Whether ``seq`` may draft under ``cap`` this step: always, unless its drafters would
        first prefill what they have not cached (a draft model's catch-up) and the policy says
        the tokens it has left cannot pay that back (``BudgetPolicy.pays_back``)."""
        budget = seq.config.budget if cap is None else min(cap, seq.config.budget)
        if budget <= 0:
            return True
        pending = self.engine.pending_prefill(seq)
        remaining = seq.config.max_new_tokens - seq.stats.new_tokens
        return not pending or self.policy.pays_back(batch, budget, pending, remaining)

    def _run_step(self, seqs: list[SequenceState], plan: StepPlan) -> list[list[int]]:
        """``step_batch`` under ``plan``: a sequence whose catch-up would not pay back decodes
        plainly (:meth:`_pays_back`), and so does one admitted ``plain_only``; a probe goes to
        the first sequence whose drafters are primed (else the first that is not plain only).
        A step where only some sequences draft runs them in a forward of their own when the
        policy says that is cheaper than padding every sequence to their trees (``plan.split``
        for a probe, ``BudgetPolicy.split_pays`` otherwise)."""
        if not plan.probe:
            if plan.cap == 0:
                return self.engine.step_batch(seqs, 0)
            caps = [0 if s.plain_only or not self._pays_back(s, len(seqs), plan.cap) else plan.cap for s in seqs]
            budgets = [s.config.budget if c is None else min(c, s.config.budget) for s, c in zip(seqs, caps)]
            split = self.policy.split_pays(len(seqs), sum(b > 0 for b in budgets), max(budgets))
            return self._step_apart(seqs, budgets, split)
        may = [i for i, s in enumerate(seqs) if not s.plain_only]
        p = next((i for i in may if seqs[i].primed), may[0] if may else None)
        if p is None or not self._pays_back(seqs[p], len(seqs), plan.probe):
            return self.engine.step_batch(seqs, 0)
        self.stats.probe_steps += 1
        return self._step_apart(seqs, [plan.probe if i == p else 0 for i in range(len(seqs))], plan.split)

    def _step_apart(self, seqs: list[SequenceState], budgets: list[int], split: bool) -> list[list[int]]:
        """``step_batch(seqs, budgets)``; with ``split`` as two forwards, the sequences that
        draft apart from the plain ones (what each sequence emits is the same either way)."""
        plain = [i for i, b in enumerate(budgets) if b <= 0]
        if not split or not plain or len(plain) == len(seqs):
            return self.engine.step_batch(seqs, budgets)
        drafting = [i for i, b in enumerate(budgets) if b > 0]
        emitted: list[list[int]] = [[] for _ in seqs]
        for group, group_budgets in ((plain, 0), (drafting, [budgets[i] for i in drafting])):
            for i, tokens in zip(group, self.engine.step_batch([seqs[i] for i in group], group_budgets), strict=True):
                emitted[i] = tokens
        self.stats.split_steps += 1
        return emitted

    def _cancel_and_admit(self) -> list[BatchEvent]:
        events: list[BatchEvent] = []
        with self._lock:
            cancelled, self._cancelled = self._cancelled, set()
            kept: deque[_Request] = deque()
            for r in self._waiting:
                if r.request_id in cancelled:
                    events.append(BatchEvent(r.request_id, [], finished=True, finish_reason="cancelled"))
                else:
                    kept.append(r)
            self._waiting = kept
        for rid in cancelled & set(self.running):
            events.append(self._retire(rid, []))
        # who joins now, and whether each starts speculatively; on a target that prefills
        # batches (a GPU) and with no optional prefill work to weigh one start at a time
        # (``_speculative_start`` learns its cost from the starts before), they start together
        together = getattr(self.engine.target, "batched_prefill", False) and not self.engine.optional_prefill
        while len(self.running) < self.max_batch:
            joining: list[tuple[_Request, bool, bool]] = []
            while len(self.running) + len(joining) < self.max_batch:
                with self._lock:
                    if not self._waiting:
                        break
                    request = self._waiting.popleft()
                # the batch size it will decode in: a sequence expected to decode plainly starts
                # without its drafters' optional prefill work
                size = min(self.max_batch, len(self.running) + len(joining) + 1 + len(self._waiting))
                joining.append((request, *self._speculative_start(request, size)))
                if not together:
                    break
            if not joining:
                break
            # one request into an empty batch that nothing else can join this step (none waiting,
            # or room for one only): it starts as `generate` starts (its prompt fed in its first
            # step's forward where its drafters allow, ``SpecEngine.start``), one forward fewer
            # and, on llama.cpp, the same rows in the same batch shapes as alone; it steps alone.
            # That step still takes the policy's plan (its counters move), but is not observed.
            alone = len(joining) == 1 and not self.running and (self.max_batch == 1 or not self._waiting)
            if alone:
                started = [self._start_alone(*joining[0][:2])]
            else:
                started = self.engine.start_many([(r.prompt, r.config, speculative) for r, speculative, _ in joining])
            for (request, _, repays), seq in zip(joining, started):
                if not isinstance(seq, SequenceState):  # e.g. out of memory for the cache
                    events.append(BatchEvent(request.request_id, [], finished=True, finish_reason="error", error=str(seq)))
                    continue
                seq.plain_only = not repays
                if seq.optional_prefill[0]:
                    self.policy.observe_optional_prefill(*seq.optional_prefill)
                elif self.engine.optional_prefill:
                    self.stats.plain_starts += 1
                self.stats.requests_started += 1
                self.running[request.request_id] = seq
                if seq.done:  # max_new_tokens == 0
                    events.append(self._retire(request.request_id, []))
            if alone:
                break  # a later request is prefilled apart at the next step, not fused beside this one
        return events

    def _start_alone(self, request: _Request, speculative: bool) -> SequenceState | ValueError | RuntimeError:
        """``SpecEngine.start`` (its prompt fused into the first step where its drafters allow),
        or the error that refused it, as ``start_many`` returns it."""
        try:
            return self.engine.start(request.prompt, request.config, speculative)
        except (ValueError, RuntimeError) as e:
            return e

    def _speculative_start(self, request: _Request, size: int) -> tuple[bool, bool]:
        """``(speculative, repays)`` for ``request`` joining a batch of ``size``. It starts with
        its drafters' optional prefill work only if it is expected to draft there
        (``BudgetPolicy.speculating``) and, when that work has a cost
        (``SpecEngine.optional_prefill``), the policy says the tokens it has to generate repay
        it (``BudgetPolicy.prefill_pays``). If they do not, ``repays`` is False and the sequence
        decodes plainly for its whole life (:attr:`SequenceState.plain_only`): the policy
        weighed drafting's whole gain against that work, and drafting without it gains less
        (on the Zen 3, `recycling` requests started without their prompt's top-k and left to
        draft came out 4% under batched `ar` at batch size 1). One started plainly because
        its batch is not expected to draft may draft later, from what its drafters learn."""
        budget = request.config.with_default_budget(self.engine.default_budget).budget
        if not self.policy.speculating(size, budget):
            return False, True
        if not self.engine.optional_prefill:
            return True, True
        repays = self.policy.prefill_pays(size, budget, len(request.prompt) - 1, request.config.max_new_tokens)
        return repays, repays

    def _retire(self, request_id: str, tokens: list[int]) -> BatchEvent:
        seq = self.running.pop(request_id)
        self.engine.finish(seq)
        self.policy.release(request_id)
        self.stats.requests_finished += 1
        return BatchEvent(request_id, tokens, finished=True, finish_reason=seq.finish_reason, stats=seq.stats)

    def close(self) -> list[BatchEvent]:
        """Cancel everything (waiting and running) now; the events say so."""
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
        events = [BatchEvent(r.request_id, [], finished=True, finish_reason="cancelled") for r in waiting]
        for rid in list(self.running):
            events.append(self._retire(rid, []))
        return events

    # -- whole batches -------------------------------------------------------------------------

    def events(self) -> Iterator[BatchEvent]:
        """Step until nothing is waiting or running, yielding every event."""
        while self.has_work:
            yield from self.step()

    def run_to_completion(self) -> dict[str, BatchResult]:
        """Step until idle; every request's tokens, finish reason and stats by request id."""
        tokens: dict[str, list[int]] = {}
        results: dict[str, BatchResult] = {}
        for ev in self.events():
            tokens.setdefault(ev.request_id, []).extend(ev.tokens)
            if ev.finished:
                results[ev.request_id] = BatchResult(ev.request_id, tokens.pop(ev.request_id), ev.finish_reason, ev.stats, ev.error)
        return results
