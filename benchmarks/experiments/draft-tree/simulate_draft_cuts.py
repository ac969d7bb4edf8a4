"""Replay draft-tree rules over recorded pools (``record_draft_pools.py``), exactly, with a cost curve.

A rule here decides, at each step, how deep the draft drafts (the early stop), how wide it
expands, which nodes of the drafted pool are verified (the budget's best-first trim, then
optionally a cost-aware cut), and nothing else; the emitted tokens are the reference's whatever
it decides (greedy), so a replay gives each rule's steps, verified rows, draft forwards and
accepted nodes with no timing noise. Time is then a cost model: per step, the draft forwards
(``--draft-ms`` by rows: the root 1 row, an expansion ``top_k`` rows, an extension 1 row), a
host overhead (``--step-ms``) and one target forward over the verified rows (``--target-ms``, by
rows), against ``ar`` = one 1-row forward per token. Prefills are left out (the same target
prefill for every rule; the draft's own is the same for every draft rule).

Rules (``--rules``, comma list), each a change to the cpu preset as it was recorded (depth 4,
top-k 2 expanding 2, extension 8, early stop 0.35, best 8): ``tree`` (unchanged), ``nostop``,
``stop=S``, ``budget=B``, ``top1`` (expand only the best node of each layer, read off the pool:
its children are there), and ``cut`` / ``cut-raw``: after the trim, verify the best-first prefix
of ``k`` nodes that maximises the step's expected tokens per second, ``(1 + sum p) / (draft +
target(k + 1))``, with ``p`` the node's acceptance estimated from its draft path probability:
``cut`` reads it through a table of acceptance rates by path-probability bucket fitted on
``--fit`` pools (another prompt set), ``cut-raw`` uses the raw probability. Join parts with
``:``, e.g. ``top1:stop=0.5``::

    python benchmarks/experiments/draft-tree/simulate_draft_cuts.py --pools benchmarks/experiments/draft-tree/raw/results-extension/pools-short-zen3.jsonl \
        --fit benchmarks/experiments/draft-tree/raw/results-extension/pools-tuning-zen3.jsonl --rules tree,top1,top1:stop=0.5,cut --by-task

Two limits, both measured (``benchmarks/RESULTS.md``, *Narrow expansion*): the pools come from
two-row draft forwards, and the int8 draft's dynamically quantized activations share one scale
per forward, so a one-row rule's real drafts differ a little (steps matched real runs within 1-3
of 59-127); and the cost curve is the weak part: ``top1:stop=0.5`` was predicted +7% on short
answers (with the curve timed alone and with the one timed in the pipeline) where two timed runs
gave +7% and -5%.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root

from specgraft.tree.paths import best_first_order  # noqa: E402
from specgraft.types import reindex  # noqa: E402

EDGES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.9, 1.01)
# Zen 3 (AMD EPYC family 25 model 1), 2 threads, 1.5B fp32 target and int8 0.5B draft, timed
# inside draft-tree generations of 6 short answers (medians of 14-454 calls, 2026-11-26; the
# target saw 1, 3, 5, 7 and 9 rows, even counts interpolated). Alone, at ~100 cached tokens, the
# same forwards took 280 / 325 / 410 / 469 / 489 ms and 44 / 54 ms: a generation's own traffic
# makes every forward dearer, multi-row ones most.
TARGET_MS = {1: 300, 2: 338, 3: 376, 4: 412, 5: 449, 6: 498, 7: 547, 8: 537, 9: 528, 10: 560, 11: 570, 12: 580, 13: 590, 14: 600}
DRAFT_MS = {1: 58, 2: 64}
STEP_MS = 10.0  # per step: drafting's and verification's host work (``--step-ms``)


def bucket(p: float) -> int:
    for b, (lo, hi) in enumerate(zip(EDGES, EDGES[1:])):
        if lo <= p < hi:
            return b
    return len(EDGES) - 2


def layer_of(sizes: list[int]) -> list[int]:
    """Each pool node's layer (1-based; the chain's nodes are layers of one node after the tree's)."""
    return [d for d, n in enumerate(sizes, start=1) for _ in range(n)]


def accepted_path(tokens, parents, keep, reference, start) -> list[int]:
    """The kept nodes the target accepts: the longest kept path spelling ``reference[start:]``."""
    keep = set(keep)
    path: list[int] = []
    while start + len(path) < len(reference):
        node = path[-1] if path else -1
        nxt = next((i for i in keep if parents[i] == node and tokens[i] == reference[start + len(path)]), None)
        if nxt is None:
            break
        path.append(nxt)
    return path


def best_of_nodes(parents, scores, nodes: list[int], n: int) -> list[int]:
    """The ``n`` best of ``nodes`` (ascending, closed under parents) by path score, best first."""
    return [nodes[j] for j in best_first_order(reindex(parents, nodes), [scores[i] for i in nodes], n)]


def stop_layer(scores, layers: list[int], nodes, stop: float, tree_layers: int) -> int | None:
    """The first layer ``d < tree_layers`` whose best node of ``nodes`` has a path probability under ``stop`` (None: none)."""
    if stop <= 0:
        return None
    return next((d for d in range(1, tree_layers) if max(math.exp(scores[i]) for i in nodes if layers[i] == d) < stop), None)


def parse_rule(text: str) -> dict:
    rule = {"name": text, "stop": 0.35, "budget": 8, "cut": None, "top1": False, "ext": 0.3, "tok": None, "chainonly": False, "keepchain": False}
    for part in text.split(":"):
        if part == "tree":
            continue
        if part == "nostop":
            rule["stop"] = 0.0
        elif part == "top1":
            rule["top1"] = True
        elif part == "chainonly":
            rule["chainonly"] = True
        elif part == "keepchain":
            rule["keepchain"] = True
        elif part in ("cut", "cut-raw"):
            rule["cut"] = part
        elif "=" in part:
            k, v = part.split("=", 1)
            rule[k] = float(v) if k in ("stop", "ext", "tok") else int(v)
        else:
            raise SystemExit(f"unknown rule part {part!r}")
    return rule


def narrowed(pool) -> tuple[list[int], int] | None:
    """``top1``: the nodes of a tree that expands only the best node of each layer (its two
    children kept), read off the top-2 pool: ``(nodes, chain nodes kept)``, or None where the
    pool lacks a child the narrow tree would draft (its best node was not expanded there)."""
    tokens, parents, scores, sizes, chain = pool
    tree_layers = len(sizes) - chain
    layers = layer_of(sizes)
    children: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        children.setdefault(p, []).append(i)
    nodes, cur = [], -1
    for d in range(1, tree_layers + 1):
        kids = [i for i in children.get(cur, []) if layers[i] == d]
        if not kids:
            return None
        nodes += kids
        cur = max(kids, key=lambda i: scores[i])
    chain_nodes = [i for i, l in enumerate(layers) if l > tree_layers]
    if chain_nodes and parents[chain_nodes[0]] == cur:
        return nodes + chain_nodes, len(chain_nodes)
    return nodes, 0


def drafted(pool, stop: float, top_k: int = 2, top1: bool = False, ext: float = 0.3) -> tuple[list[int], list[int]]:
    """The nodes a rule's early stop leaves, and the rows of each draft forward it runs (the
    chain cut where a node to feed has a path probability under ``ext``, the preset's bound,
    so pools recorded with a longer chain replay the preset too)."""
    tokens, parents, scores, sizes, chain = pool
    cut_chain = 0
    for j in range(len(sizes) - chain, len(sizes)):
        start = sum(sizes[:j])  # the j-th layer's (one) node; its parent is the node fed
        feed = parents[start]
        if math.exp(scores[feed]) < ext:
            break
        cut_chain += 1
    if cut_chain < chain:
        keep_n = sum(sizes) - (chain - cut_chain)
        pool = [tokens[:keep_n], parents[:keep_n], scores[:keep_n], sizes[: len(sizes) - (chain - cut_chain)], cut_chain]
        tokens, parents, scores, sizes, chain = pool
    tree_layers = len(sizes) - chain
    layers = layer_of(sizes)
    narrow = narrowed(pool) if top1 else None
    if narrow is not None:
        nodes, kept_chain = narrow
        width = 1
    else:
        nodes, kept_chain, width = list(range(len(tokens))), chain, top_k
    stop_at = stop_layer(scores, layers, nodes, stop, tree_layers)
    if stop_at is None:
        return nodes, [1] + [width] * (tree_layers - 1) + [1] * kept_chain
    return [i for i in nodes if layers[i] <= stop_at], [1] + [width] * (stop_at - 1)


def token_probs(parents: list[int], scores: list[float]) -> list[float]:
    """Each node's own draft probability ``q(token | parent's path)`` (scores are path log-probabilities)."""
    return [math.exp(s - (scores[p] if p >= 0 else 0.0)) for s, p in zip(scores, parents)]


def drafted_by_token(pool, tok: float, ext: float | None, chain_cap: int, chainonly: bool, top_k: int = 2) -> tuple[list[int], list[int]]:
    """HF-style stops (``tok``): the tree stops deeper layers when its best node's own
    probability is under ``tok``, and the chain (recorded in full: ``record_draft_pools.py
    --extend-min 0 --budget 0``) feeds a node only while that node's own probability is at least
    ``tok`` (``ext``: also its path probability at least ``ext``), for at most ``chain_cap``
    nodes. ``chainonly``: keep just the path to the best last-layer node and the chain (no
    siblings), as HF's assisted generation verifies one chain."""
    tokens, parents, scores, sizes, chain = pool
    tree_layers = len(sizes) - chain
    layers = layer_of(sizes)
    tp = token_probs(parents, scores)
    best_of = {d: max((i for i, l in enumerate(layers) if l == d), key=lambda i: scores[i]) for d in range(1, len(sizes) + 1)}
    stop_at = next((d for d in range(1, tree_layers) if tp[best_of[d]] < tok), None)
    last = stop_at or tree_layers
    nodes = [i for i, l in enumerate(layers) if l <= last]
    forwards = [1] + [top_k] * (last - 1)
    if stop_at is None:
        feed = best_of[tree_layers]
        for j in range(tree_layers + 1, tree_layers + 1 + min(chain, chain_cap)):
            if tp[feed] < tok or (ext is not None and math.exp(scores[feed]) < ext):
                break
            node = best_of[j]
            nodes.append(node)
            forwards.append(1)
            feed = node
    if chainonly:
        leaf = max(nodes, key=lambda i: (layers[i], scores[i]))
        path = []
        while leaf >= 0:
            path.append(leaf)
            leaf = parents[leaf]
        nodes = sorted(path)
    return nodes, forwards


def fit_rates(records) -> list[float]:
    """Acceptance rate per path-probability bucket over every node the preset tree verifies."""
    counts = defaultdict(lambda: [0, 0])
    for rec in records:
        ref = rec["reference"]
        for i, pool in enumerate(rec["pools"]):
            tokens, parents, scores, _, _ = pool
            nodes, _ = drafted(pool, 0.35)
            keep = best_of_nodes(parents, scores, nodes, 8)
            on_path = set(accepted_path(tokens, parents, keep, ref, i))
            for j in keep:
                b = bucket(min(math.exp(scores[j]), 1.0))
                counts[b][0] += 1
                counts[b][1] += j in on_path
    rates = []
    for b in range(len(EDGES) - 1):
        n, a = counts[b]
        rates.append((a + 1) / (n + 2))  # Laplace: an empty bucket reads 0.5
    # acceptance should not fall as the probability rises: pool adjacent violators
    for _ in range(len(rates)):
        for b in range(1, len(rates)):
            if rates[b] < rates[b - 1]:
                rates[b] = rates[b - 1] = (rates[b] + rates[b - 1]) / 2
    return rates


def simulate(records, rule: dict, rates: list[float] | None, target_ms: dict, draft_ms: dict, step_ms: float = STEP_MS) -> dict:
    """Replay ``rule`` over ``records`` (pools and references); totals of tokens, steps, verified
    rows, draft forwards, accepted nodes and the modelled milliseconds, plus MAT and the speedup
    over ``ar`` (one 1-row target forward per token)."""
    total = {"tokens": 0, "steps": 0, "rows": 0, "draft_forwards": 0, "accepted": 0, "draft_ms": 0.0, "target_ms": 0.0, "ar_ms": 0.0}
    for rec in records:
        ref, pools = rec["reference"], rec["pools"]
        i = 0
        total["ar_ms"] += len(ref) * target_ms[1]
        while i < len(ref):
            pool = pools[i]
            tokens, parents, scores, _, _ = pool
            if rule["tok"] is not None:
                ext = rule["ext"] if rule["ext"] > 0 else None
                nodes, forwards = drafted_by_token(pool, rule["tok"], ext, rule.get("chain", 8), rule["chainonly"])
            else:
                nodes, forwards = drafted(pool, rule["stop"], top1=rule["top1"], ext=rule["ext"])
            chain_part: list[int] = []
            if rule["keepchain"]:  # the budget trims the tree's layers; the chain is verified whole
                sizes, chain = pool[3], pool[4]
                first_chain = sum(sizes[: len(sizes) - chain])
                chain_part = [n for n in nodes if n >= first_chain]
                nodes = [n for n in nodes if n < first_chain]
            order = best_of_nodes(parents, scores, nodes, rule["budget"])
            if chain_part and parents[chain_part[0]] in order:
                order += chain_part
            d_ms = sum(draft_ms[min(r, max(draft_ms))] for r in forwards) + step_ms
            if rule["cut"] and order:
                probs = [min(math.exp(scores[n]), 1.0) for n in order]
                est = probs if rule["cut"] == "cut-raw" else [rates[bucket(p)] for p in probs]
                best_k, best, tok = 0, 1.0 / (d_ms + target_ms[1]), 1.0
                for k, p in enumerate(est, start=1):
                    tok += p
                    value = tok / (d_ms + target_ms[min(k + 1, max(target_ms))])
                    if value > best:
                        best_k, best = k, value
                order = order[:best_k]
            acc = len(accepted_path(tokens, parents, order, ref, i))
            emitted = min(acc + 1, len(ref) - i)
            total["tokens"] += emitted
            total["steps"] += 1
            total["rows"] += len(order) + 1
            total["draft_forwards"] += len(forwards)
            total["accepted"] += acc
            total["draft_ms"] += d_ms
            total["target_ms"] += target_ms[min(len(order) + 1, max(target_ms))]
            i += acc + 1
    total["mat"] = round(total["tokens"] / total["steps"], 3)
    total["speedup"] = round(total["ar_ms"] / (total["draft_ms"] + total["target_ms"]), 3)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", required=True)
    parser.add_argument("--fit", default=None, help="Pools to fit the acceptance table on (default: --pools itself).")
    parser.add_argument("--rules", default="tree,nostop,cut,cut-raw")
    parser.add_argument("--target-ms", default=None, help="JSON {rows: ms} for 1 .. 14 rows; default: the Zen 3 curve in this file.")
    parser.add_argument("--draft-ms", default=None, help="JSON {rows: ms} for 1 and 2 rows; default: the Zen 3 costs in this file.")
    parser.add_argument("--by-task", action="store_true")
    parser.add_argument("--step-ms", type=float, default=STEP_MS)
    args = parser.parse_args()
    records = [json.loads(line) for line in open(args.pools)]
    fit = [json.loads(line) for line in open(args.fit)] if args.fit else records
    rates = fit_rates(fit)
    print("acceptance by path-probability bucket:", {f"{lo:.2f}": round(r, 3) for lo, r in zip(EDGES, rates)})
    target_ms = {int(k): v for k, v in json.loads(args.target_ms).items()} if args.target_ms else TARGET_MS
    draft_ms = {int(k): v for k, v in json.loads(args.draft_ms).items()} if args.draft_ms else DRAFT_MS
    groups = {"all": records}
    if args.by_task:
        for rec in records:
            groups.setdefault(rec["task"], []).append(rec)
    for name, recs in groups.items():
        print(f"== {name} ({len(recs)} prompts, {sum(len(r['reference']) for r in recs)} tokens)")
        for text in args.rules.split(","):
            t = simulate(recs, parse_rule(text), rates, target_ms, draft_ms, args.step_ms)
            print(f"{text:24s} speedup {t['speedup']:.3f}  MAT {t['mat']:.2f}  steps {t['steps']:4d}  rows/step {t['rows'] / t['steps']:.2f}  "
                  f"draft fwd/step {t['draft_forwards'] / t['steps']:.2f}  draft {t['draft_ms'] / 1000:.1f} s  target {t['target_ms'] / 1000:.1f} s")


if __name__ == "__main__":
    main()
