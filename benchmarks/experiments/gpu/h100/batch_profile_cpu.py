"""cProfile of batched `ar` at B = 16 with the tiny Qwen2 on the CPU: where a batched step's host time goes
(RESULTS, *On a GPU again*). Run from the repository root: python benchmarks/experiments/gpu/h100/batch_profile_cpu.py"""
import cProfile, pstats, sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
torch.set_num_threads(1)
from tests.helpers.models import tiny_qwen2, tiny_tokenizer
from specgraft.api import SpecDecoder
from specgraft.config import GenerationConfig
model = tiny_qwen2(layers=2)
dec = SpecDecoder(model, tiny_tokenizer(), method="ar")
prompts = [[5 + (7 * i + j) % 80 for i in range(30 + j)] for j in range(16)]
cfg = GenerationConfig(max_new_tokens=64, stop_on_eos=False)
def run():
    batch = dec.batch_engine(max_batch=16)
    ids = [batch.submit(p, cfg) for p in prompts]
    for ev in batch.events(): pass
run()
t0 = time.perf_counter(); run(); print("B=16, 64 tokens:", round(time.perf_counter() - t0, 3), "s")
pr = cProfile.Profile(); pr.enable(); run(); pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
