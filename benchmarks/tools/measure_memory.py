"""Resident memory after loading models the way specgraft loads them (issue 14, part 2).

Each configuration runs in a fresh Python process (RSS never goes down reliably once a process
has touched memory), which loads the model(s) with ``load_causal_lm`` / ``load_draft_model``
and reports ``VmRSS`` (resident now) and ``VmHWM`` (peak resident, loading included) from
``/proc/self/status``, in GiB::

    python benchmarks/tools/measure_memory.py --out benchmarks/memory_issue14.json
    python benchmarks/tools/measure_memory.py --only qwen2.5-coder-1.5b-instruct
    python benchmarks/tools/measure_memory.py --only pair --draft-quant int8    # 1.5B target + int8 0.5B draft

``--draft-quant`` is passed to the draft of the target + draft row (code from before issue 14
has no such option: leave it out there).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CATALOG = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def status_gib() -> dict[str, float]:
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = round(int(value.split()[0]) / 2**20, 2)  # kB -> GiB
    return fields


def child(target: str, draft: str | None, quant: str | None, fast_kernels: bool) -> None:
    import gc

    import torch

    from specgraft.models.loading import load_causal_lm
    from specgraft.models.resolve import resolve_model

    torch.set_num_threads(2)
    base = status_gib()["VmRSS"]
    models = [load_causal_lm(str(resolve_model(target, progress=False)), "float32", "cpu", fast_kernels)]
    if draft:
        from specgraft.models.loading import load_draft_model

        kwargs = {"quant": quant} if quant else {}
        models.append(load_draft_model(draft, "float32", "cpu", progress=False, **kwargs))
    gc.collect()
    # one forward each, so lazily built state (oneDNN primitives, unpacked weights) is counted
    with torch.no_grad():
        for model in models:
            model(torch.tensor([[1, 2, 3, 4]]))
    gc.collect()
    import specgraft

    print(json.dumps({"python_torch_gib": base, **status_gib(), "specgraft": specgraft.__file__}))


def measure(target: str, draft: str | None = None, quant: str | None = None, fast_kernels: bool = True) -> dict:
    cmd = [sys.executable, __file__, "--child", target, "--fast-kernels", str(int(fast_kernels))]
    if draft:
        cmd += ["--draft", draft]
    if quant:
        cmd += ["--draft-quant", quant]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    row = {"target": target, "draft": draft, "draft_quant": quant, "fast_kernels": fast_kernels, **json.loads(out.splitlines()[-1])}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--draft", help=argparse.SUPPRESS)
    parser.add_argument("--fast-kernels", default="1", help=argparse.SUPPRESS)
    parser.add_argument("--draft-quant", default=None, help="draft numerics of the target + draft row")
    parser.add_argument("--only", default=None, help="measure this one model alone, or 'pair' (target + draft) alone")
    parser.add_argument("--plain", action="store_true", help="also each model with fast_kernels=False")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.draft, args.draft_quant, args.fast_kernels == "1")
        return
    rows = []
    for name in [args.only] if args.only and args.only != "pair" else [] if args.only else CATALOG:
        rows.append(measure(name))
        if args.plain:
            rows.append(measure(name, fast_kernels=False))
    if args.only in (None, "pair"):
        rows.append(measure(TARGET, DRAFT, args.draft_quant))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
