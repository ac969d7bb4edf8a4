"""Start + first step of a method with the prompt fused into the first forward and apart, two rounds, order
alternating (this session's check of SpecEngine.fusion). Run from the repository root:
``python benchmarks/experiments/adapld-reader/adapld-zen5-fused/measure_fuse_length.py "code_edit@30-34;mt_bench@43-44" pld``."""
import sys, time, torch
sys.path.insert(0, "benchmarks/experiments/adapld-reader")  # measure_step_trace.py
from measure_step_trace import parse_prompts
from specgraft.api import SpecDecoder
from specgraft.config import GenerationConfig
from specgraft.methods import MethodOptions
from specgraft.engine import PrefillFusion
torch.set_num_threads(2)
table = "specgraft/data/costs/qwen2.5-coder-1.5b-instruct-cpu-avx512-t2.json"
base = SpecDecoder.from_pretrained("qwen2.5-coder-1.5b-instruct", method="ar", dtype="float32", progress=False, options=MethodOptions(cost_table=table))
eng = base.with_method(sys.argv[2]).engine
prompts = parse_prompts(sys.argv[1])
for r in range(2):
    for i, p in enumerate(prompts):
        ids = base.encode(p.turns[0], chat=True)
        res = {}
        for fuse in ((True, False) if (i + r) % 2 == 0 else (False, True)):
            eng = eng.with_fusion(PrefillFusion(max_rows=4096 if fuse else 0))
            t0 = time.perf_counter()
            seq = eng.start(ids, GenerationConfig(max_new_tokens=8, budget=16))
            eng.step(seq)
            res[fuse] = (time.perf_counter() - t0, list(seq.new_tokens))
            eng.finish(seq)
        assert res[True][1] == res[False][1]
        print(f"{p.id} {len(ids)} fused {res[True][0]:.2f} apart {res[False][0]:.2f}", flush=True)
