"""How often a draft model's top-1 is the target's next token, teacher-forced, per draft numerics.

Greedy speculative decoding accepts a draft token exactly when it is the target's next greedy
token, so a draft's top-1 agreement along the target's own output is the accuracy that drafting
lives on, free of timing noise. For every prompt of a ``record_draft_pools.py`` file (its
``reference``: the target's greedy output) the draft prefills the prompt as the drafter does (one
forward) and is then fed the reference one token per forward; at each position its argmax is
compared with the next reference token (the prefill's logits: its last row only, as the drafter
computes them). ``--quants`` lists the numerics (``models/quant.py``)::

    python benchmarks/experiments/draft-numerics/measure_draft_top1.py --references benchmarks/experiments/draft-tree/raw/results-extension/pools-short-zen3.jsonl \\
        --quants int8,int8-tensor,none --out benchmarks/experiments/draft-tree/raw/results-extension/draft-top1-zen3.json

Prompts are re-encoded from their ids (Spec-Bench items, chat template) and checked against the
recorded prompt length. Prints, per numerics, top-1 hits over positions and the prefill's time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import warnings

    import torch
    from transformers import AutoTokenizer, DynamicCache

    from tools.common import task_tuning_prompts

    from specgraft.suites import conversation_ids
    from specgraft.models.loading import load_draft_model
    from specgraft.models.resolve import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--references", required=True, help="A record_draft_pools.py JSONL file (Spec-Bench prompts).")
    parser.add_argument("--quants", default="int8,int8-tensor,none")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)

    records = [json.loads(line) for line in open(args.references)]
    by_id = {p.id: p for p in task_tuning_prompts(100)}
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.draft_model, progress=False))
    prompts = []
    for rec in records:
        p = by_id[rec["prompt"]]
        ids = conversation_ids(tokenizer, p.turns[:1], [], p.chat)
        if len(ids) != rec["prompt_tokens"]:
            raise SystemExit(f"{rec['prompt']}: {len(ids)} prompt tokens here, {rec['prompt_tokens']} recorded")
        prompts.append((rec["prompt"], ids, rec["reference"]))

    results = {}
    for quant in args.quants.split(","):
        model = load_draft_model(args.draft_model, "float32", "cpu", progress=False, quant=quant)
        hits = positions = 0
        prefill_s = 0.0
        per_prompt = {}
        with torch.inference_mode():
            model(torch.tensor([prompts[0][1]]), past_key_values=DynamicCache(), use_cache=True)  # warm-up
            for name, ids, reference in prompts:
                cache = DynamicCache()
                t0 = time.perf_counter()
                logits = model(torch.tensor([ids]), past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
                prefill_s += time.perf_counter() - t0
                h = 0
                for i, token in enumerate(reference):
                    h += int(logits.argmax()) == token
                    if i + 1 < len(reference):
                        logits = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True).logits[0, -1]
                per_prompt[name] = [h, len(reference)]
                hits, positions = hits + h, positions + len(reference)
        results[quant] = {"top1": round(hits / positions, 4), "hits": hits, "positions": positions, "prefill_s": round(prefill_s, 3), "per_prompt": per_prompt}
        print(f"{quant:12s} top-1 {hits}/{positions} = {hits / positions:.1%}   prefill {prefill_s:.2f} s over {len(prompts)} prompts", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
