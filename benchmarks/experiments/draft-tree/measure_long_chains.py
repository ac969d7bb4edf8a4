"""draft-tree's long chains against its plain tree and HF assisted generation, on tuning prompts (issue 14).

One process: the 1.5B target, the int8 0.5B draft (``--draft-quant auto``), greedy, 128 new
tokens, EOS stops. Per prompt: ``ar`` once (the reference every output must equal), then in an
order that alternates from prompt to prompt: ``tree`` (the cpu preset's plain tree: extension 8,
budget 8), ``long`` (``draft-tree``'s default: long chains, budget 16, the 8 best nodes then only
confident ones, extension 12) and HF's ``generate(assistant_model=draft)``. Prompts: HumanEval
items 100+ (``--code``) and Spec-Bench items 41+ of ``--tasks``, which no benchmark suite uses::

    python benchmarks/experiments/draft-tree/measure_long_chains.py --out benchmarks/experiments/draft-tree/raw/results-issue14/long-chains/tuning-zen3.json

Prints per prompt ``(seconds, equal to ar, steps, verified nodes, MAT, draft s, verify-forward s)``
and per task the speedups over ``ar``; writes the rows to ``--out``.
"""
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch
    from tools.common import code_and_task_prompts, hf_assisted, load_base, load_draft, model_arguments, timed_generate
    from specgraft.methods import MethodOptions
    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--tasks", default="math_reasoning,translation,qa")
    parser.add_argument("--per-task", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    g = base.options.graft
    draft = load_draft(args, base)
    tree = base.with_method("draft-tree", MethodOptions(graft=dataclasses.replace(g, extend=8), cost_table=None), draft_model=draft)
    long = base.with_method("draft-tree", MethodOptions(graft=g, cost_table=None), draft_model=draft)
    hf = hf_assisted(base, draft)
    prompts = code_and_task_prompts(args.code, args.per_task, args.tasks.split(","))
    warm = base.encode("Say hello.", chat=True)
    for dec, budget in ((base, None), (tree, 8), (long, 16)):
        timed_generate(dec, warm, 8, budget, stop_on_eos=True)
    hf.run(warm, 8)
    tot = {}
    rows = []
    for i, p in enumerate(prompts):
        ids = base.encode(p.turns[0], chat=p.chat)
        ar_s, ref = timed_generate(base, ids, 128, stop_on_eos=True)
        res = {"ar": (ar_s, True, len(ref.tokens), None)}
        order = ["tree", "long", "hf"] if i % 2 == 0 else ["hf", "long", "tree"]
        for name in order:
            if name == "hf":
                r = hf.run(ids); res[name] = (r.time_s, r.tokens == ref.tokens, None, None)
            else:
                s, out = timed_generate(tree if name == "tree" else long, ids, 128, 8 if name == "tree" else 16, stop_on_eos=True)
                st = out.stats
                res[name] = (s, out.tokens == ref.tokens, st.steps, st.tree_nodes, round(st.mat, 2), round(st.draft_s, 2), round(st.forward_s, 2))
        for k, v in res.items():
            tot.setdefault(p.task, {}).setdefault(k, 0.0); tot[p.task][k] += v[0]
        rows.append({"id": p.id, "task": p.task, "res": res})
        print(p.id, p.task, len(ids), len(ref.tokens), {k: tuple(round(x, 2) if isinstance(x, float) else x for x in v) for k, v in res.items()}, flush=True)
    for t, d in tot.items():
        print(t, {k: f"{v:.1f}s {d['ar'] / v:.2f}x" for k, v in d.items()})
    allt = {k: sum(d[k] for d in tot.values()) for k in ("ar", "tree", "long", "hf")}
    print("all", {k: f"{v:.1f}s {allt['ar'] / v:.2f}x" for k, v in allt.items()})
    json.dump(rows, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
