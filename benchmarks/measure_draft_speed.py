"""Speed of the draft-model methods with each draft numeric, in one process against ``ar`` (issue 14).

``specgraft bench`` takes one ``--draft-quant`` per run, so comparing an int8 draft with an fp32
one there means two runs with two ``ar`` baselines on a machine whose speed drifts by up to
+-10% between runs. This script loads the target once and runs, on the same prompts (first
turns, greedy, ``--max-new-tokens`` tokens, EOS does not stop): ``ar``, then every method of
``--methods`` with every draft numeric of ``--quants`` (the drafts loaded one at a time), then
``ar`` again; the baseline is the mean of the two ``ar`` passes, so drift during the run is
bracketed. Each pass starts with one untimed warm-up generation on a prompt outside the set.
Every output is checked against this run's ``ar`` token for token.

Speed = total time of ``ar`` over the prompts / total time of the method (prefill included:
the draft model's own prompt prefill happens at its first drafting step), with MAT beside it::

    python benchmarks/measure_draft_speed.py --suite spec-bench:1,humaneval:2 --max-new-tokens 64 \\
        --methods graft-prune --quants none,int8 --threads 2 --out benchmarks/results-issue14/speed.json
"""

from __future__ import annotations

import argparse
import gc
import json
import time


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
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    prompts = load_suite(args.suite).prompts
    warm = "Write one sentence about the sea."
    target = SpecDecoder.from_pretrained(args.model, method="ar", dtype="float32", device="cpu", progress=False)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_on_eos=False)
    rows: list[dict] = []
    reference: dict[str, list[int]] = {}

    def run(decoder, label: str, quant: str) -> None:
        decoder.generate(warm, config=GenerationConfig(max_new_tokens=8, stop_on_eos=False))
        for prompt in prompts:
            t0 = time.perf_counter()
            out = decoder.generate(prompt.turns[0], chat=prompt.chat, config=config)
            elapsed = time.perf_counter() - t0
            if label == "ar" and prompt.id not in reference:
                reference[prompt.id] = out.tokens
            row = {
                "method": label, "quant": quant, "prompt_id": prompt.id, "task": prompt.task, "new_tokens": len(out.tokens),
                "steps": out.stats.steps, "mat": round(out.stats.mat, 4), "time_s": round(elapsed, 3),
                "exact": out.tokens == reference[prompt.id],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)

    run(target, "ar", "-")
    for quant in args.quants.split(","):
        draft = load_draft_model(args.draft_model, "float32", "cpu", progress=False, target_tokenizer=target.tokenizer, quant=quant)
        for method in args.methods.split(","):
            graft = GraftOptions(draft_model=args.draft_model, draft_quant=quant, calibration=args.calibration)
            run(target.with_method(method, MethodOptions(graft=graft), draft_model=draft), method, quant)
        del draft
        gc.collect()
    run(target, "ar", "-")

    ar_time = sum(r["time_s"] for r in rows if r["method"] == "ar") / 2
    print(f"\nar: {ar_time:.1f} s over {len(prompts)} prompts (mean of the two passes)")
    print("method        quant  time s   speed vs ar   MAT     exact")
    summary = []
    for quant in args.quants.split(","):
        for method in args.methods.split(","):
            sel = [r for r in rows if r["method"] == method and r["quant"] == quant]
            t = sum(r["time_s"] for r in sel)
            mat = sum(r["new_tokens"] for r in sel) / sum(r["steps"] for r in sel)
            exact = sum(r["exact"] for r in sel)
            summary.append({"method": method, "quant": quant, "time_s": round(t, 2), "speedup": round(ar_time / t, 3), "mat": round(mat, 3), "exact": f"{exact}/{len(sel)}"})
            print(f"{method:<13} {quant:<6} {t:7.1f}   {ar_time / t:5.2f}x        {mat:.2f}    {exact}/{len(sel)}")
    if args.out:
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "ar_time_s": ar_time, "summary": summary, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
