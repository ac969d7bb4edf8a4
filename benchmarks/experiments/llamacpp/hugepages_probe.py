"""Huge pages or not, ours or llama-cpp-python's: one generation setup per process.

Each run is its own process (how a process's models are placed in memory moved one-row decoding
by ~7%, so in-process comparisons of page sizes mislead): load, one warm-up generation, then the
best of two timed 128-token greedy generations of one chat prompt, prefill included. ``ours`` is
``ar`` on the llama.cpp backend (:class:`~specgraft.models.llamacpp.LlamaCppTarget`, which advises
huge pages after loading); ``peer`` is llama-cpp-python's ``Llama.generate`` (the bench's
``llamacpp`` peer, advised the same way). ``SPECGRAFT_HUGE_PAGES=0`` leaves both in 4 KiB pages.
Findings: NOTES.md, *Huge pages*.

    for r in 1 2; do for hp in 1 0; do for w in ours peer; do
        SPECGRAFT_HUGE_PAGES=$hp python benchmarks/experiments/llamacpp/hugepages_probe.py $w
    done; done; done
"""

from __future__ import annotations

import glob
import os
import sys
import time
from pathlib import Path

from specgraft.models.hugepages import anon_huge_bytes

GGUF = glob.glob(str(Path.home() / ".cache/specgraft/models/qwen2.5-coder-1.5b-instruct/*.gguf"))[0]
PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime, with tests."


def main() -> None:
    from transformers import AutoTokenizer

    which = sys.argv[1]
    tokenizer = AutoTokenizer.from_pretrained(Path(GGUF).parent)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=False)
    ids = tokenizer(ids, add_special_tokens=False)["input_ids"]
    if which == "ours":
        from specgraft import SpecDecoder

        dec = SpecDecoder.from_pretrained("qwen2.5-coder-1.5b-instruct", method="ar", backend="llamacpp", threads=2)
        def run():
            return dec.generate(ids, max_new_tokens=128)
    else:
        from specgraft.bench.llamacpp_peers import LlamaCppPeer

        peer = LlamaCppPeer("llamacpp", GGUF, [151643, 151645], 128, threads=2)
        def run():
            return peer.run(ids, 128)
    run()
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    best = min(times)
    print(f"{which:5s} SPECGRAFT_HUGE_PAGES={os.environ.get('SPECGRAFT_HUGE_PAGES', '1')} "
          f"({anon_huge_bytes() >> 20} MiB in huge pages): {best:.2f} s, {128 / best:.2f} tokens/s", flush=True)


if __name__ == "__main__":
    main()
