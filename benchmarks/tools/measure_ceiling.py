"""READER's Table 1 on our outputs: the retrieval ceiling (self-repetition) with and without datastores.

The bench reports each task's ceiling from prompt + history (``bench/repetition.py``); READER's
Table 1 also gives it "W/ DS", where a match may lie in a datastore of other responses. This
recomputes both from a bench run's plain-decoding (``ar``) outputs, for each datastore set given,
so a datastore's reach is known before any timing::

    python benchmarks/tools/measure_ceiling.py --results benchmarks/experiments/adapld-reader/raw/results-issue13/reader-zen5 \\
        --model qwen2.5-coder-1.5b-instruct --datastore DS/code --datastore DS/responses --datastore DS/answers

Each ``--datastore`` (a comma list is one set) adds a column; ``all`` pools every one given.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from specgraft.bench.repetition import SelfRepetition, self_repetition
from specgraft.bench.session import plain_answers
from specgraft.cli.datastore import load_tokenizer
from specgraft.retrieval import Datastore


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, type=Path, help="A bench output directory (results.jsonl, run.json).")
    ap.add_argument("--model", required=True, help="The target, for its tokenizer.")
    ap.add_argument("--datastore", action="append", default=[], help="A datastore set (comma list); repeatable.")
    ap.add_argument("--json", type=Path, help="Also write the table here.")
    args = ap.parse_args()

    tokenizer = load_tokenizer(args.model)
    answers = plain_answers(args.results, tokenizer)
    sets = {name: [Datastore.load(p, tokenizer=tokenizer) for p in name.split(",")] for name in args.datastore}
    if len(sets) > 1:
        sets["all"] = [s for stores in list(sets.values()) for s in stores]
    columns = {"prompt + history": []} | {name: stores for name, stores in sets.items()}
    counts: dict[str, dict[str, list[SelfRepetition]]] = defaultdict(lambda: defaultdict(list))
    for r, ids in answers:
        for name, stores in columns.items():
            sr = self_repetition(ids, r["tokens"], stores=stores)
            counts[name][r["task"]].append(sr)
            counts[name]["overall"].append(sr)
    tasks = list(dict.fromkeys(r["task"] for r, _ in answers)) + ["overall"]
    table = {name: {t: round(SelfRepetition.pool(counts[name][t]).value, 3) for t in tasks} for name in columns}
    print("| task | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for t in tasks:
        print(f"| {t} | " + " | ".join(f"{table[name][t]:.2f}" for name in columns) + " |")
    if args.json:
        args.json.write_text(json.dumps({"results": str(args.results), "model": args.model, "ceiling": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
