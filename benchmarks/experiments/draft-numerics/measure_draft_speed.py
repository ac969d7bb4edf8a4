"""Speed of the draft-model methods with each draft numeric, in one process against ``ar`` (issue 14).

``specgraft bench`` takes one ``--draft-quant`` per run, so comparing an int8 draft with an fp32
one there means two runs with two ``ar`` baselines on a machine whose speed drifts by up to
+-10% between runs. This script loads the target once and runs, on the same prompts (first
turns, greedy, ``--max-new-tokens`` tokens, EOS does not stop): ``ar``, then every method of
``--methods`` with every draft numeric of ``--quants`` (the drafts loaded one at a time), then
``ar`` again; the baseline is the mean of the two ``ar`` passes, so drift during the run is
bracketed. Each pass starts with one untimed warm-up generation on a prompt outside the set.
Every output is checked against this run's ``ar`` token for token.

``--baselines`` times methods without a draft model beside them, once per ``METHOD[@ROW_COST]``
(``MethodOptions.row_cost``: the cost-aware cut of ``pld`` and AdaPLD)::

    python benchmarks/experiments/draft-numerics/measure_draft_speed.py --methods none --baselines pld,pld@0.067,adapld,adapld@0.067 \\
        --suite benchmarks/experiments/adapld-reader/suites/input_guided.jsonl --max-new-tokens 128 --out benchmarks/results-issue13/row_cost.json

``--shapes`` also sweeps the draft tree's shape, ``DEPTHxTOPK:BUDGET`` each (``preset`` = the
preset's own): a cheaper draft may pay for a deeper tree. A calibration belongs to one shape, so
shapes other than the preset's run without one (use it for ``draft-tree``, which reads none)::

    python benchmarks/experiments/draft-numerics/measure_draft_speed.py --methods draft-tree --quants int8 \\
        --shapes preset,5x2:10,6x2:12,6x3:12 --out benchmarks/results-issue14/shapes.json

Speed = total time of ``ar`` over the prompts / total time of the method (prefill included:
the draft model's own prompt prefill happens at its first drafting step), with MAT beside it::

    python benchmarks/experiments/draft-numerics/measure_draft_speed.py --suite spec-bench:1,humaneval:2 --max-new-tokens 64 \\
        --methods graft-prune --quants none,int8 --threads 2 --out benchmarks/experiments/draft-numerics/raw/results-issue14/speed.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import replace


def main() -> None:
    import torch

    from specgraft.api import SpecDecoder
    from specgraft.config import GenerationConfig
    from specgraft.methods import GraftOptions, MethodOptions
    from specgraft.models.loading import load_draft_model
    from specgraft.suites import load_suite

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--quants", default="none,int8")
    parser.add_argument("--methods", default="graft-prune")
    parser.add_argument("--calibration", default="benchmarks/calib/graft.json")
    parser.add_argument("--suite", default="spec-bench:1,humaneval:2")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--baselines", default="",
        help="methods without a draft model to time beside them, each METHOD or METHOD@ROW_COST (e.g. pld,pld@0.067: MethodOptions.row_cost)",
    )
    parser.add_argument("--shapes", default="preset", help="DEPTHxTOPK:BUDGET list; preset = the preset's shape")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts = load_suite(args.suite).prompts
    warm = "Write one sentence about the sea."
    target = SpecDecoder.from_pretrained(args.model, method="ar", dtype="float32", device="cpu", progress=False)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_on_eos=False)
    rows: list[dict] = []
    reference: dict[str, list[int]] = {}

    def parse_shape(text: str) -> tuple[int | None, int | None, int | None]:
        if text == "preset":
            return None, None, None
        dims, budget = text.split(":")
        depth, top_k = dims.split("x")
        return int(depth), int(top_k), int(budget)

    def run(decoder, label: str, quant: str, shape: str = "-", budget: int | None = None) -> None:
        cfg = config if budget is None else replace(config, budget=budget)
        decoder.generate(warm, config=replace(cfg, max_new_tokens=8))
        for prompt in prompts:
            t0 = time.perf_counter()
            out = decoder.generate(prompt.turns[0], chat=prompt.chat, config=cfg)
            elapsed = time.perf_counter() - t0
            if label == "ar" and prompt.id not in reference:
                reference[prompt.id] = out.tokens
            row = {
                "method": label, "quant": quant, "shape": shape, "prompt_id": prompt.id, "task": prompt.task, "new_tokens": len(out.tokens),
                "steps": out.stats.steps, "mat": round(out.stats.mat, 4), "time_s": round(elapsed, 3),
                "exact": out.tokens == reference[prompt.id],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)

    run(target, "ar", "-")
    baselines = [m for m in args.baselines.split(",") if m]
    for label in baselines:
        method, _, row_cost = label.partition("@")
        options = MethodOptions(row_cost=float(row_cost)) if row_cost else MethodOptions()
        run(target.with_method(method, options), label, "-")
    draft_methods = [m for m in args.methods.split(",") if m and m != "none"]
    for quant in args.quants.split(",") if draft_methods else ():
        draft = load_draft_model(args.draft_model, "float32", "cpu", progress=False, target_tokenizer=target.tokenizer, quant=quant)
        for method in draft_methods:
            for shape in args.shapes.split(","):
                depth, top_k, budget = parse_shape(shape)
                calibration = args.calibration if shape == "preset" else None
                graft = GraftOptions(draft_model=args.draft_model, draft_quant=quant, calibration=calibration, depth=depth, top_k=top_k)
                run(target.with_method(method, MethodOptions(graft=graft), draft_model=draft), method, quant, shape, budget)
        del draft
        gc.collect()
    run(target, "ar", "-")

    ar_time = sum(r["time_s"] for r in rows if r["method"] == "ar") / 2
    print(f"\nar: {ar_time:.1f} s over {len(prompts)} prompts (mean of the two passes)")
    print("method        quant  shape     time s   speed vs ar   MAT     exact")
    summary = []
    cells = [(m, "-", "-") for m in baselines]
    cells += [(m, q, s) for q in args.quants.split(",") for m in draft_methods for s in args.shapes.split(",")]
    for method, quant, shape in cells:
        sel = [r for r in rows if r["method"] == method and r["quant"] == quant and r["shape"] == shape]
        t = sum(r["time_s"] for r in sel)
        mat = sum(r["new_tokens"] for r in sel) / sum(r["steps"] for r in sel)
        exact = sum(r["exact"] for r in sel)
        summary.append({"method": method, "quant": quant, "shape": shape, "time_s": round(t, 2), "speedup": round(ar_time / t, 3), "mat": round(mat, 3), "exact": f"{exact}/{len(sel)}"})
        print(f"{method:<13} {quant:<6} {shape:<9} {t:7.1f}   {ar_time / t:5.2f}x        {mat:.2f}    {exact}/{len(sel)}")
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "ar_time_s": ar_time, "summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
