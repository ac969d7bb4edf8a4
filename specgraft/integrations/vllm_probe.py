"""What one vLLM decode step costs with a draft of L tokens, measured inside one engine (issue 15).

Fitting step costs to whole-generation times confounds them with drift and with which proposer
drafted what. Here a probe proposer (``StepCostProbe``, loaded by vLLM as a ``custom_class``)
proposes drafts whose length cycles through 0..k in a shuffled order, made of a token greedy
decoding never picks (the last id of the model's padded vocabulary), so they are rejected and
every step emits exactly one token. The probe timestamps each of its ``propose`` calls: the gap
between two calls is one engine step (schedule, forward over 1 + L rows, sampling and rejection,
propose), attributed to the L it proposed at the first. Lengths are interleaved within one
generation, so drift cancels. A plain engine (no speculation) is timed on the same prompt too.

``--isolated`` asks what a draft costs among steps without one, as in a real generation where a
proposer drafts now and then: each draft (lengths 1..k, shuffled) is followed by
``--gap`` steps without one, and the steps are told apart by what came before them: a step
without a draft after ``--gap - 1`` of them (plain decoding inside the speculative engine), the
drafting step, and the first step after it.

Run it in vLLM's venv (with specgraft installed there) on the machine that will serve, then give
the proposers its output (:meth:`specgraft.integrations.vllm.ChainCost.from_probe`)::

    python -m specgraft.integrations.vllm_probe --model ~/.cache/specgraft/models/qwen2.5-coder-1.5b-instruct \\
        --tokens 130 --out step-cost.json                          # 5-8 min on a 2-core CPU
    SPECGRAFT_VLLM_CHAIN_COST=step-cost.json vllm serve ...      # or LLM(...) in that environment

Prints the median step time per L and its ratio to a plain engine's step, and the least-squares
``ChainCost`` over the steps with a draft (``step``: a drafting step's extra cost at 0 tokens,
``token``: per draft token, both relative to the same engine's step without a draft, L = 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

#: Where the probe (in vLLM's worker process) writes its records.
RECORDS_ENV = "SPECGRAFT_STEP_COST_RECORDS"
#: ``--gap`` for the probe in vLLM's worker process (0: the shuffled mode).
GAP_ENV = "SPECGRAFT_STEP_COST_GAP"
#: What vLLM imports as the ``custom_class`` proposer.
PROBE_CLASS = "specgraft.integrations.vllm_probe.StepCostProbe"


class StepCostProbe:
    """A vLLM ``custom_class`` proposer that drafts rejected tokens of cycling length and times steps."""

    def __init__(self, vllm_config: Any):
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.junk = int(vllm_config.model_config.get_vocab_size()) - 1
        self.path = os.environ[RECORDS_ENV]
        self.rng = random.Random(0)
        self.gap = int(os.environ.get(GAP_ENV, "0"))  # 0: lengths 0..k shuffled; g > 0: each draft then g steps without
        self.cycle: list[int] = []
        self.last: tuple[float, int] | None = None  # (time of the last propose call, L proposed then)
        self.previous = 0  # L proposed the call before that
        self.records: list[tuple[int, float, int, int]] = []  # (L, step seconds, tokens the step emitted, L the step before)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        pass

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None):
        now = time.perf_counter()
        if self.last is not None and sampled_token_ids and sampled_token_ids[0]:
            self.records.append((self.last[1], now - self.last[0], len(sampled_token_ids[0]), self.previous))
            self.previous = self.last[1]
            if len(self.records) % 16 == 0:
                Path(self.path).write_text(json.dumps(self.records))
        if not self.cycle:
            if self.gap:
                lengths = list(range(1, self.k + 1))
                self.rng.shuffle(lengths)
                self.cycle = [L for length in lengths for L in [0] * self.gap + [length]]  # popped from the end
            else:
                self.cycle = list(range(self.k + 1))
                self.rng.shuffle(self.cycle)
        length = self.cycle.pop()
        drafts = [[self.junk] * length if sampled else [] for sampled in sampled_token_ids]
        self.last = (time.perf_counter(), length) if sampled_token_ids and sampled_token_ids[0] else None
        return drafts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="model directory")
    ap.add_argument("--tokens", type=int, default=192, help="tokens generated (one step each)")
    ap.add_argument("-k", type=int, default=5, help="num_speculative_tokens (longest draft probed)")
    ap.add_argument("--prompt-tokens", type=int, default=500, help="prompt length (the context steps attend to)")
    ap.add_argument("--skip", type=int, default=6, help="first steps left out (warm-up)")
    ap.add_argument("--isolated", action="store_true", help="each draft among --gap steps without one (see above)")
    ap.add_argument("--gap", type=int, default=4, help="with --isolated: steps without a draft after each draft")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.isolated and args.gap < 2:
        raise SystemExit("--gap must be >= 2 (the step after a draft, then plain ones)")

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from specgraft.integrations.vllm_worker import make_llm

    records_file = Path(f"/tmp/step-cost-{os.getpid()}.json")
    os.environ[RECORDS_ENV] = str(records_file)
    os.environ[GAP_ENV] = str(args.gap if args.isolated else 0)
    rng = np.random.default_rng(0)
    prompt = TokensPrompt(prompt_token_ids=rng.integers(100, 20000, args.prompt_tokens).tolist())
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True, detokenize=False)
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)

    # plain engine: decode time per token = (t(N) - t(1)) / (N - 1), medians of 2
    llm = make_llm(args.model, None)
    llm.generate([prompt], one, use_tqdm=False)
    t1, tn = [], []
    for _ in range(2):
        t0 = time.perf_counter(); llm.generate([prompt], one, use_tqdm=False); t1.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); llm.generate([prompt], params, use_tqdm=False); tn.append(time.perf_counter() - t0)
    plain_step = (statistics.median(tn) - statistics.median(t1)) / (args.tokens - 1)
    llm.llm_engine.engine_core.shutdown()
    del llm

    spec = {"method": "custom_class", "model": PROBE_CLASS, "num_speculative_tokens": args.k}
    llm = make_llm(args.model, spec)
    llm.generate([prompt], one, use_tqdm=False)
    llm.generate([prompt], params, use_tqdm=False)
    llm.llm_engine.engine_core.shutdown()
    records = [tuple(r) for r in json.loads(records_file.read_text())]
    # the last generation's steps (the records of the warm-up come first), warm-up steps left out
    records = records[-(args.tokens - 1):][args.skip:]
    meta = {"model": args.model, "prompt_tokens": args.prompt_tokens, "tokens": args.tokens, "k": args.k}
    result = isolated_costs(records, plain_step, args.gap) if args.isolated else shuffled_costs(records, plain_step)
    result = {**meta, **result}
    print_costs(result)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def shuffled_costs(records: list, plain_step: float) -> dict[str, Any]:
    """The shuffled mode's result from the probe's ``(L, seconds, emitted, L before)`` records:
    median step per draft length, relative to a plain engine's step and to the same engine's
    step without a draft (what :meth:`ChainCost.from_probe` reads), and the least-squares line.

    >>> records = [(L, 0.1 * (1 + 0.2 * L), 1, 0) for L in range(4) for _ in range(3)]
    >>> shuffled_costs(records, 0.1)["relative_to_no_draft"]
    {'0': 1.0, '1': 1.2, '2': 1.4, '3': 1.6}
    """
    by_len: dict[int, list[float]] = {}
    for length, dt, emitted, _ in records:
        if emitted == 1:  # a rejected draft (always, but for a junk token the model picked)
            by_len.setdefault(length, []).append(dt)
    if 0 not in by_len or len(by_len) < 2:
        raise ValueError(f"the probe recorded too few steps ({len(records)}): generate more --tokens")
    medians = {L: statistics.median(v) for L, v in sorted(by_len.items())}
    # ChainCost is relative to a step of the same engine without a draft (L = 0)
    xs = np.array([[1.0, L] for L, v in by_len.items() for _ in v if L > 0])
    ys = np.array([dt / medians[0] for L, v in by_len.items() for dt in v if L > 0])
    (intercept, per_token), *_ = np.linalg.lstsq(xs, ys, rcond=None)
    return {
        "plain_step_s": plain_step,
        "step_s_by_draft_len": {str(L): round(m, 5) for L, m in medians.items()},
        "samples_by_draft_len": {str(L): len(v) for L, v in sorted(by_len.items())},
        "relative_to_plain": {str(L): round(m / plain_step, 4) for L, m in medians.items()},
        "relative_to_no_draft": {str(L): round(m / medians[0], 4) for L, m in medians.items()},
        "chain_cost": {"step": round(float(intercept) - 1.0, 4), "token": round(float(per_token), 4)},
    }


def isolated_costs(records: list, plain_step: float, gap: int) -> dict[str, Any]:
    """``--isolated``: median seconds of plain steps (no draft, none the step before), and of each
    drafting step and the step right after it by the draft's length, relative to the plain ones.

    >>> records = [(0, 0.1, 1, 0)] * 5 + [(2, 0.13, 1, 0), (0, 0.1, 1, 2)]
    >>> isolated_costs(records, 0.09, 4)["drafting_relative"]
    {'2': 1.3}
    """
    plain = [dt for length, dt, emitted, before in records if length == 0 and before == 0]
    drafting: dict[int, list[float]] = {}
    after: dict[int, list[float]] = {}
    for length, dt, emitted, before in records:
        if length > 0 and emitted == 1:
            drafting.setdefault(length, []).append(dt)
        elif length == 0 and before > 0:
            after.setdefault(before, []).append(dt)
    if not plain or not drafting:
        raise ValueError(f"the probe recorded too few steps ({len(records)}): generate more --tokens")
    base = statistics.median(plain)
    return {
        "gap": gap, "plain_step_s": plain_step, "spec_engine_plain_step_s": round(base, 5), "plain_steps": len(plain),
        "drafting_relative": {str(L): round(statistics.median(v) / base, 4) for L, v in sorted(drafting.items())},
        "after_relative": {str(L): round(statistics.median(after.get(L, [base])) / base, 4) for L in sorted(drafting)},
        "samples": {str(L): len(v) for L, v in sorted(drafting.items())},
    }


def print_costs(result: dict[str, Any]) -> None:
    """The result, a line per draft length."""
    plain = result["plain_step_s"]
    if "gap" in result:
        base = result["spec_engine_plain_step_s"]
        print(f"plain engine step {plain * 1000:.1f} ms; spec engine, no draft and none before: {base * 1000:.1f} ms ({result['plain_steps']} steps)")
        for L, d in result["drafting_relative"].items():
            a = result["after_relative"][L]
            print(f"draft L={L}: drafting step {d:.3f}, the step after {a:.3f}, together {d + a - 2:+.3f} of a step ({result['samples'][L]} samples)")
        return
    print(f"plain step {plain * 1000:.1f} ms")
    for L, m in result["step_s_by_draft_len"].items():
        print(f"L={L}: {m * 1000:7.1f} ms  {result['relative_to_plain'][L]:.3f} x plain  "
              f"{result['relative_to_no_draft'][L]:.3f} x L=0  ({result['samples_by_draft_len'][L]} steps)")
    cost = result["chain_cost"]
    print(f"ChainCost(step={cost['step']}, token={cost['token']})  (L >= 1, least squares)")


if __name__ == "__main__":
    raise SystemExit(main())
