"""How many steps could any prompt-lookup tree save over `pld`? An upper bound from the answers.

Issue 13 asks AdaPLD for >= 1.1x `pld`'s speedup on the input-guided tasks. Under greedy
decoding the output is fixed (plain decoding's), so what a drafter *could* get accepted at each
step is known from the text alone. This replays a bench run's plain-decoding (``ar``) outputs
step by step and lets an **oracle** draft: at every step it sees the true continuation and
proposes the best tree the method's candidates allow, so its step count bounds from below what
the real method can reach with any reranking, any estimate of which rows to verify, any
threshold. (Jumping furthest at every step is the fewest steps because the reach ``t + gain``
never falls as ``t`` grows: a copy right from ``t`` is right from ``t + 1`` one token shorter,
from the next anchor. Branches and `pld`'s candidate cap can break that in principle, so every
bound is also checked against the run's real step counts.) Deterministic counts; no timing. The bounds (``oracle-pld``'s candidates are a subset of
``oracle-lexical``'s, and ``oracle-adapld`` adds branches to those; ``oracle-anywhere`` holds every
copy but no branch):

- ``pld-chain``: the most recent occurrence of the longest trailing n-gram (n <= 3) copied up
  to ``--max-copy`` tokens: a plain single-chain PLD, no oracle (a sanity row).
- ``oracle-pld``: the best of `pld`'s own candidates (``PLDDrafter.matches``: up to 8 earlier
  matches of the trailing n-gram, longest n <= 3 first, then most recent), copied as below: a
  perfect choice of rows among few, specific candidates.
- ``oracle-lexical``: the best of *every* lexical anchor (earlier positions ``j`` with ``x_j == x_t``,
  AdaPLD eq. 3), its copy up to ``--max-copy`` tokens (eq. 8-9): what a perfect reranker
  (eq. 6-7, PLD+) could reach.
- ``oracle-pld-branches``: ``oracle-pld``, or when longer, the branches (eq. 10-12) of one
  anchor, `pld`'s first candidate (the longest, most recent match), with the successor as below:
  AdaPLD's tree with `pld`'s anchor and a perfect choice of rows.
- ``oracle-adapld``: ``oracle-lexical``, or when longer, AdaPLD's branches (eq. 10-15) with
  oracle luck: the next token counts as found if it is among the target's top-``k`` after *some*
  lexical anchor (the oracle picks that anchor), and its successor if it followed that token
  *anywhere* before (or if that token never occurred: the semantic fallback might find it).
  With no lexical anchor, the semantic fallback (eq. 4-5): the same branches after any earlier
  position whose token's input embedding has cosine >= AdaPLD's threshold (0.5) with ``x_t``'s
  (AdaPLD copies from lexical anchors only). The target's top-``k`` come from one forward over
  each conversation (``--target``; without it the branches are skipped).
- ``oracle-anywhere``: the longest earlier occurrence of the true continuation, anchored or not (the
  retrieval ceiling of ``bench/repetition.py``, here with a bonus token per step).

Every bound's tree holds only the accepted path (an oracle verifies no wrong row), so a bound's
rows a step are its accepted tokens; the real methods pay for rows that fail. The real `pld` and
AdaPLD steps of the run are printed beside, and a bound above a real method's count on any
conversation is an error (the script says so). Example (issue 13's AdaPLD set, ~2 min with the
target pass on a 2-core CPU)::

    python benchmarks/tools/measure_copy_bound.py --results benchmarks/experiments/adapld-reader/raw/results-issue13/adapld-zen5-chunk256 \\
        --model qwen2.5-coder-1.5b-instruct --target --json benchmarks/results-issue13/copy-bound.json

Worked example of one step (``oracle-lexical``): context ``[5, 7, 1, 9, 5, 7, 2, 8, 5]``, truth ahead
``[7, 2, 4]``: anchors of ``5`` are 0 and 4; from 0 the copy ``7, 1`` agrees for 1 token, from 4
``7, 2, 8`` for 2, so the step accepts 2 and adds the bonus: 3 tokens, one step.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from specgraft.bench.repetition import longest_match
from specgraft.bench.session import plain_answers
from specgraft.cli.datastore import load_tokenizer
from specgraft.drafters.adapld import AdaPLDConfig
from specgraft.drafters.pld import PLDDrafter

BOUNDS = ("pld-chain", "oracle-pld", "oracle-lexical", "oracle-pld-branches", "oracle-adapld", "oracle-anywhere")


@dataclass
class Conversation:
    """One ``ar`` output with the exact ids the target was given before it."""

    key: tuple[str, int]
    task: str
    prompt: list[int]
    output: list[int]
    top: np.ndarray | None = None
    """[len(prompt) + len(output), k]: the target's top-k next tokens after each position."""
    similar: dict[int, set[int]] | None = None
    """Per token of the conversation, the other tokens of it whose input embedding has cosine
    >= AdaPLD's threshold with it (the semantic fallback's anchors, eq. 4-5)."""


def agreeing_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix.

    >>> agreeing_prefix([7, 2, 8], [7, 2, 4])
    2
    """
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def step_gain(bound: str, full: list[int], arr: np.ndarray, end: int, truth: list[int], max_copy: int,
              top: np.ndarray | None, similar: dict[int, set[int]] | None = None) -> int:
    """Tokens the bound's oracle tree gets accepted when the context is ``full[:end + 1]``
    (``x_t = full[end]``) and ``truth`` follows (the bonus token not counted).

    >>> full = [5, 7, 1, 9, 5, 7, 2, 8, 5]
    >>> step_gain("oracle-lexical", full, np.array(full), 8, [7, 2, 4], 30, None)
    2
    >>> step_gain("pld-chain", full, np.array(full), 8, [7, 2, 4], 30, None)  # no earlier "2 8 5" or "8 5"; "5" at 4
    2
    >>> step_gain("oracle-pld", full, np.array(full), 8, [7, 2, 4], 30, None)  # "5" at 4 and 0
    2
    """
    anchors = np.flatnonzero(arr[:end] == full[end])
    copy = lambda j: full[j + 1 : min(j + 1 + max_copy, end + 1)]  # noqa: E731 (eq. 8-9: up to x_t)
    if bound == "oracle-anywhere":
        return longest_match(truth[:max_copy], full[: end + 1])
    if bound == "pld-chain":
        for n in (3, 2, 1):
            tail = full[end - n + 1 : end + 1]
            hits = [j for j in anchors[::-1] if j - n + 1 >= 0 and full[j - n + 1 : j + 1] == tail]
            if hits:
                return agreeing_prefix(copy(int(hits[0])), truth)
        return 0
    if bound.startswith("oracle-pld"):
        anchors = np.asarray([stop - 1 for stop, _ in PLDDrafter().matches(arr[: end + 1])], dtype=np.int64)
    best = max((agreeing_prefix(copy(int(j)), truth) for j in anchors), default=0)
    if bound in ("oracle-pld", "oracle-lexical") or not truth or top is None:
        return best
    if bound == "oracle-pld-branches":
        anchors = anchors[:1]
    if not len(anchors) and similar is not None:  # semantic fallback (eq. 4-5): branches only
        close = similar.get(full[end], set())
        anchors = np.asarray([j for j in range(end) if full[j] in close], dtype=np.int64)
    if len(anchors) and bool((top[anchors] == truth[0]).any()):
        # one anchor's branches (eq. 10-12): some anchor's top-k holds the next token (that
        # anchor's own copy may be wrong while another's is right); the successor (eq. 13-15)
        # counts if it followed that token anywhere before, or if that token never occurred (the
        # semantic fallback might find it anywhere)
        follows = np.flatnonzero(arr[:end] == truth[0]) + 1
        successor = len(truth) > 1 and (not len(follows) or bool((arr[follows] == truth[1]).any()))
        return max(best, 1 + int(successor))
    return best


def replay(conv: Conversation, bound: str, max_copy: int) -> int:
    """Steps the bound's oracle needs for the whole output (the first token comes from the
    prefill, as in the engine, so ``mat = len(output) / steps``)."""
    full = conv.prompt + conv.output
    arr = np.asarray(full)
    t, steps, n = 1, 0, len(conv.output)
    while t < n:
        end = len(conv.prompt) + t - 1
        t += step_gain(bound, full, arr, end, conv.output[t:], max_copy, conv.top, conv.similar) + 1
        steps += 1
    return steps


def similar_tokens(tokens: Sequence[int], embeddings, threshold: float) -> dict[int, set[int]]:
    """For each distinct token, the others whose embedding rows have cosine >= ``threshold``.

    >>> import torch
    >>> similar_tokens([0, 1, 2], torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]]), 0.5)
    {0: {1}, 1: {0}, 2: set()}
    """
    import torch

    uniq = sorted(set(int(t) for t in tokens))
    rows = torch.nn.functional.normalize(embeddings[torch.tensor(uniq)].float(), dim=-1)
    close = (rows @ rows.T) >= threshold
    return {a: {uniq[j] for j in torch.nonzero(close[i]).flatten().tolist() if j != i} for i, a in enumerate(uniq)}


def target_top(model: str, convs: list[Conversation], k: int, threads: int, cache: Path | None = None,
               threshold: float = AdaPLDConfig.threshold) -> None:
    """Fill ``conv.top`` with the target's top-``k`` after every position (fp32, one forward
    each), read from / written to ``cache`` (an ``.npz`` keyed by conversation) when given, and
    ``conv.similar`` from the target's input embeddings."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from specgraft.models.resolve import resolve_model

    path = resolve_model(model)
    embeddings = None
    for shard in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            name = next((n for n in f.keys() if n.endswith("embed_tokens.weight")), None)
            if name is not None:
                embeddings = f.get_tensor(name)
                break
    if embeddings is None:
        raise SystemExit(f"no embed_tokens.weight in {path}'s safetensors files")
    for conv in convs:
        conv.similar = similar_tokens(conv.prompt + conv.output, embeddings, threshold)
    names = [f"{pid}@{turn}" for pid, turn in (c.key for c in convs)]
    if cache is not None and cache.exists():
        saved = np.load(cache)
        if all(n in saved and saved[n].shape == (len(c.prompt) + len(c.output), k) for n, c in zip(names, convs)):
            for n, conv in zip(names, convs):
                conv.top = saved[n]
            return
    torch.set_num_threads(threads)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.inference_mode():
        for i, conv in enumerate(convs):
            ids = torch.tensor([conv.prompt + conv.output])
            hidden = lm.model(input_ids=ids).last_hidden_state[0]
            tops = [lm.lm_head(hidden[s : s + 256]).topk(k, dim=-1).indices for s in range(0, len(hidden), 256)]
            conv.top = torch.cat(tops).numpy()
            print(f"  target pass {i + 1}/{len(convs)}: {len(hidden)} positions", flush=True)
    if cache is not None:
        np.savez_compressed(cache, **{n: c.top for n, c in zip(names, convs)})


def load_conversations(results: Path, model: str) -> tuple[list[Conversation], list[dict]]:
    """The run's plain-decoding answers with their input ids, and all its result records."""
    convs = [Conversation((r["prompt_id"], r["turn"]), r["task"], ids, list(r["tokens"]))
             for r, ids in plain_answers(results, load_tokenizer(model))]
    rows = [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines() if line.strip()]
    return convs, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", required=True, type=Path, help="A bench output directory with `ar` rows.")
    ap.add_argument("--model", required=True, help="The target (its tokenizer; with --target its weights).")
    ap.add_argument("--target", action="store_true", help="Run the target once per conversation for AdaPLD's branches.")
    ap.add_argument("--branch-k", type=int, default=8, help="AdaPLD's k (eq. 10-12).")
    ap.add_argument("--max-copy", type=int, default=30, help="Longest copy (AdaPLD's L).")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top-cache", type=Path, help="An .npz for the target's top-k (reused when it matches).")
    ap.add_argument("--json", type=Path, help="Also write the table here.")
    args = ap.parse_args()

    convs, rows = load_conversations(args.results, args.model)
    if args.target:
        target_top(args.model, convs, args.branch_k, args.threads, args.top_cache)
    real: dict[str, dict[tuple[str, int], int]] = defaultdict(dict)
    for r in rows:
        if r["method"] not in ("ar", "ar-end") and not r.get("peer"):
            real[r["method"]].setdefault((r["prompt_id"], r["turn"]), r["steps"])
    steps: dict[str, Counter] = {}
    tokens: Counter = Counter()
    for conv in convs:
        tokens[conv.task] += len(conv.output)
    for bound in BOUNDS:
        if bound == "oracle-adapld" and not args.target:
            continue
        steps[bound] = Counter()
        for conv in convs:
            s = replay(conv, bound, args.max_copy)
            steps[bound][conv.task] += s
            if bound != "pld-chain":
                worse = {m: c[conv.key] for m, c in real.items() if conv.key in c and c[conv.key] < s}
                if worse:
                    raise SystemExit(f"bound {bound} takes {s} steps on {conv.key}, more than {worse}: the replay is wrong")
    for method, per in real.items():
        steps[method] = Counter()
        for conv in convs:
            steps[method][conv.task] += per[conv.key]
    tasks = sorted(tokens) + ["overall"]
    for c in steps.values():
        c["overall"] = sum(c[t] for t in tasks[:-1])
    tokens["overall"] = sum(tokens[t] for t in tasks[:-1])
    ref = steps.get("pld")
    print("| steps (MAT) | " + " | ".join(tasks) + " |")
    print("|---" * (len(tasks) + 1) + "|")
    for name, c in steps.items():
        cells = [f"{c[t]} ({tokens[t] / c[t]:.2f})" + (f", {ref[t] / c[t]:.2f}x" if ref and name != "pld" else "") for t in tasks]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        table = {name: {t: {"steps": c[t], "mat": round(tokens[t] / c[t], 3)} for t in tasks} for name, c in steps.items()}
        args.json.write_text(json.dumps({"results": str(args.results), "model": args.model, "max_copy": args.max_copy,
                                         "branch_k": args.branch_k if args.target else None, "steps": table}, indent=1) + "\n")


if __name__ == "__main__":
    main()
