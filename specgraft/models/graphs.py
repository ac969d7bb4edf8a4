"""CUDA graphs of the decoder forward: the forward's kernel launches recorded once, replayed as one.

On a GPU a forward of our models is bound by launching its kernels from Python, not by the
GPU: on an H100 the 1.5B costs ~20 ms for 1 row and ~23 ms for 64 (bf16; RESULTS *On a GPU
again*), while reading its 3 GB of weights takes ~1.5 ms. A CUDA graph records the launches
of one forward and replays them with one call (what vLLM's model runner and gpt-fast's
``reduce-overhead`` compile do). :class:`DecoderGraphs` does it for :class:`~specgraft.models.hf.HFTarget`'s
decoder forwards (``forward_batch``: verify passes, plain steps, a draft model's forwards).

A graph's shapes and addresses are fixed, so each graph belongs to one **key**: the slots
(their buffers), the rows per slot, the key/value length rounded up to a multiple of
``kv_step`` (its **bucket**), and the hidden layer returned. A forward of a captured key copies
its inputs (ids ``[B, n]``, positions ``[B, n]``, the additive mask ``[B, 1, n, kv_len]`` and
the cache rows it writes, ``[B, n]``) into the graph's static tensors, replays it and clones
the outputs. Mask columns ``kv_len .. bucket - 1`` hold the dtype's minimum: those cache rows
are never seen, as rows past a slot's end never are in the eager path (``cache/slots.py``).
The cache writes through the same indexed path as an eager forward whose slots sit at
different offsets (:class:`~specgraft.cache.slots.Write` with ``row_index`` given).

- Rows are padded up to a power of two (:meth:`DecoderGraphs.rows`; ``pad_rows=False`` is the
  unpadded twin), so trees of every size share a few keys.
- A key runs eagerly until it has been seen ``capture_after`` times (default 2: prompt chunks
  and other one-off shapes are never captured); then its forward runs once more eagerly on a
  side stream with the static tensors (the warm-up CUDA graphs ask for; it is also this call's
  result) and is captured; later forwards of the key replay it.
- Graphs share one memory pool and are replayed one at a time, outputs cloned at once, so a
  graph reusing another's memory never overwrites anything still read.
- A forward that cannot be captured (an error while capturing) warns once and turns the
  graphs off for that model (:attr:`DecoderGraphs.failed`); every forward then runs eagerly.
- The cache buffers are captured by address: when they are reallocated (more slots or rows;
  :attr:`SlotCache.version <specgraft.cache.slots.SlotCache>`) every graph is dropped. At most
  ``max_graphs`` are kept (least recently used dropped first).

Numerics: a replay runs the warm-up's kernels on the same shapes, so it computes what the
eager forward over the bucket computes; against the eager forward over ``kv_len`` only the
attention's reduction length differs (masked columns add exact zeros; the kernel may block
the sum differently), as with any change of padding. The guarantee stays fp32's: in fp32
greedy outputs with graphs equal those without and Hugging Face's plain greedy decoding
(``tests/lossless/test_cuda.py``, passed on an H100).

Measured on an H100 (bf16, random weights of the 1.5B / 0.5B shapes; ``benchmarks/experiments/gpu/measure_cuda_graphs.py``,
RESULTS *On a GPU, third time*): ``ar`` 22.6 -> 4.8 ms a token (Hugging Face's ``generate``
20.9), ``draft-tree`` 50.1 -> 9.2 ms a token, a batched ``ar`` step at 16 sequences 31.9 ->
8.7 ms; the 1.5B's forward 5.3 ms for 1 row, 7.1 for 64.

**Plain twin.** ``capture=False`` does all of the above but capture: a "replay" runs the eager
forward on the static tensors. It runs on any device; ``tests/unit/models/test_graphs.py`` compares it with
the plain forwards on the CPU, where no graph can be captured.

Example (on a GPU; ``HFTarget`` builds this itself, see ``HFTarget.graphs``)::

    target = HFTarget(model)                  # model on cuda: target.graphs is a DecoderGraphs
    target.forward_rows(slot, [t], [-1])      # key (slot,), 1 row, bucket 256: eager, seen once
    target.commit(slot, [0])
    target.forward_rows(slot, [u], [-1])      # seen twice: eager warm-up (this call's result) + capture
    target.commit(slot, [0])
    target.forward_rows(slot, [v], [-1])      # replay
    target.graphs.stats                       # GraphStats(eager=1, captured=1, replayed=1, dropped=0)
"""

from __future__ import annotations

import os
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch

from specgraft.cache.slots import SlotCache, Write

#: ``(slots, rows per slot, key/value bucket, hidden layer or None)``
Key = tuple[tuple[int, ...], int, int, "int | None"]
#: ``decode(slots, ids, positions, mask, layer) -> (final hidden [B, n, H], layer's hidden [B, n, H])``
Decode = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def graphs_by_default(device: torch.device | str) -> bool:
    """CUDA graphs on a CUDA device unless ``SPECGRAFT_CUDA_GRAPHS=0``.

    >>> graphs_by_default("cpu")
    False
    """
    return torch.device(device).type == "cuda" and os.environ.get("SPECGRAFT_CUDA_GRAPHS", "1") != "0"


def replays_graphs(target: object) -> bool:
    """Whether ``target``'s forwards are replayed as captured CUDA graphs (not the twin, not
    off, not given up): what a run's config and a cost table record.

    >>> replays_graphs(object())
    False
    """
    graphs = getattr(target, "graphs", None)
    return isinstance(graphs, DecoderGraphs) and graphs.capture and not graphs.failed


@dataclass
class GraphStats:
    """Forwards run eagerly (keys not captured yet), graphs captured, forwards replayed, graphs
    dropped (cache reallocated or least recently used)."""

    eager: int = 0
    captured: int = 0
    replayed: int = 0
    dropped: int = 0


@dataclass
class _Graph:
    """One key's static tensors and, once captured, its graph and outputs."""

    # [B, n] token ids, positions, and the cache row each new row is written to
    ids: torch.Tensor
    positions: torch.Tensor
    row_index: torch.Tensor
    # [B, 1, n, bucket] additive mask
    mask: torch.Tensor
    # [B] the slots, for a write to slots that are not a contiguous range
    slot_index: torch.Tensor
    graph: "torch.cuda.CUDAGraph | None" = None
    # [B, n, H] outputs the graph writes (final hidden, the layer's hidden)
    outputs: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)


class DecoderGraphs:
    """CUDA graphs of one model's decoder forwards, by key (module docstring).

    ``decode``: the eager forward (``HFTarget._decode``); ``cache``: the model's slot cache.
    """

    def __init__(
        self,
        decode: Decode,
        cache: SlotCache,
        capture: bool = True,
        kv_step: int = 256,
        capture_after: int = 2,
        max_graphs: int = 64,
        pad_rows: bool = True,
    ):
        if kv_step < 1 or capture_after < 1 or max_graphs < 1:
            raise ValueError(f"kv_step, capture_after and max_graphs must be >= 1, got {kv_step}, {capture_after}, {max_graphs}")
        self.decode = decode
        self.cache = cache
        self.capture = capture
        self.kv_step = kv_step
        self.capture_after = capture_after
        self.max_graphs = max_graphs
        self.pad_rows = pad_rows
        self.stats = GraphStats()
        self._graphs: OrderedDict[Key, _Graph] = OrderedDict()
        self._seen: Counter[Key] = Counter()
        self._version = cache.version
        self._pool = None
        self._stream: torch.cuda.Stream | None = None
        # why capturing failed, once it has (every forward runs eagerly from then on)
        self.failed: str | None = None

    def __len__(self) -> int:
        return len(self._graphs)

    def bucket(self, kv_len: int) -> int:
        """``kv_len`` rounded up to a multiple of ``kv_step``, at most the cache's capacity.

        >>> DecoderGraphs(None, SlotCache(1, capacity=512), kv_step=256).bucket(257)
        512
        """
        return min(-(-kv_len // self.kv_step) * self.kv_step, self.cache.capacity)

    def rows(self, n: int) -> int:
        """Rows a forward of ``n`` new rows per slot feeds: ``n`` rounded up to a power of two
        (``n`` itself with ``pad_rows`` off). The caller pads each slot with rows that see only
        themselves and are never kept (``HFTarget.forward_batch``).

        A tree's size changes from step to step (prompt lookup keeps 1-17 rows, a draft tree
        whatever its cut leaves), and every new ``(rows, bucket)`` key runs eagerly until it is
        captured: on an H200 an eager forward of the 1.5B costs 17-50 ms against 5-7 ms replayed,
        and the step traces of issue 13's prompts (``benchmarks/tools/project_gpu.py``) saw 9-24 keys a
        128-token generation. Padded, a generation meets at most a handful. Padding costs little
        where graphs pay (the 1.5B's forward: 6.0 ms for 2 rows, 6.5 for 16, 7.0 for 64).

        >>> g = DecoderGraphs(None, SlotCache(1, capacity=512))
        >>> [g.rows(n) for n in (1, 2, 3, 5, 9, 17, 33, 100)]
        [1, 2, 4, 8, 16, 32, 64, 128]
        >>> DecoderGraphs(None, SlotCache(1, capacity=512), pad_rows=False).rows(5)
        5
        """
        return 1 << (n - 1).bit_length() if self.pad_rows and n > 1 else n

    def clear(self) -> None:
        """Drop every graph (and what was counted towards capturing)."""
        self.stats.dropped += len(self._graphs)
        self._graphs.clear()
        self._seen.clear()

    def run(
        self, write: Write, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, layer: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder forward of ``write`` (set up by ``SlotCache.set_write``) on ``ids`` and
        ``positions`` (``[B, n]``, or positions ``[B, 1]`` for one row) and ``mask``
        (``[B, 1, n, write.kv_len]``): eager, captured or replayed. Returns new tensors."""
        if self.cache.version != self._version:
            self.clear()
            self._version = self.cache.version
        slots = tuple(write.slots)
        if self.failed or not self.cache.layers[0].is_initialized or mask.shape[-1] != write.kv_len:
            return self._eager(slots, ids, positions, mask, layer)
        key = (slots, write.rows, self.bucket(write.kv_len), layer)
        g = self._graphs.get(key)
        if g is None:
            self._seen[key] += 1
            if self._seen[key] < self.capture_after:
                return self._eager(slots, ids, positions, mask, layer)
            g = self._new(key, ids.device, mask.dtype)
            self._fill(g, write, ids, positions, mask)
            out = self._warm_and_capture(key, g, write)
            if self.failed:
                return out
            self.stats.captured += 1
            self._graphs[key] = g
            del self._seen[key]
            if len(self._graphs) > self.max_graphs:
                self._graphs.popitem(last=False)
                self.stats.dropped += 1
            return out
        self._graphs.move_to_end(key)
        self._fill(g, write, ids, positions, mask)
        self.stats.replayed += 1
        if g.graph is None:  # the plain twin: the same forward on the static tensors, eagerly
            return self._static_decode(key, g, write)
        g.graph.replay()
        final, hidden = g.outputs
        final_copy = final.clone()  # the next replay of any graph may overwrite the outputs
        return final_copy, (final_copy if hidden is final else hidden.clone())

    # -- internals -----------------------------------------------------------------------

    def _eager(self, slots, ids, positions, mask, layer) -> tuple[torch.Tensor, torch.Tensor]:
        self.stats.eager += 1
        return self.decode(slots, ids, positions, mask, layer)

    def _new(self, key: Key, device: torch.device, dtype: torch.dtype) -> _Graph:
        slots, n, bucket, _ = key
        b = len(slots)
        return _Graph(
            ids=torch.zeros(b, n, dtype=torch.long, device=device),
            positions=torch.zeros(b, n, dtype=torch.long, device=device),
            row_index=torch.zeros(b, n, dtype=torch.long, device=device),
            mask=torch.full((b, 1, n, bucket), torch.finfo(dtype).min, dtype=dtype, device=device),
            slot_index=torch.tensor(slots, dtype=torch.long, device=device),
        )

    def _fill(self, g: _Graph, write: Write, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> None:
        """Copy one forward's inputs into the static tensors."""
        kv_len = write.kv_len
        g.ids.copy_(ids)
        g.positions.copy_(positions)  # [B, 1] broadcasts
        g.mask[..., :kv_len].copy_(mask)
        if kv_len < g.mask.shape[-1]:
            g.mask[..., kv_len:].fill_(torch.finfo(g.mask.dtype).min)
        g.row_index.copy_(write.new_rows())  # built on the host: one copy to the device

    def _point(self, write: Write, g: _Graph, bucket: int) -> None:
        """Make the cache's write read the static tensors and attend over the bucket."""
        write.row_index, write.slot_index, write.kv_len = g.row_index, g.slot_index, bucket

    def _static_decode(self, key: Key, g: _Graph, write: Write) -> tuple[torch.Tensor, torch.Tensor]:
        self._point(write, g, key[2])
        return self.decode(key[0], g.ids, g.positions, g.mask, key[3])

    def _warm_and_capture(self, key: Key, g: _Graph, write: Write) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.capture:
            return self._static_decode(key, g, write)
        device = g.ids.device
        if self._stream is None:
            try:
                self._stream = torch.cuda.Stream(device)
                self._pool = torch.cuda.graph_pool_handle()
            except Exception as e:  # no CUDA here
                self._give_up(e)
                return self._static_decode(key, g, write)
        current = torch.cuda.current_stream(device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            out = self._static_decode(key, g, write)  # the warm-up, and this call's forward
            graph = torch.cuda.CUDAGraph()
            try:
                # thread_local: a server's other threads may use CUDA while this one captures
                with torch.cuda.graph(graph, pool=self._pool, stream=self._stream, capture_error_mode="thread_local"):
                    g.outputs = self._static_decode(key, g, write)
            except Exception as e:  # a model whose forward cannot be captured: eager from now on
                self._give_up(e)
        current.wait_stream(self._stream)
        if not self.failed:
            g.graph = graph
        return out

    def _give_up(self, error: Exception) -> None:
        """Capturing failed (say, a model whose forward reads a value back to the host): warn
        once, drop every graph and run every later forward eagerly; outputs are unchanged."""
        import warnings

        self.failed = f"{type(error).__name__}: {error}"
        warnings.warn(f"CUDA graph capture failed ({self.failed}); forwards run eagerly", RuntimeWarning, stacklevel=4)
        self.clear()
