"""Our one-row decoding on llama.cpp with flash attention "auto" against "on", beside
llama-cpp-python's plain ``generate``, alternating, on one 300-token prompt (the record in NOTES.md,
"Flash attention by default").

    python benchmarks/experiments/llamacpp/flash_attention_probe.py

It patches ``llama_context_default_params`` while building each ``LlamaCppTarget`` so the only
difference between the two targets is ``flash_attn_type``.
"""

from __future__ import annotations

import glob
import time
from pathlib import Path

import llama_cpp

from specgraft.bench.llamacpp_peers import LlamaCppPeer
from specgraft.models.llamacpp import LlamaCppTarget

GGUF = glob.glob(str(Path.home() / ".cache/specgraft/models/qwen2.5-coder-1.5b-instruct/*.gguf"))[0]
PROMPT = list(range(1000, 1300))


def target_with(flash_attn_type: int) -> LlamaCppTarget:
    original = llama_cpp.llama_context_default_params

    def patched():
        params = original()
        params.flash_attn_type = flash_attn_type
        return params

    llama_cpp.llama_context_default_params = patched
    try:
        return LlamaCppTarget(GGUF, threads=2)
    finally:
        llama_cpp.llama_context_default_params = original


def decode(target: LlamaCppTarget, n: int = 128) -> tuple[float, float]:
    """Seconds of the prompt's prefill and of ``n`` greedy one-row steps."""
    slot = target.allocate()
    t0 = time.perf_counter()
    target.prefill(slot, PROMPT[:-1])
    t1 = time.perf_counter()
    token = PROMPT[-1]
    for _ in range(n):
        out = target.forward_rows(slot, [token], [-1])
        target.commit(slot, [0])
        token = int(out.logits[0].argmax())
    t2 = time.perf_counter()
    target.release(slot)
    return t1 - t0, t2 - t1


def main() -> None:
    targets = {"auto": target_with(-1), "on": target_with(1)}
    peer = LlamaCppPeer("llamacpp", GGUF, targets["auto"].eos_token_ids, 128, threads=2)
    for _ in range(2):
        for name, target in targets.items():
            prefill, steps = decode(target)
            print(f"ours, flash attention {name}: prefill {prefill:.2f} s, 128 steps {steps:.2f} s ({128 / steps:.2f} tok/s)", flush=True)
        run = peer.run(PROMPT, 128)
        print(f"llama-cpp-python generate: {len(run.tokens)} tokens in {run.time_s:.2f} s (prefill included)", flush=True)


if __name__ == "__main__":
    main()
