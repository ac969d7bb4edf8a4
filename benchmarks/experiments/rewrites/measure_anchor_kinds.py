"""Does AdaPLD's semantic fallback ever fire where its paper says it helps? (the rewrites gate)

AdaPLD anchors a copy at an earlier occurrence of the last token (lexical), else at a position
whose input embedding is close to it (semantic fallback, cosine >= ``threshold``). Its gain over
PLD+ should come from rewrites: text whose meaning is in the context but whose words are not.
This script answers two questions before any timing:

1. **Threshold**: the fraction of *random* token pairs of the target's vocabulary whose input
   embeddings pass the threshold (a fallback that admits many random pairs anchors on noise), and
   the cosine that only 5% of random pairs reach (the per-model threshold the issue asks for).
2. **Anchor kinds**: greedy ``adapld`` on second turns that rewrite the model's own first answer
   (MT-bench items whose second turn asks for a rewrite), counting per drafting step whether the
   anchor was lexical, semantic or missing (``AdaPLDState.anchors``), with the threshold of 1.

Usage (minutes on a 2-core CPU; outputs are plain greedy decoding, any method gives them)::

    python benchmarks/experiments/rewrites/measure_anchor_kinds.py --model qwen2.5-coder-1.5b-instruct \\
        --threads 2 --max-new-tokens 160 --out benchmarks/experiments/rewrites/raw/anchors.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from specgraft.api import SpecDecoder
from specgraft.suites import load_suite

#: MT-bench items whose second turn rewrites the first answer (found by reading their turns)
REWRITES = ("mt_bench-81", "mt_bench-83", "mt_bench-84", "mt_bench-85", "mt_bench-86", "mt_bench-87", "mt_bench-89",
            "mt_bench-131", "mt_bench-133", "mt_bench-140", "mt_bench-144")


def random_pair_cosines(embeddings: torch.Tensor, pairs: int, seed: int = 0) -> np.ndarray:
    """Cosines of ``pairs`` random pairs of distinct rows of ``embeddings`` ``[V, H]``."""
    g = torch.Generator().manual_seed(seed)
    v = embeddings.shape[0]
    a = torch.randint(0, v, (pairs,), generator=g)
    b = (a + torch.randint(1, v, (pairs,), generator=g)) % v
    e = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    return (e[a] * e[b]).sum(-1).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--pairs", type=int, default=200_000)
    ap.add_argument("--limit", type=int, default=len(REWRITES), help="rewrite items to run (first N)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    dec = SpecDecoder.from_pretrained(args.model, method="adapld", dtype="float32")
    threshold = dec.options.adapld.threshold
    cos = random_pair_cosines(dec.model.get_input_embeddings().weight.detach(), args.pairs)
    gate = {"threshold": threshold, "random_pairs": args.pairs, "random_pass_rate": float((cos >= threshold).mean()),
            "cosine_p95": float(np.quantile(cos, 0.95)), "cosine_p99": float(np.quantile(cos, 0.99))}
    print(json.dumps(gate), flush=True)

    prompts = {p.id: p for p in load_suite("mt-bench").prompts}
    config = dec.resolve(SpecDecoder.make_config(max_new_tokens=args.max_new_tokens))
    rows = []
    for pid in REWRITES[: args.limit]:
        p = prompts[pid]
        t0 = time.perf_counter()
        first = dec.generate(p.turns[0], chat=True, config=config).text
        ids = dec.encode_messages([{"role": "user", "content": p.turns[0]}, {"role": "assistant", "content": first},
                                   {"role": "user", "content": p.turns[1]}])
        seq = dec.engine.start(ids, config)
        try:
            while not seq.done:
                dec.engine.step(seq)
            anchors = dict(seq.drafter_states[0].anchors)
            steps, new = seq.stats.steps, seq.stats.new_tokens
        finally:
            dec.engine.finish(seq)
        row = {"id": pid, "turn2": p.turns[1][:80], "anchors": anchors, "steps": steps, "new_tokens": new,
               "seconds": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    total = {k: sum(r["anchors"][k] for r in rows) for k in ("lexical", "semantic", "none")}
    n = sum(total.values()) or 1
    summary = {"anchors": total, "semantic_share": total["semantic"] / n, "lexical_share": total["lexical"] / n,
               "none_share": total["none"] / n}
    print(json.dumps(summary), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"gate": gate, "rows": rows, "summary": summary, "model": args.model,
                                          "max_new_tokens": args.max_new_tokens}, indent=1))


if __name__ == "__main__":
    main()
