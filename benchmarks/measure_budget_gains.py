"""What each method gains per step at each budget: the measurements that default budgets are
derived from (``specgraft/methods/device_budget.py``).

Runs every method greedily at each budget of :data:`BUDGETS` on the tuning prompts that no
benchmark uses (``specgraft tune``'s: Spec-Bench items from the 41st of each task, HumanEval 100
onwards) and records, per budget, the steps, the tokens they emitted, the nodes they verified
and the drafting time, with the target's one-row forward on the same machine measured as
``specgraft profile`` measures a cost table's ``T(1, 1)``: drafting is read as a multiple of it,
so a table of another device scales it.
Measured per budget rather than per tree position because a smaller budget is not the first
nodes of a larger tree (a draft tree's nodes are in topological order, and each drafter picks
its own best nodes for the budget it gets). Tokens per step depend on the method and the models,
not on the device, so one measurement serves every cost table::

    python benchmarks/measure_budget_gains.py --threads 2 --out specgraft/data/budget_gains.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

#: Budgets each method is measured at, up to every node it can verify (the cpu preset's draft
#: tree holds at most 2 + 4 + 8 + 16 = 30 nodes; prompt lookup proposes only nodes whose estimated
#: acceptance passes its cut, so its larger budgets are caps it rarely fills).
BUDGETS = {
    "pld": (1, 2, 4, 8, 16, 32, 60),
    "recycling": (1, 2, 4, 8, 16, 32),
    "ptd": (1, 2, 4, 8, 16, 32),
    "adapld": (1, 2, 4, 8, 16, 46),
    "draft-tree": (1, 2, 4, 8, 16, 30),
    "graft-prune": (1, 2, 4, 8, 16, 30),
    "graft": (1, 2, 4, 8, 16, 30),
}


def task_tuning_prompts(per_task: int, tasks: list[str] | None = None):
    """Spec-Bench items 41 .. 40 + ``per_task`` of each of ``tasks`` (default: every task, in
    file order), which no benchmark suite uses (``spec-bench:N`` takes the first ``N``)."""
    from specgraft.suites import DATA_DIR, read_prompt_file

    by_task: dict[str, list] = {}
    for p in read_prompt_file(DATA_DIR / "spec_bench.jsonl", "spec-bench"):
        by_task.setdefault(p.task, []).append(p)
    unknown = [t for t in tasks or () if t not in by_task]
    if unknown:
        raise SystemExit(f"unknown Spec-Bench task {unknown[0]!r}; choose from {', '.join(by_task)}")
    return [p for t in tasks or list(by_task) for p in by_task[t][40 : 40 + per_task]]


def code_tuning_prompts(code_prompts: int):
    """HumanEval items 100 .. 99 + ``code_prompts`` (no benchmark suite uses them)."""
    from specgraft.suites import DATA_DIR, read_prompt_file

    return read_prompt_file(DATA_DIR / "humaneval.jsonl", "humaneval")[100 : 100 + code_prompts]


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


def write(path: str, result: dict) -> None:
    """One line per method, so the file reads as a table."""
    methods = ",\n".join(f"  {json.dumps(name)}: {json.dumps(row)}" for name, row in result["methods"].items())
    with open(path + ".tmp", "w") as f:
        f.write('{"meta": ' + json.dumps(result["meta"]) + ',\n "methods": {\n' + methods + "\n }\n}\n")
    os.replace(path + ".tmp", path)


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


def bracketed_timings(base, variants, prompts, max_new_tokens: int):
    """Time each variant against ``ar`` per prompt, drift bracketed: for every prompt, ``ar``,
    then each variant (in an order that alternates from prompt to prompt), then ``ar`` again.
    ``variants``: ``(key, budget, decoder)``; greedy, exactly ``max_new_tokens`` tokens (EOS
    does not stop). Warms every decoder up first. Yields, per prompt, ``(i, ar_first, ar_last,
    {key: (seconds, MAT, output equals ar's)})``."""

    def run(dec, ids, budget=None, tokens=max_new_tokens):
        return timed_generate(dec, ids, tokens, budget)

    warm = base.encode("Say hello.", chat=True)
    for _, budget, dec in variants:
        run(dec, warm, budget, tokens=4)
    run(base, warm, tokens=4)
    for i, ids in enumerate(prompts):
        ar_first, ref = run(base, ids)
        timed = {}
        for key, budget, dec in variants if i % 2 == 0 else variants[::-1]:
            seconds, out = run(dec, ids, budget)
            timed[key] = (seconds, out.stats.mat, out.tokens == ref.tokens)
        ar_last, _ = run(base, ids)
        yield i, ar_first, ar_last, timed


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


def main() -> None:
    import torch

    from specgraft.bench.runner import conversation_ids
    from specgraft.config import GenerationConfig
    from specgraft.drafters.draft_model import get_preset

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--methods", default=",".join(BUDGETS))
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--code-prompts", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--resume", action="store_true", help="Keep the (method, budget) rows already in --out.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    prompts = tuning_prompts(args.per_task, args.code_prompts)
    has_template = bool(getattr(base.tokenizer, "chat_template", None))
    ids = [conversation_ids(base.tokenizer, p.turns[:1], [], p.chat and has_template) for p in prompts]
    meta = {
        "model": args.model, "draft_model": args.draft_model, "draft_quant": args.draft_quant, "dtype": str(base.target.dtype).replace("torch.", ""), "preset": "cpu",
        "extend": get_preset("cpu").extend,  # derived_budget refuses draft-model trees extended otherwise
        "stop_min": get_preset("cpu").stop_min,  # ... or stopped early otherwise
        "expand": get_preset("cpu").expand,  # ... or expanding another number of nodes per layer
        "prompts": [p.id for p in prompts], "max_new_tokens": args.max_new_tokens, "greedy": True, "measured": time.strftime("%Y-%m-%d"),
        "what": "per budget, over every prompt: steps, tokens emitted, nodes verified, drafting seconds; plain_step_s: "
                "the target's one-row forward as `specgraft profile` measures T(1, 1), on the machine that measured",
    }
    result = {"meta": meta, "methods": {}}
    if args.resume and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        result["methods"], meta["plain_step_s"] = old["methods"], old["meta"]["plain_step_s"]
    else:
        # the target's one-row forward on this machine, measured as `specgraft profile` measures a
        # cost table's T(1, 1): drafting time is stored relative to it and read against a table's
        from specgraft.batch.profile import measure_costs

        meta["plain_step_s"] = round(measure_costs(base.target, batch_sizes=(1,), rows=(1,), reps=5).cost(1, 1), 5)
        print(f"one-row forward (as profiled): {meta['plain_step_s'] * 1000:.1f} ms", flush=True)
    for method in args.methods.split(","):
        dec = base.with_method(method)
        row = result["methods"].setdefault(method, {"budgets": [], "steps": [], "tokens": [], "nodes": [], "draft_s": []})
        for budget in BUDGETS[method]:
            if budget in row["budgets"]:
                continue
            steps = tokens = nodes = 0
            draft_s = 0.0
            t0 = time.perf_counter()
            for prompt_ids in ids:
                seq = dec.engine.start(prompt_ids, GenerationConfig(max_new_tokens=args.max_new_tokens, budget=budget))
                try:
                    while not seq.done:
                        tokens += len(dec.engine.step(seq))
                        steps += 1
                        nodes += seq.last_tree_nodes
                finally:
                    dec.engine.finish(seq)
                draft_s += seq.stats.draft_s
            for key, value in (("budgets", budget), ("steps", steps), ("tokens", tokens), ("nodes", nodes), ("draft_s", round(draft_s, 3))):
                row[key].append(value)
            order = sorted(range(len(row["budgets"])), key=row["budgets"].__getitem__)
            for key in row:
                row[key] = [row[key][i] for i in order]
            print(f"{method:<12} budget {budget:3d}: {steps:4d} steps, {tokens / steps:.2f} tokens/step, "
                  f"{nodes / steps:5.1f} nodes/step, drafting {draft_s / steps / meta['plain_step_s']:.3f} plain steps per step, "
                  f"{time.perf_counter() - t0:6.1f} s", flush=True)
            write(args.out, result)


if __name__ == "__main__":
    main()
