"""Quick same-process comparison of methods on the llama.cpp backend, for tuning (not the benchmark).

Runs ``ar`` and each method on a few prompts of the headline suites, alternating per prompt,
greedy, and prints per method: seconds, tokens/s, MAT, steps, agreement with ``ar``.

    python benchmarks/experiments/llamacpp/try_methods.py --methods pld,recycling,draft-tree --prompts 6
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--methods", default="pld,recycling,draft-tree")
    ap.add_argument("--suite", default="spec-bench:1,humaneval:2,code-edit:2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--budget", type=int, default=None)
    ap.add_argument("--preset", default="cpu")
    ap.add_argument("--draft-extend", type=int, default=None)
    ap.add_argument("--draft-depth", type=int, default=None)
    ap.add_argument("--draft-top-k", type=int, default=None)
    ap.add_argument("--draft-row-cost", type=float, default=None)
    ap.add_argument("--draft-extend-min", type=float, default=None)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from specgraft import SpecDecoder
    from specgraft.methods import GraftOptions, MethodOptions
    from specgraft.suites import load_suite

    torch.set_num_threads(args.torch_threads)
    graft = GraftOptions(
        draft_model=args.draft_model, preset=args.preset, extend=args.draft_extend, depth=args.draft_depth,
        top_k=args.draft_top_k, row_cost=args.draft_row_cost, extend_min=args.draft_extend_min,
    )
    options = MethodOptions(graft=graft)
    methods = args.methods.split(",")
    base = SpecDecoder.from_pretrained(args.model, method="ar", options=options, backend="llamacpp", threads=args.threads, strict=args.strict)
    # "pld@7": pld with budget 7; "pld@7:0.2": and row cost 0.2 (the cost-aware cut)
    decs = {"ar": base}
    budgets = {"ar": args.budget}
    for m in methods:
        name, _, rest = m.partition("@")
        budget, _, row_cost = rest.partition(":")
        opts = dataclasses.replace(options, row_cost=float(row_cost)) if row_cost else options
        decs[m] = base.with_method(name, opts)
        budgets[m] = int(budget) if budget else args.budget
    configs = {m: base.make_config(max_new_tokens=args.tokens, budget=b) for m, b in budgets.items()}
    prompts = load_suite(args.suite).prompts
    parts = ("prefill_s", "draft_s", "forward_s", "tree_nodes")
    totals = {m: {"s": 0.0, "tokens": 0, "steps": 0, "equal": 0, **dict.fromkeys(parts, 0.0)} for m in decs}
    for m, d in decs.items():
        d.generate(base.encode("Say hello.", chat=True), config=base.make_config(max_new_tokens=8))
    for i, p in enumerate(prompts):
        ids = base.encode(p.turns[0], chat=p.chat)
        order = list(decs) if i % 2 == 0 else ["ar", *reversed(methods)]
        outs = {}
        for m in order:
            t0 = time.perf_counter()
            out = decs[m].generate(ids, config=configs[m])
            totals[m]["s"] += time.perf_counter() - t0
            totals[m]["tokens"] += len(out.tokens)
            totals[m]["steps"] += out.stats.steps
            for part in parts:
                totals[m][part] += getattr(out.stats, part)
            outs[m] = out.tokens
        for m in decs:
            totals[m]["equal"] += outs[m] == outs["ar"]
        print(p.id, {m: round(totals[m]["s"], 1) for m in decs}, flush=True)
    ar_s = totals["ar"]["s"]
    for m, t in totals.items():
        print(f"{m:12s} {t['s']:7.1f} s  {t['tokens'] / t['s']:6.2f} tok/s  {ar_s / t['s']:5.2f}x  MAT {t['tokens'] / max(1, t['steps']):.2f}  equal {t['equal']}/{len(prompts)}"
              f"  prefill {t['prefill_s']:.1f} s  draft {t['draft_s']:.1f} s  forward {t['forward_s']:.1f} s  nodes/step {t['tree_nodes'] / max(1, t['steps']):.1f}")
    if args.out:
        json.dump({"args": vars(args), "totals": totals}, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
