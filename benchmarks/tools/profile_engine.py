"""Where one method's generation time goes, run by run: repeat each prompt and profile every run.

A benchmark row is one generation; when a row is far slower than its twin (on the H200 the first
``ar`` of every prompt took ~3.3 s and the bracketing ``ar-end`` 1.2 s for the same 64 tokens),
this finds out why. Each prompt is generated ``--repeat`` times by each method in turn; every
run is timed, profiled with cProfile, and on a GPU its allocator's counters are read. Printed:
each run's time and tokens/s, then the functions whose cumulative time differs most between
the slowest and the fastest run of the first method::

    python benchmarks/tools/profile_engine.py --model qwen2.5-coder-1.5b-instruct --methods ar --suite spec-bench:1 --repeat 2

Exactness is checked on the way: every run of every method must give the tokens of the first
method's first run on that prompt.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch

from specgraft.api import SpecDecoder
from specgraft.config import GenerationConfig
from specgraft.models.base import synchronize
from specgraft.suites import load_suite


def cumulative(profile: cProfile.Profile) -> dict[str, float]:
    """Cumulative seconds per function, keyed ``file:line(name)``."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    return {f"{f}:{line}({name})": row[3] for (f, line, name), row in stats.stats.items()}  # type: ignore[attr-defined]


def allocator(device: torch.device) -> dict[str, int]:
    if device.type != "cuda":
        return {}
    s = torch.cuda.memory_stats(device)
    return {k: int(s.get(k, 0)) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries", "reserved_bytes.all.current")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--methods", default="ar")
    ap.add_argument("--suite", default="spec-bench:1")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--top", type=int, default=25, help="Functions printed per comparison.")
    ap.add_argument("--out", help="JSON of every run's time and allocator counters.")
    args = ap.parse_args()

    methods = args.methods.split(",")
    first = SpecDecoder.from_pretrained(args.model, method=methods[0], dtype=args.dtype, device=args.device, progress=False)
    decoders = {m: first.with_method(m) for m in methods[1:]} | {methods[0]: first}
    device = first.engine.target.device
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_on_eos=False)
    runs, profiles = [], {}
    for p in load_suite(args.suite).prompts:
        ids = first.encode(p.turns[0], chat=p.chat)
        reference = None
        for rep in range(args.repeat):
            for m in methods:
                before = allocator(device)
                prof = cProfile.Profile()
                synchronize(device)
                t0 = time.perf_counter()
                prof.enable()
                out = decoders[m].generate(ids, config=config)
                synchronize(device)
                prof.disable()
                seconds = time.perf_counter() - t0
                reference = reference if reference is not None else out.tokens
                after = allocator(device)
                run = {"prompt": p.id, "prompt_tokens": len(ids), "method": m, "rep": rep, "seconds": seconds,
                       "tokens_per_s": len(out.tokens) / seconds, "exact": out.tokens == reference,
                       "allocator": {k: after[k] - before.get(k, 0) for k in after}}
                runs.append(run)
                profiles[(p.id, m, rep)] = cumulative(prof)
                print(json.dumps(run), flush=True)
    main_runs = [r for r in runs if r["method"] == methods[0]]
    slow = max(main_runs, key=lambda r: r["seconds"])
    fast = min((r for r in main_runs if r["prompt"] == slow["prompt"]), key=lambda r: r["seconds"])
    a, b = profiles[(slow["prompt"], methods[0], slow["rep"])], profiles[(fast["prompt"], methods[0], fast["rep"])]
    print(f"\nslowest {methods[0]} run {slow['seconds']:.2f} s (rep {slow['rep']}) vs {fast['seconds']:.2f} s on {slow['prompt']}: largest differences")
    diff = sorted(((a.get(k, 0.0) - b.get(k, 0.0), k) for k in set(a) | set(b)), reverse=True)[: args.top]
    for d, k in diff:
        print(f"{d:+8.3f} s  slow {a.get(k, 0.0):7.3f}  fast {b.get(k, 0.0):7.3f}  {k[-110:]}")
    print("\nslowest run, top cumulative:")
    for k, v in sorted(a.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"{v:8.3f} s  {k[-110:]}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
