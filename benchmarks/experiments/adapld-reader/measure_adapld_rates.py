"""How often AdaPLD's nodes are right, by kind: the measurement behind ``AdaPLDConfig``'s priors.

Greedy generations of ``adapld`` (first turns, chat template, EOS stops) on held-out prompts;
for every step, every node the drafter built (verified or not: a node whose parent lay on the
accepted path has a known outcome) is counted by kind, with the main copy split by agreement
``n`` and depth (1, 2, >= 3) and the branches' anchor probabilities summed, so ``c = hits /
sum q`` is the branch factor of ``p(branch) = c * q``. Deterministic counts, free of timing
noise (~8 min on the 2-core Zen 3 for the default 11 prompts). The priors of 0.57 and 0.3 were
measured under the earlier ones (1.0 and 0.4), which propose more branches::

    cd benchmarks && python experiments/adapld-reader/measure_adapld_rates.py --prior-branch 1.0 --prior-successor 0.4 --out experiments/adapld-reader/raw/results-issue13/adapld-rates.json

Default prompts: Spec-Bench items 43-44 of summarization and rag, 41-42 of mt_bench, 41 of
math_reasoning and qa, and `code_edit-148`, `-152`, `-160` (the suite's 33rd-35th; `code-edit:4` runs the first four).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

DEFAULT_PROMPTS = "summarization@42-44;rag@42-44;mt_bench@40-42;code_edit@32-35;math_reasoning@40-41;qa@40-41"


def main() -> None:
    import torch

    from measure_step_trace import parse_prompts

    from specgraft.api import SpecDecoder
    from specgraft.config import GenerationConfig
    from specgraft.drafters import adapld
    from specgraft.methods import MethodOptions

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", default=DEFAULT_PROMPTS)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--prior-branch", type=float, help="AdaPLDConfig.prior_branch (default: the config's)")
    ap.add_argument("--prior-successor", type=float, help="AdaPLDConfig.prior_successor (default: the config's)")
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    base = SpecDecoder.from_pretrained(args.model, method="ar", dtype=args.dtype, progress=False, options=MethodOptions(cost_table=None))
    # every successor built, so each one's outcome is counted where its branch was right
    priors = {k: v for k, v in (("prior_branch", args.prior_branch), ("prior_successor", args.prior_successor)) if v is not None}
    options = MethodOptions(cost_table=None, adapld=adapld.AdaPLDConfig(lazy=False, **priors))
    dec = base.with_method("adapld", options=options)
    counts: dict[str, float] = defaultdict(float)
    observe = adapld.AdaPLDDrafter.observe

    def counting_observe(self, state, step):
        if state.last is not None:
            tokens, parents, kinds, keys = state.last.tokens, state.last.parents, state.last.kinds, state.last.keys
            truth = step.new_tokens
            right = [False] * len(tokens)
            for i, p in enumerate(parents):
                n, depth, weight = keys[i]
                if (p < 0 or right[p]) and depth <= len(truth):
                    right[i] = tokens[i] == truth[depth - 1]
                    kind = adapld.KINDS[kinds[i]]
                    key = f"main n={n} depth={min(depth, 3)}" if kind == "main" else kind
                    counts[f"{key} tries"] += 1
                    counts[f"{key} hits"] += right[i]
                    if kind == "branch":
                        counts["branch sum q"] += weight
            counts["steps"] += 1
            counts["verified"] += len(step.tree.tokens)
            counts["accepted"] += len(step.verify.accepted)
        observe(self, state, step)

    adapld.AdaPLDDrafter.observe = counting_observe
    for prompt in parse_prompts(args.prompts):
        out = dec.generate(base.encode(prompt.turns[0], chat=True), config=GenerationConfig(max_new_tokens=args.max_new_tokens, budget=args.budget))
        print(f"{prompt.id:16s} {prompt.task:15s} MAT {out.stats.mat:.2f}", flush=True)
    result = {k: round(v, 3) for k, v in sorted(counts.items())}
    result["c = branch hits / sum q"] = round(counts["branch hits"] / max(counts["branch sum q"], 1e-9), 3)
    result["successor rate"] = round(counts["successor hits"] / max(counts["successor tries"], 1), 3)
    for key, value in result.items():
        print(f"{key:28s} {value}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "budget": args.budget, "counts": result}, f, indent=1)


if __name__ == "__main__":
    main()
