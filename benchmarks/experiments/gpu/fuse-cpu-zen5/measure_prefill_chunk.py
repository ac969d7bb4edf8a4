"""Prefill time of a prompt per prefill_chunk, alternating, medians of 3 after a warm-up round (this session's check of
HFTarget's CPU default). Run from the repository root:
``python benchmarks/experiments/gpu/fuse-cpu-zen5/measure_prefill_chunk.py 128,256,512,768,1024 1024 [MODEL]``."""
import time, statistics, torch, sys
sys.path.insert(0, "benchmarks/experiments/gpu")  # measure_fuse_length.py
torch.set_num_threads(2)
from specgraft.api import SpecDecoder
from measure_fuse_length import text_ids
dec = SpecDecoder.from_pretrained(sys.argv[3] if len(sys.argv) > 3 else "qwen2.5-coder-1.5b-instruct", method="ar", dtype="float32", progress=False)
target = dec.engine.target
chunks = [int(x) for x in sys.argv[1].split(",")]
lengths = [int(x) for x in sys.argv[2].split(",")]
for n in lengths:
    ids = text_ids(dec, n)
    times = {c: [] for c in chunks}
    for r in range(4):
        order = chunks if r % 2 == 0 else chunks[::-1]
        for c in order:
            target.prefill_chunk = c
            slot = target.allocate()
            t0 = time.perf_counter()
            target.prefill(slot, ids)
            dt = time.perf_counter() - t0
            target.release(slot)
            if r > 0:
                times[c].append(dt)
    print(n, "tokens:", "  ".join(f"chunk {c}: {statistics.median(times[c]):.2f} s" for c in chunks), flush=True)
