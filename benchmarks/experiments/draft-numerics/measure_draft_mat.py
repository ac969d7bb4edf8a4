"""MAT of the draft-model methods with each draft numeric, on benchmark prompts (issue 14, part 1).

MAT (mean accepted tokens per step, bonus token included) does not depend on the machine's
speed or load, so this measures only that, cheaply: the target is loaded once, each draft
numeric (``--quants``) is loaded in turn (one draft in memory at a time) and every method
(``--methods``) generates greedily on the first turn of each prompt of ``--suite``. No ``ar``
run: each output is checked token for token against ``ar``'s output on the same prompt in a
committed benchmark run (``--reference``, rows of ``specgraft bench``; the first
``--max-new-tokens`` tokens of a longer reference)::

    python benchmarks/experiments/draft-numerics/measure_draft_mat.py --suite spec-bench:1,humaneval:2 --max-new-tokens 64 \\
        --quants none,int8 --out benchmarks/draft_mat_issue14.json
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
    parser.add_argument("--methods", default="draft-tree,graft")
    parser.add_argument("--calibration", default="benchmarks/calib/graft.json")
    parser.add_argument("--suite", default="spec-bench:1,humaneval:2")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reference", default="benchmarks/experiments/all-methods/raw/results/results.jsonl")
    parser.add_argument("--prompts", default=None, help="only these prompt ids (comma list)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    reference = {}
    with open(args.reference) as f:
        for line in f:
            row = json.loads(line)
            if row["method"] == "ar" and row["turn"] == 0:
                reference.setdefault(row["prompt_id"], row["tokens"])
    keep = set(args.prompts.split(",")) if args.prompts else set(reference)
    prompts = [p for p in load_suite(args.suite).prompts if p.id in reference and p.id in keep]
    target = SpecDecoder.from_pretrained(args.model, method="ar", dtype="float32", device="cpu")
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    rows = []
    for quant in args.quants.split(","):
        draft = load_draft_model(args.draft_model, "float32", "cpu", progress=False, target_tokenizer=target.tokenizer, quant=quant)
        for method in args.methods.split(","):
            graft = GraftOptions(draft_model=args.draft_model, draft_quant=quant, calibration=args.calibration)
            decoder = target.with_method(method, MethodOptions(graft=graft), draft_model=draft)
            for prompt in prompts:
                t0 = time.perf_counter()
                out = decoder.generate(prompt.turns[0], chat=prompt.chat, config=config)
                expected = reference[prompt.id][: args.max_new_tokens]
                row = {
                    "quant": quant, "method": method, "prompt_id": prompt.id, "task": prompt.task,
                    "new_tokens": len(out.tokens), "steps": out.stats.steps, "mat": round(out.stats.mat, 4),
                    "exact": out.tokens == expected, "time_s": round(time.perf_counter() - t0, 2),
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
        del decoder, draft
        gc.collect()
    print("\nquant   method       MAT (tokens / steps, all prompts)   exact")
    for quant in args.quants.split(","):
        for method in args.methods.split(","):
            sel = [r for r in rows if r["quant"] == quant and r["method"] == method]
            tokens, steps = sum(r["new_tokens"] for r in sel), sum(r["steps"] for r in sel)
            print(f"{quant:<7} {method:<12} {tokens / steps:.3f} ({tokens} / {steps})   {all(r['exact'] for r in sel)}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
