"""The model worker: one thread owns the model and steps the batch engine; requests come and go
through thread-safe calls.

The event loop never runs the model. It calls :meth:`ModelWorker.submit` (token ids, a
:class:`GenerationConfig` and a ``sink``) and :meth:`ModelWorker.cancel`; the worker thread loops
:meth:`BatchEngine.step` while there is work and sleeps on a condition otherwise. After each
step it turns every request's new tokens into text (its :class:`TextStream`, stop strings
applied) and hands a :class:`Piece` to the request's sink, which the server makes
``loop.call_soon_threadsafe(queue.put_nowait, piece)``. A stop string that completes cancels the
request in the engine before the next step, as ``SpecDecoder.generate_batch`` does, so the
tokens dropped after it all belong to one step and the stats can forget them.

Example (a decoder over any model; ``pieces`` collects what the worker thread hands over)::

    worker = ModelWorker(decoder, max_batch=4)
    worker.start()
    pieces = []
    worker.submit(decoder.encode("Hello"), decoder.make_config(max_new_tokens=8), pieces.append)
    ...                                   # pieces[-1].finished once the request ends
    worker.close()
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from specgraft.api import SpecDecoder
from specgraft.batch import BatchEvent
from specgraft.budget.policy import BudgetPolicy
from specgraft.config import GenerationConfig
from specgraft.detokenize import TextStream
from specgraft.serve.metrics import ServerMetrics

log = logging.getLogger("specgraft.serve")


@dataclass(frozen=True)
class Piece:
    """What one step produced for one request."""

    text: str
    """Text that became final (maybe empty)."""
    finished: bool = False
    finish_reason: str | None = None
    """``"stop"`` (EOS or a stop string), ``"length"``, ``"cancelled"`` or ``"error"``."""
    completion_tokens: int = 0
    """Tokens of the output so far (after a stop string: up to the one completing it)."""
    error: str | None = None


@dataclass
class _Live:
    """A request the worker is serving."""

    sink: Callable[[Piece], None]
    text: TextStream
    prompt_tokens: int


class WorkerFailed(RuntimeError):
    """The worker thread stopped on an unexpected error; the server answers 503 from then on."""


class ModelWorker:
    """One thread stepping one :class:`~specgraft.batch.BatchEngine` over ``decoder``'s engine."""

    def __init__(
        self,
        decoder: SpecDecoder,
        max_batch: int = 8,
        max_queue: int | None = None,
        policy: BudgetPolicy | None = None,
        metrics: ServerMetrics | None = None,
    ):
        self.decoder = decoder
        self.batch = decoder.batch_engine(max_batch=max_batch, policy=policy, max_queue=max_queue)
        self.metrics = metrics if metrics is not None else ServerMetrics(decoder.method)
        self.failure: str | None = None
        self._live: dict[str, _Live] = {}
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="specgraft-model-worker", daemon=True)

    # -- called from the event loop ------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, prompt: Sequence[int], config: GenerationConfig, sink: Callable[[Piece], None], request_id: str) -> None:
        """Queue a request; ``sink`` gets its pieces on the worker thread. Raises ``ValueError``
        (a prompt the model cannot take), :class:`~specgraft.batch.QueueFull`, or
        :class:`WorkerFailed`."""
        config = self.decoder.resolve(config)
        with self._wake:
            if self.failure is not None:
                raise WorkerFailed(self.failure)
            if self._closing:
                raise WorkerFailed("the server is shutting down")
            # registered before the engine sees it, so its first event finds it
            self._live[request_id] = _Live(sink, TextStream(self.decoder.tokenizer, config.stop_strings), len(prompt))
            try:
                self.batch.submit(prompt, config, request_id=request_id)
            except BaseException:
                del self._live[request_id]
                raise
            self._wake.notify()

    def cancel(self, request_id: str) -> None:
        """Stop a request (a client went away); its slot is freed at the next step boundary."""
        self.batch.cancel(request_id)
        with self._wake:
            self._wake.notify()

    def cancel_all(self) -> None:
        """Cancel every request the worker is serving (a shutdown's grace period is over)."""
        with self._wake:
            ids = list(self._live)
        for request_id in ids:
            self.batch.cancel(request_id)
        with self._wake:
            self._wake.notify()

    def close(self, timeout: float | None = 30.0) -> None:
        """Cancel what is left, stop the thread and wait for it."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("the model worker did not stop within %s s", timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self.failure is None

    # -- the worker thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._closing and not self.batch.has_work:
                        self._wake.wait()
                    if self._closing:
                        break
                t0 = time.perf_counter()
                events = self.batch.step()
                self.metrics.observe_step(time.perf_counter() - t0, self.batch)
                self._dispatch(events)
            self._dispatch(self.batch.close())
        except Exception as e:  # a bug in a step: every request learns it, nothing hangs
            log.exception("the model worker failed")
            with self._wake:
                self.failure = f"the model worker failed: {type(e).__name__}: {e}"
                live, self._live = self._live, {}
            for rid, req in live.items():
                self.metrics.observe_finished("error", req.prompt_tokens, 0, None)
                req.sink(Piece("", finished=True, finish_reason="error", error=self.failure))

    def _dispatch(self, events: list[BatchEvent]) -> None:
        for ev in events:
            with self._wake:
                req = self._live.get(ev.request_id)
            if req is None:
                continue
            text = req.text
            piece = text.push(ev.tokens)
            if text.stopped and not ev.finished:
                # before the next step: the tokens dropped after the stop string are this step's
                self.batch.cancel(ev.request_id)
            if not ev.finished:
                if piece:
                    req.sink(Piece(piece, completion_tokens=len(text.tokens)))
                continue
            with self._wake:
                del self._live[ev.request_id]
            piece += text.close()
            reason = "stop" if text.stopped else ev.finish_reason
            stats = ev.stats
            if stats is not None:
                stats.trim_last_step(text.dropped)
            self.metrics.observe_finished(reason, req.prompt_tokens, len(text.tokens), stats)
            req.sink(Piece(piece, finished=True, finish_reason=reason, completion_tokens=len(text.tokens), error=ev.error))
