"""Build the ``rag-cite`` suite: Spec-Bench's RAG items re-prompted HAGRID-style (quote and cite).

**Writes package data**: ``specgraft/data/rag_cite.jsonl`` (the suite shipped in the wheel), and
beside it in ``benchmarks/experiments/rag-cite/`` the two disjoint prompt sets the suite's
experiments need: ``tune.jsonl`` (tree shapes are tuned on these) and ``datastore_prompts.jsonl``
(the target answers these into a datastore of its own text, as READER's Magpie datastore is
model-generated). ``make -C benchmarks rag-cite`` reruns it; the output is byte for byte the same.

READER reports its largest gains on HAGRID (Kamalloo et al., 2023), where answers quote the
retrieved passages and cite them, so most of an answer is a copy of the prompt (its self-repetition
metric, Table 1: 10.32). Spec-Bench's RAG items (``specgraft/data/spec_bench.jsonl``, task
``rag``) are Natural Questions with five retrieved passages and the question on the last line;
here each passage is numbered and the instruction asks for quoted, cited support::

    Answer the question using only the passages below. Support every claim by quoting the
    passage's sentence word for word in double quotes, followed by its number in brackets, like
    "..." [2].

    [1] <passage 1>
    ...
    [5] <passage 5>

    Question: <question>

Split, fixed and by position in the file's RAG order (80 items): the first 3 stay out (they are
``spec-bench:3``'s, the headline's); the suite is the next 12, the tuning set the 8 after them,
the datastore prompts the remaining 57. No item is in two of them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "specgraft" / "data" / "spec_bench.jsonl"
SUITE_OUT = ROOT / "specgraft" / "data" / "rag_cite.jsonl"
EXPERIMENT = ROOT / "benchmarks" / "experiments" / "rag-cite"

INSTRUCTION = (
    "Answer the question using only the passages below. Support every claim by quoting the passage's "
    "sentence word for word in double quotes, followed by its number in brackets, like \"...\" [2]."
)
HEADLINE, SUITE, TUNE = 3, 12, 8


def hagrid_prompt(spec_bench_turn: str) -> str:
    """A Spec-Bench RAG turn (passages one per line, the question last) as a quote-and-cite prompt.

    >>> print(hagrid_prompt("Alpha is a letter.\\nBeta follows it.\\nWhat is alpha?"))
    Answer the question using only the passages below. Support every claim by quoting the passage's sentence word for word in double quotes, followed by its number in brackets, like "..." [2].
    <BLANKLINE>
    [1] Alpha is a letter.
    [2] Beta follows it.
    <BLANKLINE>
    Question: What is alpha?
    """
    lines = [line.strip() for line in spec_bench_turn.split("\n") if line.strip()]
    if len(lines) < 2:
        raise ValueError(f"a RAG turn needs passages and a question, got {len(lines)} line(s)")
    *passages, question = lines
    numbered = "\n".join(f"[{i}] {p}" for i, p in enumerate(passages, 1))
    return f"{INSTRUCTION}\n\n{numbered}\n\nQuestion: {question}"


def records(items: list[dict], task: str) -> list[dict]:
    return [{"id": f"rag_cite-{r['id'].split('-')[-1]}", "task": task, "turns": [hagrid_prompt(r["turns"][0])], "source_id": r["id"]}
            for r in items]


def write(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {path.relative_to(ROOT)}")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    rag = [r for r in map(json.loads, SOURCE.read_text(encoding="utf-8").splitlines()) if r.get("category") == "rag"]
    if len(rag) < HEADLINE + SUITE + TUNE + 1:
        raise SystemExit(f"{SOURCE} has {len(rag)} RAG items, fewer than the split needs")
    suite = rag[HEADLINE: HEADLINE + SUITE]
    tune = rag[HEADLINE + SUITE: HEADLINE + SUITE + TUNE]
    store = rag[HEADLINE + SUITE + TUNE:]
    write(SUITE_OUT, records(suite, "rag_cite"))
    write(EXPERIMENT / "tune.jsonl", records(tune, "rag_cite_tune"))
    write(EXPERIMENT / "datastore_prompts.jsonl", records(store, "rag_cite_store"))


if __name__ == "__main__":
    main()
