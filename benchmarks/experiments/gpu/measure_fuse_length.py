"""Where fusing the prompt into the first forward stops paying: start + first step, fused and apart.

``SpecEngine.start`` runs a short prompt's prefill inside the first step's forward (one forward
instead of two; ``PrefillFusion.max_rows`` tokens at most). Past some length the fused forward loses:
on a CPU one forward of many rows costs more per row than the prefill's chunks (its activations
leave the cache), on a GPU its attention grows with the square of the rows, which a CUDA graph's
padding to a power of two doubles again. This measures that crossover on the machine at hand:
for each prompt length, a method's
``start`` + first ``step`` with fusing forced on (``PrefillFusion.max_rows`` = the length) and off (0),
in an order that alternates from round to round, the same emitted tokens both ways (checked: one
is a prefix of the other, since AdaPLD's first tree differs when fused; in float32 only: in bf16
the two attention paths round differently, and a random model's near-ties can flip a token).

Prompts are real text cut to each length (the bundled Spec-Bench turns, concatenated), so prompt
lookup finds matches and the first step verifies a tree, as it would on a real request. With a
random-weight model (a GPU machine without weights) the costs are real, the tokens meaningless.
Prints one line per length (median seconds fused / apart, their ratio) and writes ``--out`` JSON::

    python benchmarks/experiments/gpu/measure_fuse_length.py --model qwen2.5-coder-1.5b-instruct --methods pld,adapld \\
        --lengths 128,256,384,512 --rounds 3
    python benchmarks/experiments/gpu/measure_fuse_length.py --model /tmp/rm/qwen2.5-coder-1.5b-instruct --device cuda \\
        --dtype bfloat16 --lengths 128,256,512,1024,2048,4096 --rounds 5 --out fuse-gpu.json

(``experiments/adapld-reader/adapld-zen5-fused/measure_fuse_length.py`` is the one-off this grew from: the
same measurement on benchmark prompts, which set the CPU's 320.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specgraft.api import SpecDecoder
from specgraft.config import GenerationConfig
from specgraft.engine import PrefillFusion
from specgraft.suites import DATA_DIR


def text_ids(decoder: SpecDecoder, length: int) -> list[int]:
    """The first ``length`` tokens of the bundled Spec-Bench turns, concatenated."""
    pieces: list[int] = []
    with (DATA_DIR / "spec_bench.jsonl").open() as f:
        for line in f:
            for turn in json.loads(line)["turns"]:
                pieces += decoder.encode(turn)
                if len(pieces) >= length:
                    return pieces[:length]
    raise ValueError(f"the bundled text has fewer than {length} tokens")


def start_and_step(decoder: SpecDecoder, ids: list[int], fuse: bool, budget: int, fuse_max: int | None = None) -> tuple[float, list[int], bool]:
    """Seconds for ``start`` + one ``step`` (fused or apart), the tokens emitted, whether it fused.
    Fused means the whole prompt in the first forward, or with ``fuse_max`` the engine's own rule
    at that ``PrefillFusion.max_rows`` (a long prompt's whole chunks apart, the rest fused)."""
    engine = decoder.engine.with_fusion(PrefillFusion(max_rows=(len(ids) if fuse_max is None else fuse_max) if fuse else 0,
                                                      tail=decoder.engine.fusion.tail))
    cuda = str(engine.target.device).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    seq = engine.start(ids, GenerationConfig(max_new_tokens=8, budget=budget))
    fused = bool(seq.unfilled)
    engine.step(seq)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens = list(seq.new_tokens)
    engine.finish(seq)
    return seconds, tokens, fused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="catalog name or local directory")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--methods", default="pld", help="comma list of methods that can fuse (pld, adapld, draft-tree, ...)")
    ap.add_argument("--lengths", default="128,256,384,512", help="comma list of prompt lengths (tokens)")
    ap.add_argument("--rounds", type=int, default=3, help="measurements per (method, length, setting); the median is kept")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--fuse-max", type=int, help="fused = the engine's rule at this PrefillFusion.max_rows (a long prompt fuses "
                    "the part past its whole prefill chunks), instead of the whole prompt")
    ap.add_argument("--tree-inputs", default="host", choices=("host", "device", "both"),
                    help="where the forward's ancestor sets and mask are built (TargetOptions.host_tree_inputs); both: a row each")
    ap.add_argument("--out", help="JSON with every measurement")
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    base = SpecDecoder.from_pretrained(args.model, method="ar", dtype=args.dtype, device=args.device, progress=False)
    lengths = [int(x) for x in args.lengths.split(",")]
    prompts = {n: text_ids(base, n) for n in lengths}
    rows = []
    settings = ("host", "device") if args.tree_inputs == "both" else (args.tree_inputs,)
    # (fused?, tree inputs) combinations, their order rotated from round to round
    combos = [(fuse, where) for where in settings for fuse in (True, False)]
    for method in args.methods.split(","):
        decoder = base.with_method(method)
        target = decoder.engine.target

        def run(n: int, fuse: bool, where: str) -> tuple[float, list[int], bool]:
            target.options = target.options.replace(host_tree_inputs=where == "host")
            return start_and_step(decoder, prompts[n], fuse, args.budget, args.fuse_max)

        if not run(lengths[0], True, settings[0])[2]:
            print(f"{method}: its drafters cannot fuse the prompt (skipped)", flush=True)
            continue
        # warm-up: every length once every way (kernels, CUDA graphs of the first step's rows)
        for n in lengths:
            for fuse, where in combos:
                run(n, fuse, where)
        for n in lengths:
            times: dict[tuple, list[float]] = {c: [] for c in combos}
            outs: dict[tuple, list[int]] = {}
            for r in range(args.rounds):
                shift = r % len(combos)
                for combo in (combos[shift:] + combos[:shift])[:: 1 if r % 2 == 0 else -1]:
                    s, toks, _ = run(n, *combo)
                    times[combo].append(s)
                    outs.setdefault(combo, toks)
            for where in settings:
                a, b = outs[(True, where)], outs[(False, where)]
                same = a[: len(b)] == b[: len(a)]  # a first tree may differ (AdaPLD's), the text not
                if not same and args.dtype == "float32":
                    raise SystemExit(f"{method} at {n} tokens: fused and apart emitted different tokens ({a} vs {b})")
                fused, apart = statistics.median(times[(True, where)]), statistics.median(times[(False, where)])
                rows.append({"method": method, "tree_inputs": where, "length": n, "fused_s": fused, "apart_s": apart,
                             "fused_all": times[(True, where)], "apart_all": times[(False, where)], "tokens": [len(a), len(b)],
                             "same_tokens": same})
                print(f"{method:10s} {where:6s} {n:5d} tokens  fused {fused * 1e3:8.1f} ms  apart {apart * 1e3:8.1f} ms  "
                      f"fused/apart {fused / apart:5.2f}" + ("" if same else "  (other tokens: bf16 rounding of the two attention paths)"),
                      flush=True)
    if args.out:
        env = {"device": args.device, "dtype": args.dtype, "model": args.model, "rounds": args.rounds, "budget": args.budget}
        if args.device.startswith("cuda"):
            env["gpu"] = torch.cuda.get_device_name()
        with open(args.out, "w") as f:
            json.dump({"environment": env, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
