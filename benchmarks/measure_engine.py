"""Issue 2's measurement: tree PLD and Token Recycling against plain decoding and HF prompt lookup.

Runs, in one process after a warm-up, on the first prompt of each Spec-Bench task
(summarization, rag, mt_bench, math_reasoning) and HumanEval/0, with the chat template, greedy:
our ``ar`` (plain decoding through the same adapter), ``pld``, ``recycling``, Hugging Face
``generate`` plain and ``generate(prompt_lookup_num_tokens=10)``. Speedups are
time(ar) / time(method) per prompt. Prints a markdown table and writes JSON.

    python benchmarks/measure_engine.py --model qwen2.5-coder-1.5b-instruct --out benchmarks/engine_issue2.json

Each method runs at its default budget (``specgraft.methods.DEFAULT_BUDGETS``) unless
``--budget`` is given; the budgets used are written to the JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from specgraft.api import SpecDecoder
from specgraft.cli import agreement

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
    ap.add_argument("--out", default="benchmarks/engine_issue2.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dec = SpecDecoder.from_pretrained(args.model, method="ar", dtype=args.dtype)
    methods = {m: dec.with_method(m) for m in ("ar", "pld", "recycling")}
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
        row["ar"] = {"time_s": base.stats.total_s, "new_tokens": base.stats.new_tokens, "tokens_per_s": base.stats.tokens_per_s}
        for m in ("pld", "recycling"):
            o = methods[m].generate(ids, config=config)
            frac, first = agreement(o.tokens, base.tokens)
            s = o.stats
            row[m] = {
                "time_s": s.total_s, "new_tokens": s.new_tokens, "steps": s.steps, "mat": s.mat,
                "speedup": base.stats.total_s / s.total_s, "overhead_fraction": s.overhead_fraction,
                "agreement": frac, "first_divergence": first, "acceptance": s.acceptance_by_source(),
                "forward_s_per_step": s.forward_s / s.steps,
            }
        for name, kw in (("hf", {}), ("hf_pld", {"prompt_lookup_num_tokens": 10})):
            toks, secs = hf_generate(dec, ids, args.max_new_tokens, **kw)
            frac, first = agreement(toks, base.tokens)
            row[name] = {"time_s": secs, "new_tokens": len(toks), "speedup": base.stats.total_s / secs, "agreement": frac, "first_divergence": first}
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"model": args.model, "dtype": str(dec.target.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
            "max_new_tokens": args.max_new_tokens, "budgets": budgets, "torch": torch.__version__,
            "machine": platform.processor() or platform.machine()}
    Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"\nbudgets {budgets}, dtype {meta['dtype']}, threads {meta['threads']}")
    print("\n| task | prompt tok | ar tok/s | pld speedup (MAT) | recycling speedup (MAT) | HF plain | HF prompt lookup | pld overhead | recycling overhead | agreement pld / rec |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['task']} | {r['prompt_tokens']} | {r['ar']['tokens_per_s']:.2f} | {r['pld']['speedup']:.2f}x ({r['pld']['mat']:.2f}) | "
            f"{r['recycling']['speedup']:.2f}x ({r['recycling']['mat']:.2f}) | {r['hf']['speedup']:.2f}x | {r['hf_pld']['speedup']:.2f}x | "
            f"{100 * r['pld']['overhead_fraction']:.1f}% | {100 * r['recycling']['overhead_fraction']:.1f}% | "
            f"{r['pld']['agreement']:.2f} / {r['recycling']['agreement']:.2f} |"
        )
    mean = lambda k, f: sum(r[k][f] for r in rows) / len(rows)
    print(f"| mean | | | {mean('pld', 'speedup'):.2f}x ({mean('pld', 'mat'):.2f}) | {mean('recycling', 'speedup'):.2f}x ({mean('recycling', 'mat'):.2f}) | "
          f"{mean('hf', 'speedup'):.2f}x | {mean('hf_pld', 'speedup'):.2f}x | | | |")


if __name__ == "__main__":
    main()
