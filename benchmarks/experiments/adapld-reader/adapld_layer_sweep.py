"""Choose AdaPLD's reranking layer for a model the way PLD+ / AdaPLD Table 6 do: sweep every layer.

Held-out texts, disjoint from every benchmark run (``bench`` uses the first prompts of each
task): Spec-Bench items from the 41st of each task that has references (summarization, rag,
translation, math_reasoning, mt_bench), as chat prompt + reference answer, and HumanEval problems
100-163 as prompt + canonical solution. Prints the mean accepted copy length per layer, PLD's
most-recent rule and the oracle; the best layer goes into ``drafters/adapld.py``'s
``RERANK_LAYERS``.

    python benchmarks/experiments/adapld-reader/adapld_layer_sweep.py --model qwen2.5-coder-1.5b-instruct --texts 48
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specgraft.calibration.rerank_layer import sweep
from specgraft.models.resolve import resolve_model
from specgraft.suites import DATA_DIR


def held_out(tokenizer, n: int, max_tokens: int) -> tuple[list[list[int]], list[int]]:
    rows = [json.loads(line) for line in (DATA_DIR / "spec_bench.jsonl").open()]
    by_task: dict[str, list[dict]] = {}
    for r in rows:
        by_task.setdefault(r["task"], []).append(r)
    picked = []
    tasks = [t for t in ("summarization", "rag", "translation", "math_reasoning", "mt_bench") if t in by_task]
    per_task = max(1, (n * 2 // 3) // len(tasks))
    for task in tasks:
        picked += [r for r in by_task[task][40:] if r.get("reference")][:per_task]
    texts, starts = [], []
    for r in picked:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": r["turns"][0]}], tokenize=False, add_generation_prompt=True)
        ref = r["reference"][0] if isinstance(r["reference"], list) else r["reference"]
        p, a = tokenizer(prompt).input_ids, tokenizer(str(ref)).input_ids
        texts.append((p + a)[:max_tokens])
        starts.append(len(p))
    he = [json.loads(line) for line in (DATA_DIR / "humaneval.jsonl").open()][100:]
    for r in he[: max(0, n - len(texts))]:
        p, a = tokenizer(r["turns"][0]).input_ids, tokenizer(r["canonical_solution"]).input_ids
        texts.append((p + a)[:max_tokens])
        starts.append(len(p))
    return texts, starts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--texts", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=1536)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    texts, starts = held_out(tokenizer, args.texts, args.max_tokens)
    t0 = time.perf_counter()
    result = sweep(model, texts, starts)
    cfg = model.config
    print(f"{args.model}: {len(texts)} texts, {result.positions} positions with >= 2 anchors, {time.perf_counter() - t0:.0f} s")
    print(f"most recent anchor (PLD): {result.mean_recent:.3f}   oracle: {result.mean_oracle:.3f}")
    for layer, mean in result.mean_by_layer.items():
        print(f"layer {layer:3d}: {mean:.3f}{'  <- best' if layer == result.best_layer else ''}")
    print(f"RERANK_LAYERS[({cfg.model_type!r}, {cfg.num_hidden_layers}, {cfg.hidden_size})] = {result.best_layer}")


if __name__ == "__main__":
    main()
