"""Host time of a tree step's small pieces on a GPU (this session's device call 2; run from the repo root):

1. AdaPLD's per-step copy of the verified rows' top-k and unit hidden states to the host: the three
   copies (``top_rows`` + ``unit_rows``), the packed one (``rows_to_host``) and variants of its top-k;
2. a tree's forward inputs built on the device (``HFTarget._tree_inputs``) and on the host
   (``_host_tree_inputs``), for trees of 4, 16 and 46 rows at 1,000 committed tokens.

    python benchmarks/experiments/gpu/gpu-adapld-host/host_bench.py MODEL_DIR
"""
import statistics
import sys
import time

import numpy as np
import torch

from specgraft.drafters.adapld import rows_to_host, top_rows, unit_rows
from specgraft.models.hf import HFTarget


def timed(fn, reps=200):
    for _ in range(10):
        fn()
    torch.cuda.synchronize() if torch.cuda.is_available() else None
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize() if torch.cuda.is_available() else None if torch.cuda.is_available() else None
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1e3


def packed(logits, hidden, k, how):
    if how == "log_softmax":
        ls = torch.log_softmax(logits, -1, dtype=torch.float32)
        best = ls.topk(k, dim=-1)
        ids, probs = best.indices, best.values.exp()
    elif how == "bf16_topk":
        best = logits.topk(k, dim=-1)
        ids, probs = best.indices, (best.values.float() - logits.float().logsumexp(-1, keepdim=True)).exp()
    elif how == "unsorted":
        lf = logits.float()
        best = lf.topk(k, dim=-1, sorted=False)
        ids, probs = best.indices, (best.values - lf.logsumexp(-1, keepdim=True)).exp()
    h = hidden.float()
    return torch.cat([ids.float(), probs, h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12)], -1).cpu().numpy()


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    for n in (1, 3, 8):
        logits = torch.randn(n, 151_936, device=dev, generator=gen).bfloat16()
        hidden = torch.randn(n, 1536, device=dev, generator=gen).bfloat16()
        res = {
            "three copies": timed(lambda: (top_rows(logits, 9), unit_rows(hidden))),
            "packed": timed(lambda: rows_to_host(logits, hidden, 9)),
            "packed log_softmax": timed(lambda: packed(logits, hidden, 9, "log_softmax")),
            "packed bf16 topk": timed(lambda: packed(logits, hidden, 9, "bf16_topk")),
            "packed unsorted": timed(lambda: packed(logits, hidden, 9, "unsorted")),
            "topk alone": timed(lambda: logits.float().topk(9, dim=-1).indices.cpu()),
            "logsumexp alone": timed(lambda: logits.float().logsumexp(-1).cpu()),
            "sync alone": timed(lambda: hidden[:, :1].cpu()),
        }
        print(f"rows {n}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in res.items()), flush=True)
    if len(sys.argv) > 1:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16).to(dev)
        target = HFTarget(model)
        slot = target.allocate()
        target.prefill(slot, list(range(100, 1100)))
        rng = np.random.default_rng(0)
        for n in (4, 16, 46):
            parents = [-1] + [int(rng.integers(0, i + 1)) for i in range(n - 1)]
            tokens = [int(t) for t in rng.integers(3, 1000, n)]
            n_rows = target.graphs.rows(n) if target.graphs is not None else n
            def device_inputs():
                target._ancestors[slot] = target._empty_ancestors()  # nothing pending, as after a commit
                return target._tree_inputs([slot], [torch.tensor(tokens).to(dev)], [torch.tensor(parents).to(dev)], [n], n_rows)

            def host_inputs():
                target._ancestors[slot] = target._empty_ancestors()
                return target._host_tree_inputs(slot, tokens, parents, n_rows)

            dev_ms, host_ms = timed(device_inputs), timed(host_inputs)
            print(f"tree of {n} rows (fed {n_rows}) at 1,000 tokens: device inputs {dev_ms:.3f} ms, host inputs {host_ms:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
