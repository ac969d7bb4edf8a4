"""draft-tree's cost-aware cut against the same tree without it and HF assisted generation (issue 14).

One process: the 1.5B target, the int8 0.5B draft (``--draft-quant auto``), greedy, 128 new
tokens, EOS stops. Per prompt: ``ar`` once (the reference every output must equal), then in an
order that alternates from prompt to prompt: ``long`` (``draft-tree`` with long chains and no
cut, ``GraftOptions(row_cost=0)``), ``cut`` (``draft-tree``'s default: the cpu preset's
``long_row_cost``), ``adapt`` (the default with ``extend_adapt=True``: each sequence caps its
chains by what the target accepted of its recent ones), ``copy`` and ``nocopy`` (the default
with ``copy_ahead`` rows guessed per extension forward, ``--copy-ahead``, and with none; the
default guesses 7 since copy-ahead was measured with this script: that run's ``cut`` had none),
``cut@R`` (the default with the cut at row cost ``R``) and HF's
``generate(assistant_model=draft)`` (``hf``), those named by ``--variants``, ``--rounds`` times. ``hf``
runs in a child process with its own target and draft (``--peer-process separate``, the default,
as ``specgraft bench`` runs it: ``specgraft.bench.peer_process``; ``shared`` runs it on this
process's models, which slowed our tree's later steps in the bench). Prompts:
HumanEval items 100+ (``--code``) and Spec-Bench items 41+ of ``--tasks`` (which no benchmark
suite uses), or the first turns of a JSONL ``--suite``::

    python benchmarks/experiments/draft-tree/measure_tree_cut.py --out benchmarks/experiments/draft-tree/raw/results-issue14/tree-cut/tuning-zen3.json

Prints per prompt and round ``(seconds, equal to ar, steps, verified nodes, MAT, draft s,
verify-forward s)`` and per task the speedups over ``ar``; writes the rows to ``--out``.
"""
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch
    from tools.common import hf_assisted, load_base, load_draft, model_arguments
    from specgraft.methods import MethodOptions

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--code", type=int, default=3)
    parser.add_argument("--tasks", default="translation,qa,math_reasoning,rag")
    parser.add_argument("--per-task", type=int, default=2)
    parser.add_argument("--suite", default=None, help="a JSONL prompt file instead of the tuning prompts")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variants", default="long,cut,hf", help="comma-separated, of long, cut, cut@R (row cost R), adapt, copy, nocopy, hf")
    parser.add_argument("--copy-ahead", type=int, default=7, help="the copy variant's guessed rows per extension forward")
    parser.add_argument("--peer-process", choices=("separate", "shared"), default="separate",
                        help="where hf runs: a child process with its own models, or this one")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    g = base.options.graft
    draft = load_draft(args, base)
    variants = args.variants.split(",")
    known = {"long": dataclasses.replace(g, row_cost=0.0), "cut": g, "adapt": dataclasses.replace(g, extend_adapt=True),
             "copy": dataclasses.replace(g, copy_ahead=args.copy_ahead), "nocopy": dataclasses.replace(g, copy_ahead=0)}
    for v in variants:  # `cut@R`: the default with the cost-aware cut at row cost R
        if v.startswith("cut@"):
            known[v] = dataclasses.replace(g, row_cost=float(v[4:]))
    unknown = [v for v in variants if v not in known and v != "hf"]
    if unknown:
        parser.error(f"unknown variants {unknown}: choose from {sorted(known) + ['hf']}")
    decoders = {
        v: base.with_method("draft-tree", MethodOptions(graft=known[v], cost_table=None), draft_model=draft)
        for v in variants if v != "hf"
    }
    process = None
    if "hf" in variants and args.peer_process == "separate":
        from specgraft.bench.peer_process import PeerProcess, PeerSpec

        spec = PeerSpec(model=args.model, dtype=args.dtype, device=str(base.target.device), threads=args.threads,
                        draft_model=args.draft_model, draft_quant=args.draft_quant, peers=("hf-assisted",),
                        max_new_tokens=128, temperature=0.0, seed=0)
        process = PeerProcess(spec).start()
        hf = process.peers()["hf-assisted"]
    else:
        hf = hf_assisted(base, draft) if "hf" in variants else None
    try:
        run_rounds(args, base, decoders, hf, variants)
    finally:
        if process is not None:
            process.close()


def run_rounds(args, base, decoders, hf, variants) -> None:
    """Per prompt: ``ar`` once, then every variant in alternating order, ``args.rounds`` times."""
    from tools.alternate import alternate
    from tools.common import code_and_task_prompts, timed_generate
    from specgraft.suites import read_prompt_file

    if args.suite:
        prompts = read_prompt_file(Path(args.suite), Path(args.suite).stem)
        prompts = [p for p in prompts if p.task in args.tasks.split(",")] if args.tasks else prompts
    else:
        prompts = code_and_task_prompts(args.code, args.per_task, args.tasks.split(","))
    warm = base.encode("Say hello.", chat=True)
    timed_generate(base, warm, 8, stop_on_eos=True)
    for dec in decoders.values():
        timed_generate(dec, warm, 8, 16, stop_on_eos=True)
    if hf is not None:
        hf.run(warm, 8)
    tot: dict[str, dict[str, float]] = {}
    rows = []
    for i, p in enumerate(prompts):
        ids = base.encode(p.turns[0], chat=p.chat)
        ar_s, ref = timed_generate(base, ids, 128, stop_on_eos=True)
        for r in range(args.rounds):
            res = {"ar": (ar_s, True, len(ref.tokens))} if r == 0 else {}
            order = alternate(variants, i + r)
            for name in order:
                if name == "hf":
                    run = hf.run(ids)
                    res[name] = (run.time_s, run.tokens == ref.tokens)
                else:
                    s, out = timed_generate(decoders[name], ids, 128, 16, stop_on_eos=True)
                    st = out.stats
                    res[name] = (s, out.tokens == ref.tokens, st.steps, st.tree_nodes, round(st.mat, 2), round(st.draft_s, 2), round(st.forward_s, 2))
            for k, v in res.items():
                tot.setdefault(p.task, {}).setdefault(k, 0.0)
                tot[p.task][k] += v[0] / (1 if k == "ar" else args.rounds)
            rows.append({"id": p.id, "task": p.task, "round": r, "res": res})
            print(p.id, p.task, len(ids), len(ref.tokens), r, {k: tuple(round(x, 2) if isinstance(x, float) else x for x in v) for k, v in res.items()}, flush=True)
    for t, d in tot.items():
        print(t, {k: f"{v:.1f}s {d['ar'] / v:.2f}x" for k, v in d.items()})
    names = ["ar", *variants]
    allt = {k: sum(d[k] for d in tot.values()) for k in names}
    print("all", {k: f"{v:.1f}s {allt['ar'] / v:.2f}x" for k, v in allt.items()})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    json.dump(rows, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
