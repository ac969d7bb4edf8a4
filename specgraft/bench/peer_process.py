"""The Hugging Face and llama-cpp-python peers in a process of their own, on their own copy of the models.

Why a second process: measured on issue 14's three summarization prompts (Zen 3, fp32, 128 new
tokens), ``draft-tree`` took 141.4 s in a bench process where the Hugging Face peers had run
``generate`` on the same model objects, and 122.2 s in one where no peer ran, while ``ar`` took
the same time in both (``benchmarks/RESULTS.md``, *Copy-ahead*). What a peer leaves behind
(allocator and cache state of a large process) slowed our later prefills and verify forwards,
so a peer sharing our process measured our methods under a handicap that plain decoding does
not pay (with the peers apart, the tree took 128.7 s on those prompts, HF assisted 132.9 s). With ``peer_process="separate"`` (the default) every peer runs in a child process
that loads the target (and the draft model, in the same numerics) itself, the same way the
bench does; each side then keeps a process of its own, and the two never run at once: the
bench waits, idle, while a peer generates. The cost is a second copy of the models in memory
(the 1.5B fp32 target is ~6 GB) and the child's load time, which is not measured.
``peer_process="shared"`` runs the peers on the bench's own model objects, as before.

The llama-cpp-python peers (``llamacpp``, ``llamacpp-pld``: :mod:`specgraft.bench.llamacpp_peers`)
run in the same child for the same reason: a ``Llama`` allocates its own context, compute
buffers, repacked weights and (``llamacpp-pld``, whose ``logits_all`` keeps every row's logits)
a logits matrix of context x vocabulary floats, and shares llama.cpp's thread pool with our
backend; in a process of its own it disturbs nothing of ours and runs as a user's script runs it.
The child loads the GGUF by itself (memory-mapped: the page cache is shared with the bench's copy).
A child with llama-cpp-python peers is started once the bench knows its EOS ids
(``PeerSpec.eos_token_ids``): the peers stop where our methods stop.

Example::

    spec = PeerSpec(model="qwen2.5-coder-1.5b-instruct", dtype="float32", device="cpu", threads=2,
                    draft_model=None, draft_quant="none", peers=("hf", "hf-pld"), max_new_tokens=32,
                    temperature=0.0, seed=0)
    with PeerProcess(spec) as process:
        peers = process.peers()           # {"hf": RemotePeer, "hf-pld": RemotePeer}
        run = peers["hf"].run([1, 5, 6, 7])  # MethodRun(tokens=[...], time_s=..., stats=None)

The child measures ``time_s`` itself, with the same ``time.perf_counter()`` bracket as
:meth:`HFPeer.run`, so the pipe's latency is never part of a time.
"""

from __future__ import annotations

import multiprocessing
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Sequence

from specgraft.api import SpecDecoder
from specgraft.bench.contract import MethodRun
from specgraft.bench.llamacpp_peers import LLAMACPP_PYTHON_PEERS, LlamaCppPeer
from specgraft.bench.peers import HFPeer
from specgraft.models.loading import load_draft_model

PEER_PROCESSES = ("separate", "shared")
"""Where the Hugging Face and llama-cpp-python peers run: a child process with its own models, or this process."""

POLL_S = 1.0
"""How often the bench checks, while it waits for the child, that the child is still alive."""


class PeerProcessError(RuntimeError):
    """The peers' process failed to load, failed a generation, or exited."""


@dataclass(frozen=True)
class PeerSpec:
    """Everything the child needs to build the same peers the bench would build in-process."""

    model: str
    dtype: str
    device: str
    threads: int | None
    draft_model: str | None
    draft_quant: str
    peers: tuple[str, ...]
    max_new_tokens: int
    temperature: float
    seed: int
    gguf: str | None = None
    """The target's GGUF, for the llama-cpp-python peers."""
    eos_token_ids: tuple[int, ...] | None = None
    """Where every peer stops: the bench's EOS ids; None: the child's Hugging Face decoder's own
    (the bench checks they are its own)."""
    llamacpp_draft_max: int | None = None
    """``llamacpp-pld``'s ``num_pred_tokens`` (None: its own default)."""


def build_peers(spec: PeerSpec) -> tuple[list[int], dict[str, Any]]:
    """The peers of ``spec`` (Hugging Face ones over a decoder and draft loaded here) and the EOS
    ids they stop at."""
    import torch

    hf = [name for name in spec.peers if name not in LLAMACPP_PYTHON_PEERS]
    llama = [name for name in spec.peers if name in LLAMACPP_PYTHON_PEERS]
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    torch.manual_seed(spec.seed)
    peers: dict[str, Any] = {}
    eos = sorted(spec.eos_token_ids) if spec.eos_token_ids is not None else None
    if hf:
        decoder = SpecDecoder.from_pretrained(
            spec.model, method="ar", dtype=spec.dtype, device=spec.device, progress=False, backend="hf"
        )
        draft = None
        if spec.draft_model and "hf-assisted" in spec.peers:
            draft = load_draft_model(
                spec.draft_model, spec.dtype, decoder.target.device, progress=False, target_tokenizer=decoder.tokenizer,
                quant=spec.draft_quant,
            )
        eos = eos if eos is not None else sorted(decoder.engine.eos_token_ids)
        for name in hf:
            peers[name] = HFPeer(name, decoder.model, eos, spec.max_new_tokens, spec.temperature, spec.seed, assistant_model=draft)
    if llama:
        assert spec.gguf is not None and eos is not None, "llama-cpp-python peers need the GGUF and the bench's EOS ids"
        for name in llama:
            peers[name] = LlamaCppPeer(
                name, spec.gguf, eos, spec.max_new_tokens, spec.threads, spec.temperature, spec.seed, spec.llamacpp_draft_max
            )
    assert eos is not None, "no peer to build"
    return eos, {name: peers[name] for name in spec.peers}


def _serve(spec: PeerSpec, conn: Connection) -> None:
    """The child's loop: load, say ``ready``, then answer ``run`` requests until ``close``.

    Messages in: ``("run", name, ids, max_new_tokens)``, ``("close",)``. Messages out:
    ``("ready", eos_token_ids, {name: resolved_config})``, ``("run", MethodRun)``, ``("error", text)``.
    """
    try:
        eos, peers = build_peers(spec)
        conn.send(("ready", eos, {name: peer.resolved_config() for name, peer in peers.items()}))
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the bench went away
            return
        if message[0] == "close":
            return
        _, name, ids, max_new_tokens = message
        try:
            conn.send(("run", peers[name].run(ids, max_new_tokens=max_new_tokens)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))


class PeerProcess:
    """A child process that holds the Hugging Face and llama-cpp-python peers; a context manager that closes it.

    :meth:`start` returns at once (the child loads while the bench loads its own models);
    :meth:`peers` waits for the child to be ready. Every failure of the child (an exception, a
    crash, being killed for memory) raises :class:`PeerProcessError` in the bench.
    """

    def __init__(self, spec: PeerSpec):
        self.spec = spec
        self._conn: Connection | None = None
        self._process: Any = None
        self._ready: tuple[list[int], dict[str, dict[str, Any]]] | None = None

    def start(self) -> "PeerProcess":
        if self._process is not None:
            return self
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: nothing of ours is inherited
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(target=_serve, args=(self.spec, child), name="specgraft-peers", daemon=True)
        self._process.start()
        child.close()
        return self

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _receive(self) -> tuple:
        assert self._conn is not None and self._process is not None, "start() first"
        while not self._conn.poll(POLL_S):
            if not self._process.is_alive():
                break
        try:
            message = self._conn.recv()
        except (EOFError, OSError):  # OSError: ConnectionResetError when the child was killed
            raise self._exited() from None
        if message[0] == "error":
            raise PeerProcessError(f"the peers' process failed:\n{message[1]}")
        return message

    def _exited(self) -> PeerProcessError:
        self._process.join(5)
        return PeerProcessError(
            f"the peers' process (pid {self._process.pid}) exited with code {self._process.exitcode} "
            "(out of memory? it holds a second copy of the models; --peer-process shared runs the peers here)"
        )

    def wait_ready(self) -> tuple[list[int], dict[str, dict[str, Any]]]:
        """EOS ids and each peer's resolved config, once the child has loaded its models."""
        if self._ready is None:
            self.start()
            _, eos, configs = self._receive()
            self._ready = (list(eos), configs)
        return self._ready

    def peers(self) -> dict[str, "RemotePeer"]:
        _, configs = self.wait_ready()
        return {name: RemotePeer(self, name, config) for name, config in configs.items()}

    def run(self, name: str, ids: Sequence[int], max_new_tokens: int | None = None) -> MethodRun:
        self.wait_ready()
        assert self._conn is not None
        try:
            self._conn.send(("run", name, [int(t) for t in ids], max_new_tokens))
        except OSError:  # BrokenPipeError
            raise self._exited() from None
        _, run = self._receive()
        return run

    def close(self) -> None:
        """Ask the child to exit; kill it if it does not within 30 s. Safe to call twice."""
        if self._process is None:
            return
        try:
            if self._process.is_alive() and self._conn is not None:
                self._conn.send(("close",))
        except (BrokenPipeError, OSError):
            pass
        self._process.join(30)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def __enter__(self) -> "PeerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RemotePeer:
    """One peer of a :class:`PeerProcess`, called like an in-process :class:`HFPeer` or :class:`LlamaCppPeer`."""

    is_peer = True

    def __init__(self, process: PeerProcess, name: str, config: dict[str, Any]):
        self.process = process
        self.name = name
        self._config = {**config, "peer_process": "separate"}

    def run(self, ids: Sequence[int], max_new_tokens: int | None = None) -> MethodRun:
        run = self.process.run(self.name, ids, max_new_tokens)
        run.config = {**run.config, **self.resolved_config()}  # the run's own fields kept (a llama.cpp peer's step counts)
        return run

    def resolved_config(self) -> dict[str, Any]:
        return dict(self._config)
