"""Derived default budgets against the fixed ones, timed in one process (issue 12).

``budget/defaults.py`` derives each method's default budget from the device's cost table
and the method's measured gains per budget. This script checks that the derivation pays on the
machine it runs on: it loads the target (and the draft model) once and, on every prompt (first
turns, greedy, ``--max-new-tokens`` tokens, EOS does not stop), runs ``ar``, then each method at
its fixed default (``DEFAULT_BUDGETS``; the preset's budget) and at its derived one, in an order
that alternates from prompt to prompt, then ``ar`` again; the baseline is the mean of the two
``ar`` runs of the prompt, so drift is bracketed per prompt. A method whose two budgets are the
same runs once. Every output is checked against ``ar`` token for token::

    specgraft profile --model qwen2.5-coder-1.5b-instruct --threads 2 --out /tmp/table.json
    python benchmarks/experiments/budgets/measure_default_budgets.py --cost-table /tmp/table.json --methods pld,recycling,draft-tree,graft-prune \\
        --suite spec-bench:1,humaneval:2 --max-new-tokens 64 --out benchmarks/experiments/budgets/raw/results-budgets/budgets.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch

    from tools.alternate import bracketed_timings
    from tools.common import load_base, model_arguments

    from specgraft.api import SpecDecoder
    from specgraft.methods import MethodOptions, derived_budget, fixed_budget
    from specgraft.suites import load_suite

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--cost-table", required=True, help="The table the derived budgets come from (this machine's).")
    parser.add_argument("--methods", default="pld,recycling,draft-tree,graft-prune")
    parser.add_argument("--suite", default="spec-bench:1,humaneval:2")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    derived_options = MethodOptions(graft=base.options.graft, cost_table=args.cost_table)
    variants: list[tuple[str, str, int, SpecDecoder]] = []  # (method, "fixed"/"derived", budget, decoder)
    plan = {}
    for method in args.methods.split(","):
        dec = base.with_method(method)
        fixed = fixed_budget(method, base.options)
        derived = derived_budget(method, derived_options)
        plan[method] = {"fixed": fixed, "derived": derived.budget if derived else None,
                        "predicted": derived.describe() if derived else "no derivation"}
        variants.append((method, "fixed", fixed, dec))
        if derived is not None and derived.budget != fixed:
            variants.append((method, "derived", derived.budget, dec))
        print(f"{method:<12} fixed {fixed:3d}, {plan[method]['predicted']}", flush=True)
    prompts = [base.encode(p.turns[0], chat=p.chat) for p in load_suite(args.suite).prompts]
    rows = []
    keyed = [((method, kind), budget, dec) for method, kind, budget, dec in variants]
    for i, ar_first, ar_last, timed in bracketed_timings(base, keyed, prompts, args.max_new_tokens):
        ar_s = (ar_first + ar_last) / 2
        for (method, kind), (seconds, mat, exact) in timed.items():
            rows.append({"prompt": i, "method": method, "kind": kind, "seconds": seconds, "ar_seconds": ar_s, "mat": mat, "exact": exact})
        print(f"prompt {i}: ar {ar_first:.1f}/{ar_last:.1f} s; "
              + ", ".join(f"{m}/{k} {s:.1f} s" for (m, k), (s, _, _) in timed.items()), flush=True)
        summary = {}
        for method, kind, budget, _ in variants:
            mine = [r for r in rows if (r["method"], r["kind"]) == (method, kind)]
            total, ar_total = sum(r["seconds"] for r in mine), sum(r["ar_seconds"] for r in mine)
            summary[f"{method}/{kind}"] = {
                "budget": budget, "seconds": round(total, 2), "ar_seconds": round(ar_total, 2), "speedup": round(ar_total / total, 4),
                "mat": round(sum(r["mat"] for r in mine) / len(mine), 3), "exact": sum(r["exact"] for r in mine), "prompts": len(mine),
            }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "plan": plan, "summary": summary, "rows": rows}, indent=1) + "\n")
    for name, s in summary.items():
        print(f"{name:<22} budget {s['budget']:3d}: {s['seconds']:7.1f} s, {s['speedup']:.3f}x ar, MAT {s['mat']:.2f}, exact {s['exact']}/{s['prompts']}")


if __name__ == "__main__":
    main()
