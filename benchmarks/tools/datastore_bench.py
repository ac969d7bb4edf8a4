"""Retrieval datastores: sizes, build times, lookup latency, resident memory, and which SearchPath
merge rule accepts more tokens on held-out text.

    python benchmarks/tools/datastore_bench.py --model qwen2.5-coder-1.5b-instruct \
        --datastore ~/.cache/specgraft/datastores/responses --datastore ~/.cache/specgraft/datastores/code

* sizes and build seconds come from each datastore's manifest;
* lookup latency: ``Datastore.next_tokens`` on keys of length 1..8 cut at random positions of the
  tokenised benchmark prompts (spec-bench, humaneval, mt-bench: text the datastores exclude),
  lengths interleaved in one shuffled run, per key length median and p99 in microseconds (one
  call per key, ``time.perf_counter_ns``; the datastore's range caches fill during the run, as
  they do while decoding); the same for ``TokenTrie.next_tokens`` over a stream of the prompts
  (so every key is found), and for ``search_path``;
* RSS (``/proc/self/status``: all, anonymous, file-backed) before loading, after loading
  (memory-mapped: little is resident), and after the lookups (the pages they touched);
* merge rules: the responses corpus split by record (every 10th held out), a datastore built in
  memory from the other records; along each held-out response, a trie over its prompt and the
  response so far, and at every 4th position ``search_path`` of depth 8: how many leading path
  tokens equal the response's next tokens, per rule (``longest``, ``sum``, trie or datastore only).

Prints markdown tables; ``--json FILE`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import numpy as np

from specgraft.retrieval import Datastore, TokenTrie, load_datastores, search_path
from specgraft.retrieval.corpus import CorpusReader

RESPONSES = [
    "/work/shared/data/bench/datastore/alpaca_eval_llama3_8b_instruct_outputs.jsonl",
    "/work/shared/data/bench/datastore/gpteacher_codegen.jsonl",
]


def rss_mb() -> dict[str, float]:
    """Resident MB: all, anonymous (the process's own memory), file-backed (mapped pages of the
    datastores and libraries, shared with the page cache)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "RssAnon", "RssFile"):
            fields[name] = int(value.split()[0]) / 1e3
    return {"rss": fields["VmRSS"], "anon": fields["RssAnon"], "file": fields["RssFile"]}


def fmt_rss(r: dict[str, float]) -> str:
    return f"{r['rss']:.0f} MB ({r['anon']:.0f} anonymous + {r['file']:.0f} file-backed)"


def load_tokenizer(model: str):
    from transformers import AutoTokenizer

    from specgraft.models.resolve import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(model, pull_if_missing=False))


def prompt_streams(tokenizer, suites: str) -> list[list[int]]:
    from specgraft.suites import load_suite

    texts = ["\n\n".join(p.turns) for p in load_suite(suites).prompts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def draw_keys(streams: list[list[int]], length: int, n: int, rng: random.Random) -> list[list[int]]:
    long_enough = [s for s in streams if len(s) > length]
    keys = []
    for _ in range(n):
        s = rng.choice(long_enough)
        i = rng.randrange(0, len(s) - length + 1)
        keys.append(s[i : i + length])
    return keys


def timed(fn, keys) -> tuple[np.ndarray, list]:
    """Per-call microseconds and results, after one untimed pass over the first keys (warm-up)."""
    for key in keys[:50]:
        fn(key)
    micros = np.empty(len(keys))
    results = []
    for i, key in enumerate(keys):
        t = time.perf_counter_ns()
        r = fn(key)
        micros[i] = (time.perf_counter_ns() - t) / 1e3
        results.append(r)
    return micros, results


def latency_table(name: str, fn, streams, n: int, rng: random.Random, max_len: int = 8) -> list[dict]:
    """Per key length: ``fn``'s latency over ``n`` keys, the lengths interleaved in one shuffled
    run so that the structure's caches warm up alike for every length."""
    keys = [(length, key) for length in range(1, max_len + 1) for key in draw_keys(streams, length, n, rng)]
    rng.shuffle(keys)
    micros, results = timed(fn, [key for _, key in keys])
    lengths = np.array([length for length, _ in keys])
    matched = np.array([r.matched for r in results])
    rows = []
    for length in range(1, max_len + 1):
        sel = lengths == length
        rows.append({
            "structure": name, "key_len": length, "median_us": float(np.median(micros[sel])),
            "p99_us": float(np.percentile(micros[sel], 99)), "hit_rate": float(np.mean(matched[sel] > 0)),
            "mean_matched": float(matched[sel].mean()),
        })
    return rows


def merge_rule_eval(tokenizer, depth: int = 8, key_len: int = 8, stride: int = 4, max_docs: int = 300) -> list[dict]:
    """Mean accepted tokens per path (leading path tokens equal to the text's next tokens)."""
    docs = list(CorpusReader(RESPONSES))
    train = [d for i, d in enumerate(docs) if i % 10]
    held = [d for i, d in enumerate(docs) if i % 10 == 0][:max_docs]
    ds = Datastore.from_documents(tokenizer([d.text for d in train], add_special_tokens=False)["input_ids"])
    prompts = tokenizer([d.prompt for d in held], add_special_tokens=False)["input_ids"]
    answers = tokenizer([d.text for d in held], add_special_tokens=False)["input_ids"]
    rules = {
        "longest": dict(merge="longest", use_trie=True, use_ds=True),
        "sum": dict(merge="sum", use_trie=True, use_ds=True),
        "trie only": dict(merge="longest", use_trie=True, use_ds=False),
        "datastore only": dict(merge="longest", use_trie=False, use_ds=True),
    }
    accepted = {name: [] for name in rules}
    for prompt, answer in zip(prompts, answers, strict=True):
        trie = TokenTrie(max_depth=key_len + 1)
        trie.extend(prompt)
        context = list(prompt)
        for i, token in enumerate(answer):
            if i % stride == 0 and len(context) >= 1:
                truth = answer[i : i + depth]
                for name, rule in rules.items():
                    path = search_path(
                        context[-key_len:], depth, trie=trie if rule["use_trie"] else None,
                        datastores=[ds] if rule["use_ds"] else [], key_len=key_len, merge=rule["merge"],
                    )
                    n = 0
                    while n < min(len(path.tokens), len(truth)) and path.tokens[n] == truth[n]:
                        n += 1
                    accepted[name].append(n)
            trie.extend([token])
            context.append(token)
    return [
        {"rule": name, "queries": len(a), "mean_accepted": float(np.mean(a)), "top1": float(np.mean(np.array(a) > 0))}
        for name, a in accepted.items()
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="Model whose tokenizer built the datastores.")
    ap.add_argument("--datastore", action="append", required=True, help="Datastore directory (repeatable); the last is timed.")
    ap.add_argument("--suites", default="spec-bench,humaneval,mt-bench", help="Where lookup keys are cut from.")
    ap.add_argument("--keys", type=int, default=2000, help="Keys per key length.")
    ap.add_argument("--no-merge-eval", action="store_true", help="Skip the merge-rule comparison.")
    ap.add_argument("--json", help="Also write the numbers here.")
    args = ap.parse_args()
    rng = random.Random(0)
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)")

    tokenizer = load_tokenizer(args.model)
    streams = prompt_streams(tokenizer, args.suites)
    rss_before = rss_mb()
    t = time.perf_counter()
    datastores = load_datastores([Path(p).expanduser() for p in args.datastore], tokenizer)
    load_s = time.perf_counter() - t
    rss_loaded = rss_mb()
    results: dict = {"load_average": load, "load_seconds": load_s, "datastores": []}

    print("\n| datastore | documents | tokens | files (MB) | build s (tokenise / suffix array / total) |")
    print("|---|---|---|---|---|")
    for ds in datastores:
        m = ds.manifest
        files = {f.name: f.stat().st_size / 1e6 for f in ds.path.iterdir()}
        b = m["build_seconds"]
        corpus_mb = sum(s["bytes"] for s in m["corpus"]) / 1e6
        print(
            f"| {ds.path.name} ({corpus_mb:.1f} MB corpus) | {m['documents']} | {m['token_count']:,} | "
            f"{sum(files.values()):.1f} | {b['tokenize']:.1f} / {b['suffix_array']:.1f} / {b['total']:.1f} |"
        )
        results["datastores"].append({"path": str(ds.path), "manifest": m, "files_mb": files})

    timed_ds = datastores[-1]
    rows = latency_table(f"datastore {timed_ds.path.name}", timed_ds.next_tokens, streams, args.keys, rng)
    rss_after = rss_mb()
    trie = TokenTrie(max_depth=9)
    stream = [t for s in streams for t in s]
    t = time.perf_counter()
    trie.extend(stream)
    extend_us = (time.perf_counter() - t) / len(stream) * 1e6
    rows += latency_table(f"trie ({len(stream):,} tokens)", trie.next_tokens, streams, args.keys, rng)
    print(f"\nkeys cut from {args.suites} prompts; {args.keys} keys per length; matched = key suffix length answered from")
    print("\n| structure | key length | median µs | p99 µs | hit rate | mean matched |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['structure']} | {r['key_len']} | {r['median_us']:.1f} | {r['p99_us']:.1f} | {r['hit_rate']:.2f} | {r['mean_matched']:.2f} |")
    print(f"\ntrie extend: {extend_us:.2f} µs per token (max_depth 9)")

    paths = []
    for depth in (8, 32):
        keys = draw_keys(streams, 8, 300, rng)
        micros, found = timed(lambda k, d=depth: search_path(k, d, trie=trie, datastores=datastores, key_len=8), keys)
        paths.append({"depth": depth, "median_us": float(np.median(micros)), "p99_us": float(np.percentile(micros, 99)),
                      "mean_len": float(np.mean([len(p) for p in found]))})
        print(f"search_path depth {depth} (trie + {len(datastores)} datastores): median {np.median(micros):.0f} µs, "
              f"p99 {np.percentile(micros, 99):.0f} µs, mean path length {paths[-1]['mean_len']:.1f}")
    print(f"\nRSS before loading: {fmt_rss(rss_before)}\nRSS after loading {len(datastores)} datastores "
          f"({load_s * 1e3:.0f} ms): {fmt_rss(rss_loaded)}\nRSS after the datastore lookups: {fmt_rss(rss_after)}")
    results.update(latency=rows, extend_us=extend_us, search_path=paths,
                   rss_mb={"before": rss_before, "loaded": rss_loaded, "after_lookups": rss_after})

    if not args.no_merge_eval:
        merge = merge_rule_eval(tokenizer)
        print("\nSearchPath merge rules on held-out responses (depth 8, key 8; accepted = leading tokens equal to the text)")
        print("\n| rule | queries | mean accepted | top-1 |\n|---|---|---|---|")
        for r in merge:
            print(f"| {r['rule']} | {r['queries']} | {r['mean_accepted']:.3f} | {r['top1']:.3f} |")
        results["merge_rules"] = merge
    load = os.getloadavg()
    print(f"\nload average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
