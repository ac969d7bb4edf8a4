"""What the target's and the draft's forwards cost inside draft-tree generations, by rows fed.

``specgraft profile`` (the cost tables) times forwards alone, back to back. Inside a generation
the target's verify pass follows the draft's forwards and the host work between them, and on a
2-core CPU that makes every forward dearer, multi-row ones most (Zen 3: a 7-row verify pass
547 ms in the pipeline against 469 ms alone). This script loads the target and the draft (int8
on CPU: ``--draft-quant auto``) once, decodes short answers (Spec-Bench items 41+ of
``--tasks``, EOS stopping) with each ``--variants`` draft-tree variant and ``ar``, and records
the wall time of every ``forward_rows`` / ``forward_batch`` call of either model by the rows it
fed; it prints medians per (model, rows), the curve ``simulate_draft_cuts.py`` reads::

    python benchmarks/experiments/draft-tree/measure_pipeline_costs.py --tasks translation,qa --per-task 3 \\
        --variants draft-tree,draft-tree:expand=1 --out benchmarks/experiments/draft-tree/raw/results-extension/pipeline-costs-zen3.json
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch

    from tools.common import load_base, load_draft, model_arguments, parse_variant, task_tuning_prompts, timed_generate

    from specgraft.methods import MethodOptions
    from specgraft.models.hf import HFTarget

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="translation,qa")
    parser.add_argument("--per-task", type=int, default=3)
    parser.add_argument("--variants", default="draft-tree,draft-tree:expand=1")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    draft = load_draft(args, base)
    decoders = []
    for text in args.variants.split(","):
        method, overrides, budget = parse_variant(text)
        options = dataclasses.replace(base.options.graft, **overrides)
        decoders.append((budget, base.with_method(method, MethodOptions(graft=options, cost_table=None), draft_model=draft)))
    target = base.engine.target
    seconds: dict[tuple[str, int], list[float]] = defaultdict(list)
    plain_batch, plain_rows = HFTarget.forward_batch, HFTarget.forward_rows

    def forward_batch(self, slots, tokens, parents, *rest, **kw):
        t0 = time.perf_counter()
        out = plain_batch(self, slots, tokens, parents, *rest, **kw)
        seconds[("target" if self is target else "draft", sum(len(t) for t in tokens))].append(time.perf_counter() - t0)
        return out

    def forward_rows(self, slot, tokens, parents, *rest, **kw):
        t0 = time.perf_counter()
        out = plain_rows(self, slot, tokens, parents, *rest, **kw)
        seconds[("target" if self is target else "draft", len(tokens))].append(time.perf_counter() - t0)
        return out

    HFTarget.forward_batch, HFTarget.forward_rows = forward_batch, forward_rows
    warm = base.encode("Say hello.", chat=True)
    for budget, dec in decoders:
        timed_generate(dec, warm, 8, budget, stop_on_eos=True)
    seconds.clear()
    for p in task_tuning_prompts(args.per_task, args.tasks.split(",")):
        ids = base.encode(p.turns[0], chat=p.chat)
        for budget, dec in decoders:
            timed_generate(dec, ids, args.max_new_tokens, budget, stop_on_eos=True)
        timed_generate(base, ids, args.max_new_tokens, stop_on_eos=True)
        print(f"{p.id} ({p.task}) done", flush=True)
    table = {f"{model} {rows}": {"calls": len(v), "median_ms": round(statistics.median(v) * 1000, 1), "mean_ms": round(statistics.mean(v) * 1000, 1)}
             for (model, rows), v in sorted(seconds.items())}
    for key, row in table.items():
        print(f"{key:>10} rows: {row['calls']:4d} calls, median {row['median_ms']:.0f} ms")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "forwards": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
