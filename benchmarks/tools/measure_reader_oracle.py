"""READER with an oracle for retrieval: how much could its widening and deepening paths add to `draft-tree`?

READER (issue 13) widens `draft-tree`'s tree with a retrieved path at the root (``d_search``
tokens) and deepens it with one hung under the draft's best node (``d_deep``). Measured, those
paths were accepted a handful of times in hundreds. This asks whether *any* retrieval could do
better, by replacing READER's search with an oracle that knows plain decoding's answer (the
``ar`` rows of a bench run) and proposes, at both places, the true continuation:

- ``retrievable``: as far as a search keyed by at least ``--min-key`` tokens could have found
  it, level by level as READER's SearchPath extends a path (Alg. 3): each next token must follow
  the last ``min-key`` tokens (of the context, the draft prefix and the path so far) somewhere in
  the prompt and output so far (the trie) or in a datastore (``--datastore``). No ranking or
  frequency stands in the way, so no search over these stores whose every level is keyed by that
  many tokens can propose a longer right path.
- ``clairvoyant``: the true continuation up to the path's depth, found or not: the ceiling of
  READER's tree *shape* whatever the retrieval.

The draft tree is the real one, and the verifier is the real one: outputs must equal ``ar``
token for token (checked). Deterministic counts (steps, MAT, accepted by source, verified rows a
step); the times are one pass and only indicative. Example (issue 13's HumanEval set, the
datastores of the README; ~3 min a variant on a 2-core Zen 5)::

    python benchmarks/tools/measure_reader_oracle.py --results benchmarks/experiments/adapld-reader/raw/results-issue13/reader-answers-humaneval6-zen5 \\
        --datastore ~/.cache/specgraft/datastores/code --datastore ~/.cache/specgraft/datastores/answers \\
        --variant draft-tree --variant reader --variant retrievable --variant clairvoyant \\
        --variant 'retrievable:{"d_search": 16, "d_deep": 8}'

A variant is ``draft-tree``, ``reader`` (READER's own search), or ``retrievable`` /
``clairvoyant``, each optionally followed by ``:`` and a JSON object of ``ReaderConfig`` fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Sequence

import torch

from specgraft.api import SpecDecoder
from specgraft.bench.repetition import longest_match, store_match
from specgraft.bench.session import plain_answers
from specgraft.drafters.reader_retrieval import ReaderConfig, ReaderRetrieval
from specgraft.methods import GraftOptions, MethodOptions
from specgraft.retrieval import SearchPath


@dataclasses.dataclass
class Truth:
    """The answer of the generation under way: plain decoding's tokens after ``prompt``."""

    prompt: list[int]
    output: list[int]
    mode: str = "retrievable"
    stores: Sequence = ()
    min_key: int = 1
    """Tokens (>= 1) each retrieved token must follow somewhere in the trie or a datastore."""


TRUTH: Truth | None = None
_propose, _search = ReaderRetrieval.propose, ReaderRetrieval.search


def oracle_propose(self, state, context, budget):
    state.oracle_len = len(context)  # the deepening search only sees the key's suffix
    return _propose(self, state, context, budget)


def oracle_search(self, state, context, prefix, depth) -> SearchPath:
    """The true continuation after the context and ``prefix`` (empty when ``prefix`` is already
    wrong), cut where retrieval could no longer have found it (``retrievable``)."""
    state.searches += 1
    truth = TRUTH
    t = state.oracle_len - len(truth.prompt)
    ahead = truth.output[t:]
    if list(prefix) != ahead[: len(prefix)] or depth <= 0:
        return SearchPath((), (), (), ())
    path = ahead[len(prefix) : len(prefix) + depth]
    sources = ["trie"] * len(path)
    if truth.mode == "retrievable":
        # level by level, as SearchPath extends a path: the next token must follow the last
        # min_key tokens (context, prefix, path so far) somewhere in the trie or a datastore
        seen = truth.prompt + truth.output[: t + len(prefix)]
        k = truth.min_key
        for i, token in enumerate(path):
            gram = (seen + path[:i])[-k:] + [token]
            if longest_match(gram, seen) == len(gram):
                continue
            if any(store_match(gram, s) == len(gram) for s in truth.stores):
                sources[i] = "datastore"
                continue
            path, sources = path[:i], sources[:i]
            break
    n = len(path)
    return SearchPath(tuple(path), tuple(sources), (1.0,) * n, (self.config.key_len,) * n)


def use_oracle(on: bool) -> None:
    """Route every :class:`ReaderRetrieval`'s search through the oracle (``TRUTH`` says the
    answer and the mode), or restore READER's own."""
    ReaderRetrieval.propose, ReaderRetrieval.search = (oracle_propose, oracle_search) if on else (_propose, _search)


def main() -> None:
    global TRUTH
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, type=Path, help="A bench run with `ar` rows of the prompts (its suite).")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--datastore", action="append", default=[], help="Datastore directory (repeatable).")
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--min-key", type=int, default=1, help="Tokens each retrievable token must follow somewhere (>= 1).")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, help="Append one JSON line per variant here.")
    args = ap.parse_args()
    if args.min_key < 1:
        raise SystemExit("--min-key must be >= 1")
    torch.set_num_threads(args.threads)

    base = SpecDecoder.from_pretrained(
        args.model, method="draft-tree", dtype="float32", progress=False,
        options=MethodOptions(graft=GraftOptions(draft_model=args.draft_model, draft_dtype="float32")),
    )
    cases = [(r["task"], ids, r["tokens"]) for r, ids in plain_answers(args.results, base.tokenizer) if r["turn"] == 0]
    if any(len(out) > args.max_new_tokens for _, _, out in cases):
        raise SystemExit(f"the run's answers are longer than --max-new-tokens {args.max_new_tokens}")
    reader_opts = dataclasses.replace(base.options, datastores=tuple(args.datastore))
    stores = None
    for variant in args.variant:
        kind, _, fields = variant.partition(":")
        if kind not in ("draft-tree", "reader", "retrievable", "clairvoyant"):
            raise SystemExit(f"unknown variant {variant!r}")
        config = ReaderConfig(**json.loads(fields or "{}"))
        dec = base if kind == "draft-tree" else base.with_method("reader", dataclasses.replace(reader_opts, reader=config))
        oracle = kind in ("retrievable", "clairvoyant")
        if oracle and stores is None:
            retrieval = next(d for d in dec.engine.drafters if isinstance(d, ReaderRetrieval))
            stores = retrieval.datastores
        use_oracle(oracle)
        steps = tokens = 0
        proposed: Counter = Counter()
        accepted: Counter = Counter()
        times: Counter = Counter()
        tasks: dict[str, Counter] = {}
        for task, prompt_ids, output in cases:
            TRUTH = Truth(list(prompt_ids), list(output), kind, stores or (), args.min_key)
            result = dec.generate(prompt_ids, max_new_tokens=len(output))
            if list(result.tokens) != list(output):
                use_oracle(False)
                raise SystemExit(f"{variant}: output differs from plain decoding's: not lossless")
            stats = result.stats
            steps += stats.steps
            tokens += stats.new_tokens
            tasks.setdefault(task, Counter()).update(steps=stats.steps, tokens=stats.new_tokens)
            proposed.update(stats.proposed_by_source)
            accepted.update(stats.accepted_by_source)
            times.update({k: getattr(stats, f"{k}_s") for k in ("prefill", "draft", "forward", "total")})
        use_oracle(False)
        line = {"variant": variant, "steps": steps, "tokens": tokens, "mat": round(tokens / steps, 3),
                "rows_per_step": round(sum(proposed.values()) / steps, 2),
                "tasks": {t: {"steps": c["steps"], "mat": round(c["tokens"] / c["steps"], 3)} for t, c in tasks.items()},
                "proposed": dict(proposed), "accepted": dict(accepted), "time_s": {k: round(v, 2) for k, v in times.items()}}
        print(json.dumps(line), flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
