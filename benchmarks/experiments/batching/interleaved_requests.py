"""Batch size 1, method against batched ``ar`` request by request: a drift-robust twin of
``specgraft bench-serve --batch-sizes 1`` (issue 12).

bench-serve alternates whole passes (8 requests, ~2 min each), so a host whose speed wanders by
20-30% within minutes (seen on the Zen 3 VM: the same ``ar`` pass took 22.7 and 36.8 s ten minutes
apart) can move a ratio by more than the few percent it is meant to resolve. Here every request
of the suite runs through a :class:`~specgraft.batch.BatchEngine` of one slot for ``ar`` (no
policy, as bench-serve) and for the method (one :class:`~specgraft.batch.AdaptiveBudget` from its
measured gains, kept for the whole run as bench-serve keeps it), the two back to back, in an
order that alternates from request to request; ``--rounds`` repeats the suite. The method does
what bench-serve's pass does request by request (admission decisions, probes, guard); only the
grain of the alternation differs. Prints one line per request (wall, decoding and admission
seconds, whether the request started without its drafters' optional prefill work) and the
totals, and writes them as JSON::

    python benchmarks/experiments/batching/interleaved_requests.py --method recycling --suite spec-bench:1,humaneval:2 \\
        --max-new-tokens 32 --rounds 2 --out benchmarks/experiments/batching/raw/results-batch-zen3-rounds/b1-interleaved.json
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
    from specgraft.cli.options import cost_table_value
    from specgraft.methods import GraftOptions, MethodOptions
    from specgraft.suites import load_suite

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--method", default="recycling")
    parser.add_argument("--suite", default="spec-bench:1,humaneval:2")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--cost-table", default="auto")
    parser.add_argument("--recycling-state", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    graft = GraftOptions(draft_model=args.draft_model, draft_dtype=args.dtype, draft_quant=args.draft_quant)
    options = MethodOptions(graft=graft, cost_table=cost_table_value(args.cost_table), recycling_state=args.recycling_state)
    ar = SpecDecoder.from_pretrained(args.model, method="ar", dtype=args.dtype, options=options, progress=False)
    method = ar.with_method(args.method)
    if ar.options.cost_table is None:
        raise SystemExit("no cost table for this model and device: run `specgraft profile` first")
    policy = AdaptiveBudget.for_method(CostTable.load(ar.options.cost_table), args.method)
    prompts = [ar.encode(p.turns[0], chat=p.chat) for p in load_suite(args.suite).prompts]
    config = SpecDecoder.make_config(max_new_tokens=args.max_new_tokens, stop_on_eos=False)

    def one(dec, prompt, pol) -> dict:
        batch = dec.batch_engine(max_batch=1, policy=pol)
        batch.submit(prompt, dec.resolve(config))
        t0 = time.perf_counter()
        tokens = [t for ev in batch.events() for t in ev.tokens]
        wall = time.perf_counter() - t0
        decode_s = sum(s for _, s in batch.stats.decode_by_batch.values())
        return {"wall_s": wall, "decode_s": decode_s, "admit_s": wall - decode_s, "tokens": tokens,
                "plain_start": bool(batch.stats.plain_starts), "probe_steps": batch.stats.probe_steps}

    rows = []
    n = 0
    for r in range(args.rounds):
        for i, prompt in enumerate(prompts):
            order = ("ar", args.method) if n % 2 == 0 else (args.method, "ar")
            n += 1
            got = {name: one(ar if name == "ar" else method, prompt, None if name == "ar" else policy) for name in order}
            if got[args.method]["tokens"] != got["ar"]["tokens"]:
                raise SystemExit(f"round {r + 1} request {i}: {args.method}'s output differs from ar's")
            a, m = got["ar"], got[args.method]
            print(
                f"round {r + 1} request {i} ({len(prompt)} prompt tokens): ar {a['wall_s']:.2f} s, {args.method} {m['wall_s']:.2f} s "
                f"(decoding {m['decode_s']:.2f} / {a['decode_s']:.2f} s, admission {m['admit_s']:.2f} / {a['admit_s']:.2f} s, "
                f"plain start {m['plain_start']}, probe steps {m['probe_steps']})",
                flush=True,
            )
            rows.append({"round": r + 1, "request": i, "prompt_tokens": len(prompt), "order": list(order),
                         **{f"{k}_{name}": v[k] for name, v in (("ar", a), ("method", m)) for k in ("wall_s", "decode_s", "admit_s")},
                         "plain_start": m["plain_start"], "probe_steps": m["probe_steps"]})
    total = {k: sum(row[k] for row in rows) for k in ("wall_s_ar", "wall_s_method", "decode_s_ar", "decode_s_method")}
    ratio = total["wall_s_ar"] / total["wall_s_method"]
    print(f"{args.method}: {ratio:.3f}x batched ar at batch size 1 over {len(rows)} requests "
          f"(ar {total['wall_s_ar']:.1f} s, {args.method} {total['wall_s_method']:.1f} s; decoding "
          f"{total['decode_s_ar'] / total['decode_s_method']:.3f}x); every output equal to ar's")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "ratio": ratio, "totals": total, "requests": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
