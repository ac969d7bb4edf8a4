"""Issue 2's measurement: tree PLD and Token Recycling against plain decoding and HF prompt lookup.

Runs, in one process after a warm-up, on the first prompt of each Spec-Bench task
(summarization, rag, mt_bench, math_reasoning) and HumanEval/0, with the chat template, greedy:
our ``ar`` (plain decoding through the same adapter), ``pld``, ``recycling``, Hugging Face
``generate`` plain and ``generate(prompt_lookup_num_tokens=10)``, then ``ar`` again. Speedups
are time(ar) / time(method) per prompt, time(ar) being the mean of the two ``ar`` runs that
bracket the others. Prints a markdown table and writes JSON.

    python benchmarks/experiments/all-methods/measure_engine.py --model qwen2.5-coder-1.5b-instruct --out benchmarks/experiments/all-methods/engine_issue2.json

Each method runs at its default budget (``specgraft.methods.DEFAULT_BUDGETS``) unless
``--budget`` is given; the budgets used are written to the JSON. With ``--recycling-state``
(a successor matrix from ``specgraft warmup`` or ``specgraft calibrate``) a second recycling
column, ``recycling-warm``, starts from that warmed-up matrix; plain ``recycling`` starts empty
and learns from the prompts as it goes (its matrix persists across them, in run order).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from specgraft.api import SpecDecoder
from specgraft.agreement import agreement
from specgraft.methods import MethodOptions

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "bench"


def first_prompts(data_dir: Path) -> list[tuple[str, str]]:
    out: dict[str, str] = {}
    with open(data_dir / "spec_bench.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            if rec["task"] in ("summarization", "rag", "mt_bench", "math_reasoning") and rec["task"] not in out:
                out[rec["task"]] = rec["turns"][0]
    with open(data_dir / "humaneval.jsonl") as f:
        out["humaneval"] = json.loads(f.readline())["turns"][0]
    return [(t, out[t]) for t in ("summarization", "rag", "mt_bench", "math_reasoning", "humaneval")]


def hf_generate(dec: SpecDecoder, ids: list[int], max_new: int, **kw) -> tuple[list[int], float]:
    inp = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = dec.model.generate(
            inp, attention_mask=torch.ones_like(inp), max_new_tokens=max_new, do_sample=False,
            eos_token_id=sorted(dec.engine.eos_token_ids), pad_token_id=sorted(dec.engine.eos_token_ids)[0], **kw,
        )
    return out[0, len(ids):].tolist(), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--budget", type=int, default=None, help="nodes per step (default: each method's own default budget)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--data", default=str(SHARED))
    ap.add_argument("--out", default="benchmarks/experiments/all-methods/engine_issue2.json")
    ap.add_argument("--recycling-state", default=None, help="warmed-up successor matrix (.npz) for a recycling-warm column")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dec = SpecDecoder.from_pretrained(args.model, method="ar", dtype=args.dtype)
    methods = {m: dec.with_method(m) for m in ("ar", "pld", "recycling")}
    if args.recycling_state:
        methods["recycling-warm"] = dec.with_method("recycling", MethodOptions(recycling_state=args.recycling_state))
    ours = [m for m in methods if m != "ar"]
    config = SpecDecoder.make_config(max_new_tokens=args.max_new_tokens, budget=args.budget)
    warm = SpecDecoder.make_config(max_new_tokens=8, budget=args.budget)
    budgets = {m: args.budget or d.spec.default_budget for m, d in methods.items()}
    prompts = first_prompts(Path(args.data))
    ids0 = methods["ar"].encode(prompts[-1][1], chat=True)
    for d in methods.values():
        d.generate(ids0, config=warm)
    hf_generate(dec, ids0, 8)
    hf_generate(dec, ids0, 8, prompt_lookup_num_tokens=10)
    rows = []
    for task, text in prompts:
        ids = methods["ar"].encode(text, chat=True)
        row = {"task": task, "prompt_tokens": len(ids)}
        base = methods["ar"].generate(ids, config=config)
        results = {}
        for m in ours:
            results[m] = methods[m].generate(ids, config=config)
        peers = {name: hf_generate(dec, ids, args.max_new_tokens, **kw) for name, kw in (("hf", {}), ("hf_pld", {"prompt_lookup_num_tokens": 10}))}
        # ar again after the others: the baseline is the mean of the two runs (the machine drifts)
        again = methods["ar"].generate(ids, config=config)
        ar_s = (base.stats.total_s + again.stats.total_s) / 2
        row["ar"] = {"time_s": ar_s, "time_s_runs": [base.stats.total_s, again.stats.total_s], "new_tokens": base.stats.new_tokens,
                     "tokens_per_s": base.stats.new_tokens / ar_s}
        for m, o in results.items():
            same = agreement(o.tokens, base.tokens)
            frac, first = same.fraction_equal, same.first_divergence
            s = o.stats
            row[m] = {
                "time_s": s.total_s, "new_tokens": s.new_tokens, "steps": s.steps, "mat": s.mat,
                "speedup": ar_s / s.total_s, "overhead_fraction": s.overhead_fraction,
                "agreement": frac, "first_divergence": first, "acceptance": s.acceptance_by_source(),
                "forward_s_per_step": s.forward_s / s.steps,
            }
        for name, (toks, secs) in peers.items():
            same = agreement(toks, base.tokens)
            frac, first = same.fraction_equal, same.first_divergence
            row[name] = {"time_s": secs, "new_tokens": len(toks), "speedup": ar_s / secs, "agreement": frac, "first_divergence": first}
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"model": args.model, "dtype": str(dec.target.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
            "max_new_tokens": args.max_new_tokens, "budgets": budgets, "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(), "recycling_state": args.recycling_state}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nbudgets {budgets}, dtype {meta['dtype']}, threads {meta['threads']}")
    print("\nspeedup = time(ar) / time(method) on the same prompt; MAT counts the bonus token; overhead = share of")
    print("decoding-step time spent outside the target forward (drafting, verify rule, cache commit, drafter updates)\n")
    head = " | ".join(f"{m} speedup (MAT)" for m in ours)
    print(f"| task | prompt tok | ar tok/s | {head} | HF plain | HF prompt lookup | " + " | ".join(f"{m} overhead" for m in ours) + " | agreement |")
    print("|---|---|---|" + "---|" * (2 * len(ours) + 3))
    for r in rows:
        cells = " | ".join(f"{r[m]['speedup']:.2f}x ({r[m]['mat']:.2f})" for m in ours)
        over = " | ".join(f"{100 * r[m]['overhead_fraction']:.1f}%" for m in ours)
        agree = " / ".join(f"{r[m]['agreement']:.2f}" for m in ours)
        print(f"| {r['task']} | {r['prompt_tokens']} | {r['ar']['tokens_per_s']:.2f} | {cells} | {r['hf']['speedup']:.2f}x | "
              f"{r['hf_pld']['speedup']:.2f}x | {over} | {agree} |")
    mean = lambda k, f: sum(r[k][f] for r in rows) / len(rows)
    cells = " | ".join(f"{mean(m, 'speedup'):.2f}x ({mean(m, 'mat'):.2f})" for m in ours)
    over = " | ".join(f"{100 * mean(m, 'overhead_fraction'):.1f}%" for m in ours)
    print(f"| mean | | | {cells} | {mean('hf', 'speedup'):.2f}x | {mean('hf_pld', 'speedup'):.2f}x | {over} | |")


if __name__ == "__main__":
    main()
