"""Batched `ar` at B = 16 on a GPU (random 1.5B, bf16): time a decode step (difference of 64- and
16-token runs), HF padded generate on the same prompts, then a cProfile of one 64-token run."""
import cProfile, pstats, sys, time, torch
from specgraft.api import SpecDecoder
from specgraft.config import GenerationConfig
from specgraft.models.device import attention_backends
path = sys.argv[1]; B = int(sys.argv[2]) if len(sys.argv) > 2 else 16
device = sys.argv[3] if len(sys.argv) > 3 else "cuda"
dec = SpecDecoder.from_pretrained(path, method="ar", dtype="bfloat16" if device == "cuda" else "float32", device=device, progress=False)
model = dec.target.model
texts = [f"Write a python function number {i} that adds {i} numbers and explain it in detail." for i in range(B)]
prompts = [dec.encode(t, chat=True) for t in texts]
sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
def ours(n):
    cfg = GenerationConfig(max_new_tokens=n, stop_on_eos=False)
    batch = dec.batch_engine(max_batch=B)
    sync(); t0 = time.perf_counter()
    for p in prompts: batch.submit(p, cfg)
    for ev in batch.events(): pass
    sync(); return time.perf_counter() - t0
tok = dec.tokenizer if hasattr(dec, "tokenizer") else None
L = max(len(p) for p in prompts)
x = torch.tensor([[0] * (L - len(p)) + p for p in prompts], device=device)
m = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts], device=device)
def hf(n):
    with torch.inference_mode(), attention_backends(x.device):
        sync(); t0 = time.perf_counter()
        model.generate(x, attention_mask=m, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0)
        sync(); return time.perf_counter() - t0
ours(4); hf(4)
for rnd in range(2):
    a64, a16, h64, h16 = ours(64), ours(16), hf(64), hf(16)
    print(f"round {rnd}: ours 64 {a64:.3f} s 16 {a16:.3f} s step {(a64 - a16) / 48 * 1000:.2f} ms | "
          f"HF 64 {h64:.3f} s 16 {h16:.3f} s step {(h64 - h16) / 48 * 1000:.2f} ms", flush=True)
pr = cProfile.Profile(); pr.enable(); ours(64); pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(35)
st.sort_stats("cumulative").print_stats(45)
