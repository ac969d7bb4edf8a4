"""Does a method at budget 0 cost what batched ``ar`` costs? (issue 12's fallback bar)

Every method runs the same prompts at one batch size under a policy pinned to plain decoding
(budget 0, no probes, no speculative starts), alternating with ``ar`` (``ar``, m1, m2, ...,
``ar``, m1, m2, ...) so that drift falls on every method alike; reports each pass's wall time
and the median ratio to the neighbouring ``ar`` passes::

    python benchmarks/measure_fallback_overhead.py --batch 8 --rounds 2 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import statistics


from specgraft.batch.budget import FixedBudget, StepPlan


class PinnedPlain(FixedBudget):
    """Budget 0 always: the work a method does when the policy has turned speculation off."""

    def plan(self, batch_size, budgets):
        return StepPlan(cap=0)

    def speculating(self, batch_size, budget):
        return False


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    options = MethodOptions(graft=GraftOptions(draft_model=args.draft_model))
    ar = SpecDecoder.from_pretrained(args.model, method="ar", options=options, progress=False)
    decoders = {"ar": ar} | {m: ar.with_method(m) for m in args.methods.split(",")}
    prompts = [ar.encode(p.turns[0], chat=p.chat) for p in load_suite(args.suite).prompts]
    config = SpecDecoder.make_config(max_new_tokens=args.max_new_tokens, stop_on_eos=False)
    walls: dict[str, list[float]] = {m: [] for m in decoders}
    reference = None
    for r in range(args.rounds):
        for name, dec in decoders.items():
            run = run_batched(dec, prompts, dec.resolve(config), args.batch, PinnedPlain())
            reference = reference or run.outputs
            walls[name].append(run.wall_s)
            print(f"round {r} {name:<11} {run.wall_s:7.2f} s  exact {run.outputs == reference}", flush=True)
    base = statistics.median(walls["ar"])
    for name, w in walls.items():
        print(f"{name:<11} median {statistics.median(w):7.2f} s  ratio vs ar {base / statistics.median(w):.3f}  passes {[round(x, 1) for x in w]}")


if __name__ == "__main__":
    main()
