"""llama.cpp as benchmark peers: llama-cpp-python's high-level ``Llama`` in two forms, and the
names of every llama.cpp peer.

- ``llamacpp``: ``Llama.generate`` greedy, one token per decode: llama.cpp's own one-row plain
  decoding. It is the baseline (``vs own plain``) and exactness reference of every llama.cpp
  peer, and the speed bar of a run on the llama.cpp backend (in strict mode our ``ar`` pads
  every forward; this one never does).
- ``llamacpp-pld``: ``Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size=2,
  num_pred_tokens=10))``, llama-cpp-python's prompt lookup decoding with its own defaults
  (``num_pred_tokens=10`` is also HF's ``prompt_lookup_num_tokens``; ``--llamacpp-draft-max``
  replaces it). llama-cpp-python turns ``logits_all`` on for any draft model, so its prefill
  computes the output layer on every prompt row and copies those logits out: that is what a
  user of this class pays, and it is measured as such.
- ``llama-speculative``, ``llama-lookup``: llama.cpp's own example programs, one subprocess per
  generation (:mod:`specgraft.bench.llamacpp_tools`).

Both ``Llama`` peers get the token ids our methods get (no re-tokenizing), stop at the bench's
EOS ids and ``max_new_tokens``, read the same GGUF with the same threads (decode and batch),
512-row batches like :class:`~specgraft.models.llamacpp.LlamaCppTarget`, a context of
:data:`PEER_N_CTX` cells, and flash attention on: what llama.cpp's ``auto`` resolves to on a CPU,
as for our backend and llama.cpp's programs (llama-cpp-python's own default is off). Their weights go
in 2 MiB pages after loading, as our target's do (:mod:`specgraft.models.hugepages`). Every run
starts from an empty cache: ``Llama.generate`` would otherwise reuse the KV rows of a previous
run's common prefix and skip most of the prefill that every other method pays.

Timing: ``time.perf_counter()`` around the ``generate`` loop only (prefill included, as for our
methods); the peers run in the peers' process by default (:mod:`specgraft.bench.peer_process`).

Example::

    peer = LlamaCppPeer("llamacpp-pld", "model.Q4_K_M.gguf", eos_token_ids=[2], max_new_tokens=32, threads=2)
    run = peer.run([1, 5, 6, 7])     # MethodRun(tokens=[...], time_s=..., config={..., "step_counts": {...}})
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Sequence

from specgraft.bench.contract import MethodRun
from specgraft.models.hugepages import advise_huge_pages
from specgraft.models.llamacpp_lib import import_llama_cpp

#: The plain llama.cpp peer: every llama.cpp peer's own plain decoding and exactness reference.
LLAMACPP_BASELINE = "llamacpp"

#: Peers run by llama-cpp-python in a process (the peers' process, or the bench's).
LLAMACPP_PYTHON_PEERS: dict[str, str] = {
    "llamacpp": "llama-cpp-python Llama.generate, plain (one row per decode)",
    "llamacpp-pld": "llama-cpp-python Llama(draft_model=LlamaPromptLookupDecoding)",
}

#: llama.cpp's own programs, run as subprocesses (``--llamacpp-tools``).
LLAMACPP_TOOL_PEERS: dict[str, str] = {
    "llama-speculative": "llama.cpp's llama-speculative (the draft model's GGUF, -md)",
    "llama-lookup": "llama.cpp's llama-lookup (n-gram lookup in the context)",
}

LLAMACPP_PEERS: dict[str, str] = {**LLAMACPP_PYTHON_PEERS, **LLAMACPP_TOOL_PEERS}

#: Context cells of every llama.cpp peer: LlamaCppTarget's default (8192, within the catalog
#: models' training context).
PEER_N_CTX = 8192

#: Flash attention of the llama-cpp-python peers: on, as llama.cpp's ``auto`` resolves on a CPU.
FLASH_ATTN = True

#: ``LlamaPromptLookupDecoding``'s own defaults.
LOOKUP_MAX_NGRAM = 2
LOOKUP_NUM_PRED_TOKENS = 10


def is_llamacpp_peer(method: str) -> bool:
    """
    >>> is_llamacpp_peer("llama-lookup"), is_llamacpp_peer("llamacpp"), is_llamacpp_peer("hf")
    (True, True, False)
    """
    return method in LLAMACPP_PEERS


def peer_threads(threads: int | None) -> int:
    """The threads a llama.cpp peer runs with: ``threads``, else the CPU count (LlamaCppTarget's
    default), always explicit."""
    return threads or os.cpu_count() or 1


def sampling_kwargs(temperature: float) -> dict[str, Any]:
    """What ``Llama.generate`` gets besides the tokens: greedy at temperature 0 (llama.cpp's
    greedy sampler: the argmax), else plain sampling at ``temperature`` with every filter off.

    >>> sampling_kwargs(0.0)["temp"], sampling_kwargs(0.7)["top_k"]
    (0.0, 0)
    """
    kw: dict[str, Any] = {"repeat_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "typical_p": 1.0}
    if temperature > 0:
        return kw | {"temp": temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    return kw | {"temp": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0}


def counting_lookup(max_ngram_size: int, num_pred_tokens: int) -> Any:
    """``LlamaPromptLookupDecoding`` that counts its calls and the tokens it proposed.

    ``Llama.generate`` calls its draft model once before every decode after the prefill, so
    a generation that stopped at a yield took ``calls + 1`` decodes (the prefill's included,
    which gives the first token), as the tools count theirs."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class CountingLookup(LlamaPromptLookupDecoding):
        def __init__(self) -> None:
            super().__init__(max_ngram_size=max_ngram_size, num_pred_tokens=num_pred_tokens)
            self.calls = 0
            self.proposed = 0

        def __call__(self, input_ids, /, **kwargs):
            draft = super().__call__(input_ids, **kwargs)
            self.calls += 1
            self.proposed += len(draft)
            return draft

    return CountingLookup()


class LlamaCppPeer:
    """One llama-cpp-python ``Llama`` configuration over a GGUF (module docstring)."""

    is_peer = True

    def __init__(
        self,
        name: str,
        gguf: str | os.PathLike[str],
        eos_token_ids: Sequence[int],
        max_new_tokens: int,
        threads: int | None = None,
        temperature: float = 0.0,
        seed: int = 0,
        draft_max: int | None = None,
        n_ctx: int = PEER_N_CTX,
    ):
        if name not in LLAMACPP_PYTHON_PEERS:
            raise ValueError(f"unknown llama-cpp-python peer {name!r}; choose one of {', '.join(LLAMACPP_PYTHON_PEERS)}")
        if not eos_token_ids:
            raise ValueError("peers need at least one EOS token id")
        llama_cpp = import_llama_cpp()
        self.name = name
        self.gguf = Path(gguf)
        self.eos_token_ids = sorted(int(t) for t in eos_token_ids)
        self.max_new_tokens = max_new_tokens
        self.threads = peer_threads(threads)
        self.temperature = temperature
        self.seed = seed
        self.n_ctx = n_ctx
        self.lookup = (
            counting_lookup(LOOKUP_MAX_NGRAM, draft_max or LOOKUP_NUM_PRED_TOKENS) if name == "llamacpp-pld" else None
        )
        self.llama = llama_cpp.Llama(
            str(self.gguf), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=self.threads, n_threads_batch=self.threads,
            seed=seed, flash_attn=FLASH_ATTN, draft_model=self.lookup, verbose=False,
            use_mmap=False,  # read, not mapped, as our backend loads it (models/llamacpp.py)
            # a draft model turns logits_all on inside; the logits buffer is sized by the argument
            logits_all=self.lookup is not None,
        )
        # the same memory as our backend's target (specgraft.models.hugepages): speed differences
        # between them are the methods', not the page size's
        advise_huge_pages(heap=False)

    def run(self, ids: Sequence[int], max_new_tokens: int | None = None) -> MethodRun:
        n = max_new_tokens or self.max_new_tokens
        ids = [int(t) for t in ids]
        if len(ids) + n > self.n_ctx:
            raise ValueError(f"{self.name}: {len(ids)} prompt tokens + {n} new ones exceed its context of {self.n_ctx} cells")
        eos = set(self.eos_token_ids)
        # an empty cache: no prefix of the previous run is reused (module docstring)
        self.llama.reset()
        self.llama.set_seed(self.seed)
        calls_before = (self.lookup.calls, self.lookup.proposed) if self.lookup is not None else (0, 0)
        tokens: list[int] = []
        generator = self.llama.generate(ids, reset=True, **sampling_kwargs(self.temperature))
        t0 = time.perf_counter()
        try:
            for token in generator:
                tokens.append(int(token))
                if len(tokens) >= n or token in eos:
                    break
            elapsed = time.perf_counter() - t0
        finally:
            generator.close()
        if self.lookup is not None:
            steps = self.lookup.calls - calls_before[0] + 1
            proposed = self.lookup.proposed - calls_before[1]
        else:
            steps, proposed = len(tokens), 0
        counts = {"steps": steps, "proposed": proposed, "accepted": len(tokens) - steps}
        return MethodRun(tokens=tokens, time_s=elapsed, stats=None, config={**self.resolved_config(), "step_counts": counts})

    def resolved_config(self) -> dict[str, Any]:
        from importlib import metadata

        return {
            "method": self.name,
            "peer": LLAMACPP_PYTHON_PEERS[self.name],
            "llama_cpp_python": metadata.version("llama_cpp_python"),
            "gguf": str(self.gguf),
            "threads": self.threads,
            "n_ctx": self.n_ctx,
            "n_batch": 512,
            "flash_attn": FLASH_ATTN,
            "generate_kwargs": sampling_kwargs(self.temperature),
            "seed": self.seed,
            "eos_token_ids": self.eos_token_ids,
            "prompt_lookup": (
                {"max_ngram_size": self.lookup.max_ngram_size, "num_pred_tokens": self.lookup.num_pred_tokens}
                if self.lookup is not None else None
            ),
        }
