"""``GET /metrics``: counters of the server in Prometheus' text exposition format (version 0.0.4).

Written by hand rather than with ``prometheus_client``: about fifteen series, a format of a few
lines, no process-global registry (tests run several servers in one process) and no dependency.

Counters (``_total``) only grow; means are exported both as the counters they come from (for
PromQL ``rate`` ratios) and as a gauge over the server's life. Acceptance comes from finished
requests' :class:`~specgraft.types.GenerationStats`; MAT counts the bonus token, the per-source
means do not (they are the nodes of that source accepted per step).

Example (one finished request: 10 tokens in 4 steps, 5 of 9 recycling nodes accepted)::

    specgraft_mean_accepted_tokens_per_step{method="recycling"} 2.5
    specgraft_mean_accepted_tokens_per_step_by_source{method="recycling",source="recycling"} 1.25
    specgraft_acceptance_rate{method="recycling",source="recycling"} 0.5555555555555556
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Iterable

from specgraft.batch import BatchEngine
from specgraft.types import GenerationStats

#: Upper bounds (seconds) of the step-time histogram: tiny CPU models to 1.5B models on 2 cores.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Upper bounds of the batch-size histogram.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

OUTCOMES = ("stop", "length", "cancelled", "error", "queue_full", "invalid")
"""``stop``/``length``: finished; ``cancelled``: the client went away or the server shut down;
``error``: failed in the engine; ``queue_full``: refused with 429; ``invalid``: refused with
another 4xx before reaching the engine."""


class Histogram:
    """Cumulative buckets, sum and count, as Prometheus histograms are exposed."""

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{_number(b)}"}} {c}' for b, c in zip(self.bounds, self.counts, strict=True)]
        return out + [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {_number(self.sum)}", f"{name}_count {self.count}"]


class ServerMetrics:
    """What ``/metrics`` reports; updated by the worker thread and the event loop (a lock each)."""

    def __init__(self, method: str):
        self.method = method
        self._lock = threading.Lock()
        self.requests: Counter[str] = Counter({o: 0 for o in OUTCOMES})
        self.prompt_tokens = 0
        self.generation_tokens = 0
        # finished requests' stats, summed
        self.request_steps = 0
        self.request_tokens = 0
        self.proposed: Counter[str] = Counter()
        self.accepted: Counter[str] = Counter()
        self.step_seconds = Histogram(STEP_BUCKETS)
        self.batch_size = Histogram(BATCH_BUCKETS)
        self._sequence_steps = 0

    def observe_rejected(self, outcome: str) -> None:
        assert outcome in ("queue_full", "invalid"), outcome
        with self._lock:
            self.requests[outcome] += 1

    def observe_step(self, seconds: float, batch: BatchEngine) -> None:
        """One ``batch.step()``; its batch size is read from the engine's counters."""
        with self._lock:
            size = batch.stats.sequence_steps - self._sequence_steps
            self._sequence_steps = batch.stats.sequence_steps
            if size:
                self.step_seconds.observe(seconds)
                self.batch_size.observe(size)

    def observe_finished(self, outcome: str, prompt_tokens: int, completion_tokens: int, stats: GenerationStats | None) -> None:
        with self._lock:
            self.requests[outcome if outcome in OUTCOMES else "error"] += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += completion_tokens
            if stats is not None:
                self.request_steps += stats.steps
                self.request_tokens += stats.new_tokens
                self.proposed.update(stats.proposed_by_source)
                self.accepted.update(stats.accepted_by_source)

    def render(self, batch: BatchEngine) -> str:
        """The exposition text: one ``# HELP``/``# TYPE`` header per family, then its samples."""
        with self._lock:
            m = {"method": self.method}
            out: list[str] = []
            family(out, "specgraft_requests_total", "counter", "Requests by outcome (stop, length, cancelled, error, queue_full, invalid).",
                   [({"outcome": o}, n) for o, n in sorted(self.requests.items())])
            family(out, "specgraft_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", [({}, self.prompt_tokens)])
            family(out, "specgraft_generation_tokens_total", "counter",
                   "Tokens generated for finished requests (after a stop string: up to the token completing it).", [({}, self.generation_tokens)])
            family(out, "specgraft_steps_total", "counter", "Batched steps (one target forward each).", [({}, batch.stats.steps)])
            family(out, "specgraft_probe_steps_total", "counter",
                   "Steps in which one sequence drafted while the batch decoded plainly (budget warm-up and exploration).",
                   [({}, batch.stats.probe_steps)])
            family(out, "specgraft_plain_starts_total", "counter",
                   "Requests started without their drafters' optional prefill work (the prompt's top-k): expected to decode plainly, or too few tokens to repay it.",
                   [({}, batch.stats.plain_starts)])
            family(out, "specgraft_split_steps_total", "counter",
                   "Steps run as two forwards, the drafting sequences apart from the plain ones (cheaper than padding).",
                   [({}, batch.stats.split_steps)])
            family(out, "specgraft_sequence_steps_total", "counter", "Sequences summed over batched steps.", [({}, batch.stats.sequence_steps)])
            family(out, "specgraft_engine_tokens_total", "counter", "Tokens the engine emitted (including any dropped after a stop string).",
                   [({}, batch.stats.tokens)])
            out += histogram(self.step_seconds, "specgraft_step_seconds", "Time of one batched step (admitted prefills included).")
            out += histogram(self.batch_size, "specgraft_batch_size", "Sequences in one batched step.")
            family(out, "specgraft_running_requests", "gauge", "Sequences in the batch now.", [({}, batch.num_running)])
            family(out, "specgraft_waiting_requests", "gauge", "Requests in the queue now.", [({}, batch.num_waiting)])
            family(out, "specgraft_budget", "gauge", "Tree nodes per sequence last verified at each batch size (0 = plain decoding).",
                   [({"batch_size": str(b)}, k) for b, k in sorted(batch.stats.budget_by_batch.items())])
            family(out, "specgraft_request_steps_total", "counter", "Steps of finished requests.", [(m, self.request_steps)])
            family(out, "specgraft_request_tokens_total", "counter", "Tokens of finished requests (bonus tokens included).", [(m, self.request_tokens)])
            family(out, "specgraft_mean_accepted_tokens_per_step", "gauge", "MAT of finished requests: tokens per step, bonus token included.",
                   [(m, self.request_tokens / self.request_steps if self.request_steps else 0.0)])
            sources = sorted(self.proposed)
            family(out, "specgraft_proposed_nodes_total", "counter", "Tree nodes proposed, by source (finished requests).",
                   [(m | {"source": s}, self.proposed[s]) for s in sources])
            family(out, "specgraft_accepted_nodes_total", "counter", "Tree nodes accepted, by source (finished requests).",
                   [(m | {"source": s}, self.accepted[s]) for s in sources])
            family(out, "specgraft_mean_accepted_tokens_per_step_by_source", "gauge",
                   "Nodes of each source accepted per step of finished requests (bonus token not included).",
                   [(m | {"source": s}, self.accepted[s] / self.request_steps if self.request_steps else 0.0) for s in sources])
            family(out, "specgraft_acceptance_rate", "gauge", "Accepted / proposed nodes, by source (finished requests).",
                   [(m | {"source": s}, self.accepted[s] / self.proposed[s] if self.proposed[s] else 0.0) for s in sources])
        return "\n".join(out) + "\n"


def family(out: list[str], name: str, kind: str, help: str, samples: list[tuple[dict[str, str], float]]) -> None:
    out += [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
    out += [f"{name}{_labels(labels)} {_number(value)}" for labels, value in samples]


def histogram(h: Histogram, name: str, help: str) -> list[str]:
    return [f"# HELP {name} {help}", f"# TYPE {name} histogram"] + h.lines(name)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{_escape(v)}"' for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    """Integers without a decimal point, floats as Python's repr (Prometheus parses both).

    >>> _number(3), _number(2.5), _number(0.1)
    ('3', '2.5', '0.1')
    """
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 2**53):
        return str(int(value))
    return repr(float(value))


def parse(text: str) -> dict[str, float]:
    """Samples of an exposition text by ``name{labels}`` (tests and the load test read it).

    >>> parse('# TYPE a counter\\na_total{x="1"} 3\\nb 2.5\\n')
    {'a_total{x="1"}': 3.0, 'b': 2.5}
    """
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples
