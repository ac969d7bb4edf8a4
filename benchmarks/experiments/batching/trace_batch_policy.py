"""Per-step trace of a method under one batch budget policy, as ``specgraft bench-serve`` runs it
(issue 12): for each batched step, the batch size, the budget the policy chose, the step's wall
time, the draft model's prompt prefill inside it (catch-up) and the policy's drafting estimates.

One :class:`~specgraft.batch.AdaptiveBudget` (from the method's measured gains) is kept across the
batch sizes, in order, like bench-serve; every prompt of the suite is submitted at once at each
batch size. Prints one summary line per batch size and writes the steps as JSON::

    python benchmarks/experiments/batching/trace_batch_policy.py --method draft-tree --batch-sizes 1,2,4 \\
        --suite spec-bench:1,humaneval:2 --max-new-tokens 32 --out benchmarks/experiments/batching/raw/results-batch-zen4-gains/trace-draft-tree.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch

    from tools.common import model_arguments

    from specgraft.api import SpecDecoder
    from specgraft.budget.adaptive import AdaptiveBudget
    from specgraft.budget.costs import CostTable
    from specgraft.batch.engine import BatchEngine
    from specgraft.methods import GraftOptions, MethodOptions
    from specgraft.suites import load_suite

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--method", default="draft-tree")
    parser.add_argument("--batch-sizes", default="1,2,4")
    parser.add_argument("--suite", default="spec-bench:1,humaneval:2")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--cost-table", default="auto")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    graft = GraftOptions(draft_model=args.draft_model, draft_dtype=args.dtype, draft_quant=args.draft_quant)
    ar = SpecDecoder.from_pretrained(args.model, method="ar", dtype=args.dtype, options=MethodOptions(graft=graft, cost_table=args.cost_table))
    if ar.options.cost_table is None:
        raise SystemExit("no cost table for this model and device: run `specgraft profile` first")
    dec = ar.with_method(args.method)
    prompts = [ar.encode(p.turns[0], chat=p.chat) for p in load_suite(args.suite).prompts]
    catch = {"s": 0.0}
    for drafter in dec.engine.drafters:  # time the draft model's prompt prefill (catch-up) inside steps
        lm = getattr(drafter, "lm", None)
        if lm is not None and hasattr(lm, "prefill"):
            def timed(*a, _plain=lm.prefill, **k):
                t0 = time.perf_counter()
                try:
                    return _plain(*a, **k)
                finally:
                    catch["s"] += time.perf_counter() - t0
            lm.prefill = timed
    policy = AdaptiveBudget.for_method(CostTable.load(ar.options.cost_table), args.method)
    config = dec.resolve(SpecDecoder.make_config(max_new_tokens=args.max_new_tokens, stop_on_eos=False))
    steps: list[dict] = []
    summary = []
    for b in (int(x) for x in args.batch_sizes.split(",")):
        engine = BatchEngine(dec.engine, max_batch=b, policy=policy)
        for p in prompts:
            engine.submit(p, config)
        t_start, tokens = time.perf_counter(), 0
        while engine.has_work:
            in_flight = min(b, engine.num_running + engine.num_waiting)
            c0, t0 = catch["s"], time.perf_counter()
            events = engine.step()
            tokens += sum(len(e.tokens) for e in events)
            used = engine.stats.budget_by_batch.get(in_flight)
            seqs = list(engine.running.values())
            steps.append({
                "max_batch": b, "sequences": in_flight, "budget": used,
                "step_s": round(time.perf_counter() - t0, 4), "catch_up_s": round(catch["s"] - c0, 4),
                "tokens": sum(len(e.tokens) for e in events),
                "forward_s": round(seqs[0].last_forward.seconds, 4) if seqs and seqs[0].last_forward else None,
                "rows": seqs[0].last_forward.rows if seqs and seqs[0].last_forward else None,
                "predicted": {k: round(policy.predicted(in_flight, k), 3) for k in sorted({0, *(policy.budgets[:6])})},
                "multipliers": [round(policy.multiplier(rid), 3) for rid in engine.running],
                "draft_s_estimates": {k: round(v, 4) for k, v in policy.draft_s.items()}, "probe_steps": engine.stats.probe_steps,
                "vetoed_steps_left": dict(policy.vetoed),
                "realized_tok_s": {b: [r.rate(True), r.rate(False)] for b, r in policy.realized.items()},
            })
        wall = time.perf_counter() - t_start
        mine = [s for s in steps if s["max_batch"] == b]
        plain = [s["step_s"] for s in mine if s["budget"] == 0 and s["catch_up_s"] == 0 and s["sequences"] == b]
        line = {
            "max_batch": b, "tokens": tokens, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 3), "steps": len(mine),
            "catch_up_s": round(sum(s["catch_up_s"] for s in mine), 2), "budgets": sorted({s["budget"] for s in mine if s["budget"] is not None}),
            "median_plain_step_s": sorted(plain)[len(plain) // 2] if plain else None,
            "table_plain_step_s": round(policy.costs.cost(b, 1), 4),
            "corrected_plain_step_s": round(policy.target_cost(b, 1), 4),
            "catch_up_s_per_token": policy.catch_up_per_token,
        }
        summary.append(line)
        print(line, flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "summary": summary, "steps": steps}, indent=1) + "\n")


if __name__ == "__main__":
    main()
