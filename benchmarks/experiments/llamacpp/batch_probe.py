"""Batched decoding on the llama.cpp backend: several requests in one llama.cpp context, as the
server runs them, at batch sizes 1, 2, 4. Aggregate tokens/s of ``BatchEngine`` for each method,
and whether every request's tokens equal its tokens at batch size 1.

Run it once per llama.cpp library to compare builds (``LLAMA_CPP_LIB_PATH`` picks another
library directory, e.g. a stock AMX build of the same source):

    python benchmarks/experiments/llamacpp/batch_probe.py --methods ar,pld --batch-sizes 1,2,4
    LLAMA_CPP_LIB_PATH=~/llama/build-amx/bin python benchmarks/experiments/llamacpp/batch_probe.py ...

Requests: the first turns of ``--suite`` (chat template), ``--max-new-tokens`` each with EOS
ignored, so every batch size does the same work.
"""

from __future__ import annotations

import argparse
import json
import time

from specgraft import SpecDecoder
from specgraft.config import GenerationConfig
from specgraft.suites import load_suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--methods", default="ar,pld")
    parser.add_argument("--batch-sizes", default="1,2,4")
    parser.add_argument("--suite", default="spec-bench:1")
    parser.add_argument("--requests", type=int, default=8, help="at most this many prompts of --suite")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="JSON file for the rows")
    args = parser.parse_args()

    rows = []
    for method in args.methods.split(","):
        dec = SpecDecoder.from_pretrained(args.model, method=method, backend="llamacpp", threads=args.threads, progress=False)
        prompts = [dec.encode(p.turns[0], chat=True) for p in load_suite(args.suite).prompts][: args.requests]
        config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_on_eos=False)
        dec.generate(prompts[0], max_new_tokens=8)  # warm-up
        alone: dict[int, list[int]] = {}
        for size in [int(b) for b in args.batch_sizes.split(",")]:
            batch = dec.batch_engine(max_batch=size)
            ids = [batch.submit(p, config) for p in prompts]
            t0 = time.perf_counter()
            results = batch.run_to_completion()
            seconds = time.perf_counter() - t0
            outputs = [results[i].tokens for i in ids]
            if not alone:
                alone = dict(enumerate(outputs))
            tokens = sum(len(o) for o in outputs)
            row = {
                "method": method,
                "batch_size": size,
                "requests": len(prompts),
                "tokens": tokens,
                "seconds": round(seconds, 3),
                "tokens_per_s": round(tokens / seconds, 2),
                "equal_to_batch_1": sum(o == alone[k] for k, o in enumerate(outputs)),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        del dec
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
