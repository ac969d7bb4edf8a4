"""MAT, steps and accepted nodes by source of READER shape variants beside `draft-tree` (deterministic counts).

Greedy, one process, the same prompts for every variant; times are printed but one pass on a
shared machine is not a speed measurement (use `specgraft bench` for that). Example (issue 13's
READER subset, the own-answers datastore; variants are JSON objects of ``ReaderConfig`` fields)::

    python benchmarks/experiments/adapld-reader/measure_reader_variants.py --datastore ~/.cache/specgraft/datastores/answers \\
        --variant draft-tree --variant '{}' --variant '{"deepen_depth": 64, "d_deep": 8}'
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter

import torch

from specgraft.api import SpecDecoder
from specgraft.suites import conversation_ids
from specgraft.drafters.reader_retrieval import ReaderConfig
from specgraft.methods import GraftOptions, MethodOptions
from specgraft.suites import load_suite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--suite", default="humaneval:3,benchmarks/experiments/adapld-reader/suites/math.jsonl")
    ap.add_argument("--datastore", action="append", default=[], help="Datastore directory (repeatable).")
    ap.add_argument("--variant", action="append", required=True, help="`draft-tree`, or a JSON object of ReaderConfig fields.")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    suite = load_suite(args.suite)
    base = SpecDecoder.from_pretrained(
        args.model, method="draft-tree", dtype="float32", progress=False,
        options=MethodOptions(graft=GraftOptions(draft_model=args.draft_model, draft_dtype="float32")),
    )
    ids = [conversation_ids(base.tokenizer, p.turns[:1], [], p.chat) for p in suite.prompts]
    for variant in args.variant:
        if variant == "draft-tree":
            dec = base
        else:
            opts = dataclasses.replace(base.options, reader=ReaderConfig(**json.loads(variant)), datastores=tuple(args.datastore))
            dec = base.with_method("reader", opts)
        steps = tokens = 0
        proposed: Counter = Counter()
        accepted: Counter = Counter()
        seconds = 0.0
        for prompt_ids in ids:
            stats = dec.generate(prompt_ids, max_new_tokens=args.max_new_tokens).stats
            steps += stats.steps
            tokens += stats.new_tokens
            proposed.update(stats.proposed_by_source)
            accepted.update(stats.accepted_by_source)
            seconds += stats.total_s
        print(json.dumps({"variant": variant if variant == "draft-tree" else json.loads(variant), "mat": round(tokens / steps, 3),
                          "steps": steps, "tokens": tokens, "time_s": round(seconds, 1), "proposed": dict(proposed),
                          "accepted": dict(accepted)}), flush=True)


if __name__ == "__main__":
    main()
