"""The lean decoder forward (``models/lean.py``) against Hugging Face's, in one process.

Two parts, the two forwards alternating so drift hits them alike:

1. **Forward cost**: the int8 0.5B draft and the fp32 1.5B target, ``--context`` cached tokens,
   a chain of 8 one-row forwards (the draft's extension) and one 16-row tree (a verify pass);
   medians over ``--repeats`` rounds.
2. **End to end**: ``draft-tree`` on held-out prompts (HumanEval 100+, then Spec-Bench item 41 of
   each of ``--tasks``: ``measure_budget_gains.code_and_task_prompts``), greedy, ``--max-new-tokens``; each round runs every prompt once
   lean and once through Hugging Face (the order alternating by round); outputs must be equal.

    python benchmarks/experiments/cpu-kernels/measure_lean.py --rounds 2 --out benchmarks/experiments/cpu-kernels/raw/results-lean/zen5.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def targets_of(decoder) -> list:
    """Every ``HFTarget`` a decoder runs: the target and each draft model's."""
    from specgraft.models.hf import HFTarget

    found = [decoder.target]
    for drafter in decoder.engine.drafters:
        lm = getattr(drafter, "lm", None)
        if isinstance(lm, HFTarget):
            found.append(lm)
    return found


def set_lean(targets: list, saved: list, on: bool) -> None:
    for t, lean in zip(targets, saved):
        t.lean = lean if on else None


def forward_costs(target, context: int, repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    slot = target.allocate()
    target.reserve(context + 64)
    target.prefill(slot, torch.randint(100, 20000, (context,), generator=g).tolist())
    saved = target.lean

    def chain() -> float:
        t = time.perf_counter()
        for i in range(8):
            target.forward_rows(slot, [1000 + i], [i - 1])
        target.discard(slot)
        return (time.perf_counter() - t) / 8

    def tree() -> float:
        t = time.perf_counter()
        target.forward_rows(slot, list(range(2000, 2016)), [-1] + [i // 2 for i in range(15)])
        target.discard(slot)
        return time.perf_counter() - t

    times: dict[str, list[float]] = {f"{k}_{m}": [] for k in ("chain_row", "tree16") for m in ("hf", "lean")}
    for r in range(repeats + 1):
        for mode in (("hf", "lean") if r % 2 else ("lean", "hf")):
            target.lean = saved if mode == "lean" else None
            c, t = chain(), tree()
            if r:  # round 0 warms both up
                times[f"chain_row_{mode}"].append(c)
                times[f"tree16_{mode}"].append(t)
    target.lean = saved
    target.release(slot)
    return {k: round(statistics.median(v) * 1000, 2) for k, v in times.items()}


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/
    from tools.common import code_and_task_prompts
    from specgraft.api import SpecDecoder
    from specgraft.suites import conversation_ids
    from specgraft.methods import GraftOptions, MethodOptions

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--tasks", default="translation,qa,summarization,mt_bench,math_reasoning,rag")
    ap.add_argument("--code-prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dec = SpecDecoder.from_pretrained(
        args.model, method="draft-tree", dtype="float32", progress=False,
        options=MethodOptions(graft=GraftOptions(draft_model=args.draft_model, draft_dtype="float32")),
    )
    targets = targets_of(dec)
    saved = [t.lean for t in targets]
    if any(lean is None for lean in saved):
        raise SystemExit("a model has no lean forward here (SPECGRAFT_LEAN=0, or an unsupported model)")
    result: dict = {"model": args.model, "draft_model": args.draft_model, "threads": args.threads}
    result["forward_ms"] = {"target": forward_costs(targets[0], args.context, args.repeats),
                            "draft": forward_costs(targets[1], args.context, args.repeats)}
    print(json.dumps(result["forward_ms"]), flush=True)

    prompts = code_and_task_prompts(args.code_prompts, 1, [t for t in args.tasks.split(",") if t])
    has_template = bool(getattr(dec.tokenizer, "chat_template", None))
    ids = [conversation_ids(dec.tokenizer, p.turns[:1], [], p.chat and has_template) for p in prompts]
    set_lean(targets, saved, True)
    dec.generate(ids[0], max_new_tokens=8)  # warm-up
    seconds = {"hf": [0.0] * len(ids), "lean": [0.0] * len(ids)}
    tokens: dict[str, list] = {"hf": [None] * len(ids), "lean": [None] * len(ids)}
    for r in range(args.rounds):
        for i, prompt_ids in enumerate(ids):
            for mode in (("lean", "hf") if (r + i) % 2 else ("hf", "lean")):
                set_lean(targets, saved, mode == "lean")
                out = dec.generate(prompt_ids, max_new_tokens=args.max_new_tokens)
                seconds[mode][i] += out.stats.total_s
                if tokens[mode][i] is None:
                    tokens[mode][i] = out.tokens
        print(f"round {r + 1}: lean {sum(seconds['lean']):.1f} s, hf {sum(seconds['hf']):.1f} s", flush=True)
    set_lean(targets, saved, True)
    equal = all(a == b for a, b in zip(tokens["hf"], tokens["lean"]))
    per_prompt = [round(h / l, 4) for h, l in zip(seconds["hf"], seconds["lean"])]
    result["end_to_end"] = {
        "prompts": [p.id for p in prompts], "rounds": args.rounds, "max_new_tokens": args.max_new_tokens,
        "seconds_hf": round(sum(seconds["hf"]), 2), "seconds_lean": round(sum(seconds["lean"]), 2),
        "hf_over_lean": round(sum(seconds["hf"]) / sum(seconds["lean"]), 4), "per_prompt_hf_over_lean": per_prompt,
        "outputs_equal": equal,
    }
    print(json.dumps(result["end_to_end"]), flush=True)
    if args.out:
        from specgraft.bench.environment import environment

        result["environment"] = environment("float32")
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
