"""Replay a vLLM benchmark's greedy outputs through chain proposers, offline (issue 15).

Timing vLLM on this CPU takes an hour per model and its per-prompt times move by +-5% between
runs, so a proposer setting cannot be chosen by timing it. Greedy verification is deterministic,
though: given the target's greedy output, how many steps a proposer takes and how many draft
tokens it sends are a pure function of its proposals. This script replays vLLM's decode loop
(``propose`` after every step with the tokens vLLM appended, longest matching prefix accepted,
then one bonus token) over the outputs of a ``specgraft bench`` vLLM run, for vLLM's own
``ngram`` proposer (a re-implementation of ``_find_longest_matched_ngram_and_propose_tokens``:
the longest trailing n-gram in ``[min, max]``, its earliest occurrence) and for specgraft's
:class:`~specgraft.integrations.vllm.PLDProposer` under each ``--pld`` setting, and checks the
replayed counts against the drafts, draft tokens and accepted tokens vLLM's own counters
recorded in that run.

Time is then predicted with the step costs ``python -m specgraft.integrations.vllm_probe`` measured
(``--step-costs``: a step's time per draft length, relative to a step without a draft), or
else with a cost model fitted to the same run's measured rows:
``time = (steps + a * drafts + b * draft_tokens) * s_p``, where ``s_p`` is the prompt's measured
time per token under plain vLLM (its context length and prefill folded in), ``a`` what a step
that verifies a draft costs more than a plain one and ``b`` the cost of one draft token, both
relative to a step, least squares over every speculative row of the run (these are
:class:`~specgraft.integrations.vllm.ChainCost`'s ``step`` and ``token``). Example::

    python benchmarks/tools/replay_vllm_proposers.py benchmarks/experiments/vllm/raw/results-vllm/qwen1.5b \\
        --pld cost=0/0 --pld cost=0.25/0.065 --pld cost=0.25/0.065,min_prob=0.05

A ``--pld`` setting is ``PLDConfig`` fields plus ``cost=STEP/TOKEN`` (the proposer's
:class:`~specgraft.integrations.vllm.ChainCost`; default the CPU one).

To choose a setting on prompts the vLLM benchmark does not use, replay the ``ar`` outputs of any
``specgraft bench`` run of the same model instead (``--bench DIR``, repeatable; its prompts are
rebuilt from the run's suite and tokenizer, a second turn from the first turn's ``ar`` answer, as
the bench builds them), minus the inputs of the vLLM run given as ``--exclude`` (vLLM plain is
greedy ``ar`` token for token, checked 9/9 in every vLLM run here). Without vLLM's plain times,
each input is weighted by ``ar``'s own time per token; ``--step-costs`` is then required::

    python benchmarks/tools/replay_vllm_proposers.py --bench benchmarks/experiments/headline-set/raw/results-issue14/zen5 \
        --exclude benchmarks/experiments/vllm/raw/results-vllm/qwen1.5b --step-costs STEP_COSTS.json --pld '' --pld min_prob=0.05
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np

from specgraft.drafters.pld import PLDConfig
from specgraft.integrations.vllm import CPU_DEFAULT, ChainCost, PLDProposer


@dataclass
class Replay:
    """What a proposer did over one output (vLLM's counter names)."""

    steps: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    lengths: list[int] = field(default_factory=list)
    """Draft length of every step."""

    def cost(self, relative: Sequence[float]) -> float:
        """Steps weighted by ``relative[L]`` (a step's time with an L-token draft over one without)."""
        return 1.0 + sum(relative[min(L, len(relative) - 1)] for L in self.lengths)  # 1: the prefill's token


def ngram_chain(context: np.ndarray, k: int, min_n: int = 2, max_n: int = 4) -> list[int]:
    """vLLM 0.32's ``ngram`` proposal: after the earliest occurrence of the longest trailing n-gram.

    >>> ngram_chain(np.array([1, 2, 3, 4, 9, 2, 3, 4, 7, 3, 4]), 3)
    [9, 2, 3]
    """
    total = len(context)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        tail = context[total - n :]
        ok = np.ones(total - n, dtype=bool)  # candidate starts 0 .. total-n-1 (not the tail itself)
        for j in range(n):
            ok &= context[j : total - n + j] == tail[j]
        hits = np.flatnonzero(ok)
        if len(hits):
            start = int(hits[0]) + n
            return [int(t) for t in context[start : start + k]]
    return []


def replay(prompt: Sequence[int], output: Sequence[int], propose: Callable[[list[int], int], list[int]]) -> Replay:
    """vLLM's greedy loop over a known ``output``: ``propose(sampled, n)`` sees the tokens the last
    step appended and the committed length ``n`` (the buffer is shared through the closure)."""
    out = Replay()
    done = 1  # prefill emitted output[0]
    sampled = [int(output[0])]
    while done < len(output):
        draft = propose(sampled, len(prompt) + done)
        # vLLM verifies the whole draft even past max_tokens (then cuts the output): tokens past
        # the known output count as drafted, not accepted
        acc = 0
        while acc < len(draft) and done + acc < len(output) and draft[acc] == output[done + acc]:
            acc += 1
        out.steps += 1
        out.drafts += bool(draft)
        out.draft_tokens += len(draft)
        out.lengths.append(len(draft))
        out.accepted_tokens += acc
        sampled = [int(t) for t in output[done : done + acc + 1]]
        done += acc + 1
    return out


def pld_setting(spec: str) -> tuple[PLDConfig, ChainCost]:
    """``min_prob=0.05,max_ngram=4,cost=0.25/0.065`` -> a PLDConfig and the proposer's ChainCost
    (tuple fields: ``prior_first=0.3/0.4/0.9``; ``cost=FILE.json``: a step-cost probe's table).
    Without ``min_prob`` the config is the proposer's own default for that cost."""
    kwargs = {}
    cost = CPU_DEFAULT
    types = {f.name: f.type for f in fields(PLDConfig)}
    for part in filter(None, spec.split(",")):
        key, value = part.split("=")
        if key == "cost":
            cost = ChainCost.parse(value if value.endswith(".json") else value.replace("/", ","))
            continue
        if key not in types:
            raise SystemExit(f"PLDConfig has no field {key!r}")
        kind = str(types[key])
        kwargs[key] = (
            tuple(float(v) for v in value.split("/")) if "tuple" in kind
            else int(value) if kind == "int" else float(value)
        )
    return PLDProposer.default_config(cost, **kwargs), cost


def run_proposers(prompt: list[int], output: list[int], pld_specs: Sequence[str], k: int) -> dict[str, Replay]:
    """Replay ``ngram`` and every PLD setting over one output."""
    buffer = np.zeros((1, len(prompt) + len(output) + 1), np.int32)
    buffer[0, : len(prompt)] = prompt
    buffer[0, len(prompt) : len(prompt) + len(output)] = output
    results = {"vllm-ngram": replay(prompt, output, lambda s, n: ngram_chain(buffer[0, :n], k))}
    for spec in pld_specs:
        config = SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens=k), model_config=SimpleNamespace(max_model_len=buffer.shape[1] + k)
        )
        pld, cost = pld_setting(spec)
        proposer = PLDProposer(config, check_vllm=False, config=pld, cost=cost)
        results[f"pld[{spec}]"] = replay(prompt, output, lambda s, n, p=proposer: p.propose([s], np.array([n]), buffer)[0])
    return results


def load_run(run_dir: Path) -> tuple[dict, dict[str, dict[str, dict]]]:
    """The run's inputs (key -> ids) and each vLLM peer's measured rows (peer -> key -> row)."""
    vdir = run_dir / "vllm"
    request = json.loads((vdir / "vllm.request.json").read_text())
    inputs = {item["key"]: item["ids"] for item in request["inputs"]}
    rows: dict[str, dict[str, dict]] = {}
    for path in sorted(vdir.glob("*.results.jsonl")):
        peer = path.name.removesuffix(".results.jsonl")
        rows[peer] = {r["key"]: r for r in map(json.loads, path.read_text().splitlines())}
    return inputs, rows


def load_bench(run_dir: Path, exclude: set[str]) -> tuple[dict[str, list[int]], dict[str, dict]]:
    """A ``specgraft bench`` run's ``ar`` generations as replay inputs: ``(key -> prompt ids,
    key -> {"tokens", "time_s"})`` with vLLM's keys (``prompt_id:turn``), ``exclude``'s keys left out."""
    from transformers import AutoTokenizer

    from specgraft.suites import conversation_ids
    from specgraft.models.resolve import resolve_model
    from specgraft.suites import load_suite

    cfg = json.loads((run_dir / "run.json").read_text())["config"]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(cfg["model"], progress=False))
    ar = {(r["prompt_id"], r["turn"]): r for r in map(json.loads, (run_dir / "results.jsonl").read_text().splitlines())
          if r["method"] == "ar"}
    chat_ok = bool(getattr(tokenizer, "chat_template", None))
    inputs: dict[str, list[int]] = {}
    outputs: dict[str, dict] = {}
    for prompt in load_suite(cfg["suite"], cfg.get("per_task"), cfg.get("alpaca_path")).prompts:
        for turn in range(len(prompt.turns)):
            key, row = f"{prompt.id}:{turn}", ar.get((prompt.id, turn))
            if row is None or key in exclude:
                continue
            answers = [ar[(prompt.id, t)]["text"] for t in range(turn)]
            inputs[key] = conversation_ids(tokenizer, prompt.turns[: turn + 1], answers, prompt.chat and chat_ok)
            if len(inputs[key]) != row["prompt_tokens"]:
                raise SystemExit(f"{run_dir}: {key} rebuilt to {len(inputs[key])} prompt tokens, the run had {row['prompt_tokens']}")
            outputs[key] = {"tokens": row["tokens"], "time_s": row["time_s"]}
    return inputs, outputs


def fit_costs(rows: dict[str, dict[str, dict]], plain: dict[str, float]) -> tuple[float, float]:
    """``(a, b)`` in ``time = (steps + a * drafts + b * draft_tokens) * s_p``, least squares over
    every speculative row (``steps`` counts the prefill's token as one)."""
    xs, ys = [], []
    for peer, by_key in rows.items():
        if peer == "vllm":
            continue
        for key, r in by_key.items():
            steps = len(r["tokens"]) - r["accepted_tokens"]
            s = plain[key]
            xs.append([r["drafts"] * s, r["draft_tokens"] * s])
            ys.append(r["time_s"] - steps * s)
    (a, b), *_ = np.linalg.lstsq(np.array(xs), np.array(ys), rcond=None)
    return float(a), float(b)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, nargs="?", help="a specgraft bench output directory with a vllm/ folder")
    ap.add_argument("--bench", type=Path, action="append", default=[],
                    help="instead: replay the ar outputs of this bench run (repeatable; needs --step-costs)")
    ap.add_argument("--exclude", type=Path, action="append", default=[],
                    help="with --bench: leave out the inputs of this vLLM bench run (repeatable)")
    ap.add_argument("--pld", action="append", default=[], help="PLDConfig overrides, e.g. min_prob=0.05 (repeatable; '' = defaults)")
    ap.add_argument("-k", type=int, default=5, help="num_speculative_tokens (the run's)")
    ap.add_argument("--step-costs", type=Path, default=None,
                    help="the step-cost probe's JSON (python -m specgraft.integrations.vllm_probe): predict with its measured step time per draft length instead of the fit")
    args = ap.parse_args(argv)
    specs = args.pld or [""]

    if (args.run is None) == (not args.bench):
        raise SystemExit("give a vLLM bench run, or --bench runs (not both)")
    if args.bench:
        if args.step_costs is None:
            raise SystemExit("--bench needs --step-costs (there are no vLLM rows to fit a cost model to)")
        exclude = {key for run in args.exclude for key in load_run(run)[0]}
        inputs, reference, rows = {}, {}, {}
        for run in args.bench:
            got, outs = load_bench(run, exclude | set(inputs))
            inputs.update(got)
            reference.update(outs)
        print(f"{len(inputs)} inputs from {', '.join(map(str, args.bench))} ({len(exclude)} excluded keys)")
    else:
        inputs, rows = load_run(args.run)
        reference = rows["vllm"]
    plain = {key: r["time_s"] / len(r["tokens"]) for key, r in reference.items()}
    a, b = fit_costs(rows, plain) if rows else (0.0, 0.0)
    relative = None
    if args.step_costs is not None:
        by_len = json.loads(args.step_costs.read_text())["relative_to_plain"]
        relative = [by_len[str(L)] / by_len["0"] for L in range(len(by_len))]
        print("cost model: time = sum over steps of c(L) * plain time per token of the prompt, c = "
              + " ".join(f"{c:.3f}" for c in relative) + f" ({args.step_costs})")
    else:
        print(f"cost model: time = (steps + {a:.3f} * drafts + {b:.3f} * draft_tokens) * plain time per token of the prompt")

    totals: dict[str, list[float]] = {}
    for key, ids in inputs.items():
        output = reference[key]["tokens"]
        results = run_proposers(ids, output, specs, args.k)
        for name, rep in results.items():
            units = rep.cost(relative) if relative else rep.steps + 1 + a * rep.drafts + b * rep.draft_tokens
            predicted = units * plain[key]
            t = totals.setdefault(name, [0.0, 0.0, 0, 0, 0, 0.0, 0])
            t[0] += predicted
            t[6] += rep.drafts
            t[2] += rep.draft_tokens
            t[3] += rep.accepted_tokens
            t[4] += rep.steps + 1
            peer = {"vllm-ngram": "vllm-ngram", f"pld[{specs[0]}]": "vllm-specgraft-pld"}.get(name)
            if peer in rows and key in rows[peer]:
                m = rows[peer][key]
                t[1] += m["time_s"]
                t[5] += (m["drafts"], m["draft_tokens"], m["accepted_tokens"]) == (rep.drafts, rep.draft_tokens, rep.accepted_tokens)
    plain_total = sum(r["time_s"] for r in reference.values())
    print(f"{'proposer':40s} {'steps':>6s} {'drafts':>6s} {'draft tok':>9s} {'accepted':>8s} {'predicted s':>11s} {'pred. speedup':>13s} {'measured s':>10s} {'counts match':>12s}")
    for name, (pred, meas, dt, acc, steps, match, drafts) in totals.items():
        measured = f"{meas:10.1f}" if meas else f"{'-':>10s}"
        matched = f"{int(match)}/{len(inputs)}" if meas else "-"
        print(f"{name:40s} {steps:6d} {drafts:6d} {dt:9d} {acc:8d} {pred:11.1f} {plain_total / pred:12.3f}x {measured} {matched:>12s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
