"""``specgraft bench-serve``: throughput and latency of batched generation at several batch sizes.

For each batch size ``B`` and method, every prompt of the suite (first turns) is generated with
at most ``B`` in flight (continuous batching: a finished request's place goes to the next
prompt), all submitted at once; the row records tokens/s over the whole set, per-request
latency (submit to last token: queueing included, as a server's client sees it), the budget the
:class:`~specgraft.batch.AdaptiveBudget` used at ``B`` and its predicted tokens/s beside the
tokens/s of the steps run with ``B`` in flight (no prefills: what the prediction covers), memory (RSS,
the KV caches' bytes), and whether every output equals single-sequence ``ar`` token for token.
``hf`` is Hugging Face ``generate`` on left-padded batches of ``B`` prompts (greedy, the same
lengths), the peer a user would reach for; its outputs are compared too (padding changes
numerics, so a divergence there is the peer's, not ours).

By default every generation runs ``max_new_tokens`` tokens (EOS is an ordinary token), so every
method and batch size does the same work. With ``stop_on_eos`` a request ends at its EOS, as a
server's would: on suites whose answers are short (``rag-cite``: ~23 tokens) the fixed length
measures mostly what a model writes after its answer (an invented exchange that repeats itself,
easy to copy), which flatters retrieval; with EOS every method still does the same work (its
outputs equal ``ar``'s), requests just end at different times and free their places sooner.
Speed is a ratio against batched ``ar`` at the same ``B`` in the same run, in one of two ways:

- ``rounds = 1``: one pass per method; with ``bracket`` (the default) ``ar`` runs again after
  the others at each batch size (row ``ar-end``) and the ratios are against the mean of the two
  passes, as ``bench`` brackets its baselines; the log says how far the two passes drifted apart.
- ``rounds = R >= 2``: every method (``hf`` included) runs ``R`` passes at each batch size, in
  the order given in odd rounds and reversed in even ones (``ar, pld, hf | hf, pld, ar | ...``),
  so a drift that is linear over two rounds costs every method the same. A row sums its passes
  (tokens/s = all tokens over all passes' time; ``passes_s`` keeps each pass's time) and its
  ratio is ``ar``'s summed time over its own; the log adds each round's ratio and their median.
  On a 2-core CPU whose speed wanders 8-12% over one pass set, this is what shows a few percent.

On a GPU every batch size starts with an untimed **warm-up**: ``ar`` (and ``hf``) over the
first ``B`` prompts for :data:`WARMUP_TOKENS` tokens, so the first timed pass at a new ``B``
does not pay what its repeats do not (new kernel shapes, the allocator growing to the batch's
KV cache). On an H100 the first ``ar`` pass at ``B = 16`` ran at 203.6 tokens/s and its
``ar-end`` at 368.1 without it (``benchmarks/RESULTS.md``, *On a GPU again*). The policies are
not warmed: what they learn is part of what a row measures. ``warmup=False`` skips it; on a
CPU it is off by default (a prefill of ``B`` long prompts costs seconds there, and the drift
seen on CPUs is the machine's, not a first pass's).

For example, ``rounds = 2`` with ``ar`` and ``pld`` at ``B = 4`` runs ``ar, pld, pld, ar``; if
those took 70, 66, 68 and 72 s, ``pld``'s ratio is (70 + 72) / (66 + 68) = 1.060x and its
rounds' ratios 1.061x and 1.059x.

Each method keeps **one** :class:`~specgraft.batch.AdaptiveBudget` for the whole run (batch
sizes in the order given), as a server keeps one policy while its load changes: its warm-up
happens once, at the first batch size, and what it learned there carries over. It starts
from the method's measured gains (:meth:`~specgraft.batch.AdaptiveBudget.for_method`; the
generic prior for a method without them). The row counts the steps in which one sequence
probed (warm-up and exploration, ``probe_steps``).
"""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from specgraft.api import SpecDecoder
from specgraft.budget.adaptive import AdaptiveBudget
from specgraft.bench.contract import until_eos
from specgraft.budget.costs import CostTable
from specgraft.budget.policy import BudgetPolicy
from specgraft.models.device import attention_backends
from specgraft.types import GenerationStats


@dataclass
class BatchRow:
    method: str
    batch: int
    prompts: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    latency_p50_s: float
    latency_max_s: float
    mat: float
    exact: bool
    """Every output equals single-sequence ``ar``'s (in every pass)."""
    equal: int = 0
    """Outputs equal to single-sequence ``ar``'s, of ``prompts`` x passes (llama.cpp's default mode
    can part at a near-tie: a cell reused or a batch of another size adds in another order)."""
    budget: int | None = None
    predicted_tokens_per_s: float | None = None
    rss_mb: float = 0.0
    kv_mb: float = 0.0
    ratio_vs_ar: float | None = None
    commit_share: float = 0.0
    """Share of the wall time spent committing accepted rows in the KV caches (target's, from
    every request's stats; the cache is compacted at every commit)."""
    acceptance_by_source: dict[str, float] = field(default_factory=dict)
    probe_steps: int = 0
    """Steps in which one sequence drafted while the rest decoded plainly (the policy's warm-up
    and exploration)."""
    plain_starts: int = 0
    """Requests started without their drafters' optional prefill work although it has a cost
    (Token Recycling's prompt top-k: ``BatchStepStats.plain_starts``), over every pass."""
    passes_s: list[float] = field(default_factory=list)
    """Wall time of each pass the row sums (one per round), in the order run."""
    decode_tokens_per_s: float | None = None
    """Tokens/s of the steps run with exactly ``batch`` sequences in flight, admissions (prefills)
    and catch-ups left out: what ``predicted_tokens_per_s`` predicts (``tokens_per_s`` includes
    every prefill, most of a 32-token request's time)."""
    padding_share: float = 0.0
    """Share of the target's rows in the steps that were padding (trees padded to the batch's
    largest: ``BatchStepStats.padding_share``), over every pass."""


def rss_mb() -> float:
    """Resident memory of this process now (``VmRSS``), MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def kv_mb(*adapters: Any) -> float:
    """Bytes held by the slot caches' key and value buffers, MB (a llama.cpp model's: its
    context's KV cache as ``kv_bytes`` estimates it)."""
    total = 0
    for a in adapters:
        total += getattr(a, "kv_bytes", 0)
        for layer in getattr(getattr(a, "cache", None), "layers", []):
            for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
                if t is not None:
                    total += t.numel() * t.element_size()
    return total / 2**20


@dataclass
class BatchedRun:
    """Every prompt generated through one :class:`~specgraft.batch.BatchEngine`."""

    outputs: list[list[int]]
    latencies_s: list[float]
    wall_s: float
    stats: list[GenerationStats]
    budget_by_batch: dict[int, int]
    probe_steps: int = 0
    decode_by_batch: dict[int, list[float]] = field(default_factory=dict)
    """``BatchStepStats.decode_by_batch`` of the run."""
    plain_starts: int = 0
    rows: tuple[int, int] = (0, 0)
    """``BatchStepStats.rows_fed`` and ``rows_used`` of the run."""


def run_batched(decoder, prompts: Sequence[list[int]], config, max_batch: int, policy) -> BatchedRun:
    """Generate every prompt with at most ``max_batch`` in flight, all submitted at once."""
    batch = decoder.batch_engine(max_batch=max_batch, policy=policy)
    t0 = time.perf_counter()
    ids = [batch.submit(p, config) for p in prompts]
    results, latency = {}, {}
    tokens: dict[str, list[int]] = {}
    stats = []
    for ev in batch.events():
        tokens.setdefault(ev.request_id, []).extend(ev.tokens)
        if ev.finished:
            if ev.error:
                raise RuntimeError(f"request {ev.request_id} failed: {ev.error}")
            latency[ev.request_id] = time.perf_counter() - t0
            results[ev.request_id] = tokens.pop(ev.request_id)
            stats.append(ev.stats)
    return BatchedRun(
        [results[i] for i in ids], [latency[i] for i in ids], time.perf_counter() - t0, stats, dict(batch.stats.budget_by_batch),
        batch.stats.probe_steps, dict(batch.stats.decode_by_batch), batch.stats.plain_starts, (batch.stats.rows_fed, batch.stats.rows_used),
    )


def hf_padded(
    model, prompts: Sequence[list[int]], max_new_tokens: int, batch: int, pad_id: int, eos_ids: Sequence[int] = ()
) -> BatchedRun:
    """Hugging Face ``generate`` on left-padded batches of ``batch`` prompts (greedy), with our
    forwards' SDPA backends (``attention_backends``: no cuDNN attention on a GPU). ``eos_ids``:
    a sequence stops at the first of them (kept, the padding after it dropped; the batch runs
    until its last sequence stops); none: every sequence runs ``max_new_tokens``."""
    outs: list[list[int]] = []
    lat: list[float] = []
    t0 = time.perf_counter()
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        width = max(len(p) for p in group)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in group], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group], device=model.device)
        with torch.inference_mode(), attention_backends(model.device):
            out = model.generate(
                ids, attention_mask=mask, max_new_tokens=max_new_tokens, min_new_tokens=0 if eos_ids else max_new_tokens,
                do_sample=False, eos_token_id=list(eos_ids) or None, pad_token_id=pad_id,
            )
        outs += [until_eos(row, eos_ids) for row in out[:, width:].tolist()]
        lat += [time.perf_counter() - t0] * len(group)
    return BatchedRun(outs, lat, time.perf_counter() - t0, [], {})


#: Tokens of each warm-up generation (module docstring).
WARMUP_TOKENS = 4


def resolve_warmup(warmup: bool | None, device: torch.device) -> bool:
    """Whether :func:`bench_batches` warms each batch size up: ``warmup``, or by default on a GPU.

    >>> resolve_warmup(None, torch.device("cpu")), resolve_warmup(None, torch.device("cuda")), resolve_warmup(True, torch.device("cpu"))
    (False, True, True)
    """
    return device.type == "cuda" if warmup is None else warmup


def bench_batches(
    decoders: dict[str, Any],
    prompts: Sequence[list[int]],
    batch_sizes: Sequence[int],
    max_new_tokens: int,
    costs: CostTable | None,
    hf: bool = True,
    log: Callable[[str], None] = print,
    bracket: bool = True,
    rounds: int = 1,
    warmup: bool | None = None,
    stop_on_eos: bool = False,
    tuned: Mapping[str, BudgetPolicy] | None = None,
) -> list[BatchRow]:
    """Every method in ``decoders`` (``ar`` first) at every batch size; see the module docstring.
    ``warmup``: an untimed plain pass per batch size first (None: on a GPU only); ``stop_on_eos``:
    requests end at their EOS (the module docstring); ``tuned``: a method's policy chosen
    offline (READER's budgets per batch size from ``specgraft tune``) in place of the adaptive one."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    ar = decoders["ar"]
    config = SpecDecoder.make_config(max_new_tokens=max_new_tokens, stop_on_eos=stop_on_eos)
    eos = sorted(ar.engine.eos_token_ids) if stop_on_eos else []
    log(f"reference: single-sequence ar on {len(prompts)} prompts")
    reference = [ar.generate(p, config=config).tokens for p in prompts]
    rows: list[BatchRow] = []
    # one policy per method for the whole run, as a server keeps one (module docstring), each
    # starting from its method's measured gains where there are some
    tuned = dict(tuned or {})
    policies = {
        name: AdaptiveBudget.for_method(costs, name, decoders[name].spec.gains_from)
        for name in decoders if costs is not None and name != "ar" and name not in tuned
    }
    for name, policy in policies.items():
        log(f"{name}: adaptive budget, prior from {policy.prior}")
    for name, fixed in tuned.items():
        log(f"{name}: budgets tuned per batch size, {fixed}")
    names = list(decoders) + (["hf"] if hf else [])
    pad = (ar.engine.eos_token_ids and min(ar.engine.eos_token_ids)) or 0

    def one_pass(name: str, b: int) -> BatchedRun:
        if name == "hf":
            return hf_padded(ar.model, prompts, max_new_tokens, b, pad, eos)
        return run_batched(decoders[name], prompts, decoders[name].resolve(config), b, tuned.get(name) or policies.get(name))

    warmup = resolve_warmup(warmup, ar.target.device)
    for b in batch_sizes:
        if warmup:
            short = ar.resolve(SpecDecoder.make_config(max_new_tokens=WARMUP_TOKENS, stop_on_eos=False))
            run_batched(ar, prompts[:b], short, b, None)
            if hf:
                hf_padded(ar.model, prompts[:b], WARMUP_TOKENS, b, pad)
            log(f"B={b} warm-up (not timed): ar{' and hf' if hf else ''}, {min(b, len(prompts))} prompts x {WARMUP_TOKENS} tokens")
        runs: dict[str, list[BatchedRun]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                runs[name].append(one_pass(name, b))
                log(f"B={b} round {r + 1}/{rounds} {name:<12} {runs[name][-1].wall_s:7.1f} s")
        if bracket and rounds == 1:
            names_b, runs["ar-end"] = names + ["ar-end"], [one_pass("ar", b)]
            log(f"B={b} ar-end {runs['ar-end'][0].wall_s:7.1f} s")
        else:
            names_b = names
        first = len(rows)
        for name in names_b:
            dec = ar if name in ("hf", "ar-end") else decoders[name]
            # a tuned policy predicts nothing at run time: its prediction is the tune file's
            rows.append(_method_row(name, dec, runs[name], b, policies.get(name), reference, None if name in tuned else costs))
        _ratios(rows[first:], log)
    return rows


def _method_row(
    name: str, dec, runs: Sequence[BatchedRun], batch: int, policy: AdaptiveBudget | None, reference, costs: CostTable | None,
) -> BatchRow:
    """One method's passes over every prompt at batch size ``batch``, summed (ratio filled in by :func:`_ratios`)."""
    total = sum(len(o) for run in runs for o in run.outputs)
    wall = sum(run.wall_s for run in runs)
    lat = [x for run in runs for x in run.latencies_s]
    row = BatchRow(
        method=name, batch=batch, prompts=len(reference), tokens=total, wall_s=wall, tokens_per_s=total / wall,
        latency_p50_s=statistics.median(lat), latency_max_s=max(lat), mat=1.0, exact=all(run.outputs == reference for run in runs),
        equal=sum(o == ref for run in runs for o, ref in zip(run.outputs, reference, strict=True)),
        rss_mb=rss_mb(), passes_s=[run.wall_s for run in runs],
    )
    if name == "hf":  # the peer: outputs compared, no stats of ours
        return row
    stats = [s for run in runs for s in run.stats]
    steps = sum(s.steps for s in stats)
    proposed = sum((s.proposed_by_source for s in stats), Counter())
    accepted = sum((s.accepted_by_source for s in stats), Counter())
    row.budget = 0 if name in ("ar", "ar-end") else runs[-1].budget_by_batch.get(batch)
    row.predicted_tokens_per_s = _predicted(costs, policy, batch, row.budget)
    decoded = [run.decode_by_batch[batch] for run in runs if batch in run.decode_by_batch]
    decode_s = sum(d[1] for d in decoded)
    row.decode_tokens_per_s = sum(d[0] for d in decoded) / decode_s if decode_s > 0 else None
    row.mat = total / steps if steps else 0.0
    row.kv_mb = kv_mb(dec.target, *(getattr(d, "lm", None) for d in dec.engine.drafters))
    row.acceptance_by_source = {k: accepted[k] / v for k, v in proposed.items() if v}
    row.commit_share = sum(s.commit_s for s in stats) / wall
    row.probe_steps = sum(run.probe_steps for run in runs)
    row.plain_starts = sum(run.plain_starts for run in runs)
    fed = sum(run.rows[0] for run in runs)
    row.padding_share = 1.0 - sum(run.rows[1] for run in runs) / fed if fed else 0.0
    return row


def _ratios(rows: list[BatchRow], log: Callable[[str], None]) -> None:
    """Every row's ratio against batched ``ar`` at its batch size, logged with its line.

    Against ``ar``'s summed time when the rows hold several alternating rounds (each round's
    ratio and their median logged too); against the mean of the two ``ar`` passes (first and
    ``ar-end``, in total time for the same tokens) when a one-round run is bracketed, so the
    machine's drift between them is shared out rather than charged to the methods that ran last
    (the log gives the drift)."""
    ar = next(r for r in rows if r.method == "ar")
    end = next((r for r in rows if r.method == "ar-end"), None)
    ar_tps = ar.tokens / ((ar.wall_s + end.wall_s) / 2) if end is not None else ar.tokens_per_s
    for r in rows:
        r.ratio_vs_ar = r.tokens_per_s / ar_tps
        log(_line(r))
    others = [r for r in rows if r.method not in ("ar", "ar-end")]
    if len(ar.passes_s) > 1:
        for r in others:
            per_round = [a / m for a, m in zip(ar.passes_s, r.passes_s)]
            log(
                f"B={ar.batch} {r.method}: {r.ratio_vs_ar:.3f}x ar over {len(per_round)} alternating rounds "
                f"(rounds {', '.join(f'{x:.3f}' for x in per_round)}; median {statistics.median(per_round):.3f})"
            )
    elif end is not None:
        log(
            f"B={ar.batch} bracketed by ar and ar-end (drift {end.tokens_per_s / ar.tokens_per_s:.3f}): "
            + ", ".join(f"{r.method} {r.ratio_vs_ar:.3f}x" for r in others)
        )


def _predicted(costs: CostTable | None, policy: AdaptiveBudget | None, batch: int, budget: int | None) -> float | None:
    """The policy's prediction at the budget it used (its acceptance as learned by the end of the
    run); plain decoding (``ar``): ``B / T(B, 1)``."""
    if costs is None:
        return None
    if policy is None or budget is None:
        return batch / costs.cost(batch, 1)
    return policy.predicted(batch, budget)


def _equal(r: BatchRow) -> str:
    """``r``'s outputs equal to single-sequence ``ar``'s, of all it made (HF's padded batches are
    compared too)."""
    return f"{r.equal}/{r.prompts * len(r.passes_s)}"


def _line(r: BatchRow) -> str:
    pred = f", predicted {r.predicted_tokens_per_s:.2f}" if r.predicted_tokens_per_s else ""
    if r.decode_tokens_per_s:
        pred += f" (decoding at B={r.batch}: {r.decode_tokens_per_s:.2f})"
    return (
        f"B={r.batch} {r.method:<12} {r.tokens_per_s:6.2f} tok/s ({r.ratio_vs_ar or 0:.2f}x ar){pred}, budget {r.budget}, "
        f"MAT {r.mat:.2f}, padding rows {100 * r.padding_share:.0f}%, p50 latency {r.latency_p50_s:.1f} s, equal {_equal(r)}, RSS {r.rss_mb:.0f} MB, KV {r.kv_mb:.0f} MB, "
        f"commit {100 * r.commit_share:.1f}%, probe steps {r.probe_steps}"
        + (f", plain starts {r.plain_starts}" if r.plain_starts else "")
    )


def write_rows(rows: Sequence[BatchRow], out: str | Path, meta: dict) -> Path:
    """``results.jsonl``, ``run.json`` and ``report.md`` (a table per batch size) in ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.jsonl").write_text("".join(json.dumps(asdict(r)) + "\n" for r in rows))
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    length = f"up to {meta['max_new_tokens']} tokens, ending at EOS" if meta.get("stop_on_eos") else f"{meta['max_new_tokens']} tokens each, EOS ignored"
    lines = [
        f"{meta.get('prompts', '?')} prompts, {length}.",
        "",
        "| B | method | tok/s | x ar | passes s | predicted tok/s | decode tok/s at B | budget | probe steps | MAT | padding rows | p50 latency s | equal to ar | RSS MB | KV MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pred = f"{r.predicted_tokens_per_s:.2f}" if r.predicted_tokens_per_s else ""
        lines.append(
            f"| {r.batch} | {r.method} | {r.tokens_per_s:.2f} | {r.ratio_vs_ar or 0:.3f} | {', '.join(f'{x:.1f}' for x in r.passes_s)} | {pred} | {f'{r.decode_tokens_per_s:.2f}' if r.decode_tokens_per_s else ''} | {r.budget if r.budget is not None else ''} | {r.probe_steps} | "
            f"{r.mat:.2f} | {100 * r.padding_share:.0f}% | {r.latency_p50_s:.1f} | {_equal(r)} | {r.rss_mb:.0f} | {r.kv_mb:.0f} |"
        )
    (out / "report.md").write_text("\n".join(lines) + "\n")
    return out / "report.md"
