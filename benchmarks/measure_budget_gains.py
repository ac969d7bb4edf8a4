"""What each method gains per step at each budget: the measurements that default budgets are
derived from (``specgraft/budget/defaults.py``).

Runs every method greedily at each budget of :data:`BUDGETS` on the tuning prompts that no
benchmark uses (``specgraft tune``'s: Spec-Bench items from the 41st of each task, HumanEval 100
onwards) and records, per budget, the steps, the tokens they emitted, the nodes they verified
and the drafting time, with the target's one-row forward on the same machine measured as
``specgraft profile`` measures a cost table's ``T(1, 1)``: drafting is read as a multiple of it,
so a table of another device scales it.
Measured per budget rather than per tree position because a smaller budget is not the first
nodes of a larger tree (a draft tree's nodes are in topological order, and each drafter picks
its own best nodes for the budget it gets). Tokens per step depend on the method and the models,
not on the device, so one measurement serves every cost table.

**Writes package data**: ``specgraft/data/budget_gains.json``, which ``budget/defaults.py``
and the batch policy read (``make -C benchmarks budget-gains``; about 30 minutes on 2 cores)::

    python benchmarks/measure_budget_gains.py --threads 2 --out specgraft/data/budget_gains.json
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, for tools/
from tools.common import load_base, model_arguments, tuning_prompts  # noqa: E402

#: Budgets each method is measured at, up to every node it can verify (the cpu preset's draft
#: tree holds at most 2 + 4 + 8 + 16 = 30 nodes; prompt lookup proposes only nodes whose estimated
#: acceptance passes its cut, so its larger budgets are caps it rarely fills).
BUDGETS = {
    "pld": (1, 2, 4, 8, 16, 32, 60),
    "recycling": (1, 2, 4, 8, 16, 32),
    "ptd": (1, 2, 4, 8, 16, 32),
    "adapld": (1, 2, 4, 8, 16, 46),
    "draft-tree": (1, 2, 4, 8, 16, 30),
    "graft-prune": (1, 2, 4, 8, 16, 30),
    "graft": (1, 2, 4, 8, 16, 30),
}


def write(path: str, result: dict) -> None:
    """One line per method, so the file reads as a table."""
    methods = ",\n".join(f"  {json.dumps(name)}: {json.dumps(row)}" for name, row in result["methods"].items())
    with open(path + ".tmp", "w") as f:
        f.write('{"meta": ' + json.dumps(result["meta"]) + ',\n "methods": {\n' + methods + "\n }\n}\n")
    os.replace(path + ".tmp", path)


def main() -> None:
    import torch

    from specgraft.suites import conversation_ids
    from specgraft.config import GenerationConfig
    from specgraft.drafters.draft_model import get_preset

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(BUDGETS))
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--code-prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--resume", action="store_true", help="Keep the (method, budget) rows already in --out.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    prompts = tuning_prompts(args.per_task, args.code_prompts)
    has_template = bool(getattr(base.tokenizer, "chat_template", None))
    ids = [conversation_ids(base.tokenizer, p.turns[:1], [], p.chat and has_template) for p in prompts]
    meta = {
        "model": args.model, "draft_model": args.draft_model, "draft_quant": args.draft_quant, "dtype": str(base.target.dtype).replace("torch.", ""), "preset": "cpu",
        "extend": get_preset("cpu").extend,  # derived_budget refuses draft-model trees extended otherwise
        "stop_min": get_preset("cpu").stop_min,  # ... or stopped early otherwise
        "expand": get_preset("cpu").expand,  # ... or expanding another number of nodes per layer
        "prompts": [p.id for p in prompts], "max_new_tokens": args.max_new_tokens, "greedy": True, "measured": time.strftime("%Y-%m-%d"),
        "what": "per budget, over every prompt: steps, tokens emitted, nodes verified, drafting seconds; plain_step_s: "
                "the target's one-row forward as `specgraft profile` measures T(1, 1), on the machine that measured",
    }
    result = {"meta": meta, "methods": {}}
    if args.resume and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        result["methods"], meta["plain_step_s"] = old["methods"], old["meta"]["plain_step_s"]
    else:
        # the target's one-row forward on this machine, measured as `specgraft profile` measures a
        # cost table's T(1, 1): drafting time is stored relative to it and read against a table's
        from specgraft.budget.profile import measure_costs

        meta["plain_step_s"] = round(measure_costs(base.target, batch_sizes=(1,), rows=(1,), reps=5).cost(1, 1), 5)
        print(f"one-row forward (as profiled): {meta['plain_step_s'] * 1000:.1f} ms", flush=True)
    for method in args.methods.split(","):
        dec = base.with_method(method)
        row = result["methods"].setdefault(method, {"budgets": [], "steps": [], "tokens": [], "nodes": [], "draft_s": []})
        for budget in BUDGETS[method]:
            if budget in row["budgets"]:
                continue
            steps = tokens = nodes = 0
            draft_s = 0.0
            t0 = time.perf_counter()
            for prompt_ids in ids:
                seq = dec.engine.start(prompt_ids, GenerationConfig(max_new_tokens=args.max_new_tokens, budget=budget))
                try:
                    while not seq.done:
                        tokens += len(dec.engine.step(seq))
                        steps += 1
                        nodes += seq.last_tree_nodes
                finally:
                    dec.engine.finish(seq)
                draft_s += seq.stats.draft_s
            for key, value in (("budgets", budget), ("steps", steps), ("tokens", tokens), ("nodes", nodes), ("draft_s", round(draft_s, 3))):
                row[key].append(value)
            order = sorted(range(len(row["budgets"])), key=row["budgets"].__getitem__)
            for key in row:
                row[key] = [row[key][i] for i in order]
            print(f"{method:<12} budget {budget:3d}: {steps:4d} steps, {tokens / steps:.2f} tokens/step, "
                  f"{nodes / steps:5.1f} nodes/step, drafting {draft_s / steps / meta['plain_step_s']:.3f} plain steps per step, "
                  f"{time.perf_counter() - t0:6.1f} s", flush=True)
            write(args.out, result)


if __name__ == "__main__":
    main()
