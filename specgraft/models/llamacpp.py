"""The llama.cpp backend: a GGUF model behind the engine's target protocol, through llama-cpp-python.

One llama.cpp context holds every sequence in one **unified** KV cache, where each cell carries a
position and a *set* of sequence ids, and a token of a batch attends to the cells that hold its
first sequence id at positions up to its own. A slot is one sequence id (its **main** sequence,
holding the committed rows). Pending rows get sequence ids of their own, one per branch:

- a pending row's **own** sequence is its parent's when it is the parent's first child, else a
  fresh id whose cells are the parent's ancestors (``llama_memory_seq_cp`` of the parent's own
  sequence up to the parent's position) plus, inside the batch, every row on the way to it;
- so each pending row's own sequence holds exactly its committed prefix, its pending ancestors
  and itself: the tree mask, without a mask (this is how llama.cpp's ``examples/speculative``
  shares draft prefixes);
- :meth:`LlamaCppTarget.commit` adds the main sequence to the kept chain's cells
  (``seq_cp`` from the last kept row's own sequence) and removes every pending sequence
  (``seq_rm``), which frees the cells only they held: the cache never keeps a rejected row.

Worked example: a committed prefix of 5 tokens in main sequence 0, then a verify pass of rows
``root, a, b, a1`` with parents ``-1, 0, 0, 1`` (``a`` and ``b`` children of the root, ``a1`` of
``a``). The root gets fresh sequence 1 (a copy of sequence 0's cells), ``a`` inherits 1, ``b``
gets fresh sequence 2 (copied from sequence 0; the root, in the batch, joins it), ``a1``
inherits 1. The batch is ``root {1, 2} @5, a {1} @6, b {2} @6, a1 {1} @7``. Keeping
``root, a`` copies positions 5..6 of sequence 1 into sequence 0, then removes sequences 1 and 2:
the cells of ``b`` and ``a1`` are freed.

**Row invariance.** llama.cpp computes a row's logits with kernels chosen by how many rows the
batch has: with the repacked Q4_K weights of the Qwen GGUFs on an AVX-512 build, batches of 1-3
rows take one path, rows in whole groups of 4 of batches of 8 or more another, the rest of a
batch a third, and the results differ by up to ~0.3 in a logit (Q4_1 SmolLM2 is invariant).
A build with AMX kernels (``llamacpp_build`` on a CPU with AMX, with or without its small-batch
kernels) computes the matrix products of a row the same in batches of 1 to 63 rows. Attention
has its own classes: from 64 query rows a tiled kernel, and for one row over 512+ cached cells a
kernel that splits the cells among the threads. And in the default mode the cells of rejected rows are freed and reused, while
attention adds a row's cells in cache order.
The default mode accepts that, as bf16 does in torch: near-tied tokens can flip, and
``--compare`` measures agreement with llama.cpp's plain one-row decoding. ``strict=True`` makes
every forward of every method compute each row the same way, so methods equal this target's own
``ar`` token for token: every batch is padded to :data:`STRICT_ROWS` (at least 8 rows, a
multiple of 4; padding rows live in a sequence of their own, get logits so the output layer
runs on as many rows, and are removed after the forward); flash attention is on, whose CPU
kernel adds a row's visible cells in their order in the cache; and no cell is freed while any
slot is alive: rejected rows, and the rows of released slots, move to the context's
**garbage** sequence (attended by nothing), which is emptied when the last slot is released.
So later rows never fill holes between a sequence's cells, and every sequence's cells stay in
position order, one sequence or a batch of them. Strict mode costs a padded forward per plain
step and cells for every row verified while slots are alive; it is for checking, not for speed.

Install: ``python -m specgraft.models.llamacpp_build --install`` builds llama-cpp-python 0.3.36's
llama.cpp from source for this CPU (flags, the GCC fix, the small-batch AMX kernels and the
huge-page advice there).
"""

from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Sequence

import numpy as np
import torch

from specgraft.models.backends import gguf_path
from specgraft.models.gguf_requant import draft_gguf
from specgraft.models.hugepages import HugePageReport, advise_huge_pages, huge_pages_asked
from specgraft.models.llamacpp_lib import import_llama_cpp
from specgraft.types import DraftTree, PrefillOutput, PrefillRequest, RowsOutput

#: Strict mode's batch shape: ``(minimum rows, multiple, maximum rows)``. Measured with the
#: catalog GGUFs: in batches of 8 to 63 rows, rows in whole groups of 4 are bit-identical
#: whatever the batch; from 64 query rows on, llama.cpp's CPU flash attention switches to a
#: tiled kernel that sums a row's cells in tiles (``tests/integration/test_llamacpp.py`` pins it). Longer
#: strict forwards are split into several decodes of at most 60 rows. The minimum of 8 also keeps
#: a plain step off the kernel a one-row batch over 512+ cells takes (cells split among the
#: threads), so it stays on AMX builds, whose matrix products are invariant from one row.
STRICT_ROWS = (8, 4, 60)

#: Rows of a prefill chunk whose logits are all read (Token Recycling's top-k of every prompt
#: token): llama.cpp keeps an output buffer of ``rows x vocabulary`` floats (39 MB at 64 rows
#: for Qwen2.5's 152k tokens).
TOPK_PREFILL_ROWS = 64

#: Sequence ids a context offers (llama.cpp's ``LLAMA_MAX_SEQ``): slots, their pending
#: branches, strict mode's garbage and padding sequences share them.
MAX_SEQUENCES = 256


def strict_rows(n: int, shape: tuple[int, int, int] = STRICT_ROWS) -> int:
    """Rows a strict-mode decode of ``n`` rows (at most the shape's maximum) is padded to.

    >>> [strict_rows(n) for n in (1, 8, 9, 13, 16, 60)]
    [8, 8, 12, 16, 16, 60]
    """
    minimum, multiple, maximum = shape
    if n > maximum:
        raise ValueError(f"a strict decode takes at most {maximum} rows, got {n}")
    return max(minimum, -(-n // multiple) * multiple)


@dataclass
class _Pending:
    """One pending row of a slot."""

    token: int
    position: int
    parent: int
    """Index of the parent pending row (-1: the committed prefix)."""
    seq: int
    """Its own sequence: the cells of its prefix, its pending ancestors and itself."""
    children: int = 0


@dataclass
class _Slot:
    """One sequence of the context: its main sequence id, committed length and pending rows."""

    main: int
    length: int = 0
    pending: list[_Pending] = field(default_factory=list)
    branches: set[int] = field(default_factory=set)
    """Sequence ids owned by pending rows (freed at commit or discard)."""


@dataclass
class _Entry:
    """One row of a llama.cpp batch."""

    token: int
    position: int
    seqs: list[int]
    logits: bool


class LlamaCppTarget:
    """A GGUF model in one llama.cpp context, as a :class:`~specgraft.models.base.TargetModel`.

    ``path``: the ``.gguf`` file. ``threads`` (default: the CPU count) reach llama.cpp's decode
    and batch threads. ``n_ctx``: KV cells shared by every slot and its pending rows (default
    8192, at most the model's training context). ``strict``: module docstring. ``huge_pages``:
    the weights and KV cache in 2 MiB pages (:mod:`specgraft.models.hugepages`); False keeps
    4 KiB pages, as ``SPECGRAFT_HUGE_PAGES=0`` does for every model.

    Example::

        target = LlamaCppTarget("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", threads=2)
        slot = target.allocate()
        target.prefill(slot, prompt_ids[:-1])
        out = target.forward_tree(slot, prompt_ids[-1], tree)   # [N + 1, V] logits
        target.commit(slot, [0, 1])                             # root and node 0 kept
    """

    #: no hidden states: drafters that need them refuse this backend (``MethodSpec``)
    fill_outputs: ClassVar[bool] = False
    batched_prefill: ClassVar[bool] = False
    backend: ClassVar[str] = "llamacpp"
    #: cost tables of this backend are its own (``budget.costs.table_name``)
    cost_device: ClassVar[str] = "llamacpp"
    #: each extra verified row is 4-bit GEMM work on top of a memory-bound one-row step (the
    #: 1.5B Q4_K_M on a 2-core AVX-512 CPU: 2 rows 1.38x one, 4 rows 1.42x, 16 rows 3.1x): prompt
    #: lookup cuts its trees by the measured cost of each row count (``TargetModel.dear_rows``)
    dear_rows: ClassVar[bool] = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        threads: int | None = None,
        n_ctx: int | None = None,
        strict: bool = False,
        n_batch: int = 512,
        name: str | None = None,
        huge_pages: bool = True,
    ):
        llama = import_llama_cpp()
        path = Path(path).expanduser()
        if not path.is_file():
            raise ValueError(f"no GGUF file at {str(path)!r}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._llama = llama
        self.path = path
        self.name = name or path.name
        self.strict = strict
        self.threads = threads or os.cpu_count() or 1
        self.device = torch.device("cpu")
        self.dtype = "gguf"
        llama.llama_backend_init()
        params = llama.llama_model_default_params()
        # read, not mapped: the weights llama.cpp repacks (AMX, interleaved CPU layouts) would
        # otherwise stay resident in the mapping beside their repacked copy (1.5B Q4_K_M on an AMX
        # build: 1.92 against 1.18 GB); decoding is as fast either way
        params.load_mode = llama.LLAMA_LOAD_MODE_NONE
        with huge_pages_asked(huge_pages):  # a build from llamacpp_build asks as it allocates
            self._model = llama.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {str(path)!r} as a GGUF model")
        self._vocab = llama.llama_model_get_vocab(self._model)
        self.vocab_size: int = int(llama.llama_vocab_n_tokens(self._vocab))
        # llama.cpp's end-of-generation tokens (EOS, EOT, <|im_end|>...): where its own decoding stops
        self.eos_token_ids: tuple[int, ...] = tuple(t for t in range(self.vocab_size) if llama.llama_vocab_is_eog(self._vocab, t))
        description = ctypes.create_string_buffer(256)
        llama.llama_model_desc(self._model, description, len(description))
        # e.g. "qwen2 1.5B Q4_K - Medium": the architecture, size and quantization
        self.quantization = description.value.decode("utf-8", "replace")
        trained = int(llama.llama_model_n_ctx_train(self._model))
        n_ctx = min(n_ctx or 8192, trained) if trained > 0 else (n_ctx or 8192)
        if n_ctx < 16:
            raise ValueError(f"n_ctx must be >= 16, got {n_ctx}")
        ctx_params = llama.llama_context_default_params()
        ctx_params.n_ctx = n_ctx
        ctx_params.n_batch = ctx_params.n_ubatch = n_batch
        ctx_params.n_seq_max = MAX_SEQUENCES
        ctx_params.kv_unified = True
        ctx_params.n_threads = ctx_params.n_threads_batch = self.threads
        # flash attention on in both modes: strict mode needs its CPU kernel (a row's visible cells
        # are added in cache order); in the default mode it is also faster than llama.cpp's "auto"
        # (1.5B Q4_K_M, 2 threads: a 299-token prefill 2.8 s against 3.0 s, 128 one-row steps
        # 12.5 against 12.0 tokens/s; benchmarks/experiments/llamacpp/NOTES.md)
        ctx_params.flash_attn_type = 1
        with huge_pages_asked(huge_pages):
            self._ctx = llama.llama_init_from_model(self._model, ctx_params)
        if not self._ctx:
            llama.llama_model_free(self._model)
            raise ValueError(f"llama.cpp could not make a context of {n_ctx} cells for {str(path)!r}")
        self._mem = llama.llama_get_memory(self._ctx)
        self.n_ctx = int(llama.llama_n_ctx(self._ctx))
        self.max_positions: int = self.n_ctx
        # the KV cache (an estimate: every layer's keys and values of n_ctx cells, heads n_embd / n_head wide, float16)
        heads, kv_heads = llama.llama_model_n_head(self._model), llama.llama_model_n_head_kv(self._model)
        self.kv_bytes = 2 * 2 * self.n_ctx * llama.llama_model_n_layer(self._model) * llama.llama_model_n_embd(self._model) // heads * kv_heads
        self.n_batch = n_batch
        self.prefill_chunk = n_batch
        self._batch = llama.llama_batch_init(n_batch, 0, MAX_SEQUENCES)
        self._free_seqs = list(range(MAX_SEQUENCES - 1, -1, -1))  # pop() hands out the lowest
        self._pad_seq = self._free_seqs.pop() if strict else None
        # strict mode: rows no sequence attends to any more, kept until no slot is alive
        self._garbage = self._free_seqs.pop() if strict else None
        self._slots: dict[int, _Slot] = {}
        # the weights and the KV cache in 2 MiB pages: one-row decoding ~25% faster on a VM
        # (specgraft.models.hugepages; SPECGRAFT_HUGE_PAGES=0 turns it off); not the heap, where
        # llama.cpp keeps none of them
        self.huge_pages = advise_huge_pages(heap=False) if huge_pages else HugePageReport(note="off")

    def close(self) -> None:
        """Free the context and the model (also done when the object is collected)."""
        llama = self._llama
        if getattr(self, "_batch", None) is not None:
            llama.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            llama.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the module may be gone
            pass

    # -- slots ---------------------------------------------------------------------------

    def _seq(self) -> int:
        if not self._free_seqs:
            raise RuntimeError(
                f"all {MAX_SEQUENCES} llama.cpp sequence ids are in use (slots, their pending branches); "
                "fewer concurrent sequences or smaller trees"
            )
        return self._free_seqs.pop()

    def _slot(self, slot: int) -> _Slot:
        state = self._slots.get(slot)
        if state is None:
            raise ValueError(f"slot {slot} is not allocated")
        return state

    def allocate(self) -> int:
        """A new, empty slot for one sequence."""
        main = self._seq()
        self._slots[main] = _Slot(main=main)
        return main

    def release(self, slot: int) -> None:
        state = self._slots.pop(slot, None)
        if state is None:
            return
        for seq in (state.main, *state.branches):
            if self._garbage is not None:
                self._llama.llama_memory_seq_cp(self._mem, seq, self._garbage, -1, -1)
            self._llama.llama_memory_seq_rm(self._mem, seq, -1, -1)
            self._free_seqs.append(seq)
        if self._garbage is not None and not self._slots:
            self._llama.llama_memory_seq_rm(self._mem, self._garbage, -1, -1)

    def length(self, slot: int) -> int:
        """Committed rows of ``slot``."""
        return self._slot(slot).length

    def reserve(self, rows: int) -> None:
        """``ValueError`` when one sequence of ``rows`` rows cannot fit the context's cells."""
        if rows > self.n_ctx:
            raise ValueError(f"{rows} rows exceed the llama.cpp context of {self.n_ctx} cells (n_ctx)")

    # -- forwards ------------------------------------------------------------------------

    def _decode(self, entries: list[_Entry]) -> np.ndarray:
        """``llama_decode`` of ``entries``, in parts of at most ``n_batch`` rows (strict mode:
        :data:`STRICT_ROWS`' maximum, each part padded); ``[m, V]`` float32 logits of the
        entries that asked for them, in order (a copy). A part boundary is safe anywhere:
        every sequence of a row has seen the same earlier rows (:meth:`_plan`)."""
        part = STRICT_ROWS[2] if self.strict else self.n_batch
        if len(entries) <= part:
            return self._decode_part(entries)
        return np.concatenate([self._decode_part(entries[i : i + part]) for i in range(0, len(entries), part)])

    def _decode_part(self, entries: list[_Entry]) -> np.ndarray:
        """One ``llama_decode`` (:meth:`_decode`)."""
        want = [e.logits for e in entries]
        if self.strict:
            padded = strict_rows(len(entries))
            # padding rows: their own sequence, from position 0; they get logits too, so the last
            # layer and the output head run on as many rows as the real ones' class needs
            entries = entries + [_Entry(0, i, [self._pad_seq], True) for i in range(padded - len(entries))]
            entries = [_Entry(e.token, e.position, e.seqs, True) for e in entries]
        batch = self._batch
        batch.n_tokens = len(entries)
        for i, e in enumerate(entries):
            batch.token[i] = e.token
            batch.pos[i] = e.position
            batch.n_seq_id[i] = len(e.seqs)
            for j, s in enumerate(e.seqs):
                batch.seq_id[i][j] = s
            batch.logits[i] = e.logits
        rc = self._llama.llama_decode(self._ctx, batch)
        if self.strict:
            self._llama.llama_memory_seq_rm(self._mem, self._pad_seq, -1, -1)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with status {rc} on a batch of {len(entries)} rows (1: no room in the KV cache)")
        outputs = sum(e.logits for e in entries)
        if outputs == 0:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        logits = np.ctypeslib.as_array(self._llama.llama_get_logits(self._ctx), shape=(outputs, self.vocab_size))
        if self.strict:  # every row got logits: keep those asked for
            return logits[np.flatnonzero(want + [False] * (outputs - len(want)))]
        return logits.copy()

    def _check_tokens(self, tokens: Sequence[int]) -> None:
        bad = next((t for t in tokens if not 0 <= int(t) < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size}) of model {self.name!r}")

    def prefill(self, slot: int, tokens: Sequence[int], request: PrefillRequest = PrefillRequest()) -> PrefillOutput:
        """Append ``tokens`` to ``slot``'s committed rows (causal), in chunks of ``n_batch`` rows
        (:data:`TOPK_PREFILL_ROWS` when every row's top-k successors are asked for)."""
        if request.hidden or request.final_hidden:
            raise ValueError("the llama.cpp backend returns no hidden states; this method needs them (use the Hugging Face backend)")
        state = self._slot(slot)
        if state.pending:
            raise ValueError(f"slot {slot} has {len(state.pending)} pending rows; commit or discard them before prefilling")
        tokens = [int(t) for t in tokens]
        self._check_tokens(tokens)
        if state.length + len(tokens) > self.max_positions:
            raise ValueError(f"{state.length + len(tokens)} tokens exceed the context window of {self.max_positions}")
        chunk = min(self.n_batch, TOPK_PREFILL_ROWS) if request.topk else self.n_batch
        top: list[torch.Tensor] = []
        top_probs: list[torch.Tensor] = []
        topk_s = 0.0
        for start in range(0, len(tokens), chunk):
            part = tokens[start : start + chunk]
            entries = [_Entry(t, state.length + i, [state.main], bool(request.topk)) for i, t in enumerate(part)]
            logits = self._decode(entries)
            state.length += len(part)
            if request.topk:
                t0 = time.perf_counter()
                rows = torch.from_numpy(logits)
                best = rows.topk(request.topk, dim=-1)
                top.append(best.indices)
                if request.topk_probs:
                    top_probs.append((best.values - rows.logsumexp(dim=-1, keepdim=True)).exp())
                topk_s += time.perf_counter() - t0
        empty = torch.empty(0, request.topk, dtype=torch.long)
        return PrefillOutput(
            topk=(torch.cat(top) if top else empty) if request.topk else None,
            topk_probs=(torch.cat(top_probs) if top_probs else empty.float()) if request.topk and request.topk_probs else None,
            topk_s=topk_s,
        )

    def forward_rows(
        self,
        slot: int,
        tokens: Sequence[int] | torch.Tensor,
        parent_rows: Sequence[int] | torch.Tensor,
        output_hidden: bool = False,
        hidden_layer: int | None = None,
    ) -> RowsOutput:
        """Feed ``tokens`` as new pending rows of ``slot``; new row ``i`` hangs from pending row
        ``parent_rows[i]`` (an earlier pending row, old or new; -1 = the committed prefix).
        Returns the ``[n, V]`` float32 logits of the new rows."""
        return self.forward_batch([slot], [tokens], [parent_rows], output_hidden, hidden_layer)[0]

    def forward_tree(
        self, slot: int, root: int, tree: DraftTree, output_hidden: bool = False, hidden_layer: int | None = None
    ) -> RowsOutput:
        """The verify pass: rows ``[root, node 0, ..., node N-1]`` (row ``i + 1`` is node ``i``)."""
        return self.forward_rows(slot, [root, *tree.tokens], [-1, *(p + 1 for p in tree.parents)], output_hidden, hidden_layer)

    def forward_batch(
        self,
        slots: Sequence[int],
        tokens: Sequence[Sequence[int] | torch.Tensor],
        parent_rows: Sequence[Sequence[int] | torch.Tensor],
        output_hidden: bool = False,
        hidden_layer: int | None = None,
        logits_from: Sequence[int] | None = None,
        fill_outputs: bool = False,
    ) -> list[RowsOutput]:
        """:meth:`forward_rows` for several slots (distinct, any order) in one ``llama_decode``;
        slot ``b``'s logits start at its row ``logits_from[b]`` (default 0). Everything is
        checked before any state changes, so an error leaves every slot as it was."""
        if output_hidden or fill_outputs:
            raise ValueError("the llama.cpp backend returns no hidden states; this method needs them (use the Hugging Face backend)")
        slots = [int(s) for s in slots]
        if len(set(slots)) != len(slots) or len(tokens) != len(slots) or len(parent_rows) != len(slots):
            raise ValueError(f"forward_batch needs distinct slots, one token list and one parent list each: {slots}")
        starts = list(logits_from) if logits_from is not None else [0] * len(slots)
        plans: list[_Plan] = []
        for s, t, p in zip(slots, tokens, parent_rows, strict=True):
            plans.append(self._plan(s, _ints(t), _ints(p), taken=[seq for plan in plans for seq in plan.fresh]))
        entries: list[_Entry] = []
        for plan, start in zip(plans, starts, strict=True):
            entries += [_Entry(row.token, row.position, seqs, i >= start) for i, (row, seqs) in enumerate(zip(plan.rows, plan.seqs))]
        # every check passed: give the new sequences their prefixes, then decode
        for plan in plans:
            for src, dst, end in plan.copies:
                self._llama.llama_memory_seq_cp(self._mem, src, dst, -1, end)
        try:
            logits = self._decode(entries)
        except BaseException:
            for plan in plans:
                self._undo(plan)
            raise
        outs: list[RowsOutput] = []
        offset = 0
        for slot, plan, start in zip(slots, plans, starts, strict=True):
            self._apply(slot, plan)
            n = max(0, len(plan.rows) - start)
            outs.append(RowsOutput(logits=torch.from_numpy(logits[offset : offset + n])))
            offset += n
        return outs

    def _plan(self, slot: int, tokens: list[int], parents: list[int], taken: Sequence[int] = ()) -> "_Plan":
        """The rows, sequence sets and prefix copies of feeding ``tokens`` to ``slot`` (no state
        changes; ``ValueError`` for bad input); fresh sequence ids are free ones not in
        ``taken`` (those of other slots' plans for the same forward)."""
        state = self._slot(slot)
        if len(tokens) != len(parents):
            raise ValueError(f"{len(tokens)} tokens but {len(parents)} parent rows")
        self._check_tokens(tokens)
        old = len(state.pending)
        rows: list[_Pending] = []
        copies: list[tuple[int, int, int]] = []
        fresh: list[int] = []
        children = {i: row.children for i, row in enumerate(state.pending)}

        def row_at(i: int) -> _Pending:
            return state.pending[i] if i < old else rows[i - old]

        # the sequences each new row carries in the batch: its own, and those of new rows below it
        seqs: list[list[int]] = []
        for k, (token, parent) in enumerate(zip(tokens, parents)):
            if not -1 <= parent < old + k:
                raise ValueError(f"parent row {parent} of new row {k} is not an earlier pending row of slot {slot}")
            position = state.length if parent < 0 else row_at(parent).position + 1
            if position >= self.max_positions:
                raise ValueError(f"position {position} is outside the context window of {self.max_positions}")
            if parent >= 0 and children.get(parent, 0) == 0:
                seq = row_at(parent).seq
            else:
                seq = next((x for x in reversed(self._free_seqs) if x not in taken and x not in fresh), None)
                if seq is None:
                    raise RuntimeError(f"all {MAX_SEQUENCES} llama.cpp sequence ids are in use; fewer concurrent sequences or smaller trees")
                fresh.append(seq)
                # the new sequence's cells: the committed prefix and the cached ancestors ...
                a = parent
                while a >= old:
                    seqs[a - old].append(seq)  # ... and the ancestors in this batch
                    a = rows[a - old].parent
                copies.append((state.main, seq, -1) if a < 0 else (row_at(a).seq, seq, row_at(a).position + 1))
            if parent >= 0:
                children[parent] = children.get(parent, 0) + 1
            rows.append(_Pending(token, position, parent, seq))
            seqs.append([seq])
        return _Plan(rows=rows, seqs=seqs, copies=copies, fresh=fresh, children=children)

    def _apply(self, slot: int, plan: "_Plan") -> None:
        """Record a decoded plan's rows as pending and its fresh sequences as taken."""
        state = self._slots[slot]
        for seq in plan.fresh:
            self._free_seqs.remove(seq)
            state.branches.add(seq)
        state.pending += plan.rows
        for i, row in enumerate(state.pending):
            row.children = plan.children.get(i, row.children)

    def _undo(self, plan: "_Plan") -> None:
        """Drop the cells a plan's copies gave its fresh sequences (a failed decode)."""
        for seq in plan.fresh:
            self._llama.llama_memory_seq_rm(self._mem, seq, -1, -1)

    # -- commit ----------------------------------------------------------------------------

    def commit(self, slot: int, keep_rows: Sequence[int]) -> None:
        """Keep the pending rows ``keep_rows`` (a chain from the first pending row: each row's
        parent is the one before it, the first has none), drop the rest."""
        state = self._slot(slot)
        keep = [int(r) for r in keep_rows]
        expected = -1
        for r in keep:
            if not 0 <= r < len(state.pending) or state.pending[r].parent != expected:
                raise ValueError(f"pending rows {keep} of slot {slot} are not a chain from the first pending row")
            expected = r
        if keep:
            last = state.pending[keep[-1]]
            self._llama.llama_memory_seq_cp(self._mem, last.seq, state.main, state.length, last.position + 1)
        self._drop_pending(state)
        state.length += len(keep)

    def discard(self, slot: int) -> None:
        """Drop ``slot``'s pending rows."""
        self._drop_pending(self._slot(slot))

    def _drop_pending(self, state: _Slot) -> None:
        """Remove every pending sequence of ``state``; strict mode first keeps the rows that were
        not committed in the garbage sequence, so no later row fills their cells."""
        for seq in state.branches:
            # (the kept rows get the garbage sequence as well: harmless, nothing attends to it)
            if self._garbage is not None:
                self._llama.llama_memory_seq_cp(self._mem, seq, self._garbage, state.length, -1)
            self._llama.llama_memory_seq_rm(self._mem, seq, -1, -1)
            self._free_seqs.append(seq)
        state.branches.clear()
        state.pending.clear()


@dataclass
class _Plan:
    """What feeding rows to one slot will do (:meth:`LlamaCppTarget._plan`)."""

    rows: list[_Pending]
    seqs: list[list[int]]
    """Each new row's sequence set in the batch (its own first)."""
    copies: list[tuple[int, int, int]]
    """``(source, fresh, end)``: ``seq_cp`` of the source's cells at positions below ``end``
    (-1: all) to the fresh sequence, before the decode."""
    fresh: list[int]
    children: dict[int, int]
    """Children per pending row index after the feed."""


def load_draft_gguf(
    name_or_path: str, target: LlamaCppTarget, cache_dir: str | os.PathLike[str] | None = None, progress: bool = True,
    quant: str = "auto",
) -> LlamaCppTarget:
    """A draft model's GGUF in a llama.cpp context of its own, with ``target``'s threads (never
    strict: a draft's numbers never reach the output), requantized as ``quant`` says
    (:func:`~specgraft.models.gguf_requant.draft_gguf`: ``auto`` = Q4_0, llama.cpp's cheapest
    forward); ``ValueError`` unless its vocabulary is the target's size (a tokenizer check needs
    the Hugging Face tokenizers: ``SpecDecoder``)."""
    path = draft_gguf(gguf_path(name_or_path, cache_dir=cache_dir, progress=progress), quant, cache_dir, progress)
    draft = LlamaCppTarget(path, threads=target.threads, name=str(name_or_path))
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft model {name_or_path!r} has a vocabulary of {draft.vocab_size} tokens, the target's "
            f"{target.vocab_size}; it must use the target's tokenizer"
        )
    return draft


def _ints(values: Sequence[int] | torch.Tensor) -> list[int]:
    return values.tolist() if isinstance(values, torch.Tensor) else [int(v) for v in values]
