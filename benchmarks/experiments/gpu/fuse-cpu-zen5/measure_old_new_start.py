"""Start + first step of pld with the old CPU defaults (prefill chunks of 512, no tail fusion) and the new ones (chunks
of 256, the part past the whole chunks fused), alternating, medians of 3 after a warm-up round. From the repository root:
``python benchmarks/experiments/gpu/fuse-cpu-zen5/measure_old_new_start.py 600,700,1100``."""
import statistics, sys, torch
sys.path.insert(0, "benchmarks/experiments/gpu")  # measure_fuse_length.py
torch.set_num_threads(2)
from specgraft.api import SpecDecoder
from specgraft.engine import PrefillFusion
from measure_fuse_length import text_ids, start_and_step
base = SpecDecoder.from_pretrained("qwen2.5-coder-1.5b-instruct", method="ar", dtype="float32", progress=False)
dec = base.with_method("pld")
eng, target = dec.engine, dec.engine.target
settings = {"old (chunk 512, no tail)": (512, False), "new (chunk 256, tail)": (256, True)}
def run(ids, chunk, tail):
    target.prefill_chunk = chunk
    dec.engine = eng.with_fusion(PrefillFusion(max_rows=320, tail=tail))
    return start_and_step(dec, ids, True, 16, fuse_max=320)
for n in [int(x) for x in sys.argv[1].split(",")]:
    ids = text_ids(base, n)
    times = {k: [] for k in settings}; outs = {}
    for r in range(4):
        for k in (list(settings) if r % 2 == 0 else list(settings)[::-1]):
            s, toks, _ = run(ids, *settings[k])
            if r: times[k].append(s)
            outs.setdefault(k, toks)
    assert len({tuple(v) for v in outs.values()}) == 1
    print(n, "tokens:", "  ".join(f"{k}: {statistics.median(v):.2f} s" for k, v in times.items()), flush=True)
