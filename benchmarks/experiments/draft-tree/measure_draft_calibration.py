"""How often the target accepts a draft-tree node, against the draft's path probability of it.

Cost-aware cuts (``tree.paths.cost_aware_subset``) read a node's estimated acceptance ``p``.
For ``pld`` that estimate is learnt from copy rates; for a draft-model tree the obvious one is
the draft's own path probability ``exp(S)``. This script measures how good that is: it loads the
target and the draft (int8 on CPU: ``--draft-quant auto``) once, decodes the tuning prompts no
benchmark uses (``measure_budget_gains.tuning_prompts``; or ``--tasks`` for Spec-Bench items 41+
of some tasks, EOS stopping) with ``draft-tree`` (the cpu preset, greedy), and records for every
verified node its draft path probability and whether the target accepted it. Greedy decoding is
deterministic, so the counts are not subject to the machine's timing noise::

    python benchmarks/experiments/draft-tree/measure_draft_calibration.py --out benchmarks/experiments/draft-tree/raw/results-extension/draft-calibration.json

Output: per probability bucket, nodes, accepted nodes and the accepted fraction, overall and
per task, and the same split by depth.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/

EDGES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.01)


def bucket(p: float) -> str:
    """The bucket label of probability ``p``.

    >>> bucket(0.04), bucket(0.95), bucket(1.0)
    ('0.00-0.05', '0.90-1.01', '0.90-1.01')
    """
    for lo, hi in zip(EDGES, EDGES[1:]):
        if lo <= p < hi:
            return f"{lo:.2f}-{hi:.2f}"
    raise ValueError(f"probability {p} outside [0, 1]")


def depths(parents: list[int]) -> list[int]:
    """Depth of every node (children of the root at depth 1); parents come before children.

    >>> depths([-1, 0, 0, 1, -1])
    [1, 2, 2, 3, 1]
    """
    out: list[int] = []
    for p in parents:
        out.append(1 if p < 0 else out[p] + 1)
    return out


def table(counts: dict) -> dict:
    return {k: {"nodes": n, "accepted": a, "rate": round(a / n, 3) if n else None} for k, (n, a) in sorted(counts.items())}


def main() -> None:
    import torch

    from tools.common import load_base, model_arguments, task_tuning_prompts, tuning_prompts

    from specgraft.config import GenerationConfig
    from specgraft.methods import MethodOptions

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=None, help="Spec-Bench tasks (items 41+, EOS stops) instead of the tuning prompts.")
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--code-prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    dec = base.with_method("draft-tree", MethodOptions(graft=base.options.graft, cost_table=None))
    prompts = task_tuning_prompts(args.per_task, args.tasks.split(",")) if args.tasks else tuning_prompts(args.per_task, args.code_prompts)
    engine = dec.engine
    seen: list[tuple[str, list[float], list[int], set[int]]] = []
    observe = engine.observe

    def recording(seq, step):  # every verified tree, its scores and what was accepted
        if step.tree.scores is not None and len(step.tree):
            seen.append((current, list(step.tree.scores), list(step.tree.parents), set(step.verify.accepted)))
        observe(seq, step)

    engine.observe = recording
    by_prob: dict = defaultdict(lambda: [0, 0])
    by_task_prob: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    by_depth: dict = defaultdict(lambda: [0, 0])
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, stop_on_eos=bool(args.tasks))
    for p in prompts:
        current = p.task
        ids = dec.encode(p.turns[0], chat=p.chat)
        dec.generate(ids, config=config)
        print(f"{p.id} ({p.task}): {len(seen)} steps so far", flush=True)
    for task, scores, parents, accepted in seen:
        for i, (s, d) in enumerate(zip(scores, depths(parents))):
            key, hit = bucket(min(math.exp(s), 1.0)), int(i in accepted)
            for counts, k in ((by_prob, key), (by_task_prob[task], key), (by_depth, f"depth {d}, {key}")):
                counts[k][0] += 1
                counts[k][1] += hit
    result = {
        "args": vars(args),
        "steps": len(seen),
        "by_probability": table(by_prob),
        "by_task": {t: table(c) for t, c in sorted(by_task_prob.items())},
        "by_depth": table(by_depth),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for k, row in result["by_probability"].items():
        print(f"{k}: {row['accepted']}/{row['nodes']} accepted ({row['rate']})")


if __name__ == "__main__":
    main()
