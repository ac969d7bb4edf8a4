"""What a method's steps would cost on a GPU: real models' step traces priced with a GPU's costs.

No weights can be downloaded on the lent GPU machines, so their random-weight models show what a
forward costs but never what a real model accepts. This script joins the two halves:

1. ``trace`` steps the engine itself (one process, one model load, variants in an order that
   alternates from prompt to prompt) and writes, per prompt and variant, every step's verified
   rows, emitted tokens, target forward time, the draft model's forwards (rows and time), the
   engine's drafting, verify, commit and observe times and the step's wall time, plus the start
   (prefill); ``--profile FILE`` adds a cProfile of some variants' steps (where host work goes).
   On the CPU with the real models this is the deterministic part (rows and tokens per step).
   On the GPU it gives each method's host work
   per step (the step's wall time less its forwards); with ``--force`` (a CPU trace) the random
   target's logits are peaked on the recorded tokens (:func:`force_logits`), so it emits the
   real text and the drafters see real anchors and matches (prompt lookup's steps then equal
   the CPU's exactly; methods that read the target's hidden states or distributions draft
   from a random model's).
2. ``replay`` feeds a CPU trace's forwards again on this device (row counts and kept rows in
   order, random token ids): the device time of exactly those forwards, graph warm-ups
   included, with the CUDA graphs' rows padded or not.
3. ``project`` prices each CPU step: its replayed device time (per setting) or the cost table's
   steady-state price (``specgraft profile`` at B = 1, moved to the step's key length by a GPU
   trace's one-row steps), plus the host model (:func:`host_model`). Speedup = ``ar``'s projected
   time over the variant's, summed by task.

What it leaves out: a GPU runs bf16, where a real model's greedy trajectory can differ from
fp32's (the steps priced are fp32's); host work measured on random or forced text may differ
from a real model's (a forced target's distributions are peaked; a random draft's trees are
small, hence the per-draft-forward term).

Usage (the issue 13 subsets; ``replay`` and the GPU ``trace`` run on a lent machine with the
random models of ``random_models.py``; ``experiments/gpu/gpu-projection/gpu_run*.sh`` did it)::

    python benchmarks/tools/project_gpu.py trace --suite benchmarks/experiments/adapld-reader/suites/input_guided.jsonl,code-edit:4 \\
        --variants ar,pld,adapld,adapld-full --out cpu-adapld.jsonl
    python benchmarks/tools/project_gpu.py trace --model /tmp/rm/qwen2.5-coder-1.5b-instruct --device cuda --dtype bfloat16 \\
        --force cpu-adapld.jsonl --suite ... --variants ar,pld,adapld,adapld-full --out gpu-adapld.jsonl
    python benchmarks/tools/project_gpu.py replay --trace cpu-adapld.jsonl --model /tmp/rm/qwen2.5-coder-1.5b-instruct --out replay.jsonl
    python benchmarks/tools/project_gpu.py project --cpu cpu-adapld.jsonl --gpu gpu-adapld.jsonl --replay replay.jsonl \\
        --target-costs qwen2.5-coder-1.5b-instruct-cuda.json --context-trace gpu-adapld.jsonl

A variant is ``METHOD[:key=value...]`` (``NAME=METHOD...`` names it): ``budget=N``, ``preset=P``
(draft-model methods), else a field of the method's config (``PLDConfig``, ``AdaPLDConfig``,
``ReaderConfig``); values are numbers or names (``min_prob=0.02``, ``d_search=16``, ``preset=gpu``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/, for tools/
from tools.alternate import alternate  # noqa: E402


# -- trace -----------------------------------------------------------------------------------


def parse_variant(text: str) -> tuple[str, str, dict, int | None]:
    """``"g=adapld:min_prob=0.02:budget=64"`` -> ``("g", "adapld", {"min_prob": 0.02}, 64)``: an
    optional ``NAME=`` before ``tools.common.parse_variant``'s ``METHOD[:key=value...]``
    (unnamed, the variant is named by its text)."""
    from tools.common import parse_variant as parse_method

    name, eq, spec = text.partition("=")
    if not eq or ":" in name:
        name, spec = text, text
    method, fields, budget = parse_method(spec)
    return name, method, fields, budget


def variant_decoder(base, method: str, fields: dict, datastores: tuple[str, ...]):
    """The decoder of one variant over ``base``'s loaded target and draft model."""
    from specgraft.methods.model_free import ADAPLD_METHODS
    from specgraft.methods.reader import READER_METHODS

    options = dataclasses.replace(base.options, datastores=datastores if method in READER_METHODS else ())
    fields = dict(fields)
    if "preset" in fields:
        options = dataclasses.replace(options, graft=dataclasses.replace(options.graft, preset=fields.pop("preset")))
    if fields:
        if method == "pld":
            options = dataclasses.replace(options, pld=dataclasses.replace(options.pld, **fields))
        elif method in ADAPLD_METHODS:
            options = dataclasses.replace(options, adapld=dataclasses.replace(options.adapld, **fields))
        elif method in READER_METHODS:
            options = dataclasses.replace(options, reader=dataclasses.replace(options.reader, **fields))
        else:
            raise SystemExit(f"{method}: only pld, the AdaPLD and the READER methods take config fields here")
    return base.with_method(method, options)


class ForwardLog:
    """Every model forward (target and draft) while installed: ``(is_target, rows, seconds)``,
    timed between device synchronisations."""

    def __init__(self, target) -> None:
        from specgraft.models.hf import HFTarget

        self.target, self.calls = target, []
        # (truth, k): force the target's logits onto the recorded tokens (:func:`force_logits`)
        self.force: tuple[list[int], int] | None = None
        self.force_s = 0.0  # time spent forcing, left out of the step's wall time
        self._cls = HFTarget
        self._orig = {name: getattr(HFTarget, name) for name in ("forward_batch", "prefill")}

    def __enter__(self):
        from specgraft.models.base import synchronize

        log = self

        def wrap(name, rows_of):
            orig = self._orig[name]

            def timed(model, *args, **kw):
                synchronize(model.device)
                t0 = time.perf_counter()
                out = orig(model, *args, **kw)
                synchronize(model.device)
                log.calls.append((model is log.target, rows_of(args, kw), time.perf_counter() - t0))
                if name == "forward_batch" and model is log.target and log.force is not None:
                    t1 = time.perf_counter()
                    start = (kw.get("logits_from") or (args[5] if len(args) > 5 else None) or [0])[0]
                    force_logits(out[0].logits, args[1][0], args[2][0], start, *log.force)
                    log.force_s += time.perf_counter() - t1
                return out

            return timed

        self._cls.forward_batch = wrap("forward_batch", lambda a, kw: max(len(t) for t in (a[1] if len(a) > 1 else kw["tokens"])))
        self._cls.prefill = wrap("prefill", lambda a, kw: len(a[1] if len(a) > 1 else kw["tokens"]))
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in self._orig.items():
            setattr(self._cls, name, fn)

    def take(self) -> list:
        calls, self.calls = self.calls, []
        return calls


def force_logits(logits, tokens, parents, start: int, truth: list[int], k: int) -> None:
    """Make greedy verification accept what the real model accepted: each row from ``start``
    (the root) whose path from the root spells the recorded continuation ``truth[k:]`` gets
    logits peaked on the recorded next token; other rows keep theirs (a random model's, which
    no recorded token follows). A random-weight model then emits the recorded tokens, so the
    drafters see the real text (their anchors, matches and tree sizes) while every forward
    costs what it costs on this device. ``logits``: ``[n - start, V]``, changed in place."""
    toks = [int(t) for t in tokens]
    pars = [int(p) for p in parents]
    depth: dict[int, int] = {start: 0}
    match: dict[int, bool] = {start: True}
    for i in range(start + 1, len(toks)):
        p = pars[i]
        if p not in depth:  # hangs from an older pending row: not a path from this root
            continue
        d = depth[i] = depth[p] + 1
        match[i] = match[p] and k + d - 1 < len(truth) and toks[i] == truth[k + d - 1]
    import torch

    with torch.inference_mode():  # the logits are inference tensors
        _peak(logits, depth, match, start, truth, k)


def _peak(logits, depth: dict[int, int], match: dict[int, bool], start: int, truth: list[int], k: int) -> None:
    for i, d in depth.items():
        if match.get(i) and k + d < len(truth):
            row = logits[i - start]
            row.fill_(-30.0)
            row[truth[k + d]] = 30.0


def trace(args) -> None:
    import torch

    from specgraft.api import SpecDecoder
    from specgraft.suites import conversation_ids
    from specgraft.config import GenerationConfig
    from specgraft.machine import cpu_model
    from specgraft.methods import GraftOptions, MethodOptions, get_method
    from specgraft.suites import load_suite

    torch.set_num_threads(args.threads)
    variants = [parse_variant(v) for v in args.variants.split(",")]
    needs_draft = any(get_method(m).needs_draft_model for _, m, _, _ in variants)
    graft = GraftOptions(draft_model=args.draft_model, draft_dtype=args.dtype) if needs_draft else GraftOptions()
    base = SpecDecoder.from_pretrained(args.model, method="ar", dtype=args.dtype, device=args.device, progress=False,
                                       options=MethodOptions(graft=graft))
    if needs_draft:
        base = base.with_method("draft-tree")
    decoders = {name: variant_decoder(base, method, fields, tuple(args.datastore)) for name, method, fields, _ in variants}
    budgets = {name: budget if budget is not None else decoders[name].default_budget for name, _, _, budget in variants}
    suite = load_suite(args.suite)
    truths = {}
    if args.force:
        truths = {r["prompt"]: r["tokens"] for r in map(json.loads, open(args.force)) if r["method"] == "ar"}
    device = str(base.target.device)
    where = torch.cuda.get_device_name() if device.startswith("cuda") else cpu_model()
    out = open(args.out, "a" if args.resume else "w")
    done = set()
    if args.resume and Path(args.out).exists():
        done = {(r["prompt"], r["variant"]) for r in map(json.loads, open(args.out))}
    if device.startswith("cuda"):
        # untimed: the process's first forwards (CUDA and cuBLAS set-up), and each variant's own
        # first graph captures (a drafter that reads hidden states replays other graphs than
        # prompt lookup's; untimed here, the first variant to need them would pay for them)
        first = suite.prompts[0]
        first_ids = conversation_ids(base.tokenizer, first.turns[:1], [], first.chat)
        for name, *_ in variants:
            decoders[name].engine.generate_ids(first_ids, GenerationConfig(max_new_tokens=16, budget=budgets[name]))
    profiler = None
    if args.profile:  # cProfile of the steps of --profile-variants (host work: where it goes)
        import cProfile

        profiler = cProfile.Profile()
    with ForwardLog(base.target) as log:
        for i, prompt in enumerate(suite.prompts):
            ids = conversation_ids(base.tokenizer, prompt.turns[:1], [], prompt.chat)
            order = alternate(variants, i)
            for name, method, _, _ in order:
                if (prompt.id, name) in done:
                    continue
                engine = decoders[name].engine
                log.take()
                truth = truths.get(prompt.id)
                if args.force and truth is None:
                    raise SystemExit(f"{prompt.id}: no ar record in {args.force}")
                max_new = min(args.max_new_tokens, len(truth)) if truth else args.max_new_tokens
                t0 = time.perf_counter()
                seq = engine.start(ids, GenerationConfig(max_new_tokens=max_new, budget=budgets[name]))
                start_s = time.perf_counter() - t0
                start_calls = log.take()
                steps = []
                while not seq.done:
                    before = len(seq.new_tokens)
                    log.force = (truth, before) if truth else None
                    log.force_s = 0.0
                    host = (seq.stats.verify_s, seq.stats.commit_s, seq.stats.observe_s)
                    if profiler is not None and name in args.profile_variants.split(","):
                        profiler.enable()
                    t1 = time.perf_counter()
                    engine.step(seq)
                    wall = time.perf_counter() - t1 - log.force_s
                    if profiler is not None:
                        profiler.disable()
                    calls = log.take()
                    target = [(r, s) for is_t, r, s in calls if is_t]
                    draft = [(r, s) for is_t, r, s in calls if not is_t]
                    steps.append({
                        "rows": seq.last_forward.rows if seq.last_forward is not None else 0,
                        "emitted": len(seq.new_tokens) - before,
                        "target_s": round(sum(s for _, s in target), 6),
                        "target_rows": [r for r, _ in target],
                        "draft_rows": [r for r, _ in draft],
                        "draft_s": round(sum(s for _, s in draft), 6),
                        "drafting_s": round(seq.last_draft_s, 6),
                        "verify_s": round(seq.stats.verify_s - host[0], 6),
                        "commit_s": round(seq.stats.commit_s - host[1], 6),
                        "observe_s": round(seq.stats.observe_s - host[2], 6),
                        "wall_s": round(wall, 6),
                    })
                log.force = None
                engine.finish(seq)
                if truth and list(seq.new_tokens) != truth[: len(seq.new_tokens)]:
                    raise SystemExit(f"{prompt.id} {name}: the forced run left the recorded tokens")
                record = {
                    "prompt": prompt.id, "task": prompt.task, "variant": name, "method": method, "budget": budgets[name],
                    "device": device, "where": where, "dtype": args.dtype, "model": args.model,
                    "prompt_tokens": len(ids), "new_tokens": len(seq.new_tokens), "tokens": list(seq.new_tokens),
                    "start_s": round(start_s, 6), "start_rows": [(is_t, r) for is_t, r, _ in start_calls],
                    "steps": steps, "wall_s": round(start_s + sum(s["wall_s"] for s in steps), 6),
                }
                out.write(json.dumps(record) + "\n")
                out.flush()
                print(f"{prompt.id:18s} {name:24s} b{budgets[name]:<3d} steps {len(steps):4d} "
                      f"MAT {len(seq.new_tokens) / max(len(steps), 1):5.2f} wall {record['wall_s']:7.2f} s", flush=True)
    if profiler is not None:
        import pstats

        with open(args.profile, "w") as f:
            pstats.Stats(profiler, stream=f).sort_stats("tottime").print_stats(40)
            pstats.Stats(profiler, stream=f).sort_stats("cumulative").print_stats(40)


# -- replay ----------------------------------------------------------------------------------


def replay_record(target, draft, record: dict, generator) -> tuple[float, float]:
    """Device seconds ``(start, steps)`` of ``record``'s forwards fed again with its row counts
    (random token ids): the start's prefills, then per step the draft model's forwards (chains
    on its own slot, dropped at the step's end but for the first forward's first ``emitted``
    rows) and the target's (a chain; the first ``emitted`` rows kept, plus a prompt fed in the
    first step)."""
    import torch

    from specgraft.models.base import synchronize

    vocab = target.vocab_size

    def rand(n: int) -> list[int]:
        return torch.randint(0, vocab, (n,), generator=generator).tolist()

    slot = target.allocate()
    dslot = draft.allocate() if draft is not None else None
    try:
        synchronize(target.device)
        t0 = time.perf_counter()
        prefilled = False
        for is_target, rows in record["start_rows"]:
            model, s = (target, slot) if is_target else (draft, dslot)
            model.prefill(s, rand(rows))
            prefilled |= bool(is_target)
        synchronize(target.device)
        start = time.perf_counter() - t0
        fused = 0 if prefilled else record["prompt_tokens"] - 1  # a short prompt rides in the first step
        t0 = time.perf_counter()
        for step in record["steps"]:
            for i, rows in enumerate(step["draft_rows"]):
                draft.forward_rows(dslot, rand(rows), list(range(-1, rows - 1)))
                if i == 0:
                    first = rows
            if step["draft_rows"]:
                draft.commit(dslot, list(range(min(first, step["emitted"]))))
            for rows in step["target_rows"]:
                target.forward_rows(slot, rand(rows), list(range(-1, rows - 1)))
                target.commit(slot, list(range(min(rows, fused + step["emitted"]))))
                fused = 0
        synchronize(target.device)
        return start, time.perf_counter() - t0
    finally:
        target.release(slot)
        if draft is not None:
            draft.release(dslot)


def replay(args) -> None:
    """Feed a CPU trace's forwards (row counts, in order) to the models of ``--model`` and
    ``--draft-model`` on this device, with the CUDA graphs' rows padded or not. Each variant's
    prompts run in one pass that starts with no graphs (a process serving them with that
    method); passes of the settings alternate. One JSONL line per record, setting and round."""
    import torch

    from specgraft.models.hf import HFTarget

    records = [json.loads(l) for f in args.trace for l in open(f)]
    records = [r for r in records if args.variants is None or r["variant"] in args.variants.split(",")]
    by_variant: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_variant[r["variant"]].append(r)
    target = HFTarget.from_pretrained(args.model, args.dtype, args.device)
    needs_draft = any(s["draft_rows"] for r in records for s in r["steps"])
    draft = HFTarget.from_pretrained(args.draft_model, args.dtype, args.device) if needs_draft else None
    models = [m for m in (target, draft) if m is not None and m.graphs is not None]
    generator = torch.Generator().manual_seed(0)
    settings = {"padded": True, "unpadded": False}
    order = args.settings.split(",")
    out = open(args.out, "w")
    replay_record(target, draft, records[0], generator)  # untimed: the process's first forwards (CUDA and cuBLAS set-up)
    for round_ in range(args.rounds):
        for name in alternate(order, round_):
            for variant, recs in by_variant.items():
                for m in models:
                    m.graphs.clear()  # each variant's pass starts cold, as a new process would
                    m.graphs.pad_rows = settings[name]
                    m.graphs.stats = type(m.graphs.stats)()
                t_pass = time.perf_counter()
                for r in recs:
                    start, steps = replay_record(target, draft, r, generator)
                    out.write(json.dumps({"prompt": r["prompt"], "task": r["task"], "variant": variant, "setting": name,
                                          "round": round_, "start_s": round(start, 6), "steps_s": round(steps, 6)}) + "\n")
                out.flush()
                stats = " / ".join(f"eager {g.stats.eager} captured {g.stats.captured} replayed {g.stats.replayed}" for g in (m.graphs for m in models))
                print(f"round {round_} {name:9s} {variant:22s} {time.perf_counter() - t_pass:6.2f} s  graphs {stats}", flush=True)


# -- project ---------------------------------------------------------------------------------


class RowCost:
    """Seconds of a B = 1 forward of ``rows`` new rows, from a ``specgraft profile`` table:
    linear between measured row counts, the last segment's slope past them.

    >>> c = RowCost({"1": 0.005, "8": 0.006, "16": 0.0068})
    >>> round(c(4), 6), round(c(32), 6)
    (0.005429, 0.0084)
    """

    def __init__(self, seconds: dict) -> None:
        self.points = sorted((int(r), float(s)) for r, s in seconds.items())

    @classmethod
    def load(cls, path: str) -> "RowCost":
        table = json.load(open(path))
        return cls(table["seconds"]["1"])

    def __call__(self, rows: int) -> float:
        pts = self.points
        if rows <= pts[0][0]:
            return pts[0][1]
        for (r0, s0), (r1, s1) in zip(pts, pts[1:]):
            if rows <= r1:
                return s0 + (s1 - s0) * (rows - r0) / (r1 - r0)
        (r0, s0), (r1, s1) = pts[-2], pts[-1]
        return s1 + (s1 - s0) * (rows - r1) / (r1 - r0)


def host_model(gpu: list[dict]) -> tuple[dict[str, float], float]:
    """Host seconds a step on the GPU: ``base[variant] + per_draft * draft forwards``, from the
    GPU trace's steps (wall less their forwards; the first step, which may carry the prompt, left
    out). ``per_draft`` (a drafter's work around each draft forward: top-k, tree bookkeeping,
    reads to the host) is the least-squares slope over every step that ran draft forwards; a
    random draft's trees are small, a real one's steps run ~10 draft forwards, so it matters."""
    points = [(len(s["draft_rows"]), s["wall_s"] - s["target_s"] - s["draft_s"]) for r in gpu for s in r["steps"][1:]]
    drafted = [(n, h) for n, h in points if n > 0]
    per_draft = 0.0
    if len({n for n, _ in drafted}) > 1:
        mx, my = statistics.fmean(n for n, _ in drafted), statistics.fmean(h for _, h in drafted)
        per_draft = sum((n - mx) * (h - my) for n, h in drafted) / sum((n - mx) ** 2 for n, _ in drafted)
    by_variant: dict[str, list[float]] = defaultdict(list)
    for r in gpu:
        by_variant[r["variant"]] += [s["wall_s"] - s["target_s"] - s["draft_s"] - per_draft * len(s["draft_rows"]) for s in r["steps"][1:]]
    return {v: statistics.median(xs) for v, xs in by_variant.items() if xs}, per_draft


def one_row_costs(trace: list[dict]) -> dict[int, float]:
    """Median seconds of a one-row target forward by key-length bucket (256 tokens), from a GPU
    trace's plain steps (its first steps, which may carry a prompt, left out)."""
    by_bucket: dict[int, list[float]] = defaultdict(list)
    for r in trace:
        context = r["prompt_tokens"] - 1
        for i, s in enumerate(r["steps"]):
            if i > 0 and s["target_rows"] == [1]:
                by_bucket[-(-(context + 1) // 256)].append(s["target_s"])
            context += s["emitted"]
    return {b: statistics.median(xs) for b, xs in by_bucket.items() if len(xs) >= 5}


def project(args) -> None:
    """Projected GPU seconds of every CPU-traced generation, three ways: its forwards replayed on
    the GPU with the graphs' rows unpadded and padded (``unpadded``, ``padded``), each plus the
    host model; and every forward at the cost table's steady-state price (all graphs captured;
    with ``--context-trace``, moved to each step's key length). Speedups are ``ar``'s projected
    time over the variant's, per task and overall."""
    cpu = [json.loads(l) for f in args.cpu for l in open(f)]
    gpu = [json.loads(l) for f in args.gpu for l in open(f)]
    replayed = [json.loads(l) for f in args.replay for l in open(f)] if args.replay else []
    target_cost = RowCost.load(args.target_costs)
    draft_cost = RowCost.load(args.draft_costs) if args.draft_costs else None
    base, per_draft = host_model(gpu)
    one_row = one_row_costs([json.loads(l) for f in args.context_trace for l in open(f)]) if args.context_trace else {}

    def steady_target(rows: int, context: int) -> float:
        """The table's price of ``rows``, moved to the key length's bucket by the measured
        one-row cost there (the table is measured at 512 cached tokens; a step's attention
        reads its own context)."""
        if not one_row:
            return target_cost(rows)
        bucket = -(-(context + rows) // 256)
        nearest = min(one_row, key=lambda b: abs(b - bucket))
        return target_cost(rows) - target_cost(1) + one_row[nearest]

    gpu_start = {(r["prompt"], r["variant"]): r["start_s"] for r in gpu}
    # device seconds per (prompt, variant, setting): mean over rounds of start + steps
    device: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    start_dev: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in replayed:
        start_dev[r["prompt"], r["variant"]].append(r["start_s"])
    for r in replayed:  # a prefill is not padded: its fastest replay (the others paid a cold start)
        device[r["prompt"], r["variant"], r["setting"]].append(min(start_dev[r["prompt"], r["variant"]]) + r["steps_s"])
    # the start's host work (a drafter's begin: AdaPLD's prompt hidden states, READER's trie): the
    # median over prompts of the GPU trace's start less its replayed prefill
    by_v: dict[str, list[float]] = defaultdict(list)
    for (prompt, v), s in gpu_start.items():
        if (prompt, v) in start_dev:
            by_v[v].append(max(0.0, s - min(start_dev[prompt, v])))
    start_host: dict[str, float] = {v: statistics.median(xs) for v, xs in by_v.items()}
    settings = sorted({r["setting"] for r in replayed}, reverse=True)  # unpadded, padded
    ar_tokens = {r["prompt"]: r["tokens"] for r in cpu if r["method"] == "ar"}
    columns = [*settings, "steady"]
    totals: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(float))
    for r in cpu:
        v = r["variant"]
        h = v if v in base else r["method"]  # a variant without a GPU trace takes its method's host work
        if h not in base:
            raise SystemExit(f"variant {v} (method {r['method']}) has no GPU trace ({args.gpu})")
        if r["prompt"] in ar_tokens and r["tokens"] != ar_tokens[r["prompt"]]:
            raise SystemExit(f"{r['prompt']} {v}: tokens differ from ar's")
        n_draft = sum(len(s["draft_rows"]) for s in r["steps"])
        host = base[h] * len(r["steps"]) + per_draft * n_draft
        host += start_host.get(h, 0.0)
        times = {}
        for setting in settings:
            if not device[r["prompt"], v, setting]:
                raise SystemExit(f"{r['prompt']} {v}: not in the replay ({setting}); project it without --replay")
            times[setting] = statistics.fmean(device[r["prompt"], v, setting]) + host
        steady, context = 0.0, r["prompt_tokens"] - 1
        for s in r["steps"]:
            steady += sum(steady_target(n, context) for n in s["target_rows"])
            context += s["emitted"]
        steady += sum(target_cost(n) for is_t, n in r["start_rows"] if is_t)
        if n_draft or any(not is_t for is_t, _ in r["start_rows"]):
            if draft_cost is None:
                raise SystemExit(f"{v} runs a draft model: pass --draft-costs")
            steady += sum(draft_cost(n) for s in r["steps"] for n in s["draft_rows"])
            steady += sum(draft_cost(n) for is_t, n in r["start_rows"] if not is_t)
        times["steady"] = steady + host
        for key in ((r["task"], v), ("overall", v)):
            t = totals[key]
            for c in columns:
                t[c] += times[c]
            t["steps"] += len(r["steps"])
            t["tokens"] += r["new_tokens"]
            t["host"] += host
    variants = list(dict.fromkeys(r["variant"] for r in cpu))
    tasks = list(dict.fromkeys(r["task"] for r in cpu)) + ["overall"]
    rows = []
    for task in tasks:
        ar = totals.get((task, "ar"))
        for v in variants:
            t = totals.get((task, v))
            if t is None or ar is None:
                continue
            row = {"task": task, "variant": v, "mat": round(t["tokens"] / t["steps"], 2), "host_share": round(t["host"] / t["steady"], 3)}
            for c in columns:
                row[c] = round(ar[c] / t[c], 3)
                row[c + "_ms_per_token"] = round(1000 * t[c] / t["tokens"], 2)
            rows.append(row)
    print(f"host model: per step {', '.join(f'{v} {1000 * h:.2f} ms' for v, h in base.items())}; {1000 * per_draft:.2f} ms per draft forward\n")
    print("| task | variant | MAT | " + " | ".join(f"{c} (ms/token)" for c in columns) + " | host share |")
    print("|---|---|---|" + "---|" * len(columns) + "---|")
    for row in rows:
        cells = " | ".join(f"{row[c]:.2f}x ({row[c + '_ms_per_token']:.2f})" for c in columns)
        print(f"| {row['task']} | `{row['variant']}` | {row['mat']:.2f} | {cells} | {row['host_share']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"host_per_step": base, "host_per_draft_forward": per_draft, "rows": rows}, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trace", help="step the engine and write each step's rows, tokens and times (JSONL)")
    t.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    t.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    t.add_argument("--device", default="cpu")
    t.add_argument("--dtype", default="float32")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--suite", required=True)
    t.add_argument("--variants", required=True)
    t.add_argument("--datastore", action="append", default=[])
    t.add_argument("--max-new-tokens", type=int, default=128)
    t.add_argument("--out", required=True)
    t.add_argument("--resume", action="store_true", help="append, skipping (prompt, variant) pairs already in --out")
    t.add_argument("--profile", help="write a cProfile of --profile-variants' steps (text, by own and cumulative time) here")
    t.add_argument("--profile-variants", default="adapld", help="comma list of variant names to profile")
    t.add_argument("--force", help="a trace whose ar tokens the target is forced to emit (random-weight models: real text)")
    r = sub.add_parser("replay", help="feed a trace's forwards again (row counts, in order) on this device")
    r.add_argument("--trace", action="append", required=True)
    r.add_argument("--variants", help="comma list of variant names to replay (default: all)")
    r.add_argument("--model", required=True)
    r.add_argument("--draft-model")
    r.add_argument("--device", default="cuda")
    r.add_argument("--dtype", default="bfloat16")
    r.add_argument("--settings", default="unpadded,padded", help="CUDA graph rows: padded, unpadded or both")
    r.add_argument("--rounds", type=int, default=1)
    r.add_argument("--out", required=True)
    p = sub.add_parser("project", help="price a CPU trace's steps with a GPU's costs")
    p.add_argument("--cpu", action="append", required=True, help="CPU trace (repeatable)")
    p.add_argument("--gpu", action="append", required=True, help="GPU trace of the same variants (repeatable)")
    p.add_argument("--replay", action="append", help="replay output (repeatable; without it only the steady-state column)")
    p.add_argument("--target-costs", required=True)
    p.add_argument("--draft-costs")
    p.add_argument("--context-trace", action="append", help="GPU trace whose one-row steps price the key length (repeatable)")
    p.add_argument("--json")
    args = ap.parse_args()
    {"trace": trace, "replay": replay, "project": project}[args.command](args)


if __name__ == "__main__":
    main()
