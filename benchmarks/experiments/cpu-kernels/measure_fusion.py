"""Fused q/k/v and gate/up projections (``models/fusion.py``) against the plain layout: forward
costs of the fp32 1.5B target and the int8 0.5B draft, loaded twice in one process (plain and
fused, with the loaders' kernels), timed over 1-16 new rows at ``--context`` cached tokens in an
order that alternates from repeat to repeat, with the largest logit difference; then, with
``--per-task N``, ``ar`` and ``draft-tree`` (greedy, 128 tokens, EOS stops) on held-out Spec-Bench
prompts (items 41+ of ``--tasks``), plain and fused pairs in an order that alternates from prompt
to prompt, every output compared with the plain ``ar``'s::

    python benchmarks/experiments/cpu-kernels/measure_fusion.py --out benchmarks/experiments/cpu-kernels/raw/results-issue14/fusion/zen3.json
    python benchmarks/experiments/cpu-kernels/measure_fusion.py --forwards 0 --per-task 1 --tasks translation,qa,summarization \
        --out benchmarks/experiments/cpu-kernels/raw/results-issue14/fusion/zen3-generations.json

On a GPU (``--device cuda``: bf16 target and draft, timed with the device synchronised, rows
1-64; on an H100 it gave x0.94-0.96 target and x0.96-0.99 draft forwards, so the loaders fuse
there too; random weights of the catalog shapes serve, ``random_models.py``)::

    python benchmarks/experiments/cpu-kernels/measure_fusion.py --device cuda --model /tmp/rm/qwen2.5-coder-1.5b-instruct \
        --draft-model /tmp/rm/qwen2.5-coder-0.5b-instruct --out gpu-fusion.json
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch

    from specgraft.models.fusion import fused_groups
    from specgraft.models.loading import load_causal_lm
    from specgraft.models.loading import load_draft_model
    from specgraft.models.resolve import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (fp32 target, int8 draft) or cuda (bf16 both)")
    parser.add_argument("--context", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--target-rows", default=None, help="default 1,4,8,16 on CPU, 1,4,16,64 on a GPU")
    parser.add_argument("--draft-rows", default=None, help="default 1,2,4 on CPU, 1,2,8 on a GPU")
    parser.add_argument("--forwards", type=int, default=1, help="0: skip the single forwards")
    parser.add_argument("--per-task", type=int, default=0, help="held-out prompts a task for the generations (0: none)")
    parser.add_argument("--tasks", default="translation,qa,summarization")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gpu = args.device != "cpu"
    dtype, quant = ("bfloat16", "none") if gpu else ("float32", "int8")
    target_rows = args.target_rows or ("1,4,16,64" if gpu else "1,4,8,16")
    draft_rows = args.draft_rows or ("1,2,8" if gpu else "1,2,4")
    path = str(resolve_model(args.model, progress=False))
    pairs = {
        "target": [load_causal_lm(path, dtype, args.device, fuse=f) for f in (False, True)],
        "draft": [load_draft_model(args.draft_model, dtype, args.device, quant=quant, progress=False, fuse=f) for f in (False, True)],
    }
    rows_of = {"target": [int(r) for r in target_rows.split(",")], "draft": [int(r) for r in draft_rows.split(",")]}
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(200, 30000, (1, args.context), generator=gen).to(args.device)

    def clock() -> float:
        if gpu:
            torch.cuda.synchronize()
        return time.perf_counter()

    results = []
    with torch.inference_mode():
        for role, models in pairs.items() if args.forwards else ():
            if fused_groups(models[0]) or not fused_groups(models[1]):
                raise SystemExit(f"{role}: expected a plain and a fused copy, got {[fused_groups(m) for m in models]} fused groups")
            caches = []
            for m in models:
                out = m(context, use_cache=True)
                caches.append(out.past_key_values)
            for rows in rows_of[role]:
                new = torch.randint(200, 30000, (1, rows), generator=gen).to(args.device)
                times: list[list[float]] = [[], []]
                logits = [None, None]
                for rep in range(args.repeats + 1):
                    for i in (0, 1) if rep % 2 == 0 else (1, 0):
                        t0 = clock()
                        out = models[i](new, cache=caches[i], use_cache=True)
                        dt = clock() - t0
                        caches[i].crop(-rows)
                        if rep:  # the first pass warms up
                            times[i].append(dt)
                        logits[i] = out.logits
                diff = float((logits[0] - logits[1]).abs().max())
                same = bool(torch.equal(logits[0].argmax(-1), logits[1].argmax(-1)))
                row = {"model": role, "rows": rows, "plain_ms": [round(t * 1e3, 1) for t in times[0]],
                       "fused_ms": [round(t * 1e3, 1) for t in times[1]], "max_logit_diff": diff, "same_argmax": same}
                row["ratio_median"] = round(statistics.median(times[1]) / statistics.median(times[0]), 3)
                print(f"{role} rows {rows}: plain {statistics.median(times[0]) * 1e3:.1f} ms, fused {statistics.median(times[1]) * 1e3:.1f} ms"
                      f" (x{row['ratio_median']}), max |logit diff| {diff:.2e}, same argmax {same}", flush=True)
                results.append(row)
    generations = generate(args, path, pairs) if args.per_task else []
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"device": args.device, "context": args.context, "threads": args.threads, "rows": results, "generations": generations}
        args.out.write_text(json.dumps(record, indent=1) + "\n")


def generate(args, path: str, pairs: dict) -> list[dict]:
    """``ar`` and ``draft-tree`` on the plain and the fused models, alternating (module docstring)."""
    from tools.common import task_tuning_prompts, timed_generate
    from transformers import AutoTokenizer

    from specgraft.api import SpecDecoder
    from specgraft.methods import MethodOptions

    tokenizer = AutoTokenizer.from_pretrained(path)
    decoders = {}
    for i, layout in enumerate(("plain", "fused")):
        ar = SpecDecoder(pairs["target"][i], tokenizer, "ar", MethodOptions(cost_table=None))
        decoders[layout] = {"ar": ar, "draft-tree": ar.with_method("draft-tree", draft_model=pairs["draft"][i])}
    warm = decoders["plain"]["ar"].encode("Say hello.", chat=True)
    for layout in decoders.values():
        for dec in layout.values():
            timed_generate(dec, warm, 8, stop_on_eos=True)
    rows, totals = [], {}
    for n, prompt in enumerate(task_tuning_prompts(args.per_task, args.tasks.split(","))):
        ids = decoders["plain"]["ar"].encode(prompt.turns[0], chat=prompt.chat)
        outputs, prompt_rows = {}, []
        for layout in ("plain", "fused") if n % 2 == 0 else ("fused", "plain"):
            for method, dec in decoders[layout].items():
                seconds, out = timed_generate(dec, ids, args.max_new_tokens, stop_on_eos=True)
                outputs[layout, method] = out.tokens
                prompt_rows.append({"id": prompt.id, "layout": layout, "method": method, "s": round(seconds, 2),
                                    "tokens": len(out.tokens), "steps": out.stats.steps})
                totals[(layout, method)] = totals.get((layout, method), 0.0) + seconds
        for row in prompt_rows:  # every output against the plain layout's ar
            row["equal"] = outputs[row["layout"], row["method"]] == outputs["plain", "ar"]
            print(row, flush=True)
        rows += prompt_rows
    for (layout, method), seconds in sorted(totals.items()):
        print(f"{layout} {method}: {seconds:.1f} s")
    return rows


if __name__ == "__main__":
    main()
