"""vLLM peers timed in a drift-cancelling order, over the inputs of an earlier bench run (issue 15).

``specgraft bench`` runs each vLLM peer once, one after another, so a slow drift of the machine
over the hour a 1.5B run takes lands on whichever peer runs later; vLLM's per-prompt times on
this CPU also move by +-5% between runs. Two proposers within a few percent of each other are
compared here in an A B B A order (default: ``vllm``, ``vllm-ngram``, ``vllm-specgraft-pld``,
``vllm-specgraft-pld``, ``vllm-ngram``, ``vllm``), each pass its own vLLM subprocess exactly as
the bench runs it (``specgraft.bench.vllm_peers.run_vllm_peer``), over the token ids, EOS ids,
warm-up and token budget the earlier run recorded in ``RUN/vllm/vllm.request.json``. A linear
drift adds the same to both members of each pair, so their summed times compare fairly.

Every output is checked against the first plain pass, token for token. Per peer: total time of
each pass, the mean, speedup over the mean of the plain passes, drafts / draft tokens / accepted
tokens (vLLM's counters), written to ``OUT/summary.json`` (raw rows per pass in ``OUT/N-PEER/``)::

    python benchmarks/tools/vllm_abba.py benchmarks/experiments/vllm/raw/results-vllm/qwen0.5b --out benchmarks/experiments/vllm/raw/results-vllm/abba-qwen0.5b
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Sequence

from specgraft.bench.vllm_peers import VLLM_BASELINE, VLLM_PEERS, VLLMSettings, check_vllm_python, run_vllm_peer
from specgraft.integrations.vllm import CHAIN_COST_ENV

DEFAULT_ORDER = "vllm,vllm-ngram,vllm-specgraft-pld,vllm-specgraft-pld,vllm-ngram,vllm"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="an earlier specgraft bench output directory with vllm/vllm.request.json")
    ap.add_argument("--order", default=DEFAULT_ORDER, help=f"peers, in running order (default {DEFAULT_ORDER})")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument("--spec-tokens", type=int, default=5, help="num_speculative_tokens")
    args = ap.parse_args(argv)

    order = [p.strip() for p in args.order.split(",") if p.strip()]
    unknown = [p for p in order if p not in VLLM_PEERS]
    if unknown or VLLM_BASELINE not in order:
        raise SystemExit(f"--order needs {VLLM_BASELINE} and only vLLM peers ({', '.join(VLLM_PEERS)}); got {unknown or order}")
    request = json.loads((args.run / "vllm" / "vllm.request.json").read_text())
    inputs = [(item["key"], item["ids"]) for item in request["inputs"]]
    settings = VLLMSettings(model=request["model"], num_speculative_tokens=args.spec_tokens, engine=request.get("engine", {}),
                            **({"python": args.vllm_python} if args.vllm_python else {}))
    version = check_vllm_python(settings.python)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"vLLM {version}, {settings.model}, {len(inputs)} inputs, order {' '.join(order)}", flush=True)

    reference: dict[str, list[int]] | None = None
    passes = []
    for i, name in enumerate(order):
        t0 = time.perf_counter()
        runs = run_vllm_peer(
            name, settings, inputs, request["eos_token_ids"], request["max_new_tokens"], request.get("warmup_ids", []),
            args.out / f"{i}-{name}", request.get("warmup_tokens", 16),
        )
        if reference is None and name == VLLM_BASELINE:
            reference = {k: r.tokens for k, r in runs.items()}
        exact = None if reference is None else sum(runs[k].tokens == reference[k] for k, _ in inputs)
        spec = [r.config.get("spec_decode") or {} for r in runs.values()]
        row = {
            "pass": i, "peer": name, "time_s": round(sum(r.time_s for r in runs.values()), 3),
            "tokens": sum(len(r.tokens) for r in runs.values()), "exact": exact,
            **{k: sum(s.get(k, 0) for s in spec) for k in ("drafts", "draft_tokens", "accepted_tokens")},
            "per_input_s": {k: round(r.time_s, 3) for k, r in runs.items()},
        }
        passes.append(row)
        print(f"pass {i} {name:24s} {row['time_s']:8.1f} s  exact {exact}/{len(inputs)}  drafts {row['drafts']} "
              f"draft tokens {row['draft_tokens']} accepted {row['accepted_tokens']}  ({time.perf_counter() - t0:.0f} s wall)", flush=True)
    if reference is not None:  # a plain pass before the reference was known: check it now
        for row in passes:
            if row["exact"] is None:
                runs_dir = args.out / f"{row['pass']}-{row['peer']}" / f"{row['peer']}.results.jsonl"
                rows = [json.loads(line) for line in runs_dir.read_text().splitlines()]
                row["exact"] = sum(r["tokens"] == reference[r["key"]] for r in rows)

    by_peer: dict[str, list[float]] = {}
    for row in passes:
        by_peer.setdefault(row["peer"], []).append(row["time_s"])
    plain = sum(by_peer[VLLM_BASELINE]) / len(by_peer[VLLM_BASELINE])
    summary = {
        "run": str(args.run), "order": order, "model": settings.model, "vllm_version": version,
        "num_speculative_tokens": args.spec_tokens, "chain_cost_env": __import__("os").environ.get(CHAIN_COST_ENV),
        "host": platform.node(), "git": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "passes": passes,
        "peers": {
            p: {"time_s": times, "mean_s": round(sum(times) / len(times), 3), "speedup_vs_plain": round(plain / (sum(times) / len(times)), 4)}
            for p, times in by_peer.items()
        },
        "all_exact": all(row["exact"] == len(inputs) for row in passes),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{'peer':24s} {'passes (s)':>24s} {'mean s':>8s} {'vs plain':>8s}")
    for p, s in summary["peers"].items():
        print(f"{p:24s} {' '.join(f'{t:.1f}' for t in s['time_s']):>24s} {s['mean_s']:8.1f} {s['speedup_vs_plain']:7.3f}x")
    print(f"every output equal to vLLM plain: {summary['all_exact']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
