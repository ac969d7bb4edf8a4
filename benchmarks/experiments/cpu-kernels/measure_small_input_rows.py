"""Small inputs padded or not (``models/kernels.py``, ``min_rows``), timed in one process.

Loads the 1.5B target (fp32, oneDNN linears) and the int8 0.5B draft once; for each prompt (first
turns, chat template, greedy, ``--max-new-tokens``, EOS does not stop) runs every method with the
linears' ``min_rows`` at 1 and at ``--rows`` (the order alternating from prompt to prompt), and
reports per method the total time with each setting and whether every output is the same
(and, for the methods, equal to ``ar`` at the same setting)::

    python benchmarks/experiments/cpu-kernels/measure_small_input_rows.py --methods ar,pld,draft-tree --per-task 1 --max-new-tokens 64 \\
        --out benchmarks/experiments/budgets/raw/results-budgets/small-input-rows-zen4.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch

    from tools.alternate import alternate
    from tools.common import load_base, load_draft, model_arguments, timed_generate, tuning_prompts

    from specgraft.methods import MethodOptions
    from specgraft.models.kernels import set_min_rows

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--methods", default="ar,pld,draft-tree")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--code-prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    draft = load_draft(args, base)
    decoders = {m: base.with_method(m, MethodOptions(graft=base.options.graft, cost_table=None), draft_model=draft if m.startswith(("draft", "graft")) else None)
                for m in args.methods.split(",")}
    prompts = tuning_prompts(args.per_task, args.code_prompts)
    variants = [(m, r) for m in decoders for r in (1, args.rows)]
    warm = base.encode("Say hello.", chat=True)
    for m, r in variants:
        set_min_rows(base.model, r)
        timed_generate(decoders[m], warm, 8)
    seconds = {f"{m}@{r}": 0.0 for m, r in variants}
    exact = {f"{m}@{r}": True for m, r in variants}
    for i, p in enumerate(prompts):
        ids = base.encode(p.turns[0], chat=p.chat)
        outs = {}
        for m, r in alternate(variants, i):
            set_min_rows(base.model, r)
            took, out = timed_generate(decoders[m], ids, args.max_new_tokens)
            outs[(m, r)] = out.tokens
            seconds[f"{m}@{r}"] += took
        for m, r in variants:
            exact[f"{m}@{r}"] &= outs[(m, r)] == outs[("ar", r)] if "ar" in decoders else True
        print(f"[{i}] {p.id}, cumulative: " + ", ".join(f"{m}@{r} {seconds[f'{m}@{r}']:.1f}s" for m, r in variants), flush=True)
    set_min_rows(base.model, 1)
    summary = {m: {"seconds_unpadded": round(seconds[f"{m}@1"], 2), f"seconds_padded_to_{args.rows}": round(seconds[f"{m}@{args.rows}"], 2),
                   "padded_speedup": round(seconds[f"{m}@1"] / seconds[f"{m}@{args.rows}"], 3),
                   "exact_vs_ar_unpadded": exact[f"{m}@1"], "exact_vs_ar_padded": exact[f"{m}@{args.rows}"]} for m in decoders}
    print(json.dumps(summary, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "prompts": [p.id for p in prompts], "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
