"""``ar`` and ``draft-tree`` with the prompt's prefill fused into the first step and apart (issue 14).

One process, the 1.5B target and the int8 0.5B draft; per prompt (first turns of ``--suite`` in
``--tasks``, chat template, greedy, 128 new tokens, EOS stops) the four runs ``ar``, ``ar+fuse``,
``tree``, ``tree+fuse`` in an order that alternates from prompt to prompt (``tree``: the cpu
preset's plain tree, extension 8, budget 8; ``fuse`` toggles ``SpecEngine.fusion``
between 512 and 0). Prints per prompt ``(seconds, equal to ar, steps, prefill s, forward s)``
and the totals::

    python benchmarks/experiments/draft-tree/measure_fused_start.py --out /dev/null > benchmarks/experiments/draft-tree/raw/results-issue14/zen3-fused/fuse-check-short6.txt
"""

import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/
import torch  # noqa: E402
from tools.common import load_base, model_arguments, timed_generate  # noqa: E402

from specgraft.methods import MethodOptions  # noqa: E402
from specgraft.engine import PrefillFusion  # noqa: E402


def main() -> None:
    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--suite", default="benchmarks/experiments/headline-set/suites/lost-tasks.jsonl")
    parser.add_argument("--tasks", default="translation,qa")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_base(args)
    tree = base.with_method("draft-tree", MethodOptions(graft=dataclasses.replace(base.options.graft, extend=8), cost_table=None))
    prompts = [json.loads(l) for l in open(args.suite)]
    prompts = [p for p in prompts if p["task"] in args.tasks.split(",")]
    def run(dec, ids, fuse):
        dec.engine = dec.engine.with_fusion(PrefillFusion(max_rows=512 if fuse else 0))
        return timed_generate(dec, ids, 128, None if dec is base else 8, stop_on_eos=True)
    warm = base.encode("Say hello.", chat=True)
    for d in (base, tree):
        for f in (0, 1): run(d, warm, f)
    tot = {}
    for i, p in enumerate(prompts):
        ids = base.encode(p["turns"][0], chat=True)
        order = [("ar", base, 0), ("ar", base, 1), ("tree", tree, 0), ("tree", tree, 1)]
        if i % 2: order = order[::-1]
        res = {}
        for name, d, f in order:
            s, out = run(d, ids, f)
            key = f"{name}{'+fuse' if f else ''}"
            res[key] = (s, out.tokens, out.stats.steps, out.stats.prefill_s, out.stats.forward_s)
            tot[key] = tot.get(key, 0) + s
        ref = res["ar"][1]
        print(p["id"], len(ids), len(ref), {k: (round(v[0], 2), v[1] == ref, v[2], round(v[3], 2), round(v[4], 2)) for k, v in res.items()}, flush=True)
    print({k: round(v, 2) for k, v in tot.items()})


if __name__ == "__main__":
    main()
