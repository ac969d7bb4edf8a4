"""Host cost of a batched tree forward's inputs: ``HFTarget._batch_tree_inputs`` (whole batch)
against the slot-by-slot ``_tree_inputs``, in a forward of a tiny random model where building the
inputs is most of the work (on a GPU whose forwards are replayed as CUDA graphs that host work is
what a tree step waits for; RESULTS *On a GPU, third time*). Trees of ``--rows`` rows a slot
(random parents, counts 1..rows, so rows are padded) after 64 cached tokens, B sequences, the two
builds alternating, medians of ``--repeats`` runs of ``--steps`` forwards; outputs compared::

    python benchmarks/experiments/gpu/measure_batch_tree_inputs.py --batch-sizes 1,4,16 --rows 8
"""

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root


def main() -> None:
    import torch

    from specgraft.models.hf import HFTarget
    from tests.helpers.models import tiny_llama

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", default="1,4,16")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = tiny_llama()
    for b in (int(x) for x in args.batch_sizes.split(",")):
        times: dict[bool, list[float]] = {True: [], False: []}
        logits: dict[bool, list[torch.Tensor]] = {}
        for rep in range(args.repeats):
            for batched in ((True, False) if rep % 2 == 0 else (False, True)):
                target = HFTarget(model, batched_tree_inputs=batched)
                slots = [target.allocate() for _ in range(b)]
                for s in slots:
                    target.prefill(s, [5 + (3 * i + s) % 90 for i in range(64)])
                rng = random.Random(rep)
                out = []
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    counts = [rng.randint(1, args.rows) for _ in slots]
                    parents = [[-1] + [rng.randrange(i + 1) for i in range(c - 1)] for c in counts]
                    tokens = [[rng.randrange(3, 90) for _ in range(c)] for c in counts]
                    res = target.forward_batch(slots, tokens, parents)
                    out.append(res[0].logits)
                    for s in slots:
                        target.commit(s, [0])
                times[batched].append((time.perf_counter() - t0) / args.steps * 1000)
                logits.setdefault(batched, out)
        same = all(torch.equal(x, y) for x, y in zip(logits[True], logits[False]))
        whole, apart = statistics.median(times[True]), statistics.median(times[False])
        print(f"B={b}, up to {args.rows} rows a slot: whole-batch {whole:.2f} ms, slot by slot {apart:.2f} ms a forward "
              f"(x{whole / apart:.3f}); logits equal: {same}", flush=True)


if __name__ == "__main__":
    main()
