"""Helpers the measurement scripts share: loading the models, the tuning prompts, one timed
generation, the common command-line arguments, and the ``METHOD[:key=value...]`` variant syntax.

The tuning prompts are items no benchmark suite uses (``spec-bench:N`` and ``humaneval:N`` take
the first ``N``), so a setting chosen on them is not fitted to the benchmark set.
"""

from __future__ import annotations

import argparse
import time


def task_tuning_prompts(per_task: int, tasks: list[str] | None = None):
    """``specgraft.suites.task_tuning_prompts``, an unknown task a one-line exit."""
    from specgraft.suites import task_tuning_prompts as held_out

    try:
        return held_out(per_task, tasks)
    except ValueError as e:
        raise SystemExit(str(e)) from None


def code_tuning_prompts(code_prompts: int):
    from specgraft.suites import code_tuning_prompts as held_out

    return held_out(code_prompts)


def tuning_prompts(per_task: int, code_prompts: int):
    return task_tuning_prompts(per_task) + code_tuning_prompts(code_prompts)


def code_and_task_prompts(code_prompts: int, per_task: int, tasks: list[str]):
    """HumanEval items 100 .. 99 + ``code_prompts``, then Spec-Bench items 41+ of ``tasks``
    (:func:`task_tuning_prompts`): tuning prompts no benchmark suite uses."""
    return code_tuning_prompts(code_prompts) + task_tuning_prompts(per_task, tasks)


def hf_assisted(base, draft, max_new_tokens: int = 128):
    """HF's ``generate(assistant_model=draft)`` on ``base``'s target, greedy, stopping at its EOS tokens."""
    from specgraft.bench.peers import HFPeer

    return HFPeer("hf-assisted", base.model, sorted(base.engine.eos_token_ids), max_new_tokens, 0.0, 0, assistant_model=draft)


def load_base(args, device: str = "cpu"):
    """``ar`` over the target on ``device``, with the draft model's options for its siblings (no
    cost table)."""
    from specgraft.api import SpecDecoder
    from specgraft.methods import GraftOptions, MethodOptions

    graft = GraftOptions(draft_model=args.draft_model, draft_quant=args.draft_quant, draft_dtype=args.dtype)
    return SpecDecoder.from_pretrained(args.model, method="ar", dtype=args.dtype, options=MethodOptions(graft=graft, cost_table=None), progress=False, device=device)


def load_draft(args, base, quant: str | None = None):
    """The draft model of ``args`` (``--draft-model``, ``--dtype``, ``--draft-quant`` unless
    ``quant``) on ``base``'s device, checked against its tokenizer: what the timing scripts share."""
    from specgraft.models.loading import load_draft_model

    quant = args.draft_quant if quant is None else quant
    return load_draft_model(args.draft_model, args.dtype, base.target.device, progress=False, target_tokenizer=base.tokenizer, quant=quant)


def timed_generate(dec, ids, max_new_tokens: int, budget: int | None = None, stop_on_eos: bool = False):
    """``(seconds, output)`` of one greedy generation of ``dec`` (the benchmark scripts' timer)."""
    from specgraft.config import GenerationConfig

    config = GenerationConfig(max_new_tokens=max_new_tokens, stop_on_eos=stop_on_eos, budget=budget)
    t0 = time.perf_counter()
    out = dec.generate(ids, config=config)
    return time.perf_counter() - t0, out


def model_arguments(description: str) -> argparse.ArgumentParser:
    """The parser both budget scripts start from: target, draft model and numerics, threads, output."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft-model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--draft-quant", default="auto")
    parser.add_argument("--dtype", default="float32", help="The target's (and an unquantized draft's) dtype.")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    return parser


def parse_variant(text: str) -> tuple[str, dict, int | None]:
    """``graft-prune:extend=8:extend_min=0.3:budget=12`` -> (method, GraftOptions overrides, budget).

    >>> parse_variant("graft-prune:extend=8:extend_min=0.3:budget=12")
    ('graft-prune', {'extend': 8, 'extend_min': 0.3}, 12)
    >>> parse_variant("draft-tree:draft_quant=int8-tensor")
    ('draft-tree', {'draft_quant': 'int8-tensor'}, None)
    """
    method, *pairs = text.split(":")
    overrides: dict = {}
    budget = None
    for pair in pairs:
        key, _, value = pair.partition("=")
        try:
            number = float(value) if "." in value else int(value)
        except ValueError:  # a name, e.g. draft_quant=int8-tensor
            number = value
        if key == "budget":
            budget = int(number)
        else:
            overrides[key] = number
    return method, overrides, budget
