"""Where our one-row decoding on llama.cpp loses to llama-cpp-python's plain ``generate``: the
same 300-token prompt and 128 greedy steps, alternating, through

- ``target``: :class:`~specgraft.models.llamacpp.LlamaCppTarget` as the engine drives it
  (``forward_rows`` + ``commit``: a fresh sequence id per step, copied from the slot's);
- ``raw-ours``: a bare ``llama_decode`` loop on a context made with the target's parameters
  (unified KV cache, 256 sequence ids, 8192 cells, flash attention on), one sequence;
- ``raw-single``: the same loop on a context with llama-cpp-python's parameters for one sequence
  (no unified cache, one sequence id), flash attention on;
- ``generate``: llama-cpp-python's ``Llama.generate`` (the bench's ``llamacpp`` peer).

Each line prints the prefill and step times and llama.cpp's own counters (``llama_perf_context``:
decode calls, how many reused the previous compute graph).

    python benchmarks/experiments/llamacpp/plain_gap_probe.py [--rounds 2] [--steps 128]
"""

from __future__ import annotations

import argparse
import glob
import time
from pathlib import Path

import llama_cpp
import numpy as np

from specgraft.bench.llamacpp_peers import LlamaCppPeer
from specgraft.models.llamacpp import LlamaCppTarget

GGUF = glob.glob(str(Path.home() / ".cache/specgraft/models/qwen2.5-coder-1.5b-instruct/*.gguf"))[0]
PROMPT = list(range(1000, 1300))
THREADS = 2


class RawContext:
    """A bare llama.cpp context over the target's model, decoding one sequence one row at a time."""

    def __init__(self, model, unified: bool, n_seq_max: int, n_ctx: int, flash: int = 1):
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, 512, 512
        params.n_seq_max, params.kv_unified, params.flash_attn_type = n_seq_max, unified, flash
        params.n_threads = params.n_threads_batch = THREADS
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        self.mem = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(512, 0, 1)
        self.vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))

    def decode(self, tokens: list[int], start: int) -> np.ndarray:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, start + i, 1, i == len(tokens) - 1
            b.seq_id[i][0] = 0
        if llama_cpp.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits(self.ctx), shape=(1, self.vocab)).copy()

    def run(self, steps: int) -> tuple[float, float, list[int]]:
        llama_cpp.llama_memory_clear(self.mem, True)
        t0 = time.perf_counter()
        for s in range(0, len(PROMPT) - 1, 512):
            self.decode(PROMPT[s : min(s + 512, len(PROMPT) - 1)], s)
        t1 = time.perf_counter()
        token, pos, out = PROMPT[-1], len(PROMPT) - 1, []
        for _ in range(steps):
            token = int(self.decode([token], pos)[0].argmax())
            pos += 1
            out.append(token)
        return t1 - t0, time.perf_counter() - t1, out


def run_target(target: LlamaCppTarget, steps: int) -> tuple[float, float, list[int]]:
    slot = target.allocate()
    t0 = time.perf_counter()
    target.prefill(slot, PROMPT[:-1])
    t1 = time.perf_counter()
    token, out = PROMPT[-1], []
    for _ in range(steps):
        logits = target.forward_rows(slot, [token], [-1]).logits
        target.commit(slot, [0])
        token = int(logits[0].argmax())
        out.append(token)
    t2 = time.perf_counter()
    target.release(slot)
    return t1 - t0, t2 - t1, out


def counters(ctx) -> str:
    data = llama_cpp.llama_perf_context(ctx)
    llama_cpp.llama_perf_context_reset(ctx)
    return f"decodes {data.n_p_eval} prompt + {data.n_eval} one-row, graphs reused {data.n_reused}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=128)
    args = ap.parse_args()
    target = LlamaCppTarget(GGUF, threads=THREADS)
    contexts = {
        "raw-ours": RawContext(target._model, unified=True, n_seq_max=256, n_ctx=target.n_ctx),
        "raw-single": RawContext(target._model, unified=False, n_seq_max=1, n_ctx=target.n_ctx),
    }
    peer = LlamaCppPeer("llamacpp", GGUF, target.eos_token_ids, args.steps, threads=THREADS)
    reference = None
    for r in range(args.rounds):
        order = ["target", *contexts, "generate"]
        for name in order if r % 2 == 0 else order[::-1]:
            if name == "target":
                prefill, steps, out = run_target(target, args.steps)
                info = counters(target._ctx)
            elif name == "generate":
                t0 = time.perf_counter()
                run = peer.run(PROMPT, args.steps)
                prefill, steps, out = float("nan"), time.perf_counter() - t0, list(run.tokens)
                info = counters(peer.llama._ctx.ctx) + " (time: prefill + steps)"
            else:
                prefill, steps, out = contexts[name].run(args.steps)
                info = counters(contexts[name].ctx)
            reference = reference or out
            same = "same tokens" if out[: len(reference)] == reference[: len(out)] else "OTHER TOKENS"
            print(f"round {r} {name:10s} prefill {prefill:5.2f} s  steps {steps:6.2f} s ({len(out) / steps:5.2f} tok/s)  {info}; {same}",
                  flush=True)


if __name__ == "__main__":
    main()
