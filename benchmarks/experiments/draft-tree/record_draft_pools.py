"""Record the draft tree the int8 draft would build at every position of the target's greedy output.

Greedy speculative decoding emits exactly the target's greedy output, and a draft node is accepted
exactly when its path spells the output's next tokens. So for a given drafting rule, one plain
decode of the target (the reference) and the draft's pool of nodes at each position of it is
all it takes to replay *any* rule that only chooses which drafted nodes to verify, or how deep
to draft, step by step and exactly (which positions the steps start at, how many nodes each
verifies, what it accepts), with no timing noise: ``simulate_draft_cuts.py`` does that with a
measured cost curve. This script records the pools (the cpu preset's tree, depth 4, top-k 2,
extension 8, **without** the early stop so that any stop can be replayed by dropping layers;
``--extend-min 0 --budget 0`` records the full chain (``--extend`` nodes, default 8) at every
step, for rules that stop the chain by another test)::

    python benchmarks/experiments/draft-tree/record_draft_pools.py --tasks translation,qa --per-task 6 --max-new-tokens 128 \\
        --out benchmarks/experiments/draft-tree/raw/results-extension/pools-short.jsonl

Output, one JSON line per prompt: ``prompt``, ``task``, ``prompt_tokens``, ``reference`` (the
target's greedy tokens, EOS stopping with ``--tasks``), and ``pools``: per output position ``i``
(the step whose root is the ``i``-th committed token: context = prompt + reference[:i]), the
untrimmed pool ``[tokens, parents, scores, layer_sizes, chain]`` (``scores``: draft path
log-probabilities; ``layer_sizes``: nodes per depth, the chain's nodes last, one per layer;
``chain``: extension nodes, each one one-row draft forward).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch

    from tools.common import load_base, load_draft, model_arguments, task_tuning_prompts, tuning_prompts

    from specgraft.config import GenerationConfig
    from specgraft.drafters.draft_model import PRESETS, DraftModelDrafter, DraftTreeConfig
    from specgraft.models.hf import HFTarget

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=None, help="Spec-Bench tasks (items 41+, EOS stops) instead of the tuning prompts.")
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--code-prompts", type=int, default=3)
    parser.add_argument("--suite", default=None, help="A bench suite spec (e.g. a JSONL file) instead; EOS stops.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--extend", type=int, default=None, help="Extension forwards (default: the preset's 8).")
    parser.add_argument("--extend-min", type=float, default=None, help="The extension's path-probability bound (default: the config's 0.3).")
    parser.add_argument("--budget", type=int, default=None, help="The budget drafting is bounded by (default: the preset's 8; 0: none, so the extension always runs its 8 forwards with --extend-min 0).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    draft = load_draft(args, base)
    preset = PRESETS["cpu"]
    extra = {} if args.extend_min is None else {"extend_min": args.extend_min}
    extend = preset.extend if args.extend is None else args.extend
    config = DraftTreeConfig(depth=preset.depth, top_k=preset.top_k, extend=extend, stop_min=0.0, **extra)
    budget = preset.budget if args.budget is None else (args.budget or None)
    drafter = DraftModelDrafter(HFTarget(draft), config, target_vocab=base.target.vocab_size)
    if args.suite:
        from specgraft.suites import load_suite

        prompts, stop = list(load_suite(args.suite).prompts), True
    elif args.tasks:
        prompts, stop = task_tuning_prompts(args.per_task, args.tasks.split(",")), True
    else:
        prompts, stop = tuning_prompts(args.per_task, args.code_prompts), False
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for p in prompts:
            t0 = time.perf_counter()
            ids = base.encode(p.turns[0], chat=p.chat)
            reference = base.generate(ids, config=GenerationConfig(max_new_tokens=args.max_new_tokens, stop_on_eos=stop)).tokens
            state = drafter.begin(ids, None, GenerationConfig())
            pools = []
            for i in range(len(reference)):
                context = list(ids) + list(reference[:i])
                pool = drafter.draft_pool(state, context, budget)
                extension = state.proposal.extension if state.proposal else None
                pools.append([pool.tokens, pool.parents, [round(s, 5) for s in pool.scores], pool.layer_sizes, extension[1] if extension else 0])
                if state.proposal is not None:
                    drafter.lm.commit(state.slot, range(state.proposal.root_row + 1))  # the root, no accepted node
            drafter.end(state)
            f.write(json.dumps({"prompt": p.id, "task": p.task, "prompt_tokens": len(ids), "reference": list(reference), "pools": pools}) + "\n")
            f.flush()
            print(f"{p.id} ({p.task}): {len(ids)} + {len(reference)} tokens, {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
