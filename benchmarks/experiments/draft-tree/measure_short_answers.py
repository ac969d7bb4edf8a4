"""Draft-model methods against HF assisted generation on short answers, forwards counted (issue 14).

Loads the target and the draft (int8 on CPU: ``--draft-quant auto``) once; for each prompt (first turns, chat template, greedy,
EOS stops as in ``specgraft bench``, ``--max-new-tokens``) it runs ``ar``, HF's
``generate(assistant_model=draft)`` and every variant (in an order that alternates from prompt
to prompt), then ``ar`` again; the speedup is against the mean of the two ``ar`` runs. Beside
the time it records, for HF, the target and draft forwards and the rows they fed (forward
pre-hooks: the prompt's prefill is one forward of ``prompt`` rows), and for our variants the
steps, MAT, verified nodes, the prefill / drafting / verify-forward seconds and, per step, the
draft forwards, the extension ``(depth, chain)``, the accepted nodes and the tree's size. Default
prompts: the tuning prompts no benchmark uses (Spec-Bench items 41+ of ``--tasks``)::

    python benchmarks/experiments/draft-tree/measure_short_answers.py --tasks translation,qa --per-task 3 \\
        --variants draft-tree,draft-tree:stop_min=0.35,graft-prune --out benchmarks/experiments/draft-tree/raw/results-extension/short-answers.json

A variant is ``METHOD[:key=value...]`` as in ``measure_draft_extension.py``; a variant with
``draft_quant=NAME`` drafts with the draft model in those numerics (loaded once more), and
``--hf-quants auto,int8-tensor`` gives HF's assistant each of those drafts (rows ``hf-assisted``
and ``hf-assisted[int8-tensor]``), e.g. to compare the int8 draft's row groups with one scale per
call::

    python benchmarks/experiments/draft-tree/measure_short_answers.py --per-task 6 --hf-quants auto,int8-tensor \\
        --variants draft-tree,draft-tree:draft_quant=int8-tensor --out benchmarks/experiments/draft-tree/raw/results-extension/row-groups-zen3.json
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch

    from tools.alternate import alternate
    from tools.common import load_base, load_draft, model_arguments, parse_variant, task_tuning_prompts, timed_generate

    from specgraft.bench.peers import HFPeer
    from specgraft.drafters.draft_model import DraftModelDrafter
    from specgraft.methods import MethodOptions

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="translation,qa")
    parser.add_argument("--per-task", type=int, default=3)
    parser.add_argument("--variants", default="draft-tree,graft-prune")
    parser.add_argument("--calibration", default="benchmarks/calib/graft-int8.json", help="For the gated (graft*) variants.")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--hf-quants", default="auto", help="Draft numerics HF's assistant runs with, one row each (the first: --draft-quant's).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    prompts = task_tuning_prompts(args.per_task, args.tasks.split(","))
    base = load_base(args)
    graft = base.options.graft
    def draft_in(quant: str):
        return load_draft(args, base, quant)

    draft = draft_in(args.draft_quant)
    hf_quants = args.hf_quants.split(",")
    drafts = {q: draft if i == 0 else draft_in(q) for i, q in enumerate(hf_quants)}

    count = {"target_forwards": 0, "target_rows": 0, "draft_forwards": 0, "draft_rows": 0}

    def counter(kind: str):
        def hook(module, f_args, f_kwargs):
            ids = f_kwargs.get("input_ids", f_args[0] if f_args else None)
            count[f"{kind}_forwards"] += 1
            count[f"{kind}_rows"] += int(ids.shape[-1]) if ids is not None else 0
        return hook

    base.model.register_forward_pre_hook(counter("target"), with_kwargs=True)
    for model in drafts.values():
        model.register_forward_pre_hook(counter("draft"), with_kwargs=True)
    trace: list[tuple] = []
    plain_observe = DraftModelDrafter.observe

    def observe(self, state, step):  # per step: draft forwards, extension, accepted nodes, tree size
        p = state.proposal
        trace.append((len(state.forward_s), p.extension if p else None, len(step.verify.accepted), len(step.tree.tokens)))
        return plain_observe(self, state, step)

    DraftModelDrafter.observe = observe
    hfs = {
        "hf-assisted" if i == 0 else f"hf-assisted[{q}]": HFPeer("hf-assisted", base.model, sorted(base.engine.eos_token_ids), args.max_new_tokens, 0.0, 0, assistant_model=model)
        for i, (q, model) in enumerate(drafts.items())
    }
    variants = []
    for text in args.variants.split(","):
        method, overrides, budget = parse_variant(text)
        options = dataclasses.replace(graft, calibration=args.calibration if method.startswith("graft") else None, **overrides)
        model = draft_in(overrides["draft_quant"]) if "draft_quant" in overrides else draft
        variants.append((text, budget, base.with_method(method, MethodOptions(graft=options, cost_table=None), draft_model=model)))

    def run(dec, ids, budget=None, tokens=args.max_new_tokens):
        trace.clear()
        return timed_generate(dec, ids, tokens, budget, stop_on_eos=True)

    warm = base.encode("Say hello.", chat=True)
    for _, budget, dec in variants:
        run(dec, warm, budget, tokens=8)
    run(base, warm, tokens=8)
    for hf in hfs.values():
        hf.run(warm, 8)
    rows = []
    for i, p in enumerate(prompts):
        ids = base.encode(p.turns[0], chat=p.chat)
        ar_first, ref = run(base, ids)
        timed = {}
        order = [*((name, None, None) for name in hfs), *variants]
        for name, budget, dec in alternate(order, i):
            if dec is None:
                for k in count:
                    count[k] = 0
                r = hfs[name].run(ids)
                timed[name] = {"seconds": r.time_s, "exact": r.tokens == ref.tokens, "new_tokens": len(r.tokens), **count}
                continue
            seconds, out = run(dec, ids, budget)
            st = out.stats
            timed[name] = {
                "seconds": seconds, "exact": out.tokens == ref.tokens, "new_tokens": len(out.tokens), "steps": st.steps,
                "mat": round(st.mat, 3), "nodes": st.tree_nodes, "prefill_s": round(st.prefill_s, 3), "draft_s": round(st.draft_s, 3),
                "forward_s": round(st.forward_s, 3), "accepted": dict(st.accepted_by_source), "per_step": list(trace),
            }
        ar_last, _ = run(base, ids)
        ar_s = (ar_first + ar_last) / 2
        rows.append({"prompt": p.id, "task": p.task, "prompt_tokens": len(ids), "ar_seconds": ar_s, "timed": timed})
        print(f"[{i}] {p.task} {len(ids)}+{len(ref.tokens)} tokens, ar {ar_first:.2f}/{ar_last:.2f} s: "
              + ", ".join(f"{n} {ar_s / r['seconds']:.2f}x" for n, r in timed.items()), flush=True)
    total_ar = sum(r["ar_seconds"] for r in rows)
    summary = {n: round(total_ar / sum(r["timed"][n]["seconds"] for r in rows), 3) for n in rows[0]["timed"]}
    print("overall (total ar time / total time):", summary)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "summary": summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
