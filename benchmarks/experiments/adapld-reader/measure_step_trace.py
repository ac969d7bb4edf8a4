"""Model-free variants step by step on held-out prompts: steps, MAT, verified nodes, forward and drafting time.

One process loads the target once; for every prompt (first turn, chat template, greedy, EOS
stops as in ``specgraft bench``) each variant runs in an order that alternates from prompt to
prompt, stepping the engine itself so each step's rows and forward time are seen. A variant is
``METHOD[:key=value...]``: ``budget=N``, ``row_cost=X``, else a field of the method's config
(``PLDConfig`` for ``pld``, ``AdaPLDConfig`` for the AdaPLD methods). Without ``budget`` a
variant runs at the method's default budget for the cost table given. Every output is checked
against the first variant's on the same prompt (``MISMATCH`` printed otherwise). Prompts come
as ``TASK@FROM-TO`` ranges of Spec-Bench tasks (items 41+ are the tuning ones no benchmark
uses) or ``code_edit@FROM-TO`` (``code-edit:4`` takes the first four)::

    python benchmarks/experiments/adapld-reader/measure_step_trace.py --prompts "summarization@40-42;rag@40-42;code_edit@30-32" \\
        --variants ar,pld,pld:budget=4,adapld,adapld:budget=2
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def parse_prompts(spec: str):
    """``"summarization@40-42;code_edit@30-31"`` -> the prompts, in that order."""
    from specgraft.suites import DATA_DIR, read_prompt_file

    spec_bench = read_prompt_file(DATA_DIR / "spec_bench.jsonl", "spec-bench")
    prompts = []
    for part in spec.split(";"):
        name, _, span = part.partition("@")
        start, _, stop = span.partition("-")
        if not (start.isdigit() and stop.isdigit()):
            raise SystemExit(f"prompt range {part!r} is not TASK@FROM-TO (e.g. summarization@40-42)")
        if name == "code_edit":
            pool = read_prompt_file(DATA_DIR / "code_edit.jsonl", "code-edit")
        else:
            pool = [p for p in spec_bench if p.task == name]
            if not pool:
                raise SystemExit(f"unknown Spec-Bench task {name!r}")
        prompts += pool[int(start) : int(stop)]
    return prompts


def build_variant(base, text: str, cost_table: str | None):
    """``(decoder, budget)`` of ``METHOD[:key=value...]`` over ``base``'s model."""
    from tools.common import parse_variant

    from specgraft.methods import MethodOptions, method_budget
    from specgraft.methods.model_free import ADAPLD_METHODS

    method, overrides, budget = parse_variant(text)
    options = MethodOptions(cost_table=cost_table)
    if "row_cost" in overrides:
        options = dataclasses.replace(options, row_cost=overrides.pop("row_cost"))
    if overrides and method in ADAPLD_METHODS:
        options = dataclasses.replace(options, adapld=dataclasses.replace(options.adapld, **overrides))
    elif overrides and method == "pld":
        options = dataclasses.replace(options, pld=dataclasses.replace(options.pld, **overrides))
    elif overrides:
        raise SystemExit(f"{text}: only pld and the AdaPLD methods take config fields here")
    return base.with_method(method, options=options), budget if budget is not None else method_budget(method, options)


def main() -> None:
    import torch

    from tools.alternate import alternate

    from specgraft.api import SpecDecoder
    from specgraft.config import GenerationConfig
    from specgraft.methods import MethodOptions

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cost-table", default="specgraft/data/costs/qwen2.5-coder-1.5b-instruct-cpu-t2.json",
                    help="Table the default budgets come from ('none': the fixed defaults).")
    ap.add_argument("--prompts", default="summarization@40-42;rag@40-42;code_edit@30-32")
    ap.add_argument("--variants", default="ar,pld,adapld")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    table = None if args.cost_table == "none" else args.cost_table

    base = SpecDecoder.from_pretrained(args.model, method="ar", dtype=args.dtype, progress=False, options=MethodOptions(cost_table=table))
    variants = args.variants.split(",")
    decoders = {v: build_variant(base, v, table) for v in variants}
    prompts = parse_prompts(args.prompts)
    # per variant: steps, emitted tokens, verified nodes, forward s, drafting s, wall s
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0, 0.0, 0.0])
    for i, prompt in enumerate(prompts):
        ids = base.encode(prompt.turns[0], chat=True)
        reference = None
        for variant in alternate(variants, i):
            dec, budget = decoders[variant]
            engine = dec.engine
            t0 = time.perf_counter()
            seq = engine.start(ids, GenerationConfig(max_new_tokens=args.max_new_tokens, budget=budget))
            steps, nodes, forward, draft = 0, 0, 0.0, 0.0
            while not seq.done:
                engine.step(seq)
                steps += 1
                nodes += seq.last_forward.rows - 1
                forward += seq.last_forward.seconds
                draft += seq.last_draft_s
            engine.finish(seq)
            wall = time.perf_counter() - t0
            out = list(seq.new_tokens)
            reference = out if reference is None else reference
            if out != reference:
                print(f"MISMATCH {prompt.id} {variant}")
            row = totals[variant]
            for k, v in enumerate((steps, len(out), nodes, forward, draft, wall)):
                row[k] += v
            print(f"{prompt.id:16s} {len(ids):5d} {variant:30s} b{budget:<3d} steps {steps:4d} MAT {len(out) / steps:5.2f} "
                  f"nodes/step {nodes / steps:5.2f} forward {forward:6.1f} s ({forward / steps:.3f}/step) "
                  f"drafting {draft:5.2f} s wall {wall:6.1f} s", flush=True)
    ar = totals.get("ar")
    print(f"\n{len(prompts)} prompts, {args.max_new_tokens} tokens max")
    for variant, (steps, tokens, nodes, forward, draft, wall) in totals.items():
        speed = f"{ar[5] / wall:5.2f}x ar" if ar else ""
        print(f"{variant:30s} steps {steps:5d} MAT {tokens / steps:5.2f} nodes/step {nodes / steps:5.2f} "
              f"forward {forward:7.1f} s drafting {draft:6.2f} s wall {wall:7.1f} s {speed}")


if __name__ == "__main__":
    main()
