"""Host overhead of one decode step on a GPU: our ar vs HF generate, then a cProfile of ours."""
import cProfile, pstats, sys, time, torch
from specgraft.api import SpecDecoder
from specgraft.config import GenerationConfig
from specgraft.models.device import attention_backends
path = sys.argv[1]
device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
dec = SpecDecoder.from_pretrained(path, method="ar", dtype="bfloat16" if device == "cuda" else "float32", device=device, progress=False)
model = dec.target.model if hasattr(dec.target, "model") else None
ids = dec.encode("Write a python function that adds two numbers and explain it.", chat=True)
N = 64
cfg = GenerationConfig(max_new_tokens=N, stop_on_eos=False)
x = torch.tensor([ids], device=device)
def ours():
    sync(); t0 = time.perf_counter(); out = dec.generate(ids, config=cfg); sync(); return time.perf_counter() - t0, out
def hf():
    with torch.inference_mode(), attention_backends(x.device):
        sync(); t0 = time.perf_counter()
        model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0)
        sync(); return time.perf_counter() - t0, None
for f in (ours, hf, ours, hf, ours, hf):
    t, out = f()
    extra = f" prefill {out.stats.prefill_s*1000:.1f} ms" if out is not None and hasattr(out.stats, "prefill_s") else ""
    print(f.__name__, f"{t:.3f} s, {t / N * 1000:.2f} ms/token{extra}", flush=True)
pr = cProfile.Profile(); pr.enable(); ours(); pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(30)
st.sort_stats("cumulative").print_stats(40)
