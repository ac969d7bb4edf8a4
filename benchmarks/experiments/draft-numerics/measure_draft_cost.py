"""Cost of one draft-model forward in each draft numeric (issue 14, part 1).

Loads the draft model once per numeric (``--quants``, as ``--draft-quant`` takes them), caches
``--context`` prompt tokens in one slot of each, then times forwards of 1 / 2 / 4 new rows (a
chain, as the drafter feeds them: the root forward and the layers of a top-2 tree), discarding
them after each; the numerics are interleaved round by round, so drift on a shared machine
hits them alike. Prints medians in seconds and the ratio to the first numeric::

    python benchmarks/experiments/draft-numerics/measure_draft_cost.py --model qwen2.5-coder-0.5b-instruct --quants none,int8,bf16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def main() -> None:
    from specgraft.models.hf import HFTarget
    from specgraft.models.loading import load_draft_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--quants", default="none,int8,bf16")
    parser.add_argument("--rows", default="1,2,4")
    parser.add_argument("--context", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    quants, rows = args.quants.split(","), [int(r) for r in args.rows.split(",")]
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 20000, (args.context,), generator=generator).tolist()
    lms, slots = {}, {}
    for quant in quants:
        lms[quant] = HFTarget(load_draft_model(args.model, "float32", "cpu", progress=False, quant=quant))
        slots[quant] = lms[quant].allocate()
        lms[quant].prefill(slots[quant], prompt)
    times: dict[tuple[str, int], list[float]] = {(q, n): [] for q in quants for n in rows}
    with torch.no_grad():
        for repeat in range(args.repeats + 1):  # round 0 warms up
            for n in rows:
                for quant in quants:
                    lm, slot = lms[quant], slots[quant]
                    t0 = time.perf_counter()
                    lm.forward_rows(slot, prompt[:n], list(range(-1, n - 1)))
                    elapsed = time.perf_counter() - t0
                    lm.discard(slot)
                    if repeat:
                        times[quant, n].append(elapsed)
    result = {
        "model": args.model, "context": args.context, "threads": args.threads, "repeats": args.repeats,
        "median_s": {f"{q}/{n}": round(statistics.median(times[q, n]), 4) for q in quants for n in rows},
    }
    base = quants[0]
    for quant in quants:
        cells = [f"{statistics.median(times[quant, n]):.3f} s ({statistics.median(times[base, n]) / statistics.median(times[quant, n]):.2f}x)" for n in rows]
        print(f"{quant:>5}: " + " / ".join(cells) + f"  for {' / '.join(map(str, rows))} rows")
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
