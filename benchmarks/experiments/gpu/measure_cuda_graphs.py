"""CUDA graphs of the decoder forwards (``specgraft/models/graphs.py``) against eager forwards on
a GPU: ``ar`` and ``draft-tree`` on one prompt (ms a token, alternating eager / graphs, repeats),
Hugging Face's ``generate`` on the same weights beside them, then batched ``ar`` at ``--batch``
sequences (ms a step: the difference of a 64- and a 16-token run over 48), and batched
``draft-tree`` with graphs, its tree inputs built for the whole batch or slot by slot
(``HFTarget._batch_tree_inputs``; random drafts: MAT ~1, so ms a token ~ ms a step). Graphs are switched
by detaching each model's ``HFTarget.graphs`` (target and draft model), so both modes run the
same loaded weights. Random weights of the catalog shapes serve (``random_models.py``): costs
are real, acceptance is not (a random draft is never right, MAT ~1)::

    python benchmarks/experiments/gpu/measure_cuda_graphs.py --model /tmp/rm/qwen2.5-coder-1.5b-instruct \\
        --draft-model /tmp/rm/qwen2.5-coder-0.5b-instruct --out cuda-graphs.json
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root


def main() -> None:
    import torch

    from specgraft.api import SpecDecoder
    from specgraft.config import GenerationConfig
    from specgraft.methods import GraftOptions, MethodOptions
    from specgraft.models.device import attention_backends
    from specgraft.models.hf import HFTarget

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft-model", required=True)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script through the graphs' eager twin (fp32)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    gpu = args.device != "cpu"
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    if not gpu:
        import specgraft.models.hf as hf

        hf.graphs_by_default = lambda device: True  # the twin (no capture on a CPU)
    options = MethodOptions(graft=GraftOptions(draft_model=args.draft_model))
    dec = SpecDecoder.from_pretrained(args.model, method="ar", dtype="bfloat16" if gpu else "float32", device=args.device, options=options, progress=False)
    decoders = {"ar": dec, "draft-tree": dec.with_method("draft-tree", options)}
    targets = {name: [t for t in [d.target, *(getattr(x, "lm", None) for x in d.engine.drafters)] if isinstance(t, HFTarget)] for name, d in decoders.items()}
    saved = {id(t): t.graphs for ts in targets.values() for t in ts}
    if any(g is None for g in saved.values()):
        sys.exit(f"graphs are off for some model (SPECGRAFT_CUDA_GRAPHS=0?): {targets}")

    def mode(name: str, on: bool) -> None:
        for t in targets[name]:
            t.graphs = saved[id(t)] if on else None

    ids = dec.encode("Write a python function that adds two numbers and explain it.", chat=True)
    cfg = GenerationConfig(max_new_tokens=args.tokens, stop_on_eos=False)
    report: dict = {"device": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__, "tokens": args.tokens, "runs": []}

    def timed(name: str, on: bool) -> tuple[float, list[int], float]:
        mode(name, on)
        sync()
        t0 = time.perf_counter()
        out = decoders[name].generate(ids, config=cfg)
        sync()
        return time.perf_counter() - t0, list(out.tokens), out.stats.mat

    x = torch.tensor([ids], device=args.device)

    def hf() -> float:
        with torch.inference_mode(), attention_backends(x.device):
            sync()
            t0 = time.perf_counter()
            dec.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False, pad_token_id=0)
            sync()
            return time.perf_counter() - t0

    for name in decoders:  # warm-up: kernels, and each key seen and captured
        timed(name, False), timed(name, True), timed(name, True)
    hf()
    times: dict[str, list[float]] = {}
    outputs: dict[str, list[int]] = {}
    for r in range(args.repeats):
        for name in decoders:
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                s, toks, mat = timed(name, on)
                label = f"{name} {'graphs' if on else 'eager'}"
                times.setdefault(label, []).append(s)
                outputs[label] = toks
                report["runs"].append({"run": label, "s": s, "mat": mat})
                print(f"{label}: {s / args.tokens * 1000:.2f} ms/token (MAT {mat:.2f})", flush=True)
        times.setdefault("hf generate", []).append(hf())
        print(f"hf generate: {times['hf generate'][-1] / args.tokens * 1000:.2f} ms/token", flush=True)
    summary = {label: statistics.median(v) / args.tokens * 1000 for label, v in times.items()}
    report["ms_per_token"] = summary
    for name in decoders:
        a, b = outputs[f"{name} eager"], outputs[f"{name} graphs"]
        same = sum(p == q for p, q in zip(a, b))
        report.setdefault("same_tokens", {})[name] = same
        print(f"{name}: eager {summary[name + ' eager']:.2f}, graphs {summary[name + ' graphs']:.2f} ms/token "
              f"(x{summary[name + ' graphs'] / summary[name + ' eager']:.3f}); outputs agree on {same}/{len(a)} tokens (bf16)")
    print(f"hf generate: {summary['hf generate']:.2f} ms/token")
    report["graph_stats"] = {name: [vars(saved[id(t)].stats) for t in targets[name]] for name in decoders}
    print("graph stats", report["graph_stats"], flush=True)

    # batched ar: a step at B sequences
    texts = [f"Write a python function number {i} that adds {i} numbers and explain it in detail." for i in range(args.batch)]
    prompts = [dec.encode(t, chat=True) for t in texts]

    def run_batch(name: str, n: int) -> float:
        """Seconds for ``name`` to generate ``n`` tokens for every prompt, ``--batch`` at a time."""
        config = GenerationConfig(max_new_tokens=n, stop_on_eos=False)
        batch = decoders[name].batch_engine(max_batch=args.batch)
        sync()
        t0 = time.perf_counter()
        for p in prompts:
            batch.submit(p, config)
        for _ in batch.events():
            pass
        sync()
        return time.perf_counter() - t0

    def step_ms(name: str, switch, labels: dict[bool, str], long: int, short: int = 16) -> dict[str, float]:
        """ms a step of ``name`` batched, for each setting ``switch(True/False)`` (labelled by
        ``labels``): the difference of a ``long``- and a ``short``-token run over their
        difference, two rounds in alternating order after a warm-up of each, medians."""
        for on in (False, True, True):
            switch(on)
            run_batch(name, 8)
        steps: dict[str, list[float]] = {}
        for r in range(2):
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                switch(on)
                step = (run_batch(name, long) - run_batch(name, short)) / (long - short) * 1000
                steps.setdefault(labels[on], []).append(step)
                print(f"B={args.batch} {name}, {labels[on]}: {step:.2f} ms a step", flush=True)
        return {k: statistics.median(v) for k, v in steps.items()}

    report["batch"] = args.batch
    report["batched_step_ms"] = step_ms("ar", lambda on: mode("ar", on), {False: "eager", True: "graphs"}, 64)
    print(json.dumps(report["batched_step_ms"]))

    # batched draft-tree with graphs: tree inputs built for the whole batch or slot by slot
    # (HFTarget._batch_tree_inputs against _tree_inputs, target and draft model); random
    # drafts: MAT ~1, so a step is ~a token of each sequence
    mode("draft-tree", True)

    def tree_inputs(whole: bool) -> None:
        for t in targets["draft-tree"]:
            t.options = t.options.replace(batched_tree_inputs=whole)

    labels = {True: "graphs, whole-batch inputs", False: "graphs, slot-by-slot inputs"}
    report["batched_draft_tree_ms"] = step_ms("draft-tree", tree_inputs, labels, 48)
    print(json.dumps(report["batched_draft_tree_ms"]))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
