"""Draft-tree extension settings timed against each other in one process (issue 14).

``DraftTreeConfig.extend`` continues the best path of the draft tree past its depth, one
one-row draft forward at a time, while the path stays confident (``drafters/draft_model.py``,
*Extension*). This script loads the target and the draft model once and, on every prompt (first
turns, greedy, ``--max-new-tokens`` tokens, EOS does not stop), runs ``ar``, then each variant
in an order that alternates from prompt to prompt, then ``ar`` again; the baseline is the mean
of the two ``ar`` runs of the prompt, so drift is bracketed per prompt. Every output is checked
against ``ar`` token for token. The default prompts are the tuning prompts no benchmark uses
(``measure_budget_gains.tuning_prompts``), so a setting chosen here is not fitted to the
benchmark set::

    python benchmarks/experiments/draft-tree/measure_draft_extension.py --calibration benchmarks/calib/graft-int8.json \\
        --variants graft-prune,graft-prune:extend=8:extend_min=0.3 --out benchmarks/experiments/draft-tree/raw/results-extension/tuning.json

A variant is ``METHOD[:key=value...]`` with ``GraftOptions`` fields (``extend``, ``extend_min``,
``depth``, ``top_k``) and ``budget``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch

    from tools.alternate import bracketed_timings
    from tools.common import load_base, model_arguments, tuning_prompts

    from specgraft.methods import MethodOptions
    from specgraft.suites import load_suite

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--variants", default="graft-prune,graft-prune:extend=8")
    parser.add_argument("--calibration", default=None, help="Graft calibration for the gated variants.")
    parser.add_argument("--suite", default=None, help="Prompt suite (default: the tuning prompts).")
    parser.add_argument("--per-task", type=int, default=1, help="Tuning prompts per Spec-Bench task.")
    parser.add_argument("--code-prompts", type=int, default=3, help="Tuning HumanEval prompts.")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    variants = []
    for text in args.variants.split(","):
        method, overrides, budget = parse_variant(text)
        graft = dataclasses.replace(base.options.graft, calibration=args.calibration, **overrides)
        variants.append((text, budget, base.with_method(method, MethodOptions(graft=graft, cost_table=None))))
    prompts = load_suite(args.suite).prompts if args.suite else tuning_prompts(args.per_task, args.code_prompts)
    encoded = [(p.task, base.encode(p.turns[0], chat=p.chat)) for p in prompts]
    rows = []
    for i, ar_first, ar_last, timed in bracketed_timings(base, variants, [ids for _, ids in encoded], args.max_new_tokens):
        task, ar_s = encoded[i][0], (ar_first + ar_last) / 2
        for name, (seconds, mat, exact) in timed.items():
            rows.append({"prompt": i, "task": task, "variant": name, "seconds": seconds, "ar_seconds": ar_s, "mat": mat, "exact": exact})
        print(f"prompt {i} ({task}): ar {ar_first:.1f}/{ar_last:.1f} s; "
              + ", ".join(f"{n} {s:.1f} s MAT {m:.2f}" for n, (s, m, _) in timed.items()), flush=True)
        summary = summarise(rows, [name for name, _, _ in variants])
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "summary": summary, "rows": rows}, indent=1) + "\n")
    for name, s in summary["overall"].items():
        print(f"{name:<45} {s['seconds']:7.1f} s, {s['speedup']:.3f}x ar, MAT {s['mat']:.2f}, exact {s['exact']}/{s['prompts']}")


def summarise(rows: list[dict], names: list[str]) -> dict:
    """Per task and overall: total seconds, speedup (sum of ``ar`` seconds over the variant's), mean MAT, exact outputs."""
    out: dict = {}
    for group in ["overall", *sorted({r["task"] for r in rows})]:
        out[group] = {}
        for name in names:
            mine = [r for r in rows if r["variant"] == name and group in ("overall", r["task"])]
            if not mine:
                continue
            total, ar_total = sum(r["seconds"] for r in mine), sum(r["ar_seconds"] for r in mine)
            out[group][name] = {
                "seconds": round(total, 2), "ar_seconds": round(ar_total, 2), "speedup": round(ar_total / total, 4),
                "mat": round(sum(r["mat"] for r in mine) / len(mine), 3), "exact": sum(r["exact"] for r in mine), "prompts": len(mine),
            }
    return out


if __name__ == "__main__":
    main()
