"""Does a method at budget 0 cost what batched ``ar`` costs? (issue 12's fallback bar)

Every method runs the same prompts at one batch size under a policy pinned to plain decoding
(budget 0, no probes, no speculative starts), alternating with ``ar`` (``ar``, m1, m2, ...,
``ar``, m1, m2, ...) so that drift falls on every method alike; reports each pass's wall time
and the ratio of the median ``ar`` pass to the method's median pass::

    python benchmarks/experiments/batching/measure_fallback_overhead.py --batch 8 --rounds 2 --max-new-tokens 32

``--policy adaptive`` runs each method under its own :class:`~specgraft.batch.AdaptiveBudget`
instead (from the model's cost table and the method's measured gains, as ``bench-serve`` does),
one policy per method kept across the rounds as a server keeps one: the alternating form of
``bench-serve``'s comparison at one batch size, for when single passes drift more than the
differences measured (``--out`` writes the passes as JSON).

``--profile`` runs every pass under cProfile and prints, per method and round, the functions
whose own time most exceeds ``ar``'s: the same calls in the same numbers mean the same work,
whatever the wall clocks say (on the Zen 3, draft-tree pinned at budget 0 made exactly ``ar``'s
calls at B = 4, and its passes ran 2% faster than ``ar``'s, the drift of running second).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics


from specgraft.budget.policy import FixedBudget, StepPlan


class PinnedPlain(FixedBudget):
    """Budget 0 always: the work a method does when the policy has turned speculation off."""

    def plan(self, batch_size, budgets, keys=None):
        return StepPlan(cap=0)

    def speculating(self, batch_size, budget):
        return False


def own_times(prof: cProfile.Profile) -> dict[str, tuple[float, int]]:
    """Own (exclusive) seconds and calls per function, keyed ``file:line(name)``."""
    stats = pstats.Stats(prof, stream=io.StringIO()).stats  # type: ignore[attr-defined]
    return {f"{f.split('/')[-1]}:{line}({fn})": (row[2], row[1]) for (f, line, fn), row in stats.items()}


def print_excess(own: dict[str, tuple[float, int]], ar: dict[str, tuple[float, int]], title: str, top: int = 15) -> None:
    print(f"\n{title} (top {top}; calls: method / ar)")
    excess = sorted(((own.get(k, (0.0, 0))[0] - ar.get(k, (0.0, 0))[0], k) for k in set(own) | set(ar)), reverse=True)[:top]
    for d, k in excess:
        print(f"{d:+8.3f} s  {own.get(k, (0.0, 0))[1]:>7} / {ar.get(k, (0.0, 0))[1]:<7} {k}")


def main() -> None:
    import torch

    from specgraft.api import SpecDecoder
    from specgraft.bench.batched import run_batched
    from specgraft.methods import GraftOptions, MethodOptions
    from specgraft.suites import load_suite

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--methods", default="pld,recycling,draft-tree")
    parser.add_argument("--suite", default="spec-bench:1,humaneval:2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--policy", choices=("plain", "adaptive"), default="plain")
    parser.add_argument("--out", default=None)
    parser.add_argument("--profile", action="store_true", help="cProfile every pass; print where each method's own time exceeds ar's")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    options = MethodOptions(graft=GraftOptions(draft_model=args.draft_model))
    ar = SpecDecoder.from_pretrained(args.model, method="ar", options=options, progress=False)
    decoders = {"ar": ar} | {m: ar.with_method(m) for m in args.methods.split(",")}
    prompts = [ar.encode(p.turns[0], chat=p.chat) for p in load_suite(args.suite).prompts]
    config = SpecDecoder.make_config(max_new_tokens=args.max_new_tokens, stop_on_eos=False)
    policies = {m: PinnedPlain() for m in decoders}
    if args.policy == "adaptive":
        from specgraft.budget.adaptive import AdaptiveBudget
        from specgraft.budget.costs import CostTable

        if ar.options.cost_table is None:
            raise SystemExit("no cost table for this model and device: run `specgraft profile` first")
        costs = CostTable.load(ar.options.cost_table)
        policies |= {m: AdaptiveBudget.for_method(costs, m) for m in decoders if m != "ar"}
    walls: dict[str, list[float]] = {m: [] for m in decoders}
    passes = []
    reference = None
    profiles: dict[tuple[int, str], dict[str, tuple[float, int]]] = {}
    for r in range(args.rounds):
        for name, dec in decoders.items():
            prof = cProfile.Profile() if args.profile else None
            if prof:
                prof.enable()
            run = run_batched(dec, prompts, dec.resolve(config), args.batch, policies[name])
            if prof:
                prof.disable()
                profiles[(r, name)] = own_times(prof)
            reference = reference or run.outputs
            walls[name].append(run.wall_s)
            mat = sum(len(o) for o in run.outputs) / max(1, sum(st.steps for st in run.stats))
            passes.append({"round": r, "method": name, "wall_s": round(run.wall_s, 3), "mat": round(mat, 3), "exact": run.outputs == reference})
            print(f"round {r} {name:<11} {run.wall_s:7.2f} s  MAT {mat:.2f}  exact {run.outputs == reference}", flush=True)
    base = statistics.median(walls["ar"])
    summary = {}
    for name, w in walls.items():
        summary[name] = round(base / statistics.median(w), 4)
        print(f"{name:<11} median {statistics.median(w):7.2f} s  ratio vs ar {base / statistics.median(w):.3f}  passes {[round(x, 1) for x in w]}")
    for (r, name), own in profiles.items():
        if name != "ar":
            print_excess(own, profiles[(r, "ar")], f"round {r}: {name}'s own time beyond ar's")
    if args.out:
        import json
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "passes": passes, "ratio_vs_ar": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
