"""How many batched outputs equal ``generate``'s on the llama.cpp backend (default mode): the
first turns of a suite through ``BatchEngine`` at each batch size against single-sequence
``ar``, with the seconds each batch size took.

    python benchmarks/experiments/llamacpp/batch_equality_probe.py --batch-sizes 1,2 --prompts 6
"""

from __future__ import annotations

import argparse

from specgraft import SpecDecoder
from specgraft.bench.batched import run_batched
from specgraft.suites import load_suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--method", default="ar")
    ap.add_argument("--suite", default="spec-bench:1")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--batch-sizes", default="1,2")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    dec = SpecDecoder.from_pretrained(args.model, method=args.method, backend="llamacpp", threads=args.threads, progress=False)
    prompts = load_suite(args.suite).prompts[: args.prompts]
    config = dec.make_config(max_new_tokens=args.max_new_tokens, stop_on_eos=False)
    ids = [dec.encode(p.turns[0], chat=p.chat) for p in prompts]
    reference = [dec.generate(i, config=config).tokens for i in ids]
    for b in (int(x) for x in args.batch_sizes.split(",")):
        run = run_batched(dec, ids, dec.resolve(config), b, None)
        equal = [o == r for o, r in zip(run.outputs, reference)]
        print(f"B={b}: {sum(equal)}/{len(equal)} equal to generate {equal}, {run.wall_s:.1f} s", flush=True)


if __name__ == "__main__":
    main()
