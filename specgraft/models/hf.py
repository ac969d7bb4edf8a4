"""The one adapter for any Hugging Face causal LM, target or draft model (tested on Llama and Qwen2).

A model gets a :class:`~specgraft.cache.slots.SlotCache`; each sequence owns a slot. Rows are
fed incrementally: :meth:`HFTarget.forward_rows` appends rows to a slot's **pending** rows,
each row the child of an earlier pending row (or of the committed prefix alone, parent -1),
with explicit position ids (``length + depth``) and a 4-D additive mask in which every row
sees the committed prefix, its pending ancestors and itself. A verify pass is one call
(``[root, node 0, ...]``, :meth:`forward_tree`); a draft model drafting layer by layer makes
one call per layer on the same pending rows. :meth:`commit` keeps a chain of pending rows;
:meth:`discard` drops them. transformers 5 passes a 4-D mask through unchanged
(``masking_utils._preprocess_mask_arguments``); the ``sdpa`` and ``eager`` attention
implementations apply it as given, which the constructor checks.

Example (the target; a draft model is used the same way)::

    target = HFTarget(model)
    slot = target.allocate()
    target.prefill(slot, prompt_ids[:-1])               # cache all but the root
    out = target.forward_tree(slot, prompt_ids[-1], tree)  # rows: root, node 0, node 1, ...
    target.commit(slot, [0, 1, 2])                      # root, node 0, node 1 accepted

The decoder (``model.get_decoder()``) and the output embedding are called separately so that
hidden states come for free and prefill logits can be reduced to top-k in chunks instead of
materialising ``[prompt_len, vocab]`` at once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, ClassVar, Sequence

import numpy as np
import torch

from specgraft.cache.slots import SlotCache
from specgraft.models.base import synchronize
from specgraft.models.graphs import DecoderGraphs, graphs_by_default
from specgraft.models.lean import LeanDecoder, lean_by_default, lean_decoder
from specgraft.models.quant import Int8Head, int8_available
from specgraft.types import DraftTree, PrefillOutput, PrefillRequest, RowsOutput
from specgraft.models.device import attention_backends
from specgraft.models.inputs import TreeInputs
from specgraft.models.loading import cache_kwarg, check_tree_attention, load_causal_lm
from specgraft.models.options import TargetOptions

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class HFTarget(TreeInputs):
    """Wraps an ``AutoModelForCausalLM`` with a :class:`SlotCache` (one slot per sequence).

    How it computes is one frozen :class:`~specgraft.models.options.TargetOptions` (prefill chunk,
    initial slot capacity, lean forward, CUDA graphs, the fast input builders); keyword arguments
    change single fields of ``options``. Call :meth:`reserve` with a generation's whole length to
    allocate the cache once.
    """

    #: ``forward_batch(fill_outputs=True)`` returns a fused start's prompt rows' hidden states,
    #: so drafters with ``deferred_prefill`` may start fused (``SpecEngine.start``)
    fill_outputs: ClassVar[bool] = True
    #: extra verified rows are cheap next to the one-row step (``TargetModel.dear_rows``)
    dear_rows: ClassVar[bool] = False

    def __init__(self, model: PreTrainedModel, options: TargetOptions | None = None, **changes):
        # one frozen record of how this target computes; keyword arguments change single fields:
        # HFTarget(model, prefill_chunk=6) == HFTarget(model, TargetOptions(prefill_chunk=6))
        self.options = (options or TargetOptions()).replace(**changes)
        check_tree_attention(model)
        self.model = model.eval()
        self.config = model.config.get_text_config(decoder=True)
        self.name = getattr(model.config, "_name_or_path", "") or type(model).__name__
        self.decoder = model.get_decoder()
        self._cache_kwarg = cache_kwarg(self.decoder)
        self.lm_head = model.get_output_embeddings()
        self.vocab_size: int = self.lm_head.out_features  # not .weight: packed and int8 linears unpack it
        self._draft_head: Callable[[torch.Tensor], torch.Tensor] | None = None  # draft_head(), built on first use
        self.max_positions: int = int(getattr(self.config, "max_position_embeddings", 1 << 30))
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        # rows per prefill forward; None: 256 on a CPU, where a forward's activations then stay in
        # cache (the 1.5B in fp32 on a 2-core Zen 5: a 512-token prompt 3.28 s in chunks of 256
        # against 3.67 s in chunks of 512, 1,024 tokens 6.9-7.3 against 7.7 s; 192-384 alike, the
        # 0.5B level), 512 elsewhere (a GPU's eager forward is launch-bound: fewer is better)
        self.prefill_chunk = self.options.prefill_chunk or (256 if self.device.type == "cpu" else 512)
        self.cache = SlotCache(self.config.num_hidden_layers, self.options.capacity)
        # slot -> [P, P] bool: which pending rows each pending row sees (ancestors and itself); a
        # numpy array when built on the host (:meth:`_host_tree_inputs`), moved on first device use
        self._ancestors: dict[int, torch.Tensor | np.ndarray] = {}
        # forwards replayed as CUDA graphs (``models/graphs.py``); None = eager
        self.graphs: DecoderGraphs | None = None
        # several prompts prefilled in one forward (:meth:`prefill_batch`, ``SpecEngine.start_many``):
        # on a GPU a forward is launch-bound, so 16 prompts cost about what one does; on a CPU a
        # forward is compute-bound and padding to the longest prompt would only add work
        self.batched_prefill = self.device.type != "cpu"
        # the decoder's forward as one plain loop of the same ops (``models/lean.py``; bit for bit
        # Hugging Face's): None = Hugging Face's forward
        self.lean: LeanDecoder | None = None
        lean, cuda_graphs = self.options.lean, self.options.cuda_graphs
        if lean_by_default(self.device) if lean is None else lean:
            self.lean = lean_decoder(self.decoder)
        if graphs_by_default(self.device) if cuda_graphs is None else cuda_graphs:
            self.graphs = DecoderGraphs(self._decode, self.cache, capture=self.device.type == "cuda")

    @classmethod
    def from_pretrained(
        cls, name_or_path: str, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu", fast_kernels: bool = True
    ) -> "HFTarget":
        return cls(load_causal_lm(name_or_path, dtype, device, fast_kernels))

    # -- slots ---------------------------------------------------------------------------

    def allocate(self) -> int:
        """A new, empty slot for one sequence."""
        slot = self.cache.allocate()
        self._ancestors[slot] = self._empty_ancestors()
        return slot

    def release(self, slot: int) -> None:
        self.cache.release(slot)
        self._ancestors.pop(slot, None)

    def length(self, slot: int) -> int:
        """Committed rows of ``slot``."""
        return self.cache.lengths[slot]

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows (committed + pending) in every slot."""
        self.cache.reserve(rows)

    def _empty_ancestors(self) -> torch.Tensor:
        return torch.zeros(0, 0, dtype=torch.bool, device=self.device)

    # -- forwards ------------------------------------------------------------------------

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    @torch.inference_mode()
    def logits_of(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[n, V]`` float32 logits of final-layer hidden states ``[n, H]`` (a prefill's
        ``final_hidden`` rows: the logits of a few prompt positions without the whole ``[T, V]``)."""
        return self._logits(hidden)

    def draft_head(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """Final hidden states ``[n, H]`` -> float32 logits ``[n, V]`` for *choosing drafts*, never
        for verifying them: on a CPU with a quantized engine an int8 copy of the output embedding
        (:class:`~specgraft.models.quant.Int8Head`: built on the first call, ~4 s, and kept:
        ``V * H`` bytes, 230 MiB for Qwen2.5-1.5B), which reads a quarter of the bytes a one-row
        fp32 head does (~6 ms against ~21 ms for that model on a 2-core Zen 5); elsewhere (a GPU) the exact
        :meth:`logits_of`. Approximate logits change which tokens are drafted, never the output."""
        if self.device.type != "cpu" or not int8_available():
            return self.logits_of
        if self._draft_head is None:
            self._draft_head = Int8Head(self.lm_head.weight)
        return self._draft_head

    @property
    def cost_device(self) -> str:
        """What cost tables are filed under (``budget.costs.table_name``): the device type."""
        return self.device.type

    @property
    def threads(self) -> int:
        """CPU threads the forwards run on (torch's)."""
        return torch.get_num_threads()

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    def input_embeddings(self) -> torch.Tensor:
        """``[V, H]`` the input token embeddings (AdaPLD's semantic fallback compares them)."""
        return self.model.get_input_embeddings().weight

    def _check_layer(self, layer: int | None) -> None:
        if layer is not None and not 1 <= layer < self.num_layers:
            raise ValueError(f"hidden layer {layer} is not in 1 .. {self.num_layers - 1} (None = the final layer) for {self.name!r}")

    def _decode(
        self, slots: Sequence[int], ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, layer: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder forward over ``slots`` (the cache's write set up): ``[B, n, H]`` final
        hidden states (after the final norm) and those of ``layer`` (the final ones when None)."""
        with attention_backends(ids.device):
            if self.lean is not None:
                return self.lean(ids, positions, mask, self.cache, layer)
            out = self.decoder(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                output_hidden_states=layer is not None, **{self._cache_kwarg: self.cache},
            )
        return out.last_hidden_state, (out.last_hidden_state if layer is None else out.hidden_states[layer])

    @torch.inference_mode()
    def prefill(self, slot: int, tokens: Sequence[int], request: PrefillRequest = PrefillRequest()) -> PrefillOutput:
        """Append ``tokens`` to ``slot``'s committed rows (plain causal attention), in chunks.

        Returns what ``request`` asks for: ``[len(tokens), topk]`` ids of each token's most likely
        successors (Token Recycling fills its matrix from them) and their probabilities, and/or
        the hidden states of ``request.hidden_layer``.
        """
        self._check_layer(request.hidden_layer)
        self._check_prefill(slot, tokens)
        top: list[torch.Tensor] = []
        top_probs: list[torch.Tensor] = []
        hidden_parts: list[torch.Tensor] = []
        final_parts: list[torch.Tensor] = []
        topk_s = 0.0
        for start in range(0, len(tokens), self.prefill_chunk):
            chunk = list(tokens[start : start + self.prefill_chunk])
            n, length = len(chunk), self.length(slot)
            write = self.cache.set_write(range(slot, slot + 1), n)
            # [1, n]
            ids = torch.tensor([chunk], dtype=torch.long, device=self.device)
            positions = torch.arange(length, length + n, device=self.device)[None]
            # [1, 1, n, length + n]: the committed prefix, then causal within the chunk
            mask = torch.zeros(n, write.kv_len, dtype=self.dtype, device=self.device)
            causal = torch.ones(n, n, dtype=torch.bool, device=self.device).triu_(1)
            mask[:, length:].masked_fill_(causal, torch.finfo(self.dtype).min)
            layer = request.hidden_layer if request.hidden else None
            final, hidden = self._decode(range(slot, slot + 1), ids, positions, mask[None, None], layer)
            self.cache.end_write([n])
            self.cache.commit(slot, range(n))
            if request.topk:
                synchronize(self.device)  # a GPU's queued chunk forward is not the top-k's time
                t_top = time.perf_counter()
                logits = self._logits(final[0])
                best = logits.topk(request.topk, dim=-1)
                top.append(best.indices.cpu())  # syncs a GPU again
                if request.topk_probs:
                    # p = exp(logit - logsumexp): no [n, V] softmax kept
                    top_probs.append((best.values - logits.logsumexp(dim=-1, keepdim=True)).exp().cpu())
                topk_s += time.perf_counter() - t_top
            if request.hidden:
                hidden_parts.append(hidden[0])
            if request.final_hidden:
                final_parts.append(final[0])
        empty_top = torch.empty(0, request.topk, dtype=torch.long)
        return PrefillOutput(
            topk=(torch.cat(top) if top else empty_top) if request.topk else None,
            hidden=(torch.cat(hidden_parts) if hidden_parts else None) if request.hidden else None,
            topk_probs=(torch.cat(top_probs) if top_probs else empty_top.float()) if request.topk and request.topk_probs else None,
            final_hidden=(torch.cat(final_parts) if final_parts else None) if request.final_hidden else None,
            topk_s=topk_s,
        )

    @torch.inference_mode()
    def prefill_batch(self, slots: Sequence[int], token_lists: Sequence[Sequence[int]]) -> None:
        """:meth:`prefill` of each ``token_lists[b]`` into ``slots[b]`` (distinct; nothing asked of
        the prefill but the cache), all in one forward per chunk of :attr:`prefill_chunk` rows a
        slot, each slot's rows padded to the longest.

        Row ``i`` of slot ``b`` sees its committed prefix and its own rows up to ``i`` (causal),
        at position ``length + i``; padding rows are written past the slot's rows and never
        committed, so nothing sees them. Everything is checked before any state changes.

        Example: prompts of 3 and 5 tokens in fresh slots: one forward of ``[2, 5]`` rows, then
        slot 0 holds 3 committed rows and slot 1 holds 5, as two :meth:`prefill` calls leave them.
        """
        slots = [int(s) for s in slots]
        if len(token_lists) != len(slots) or len(set(slots)) != len(slots):
            raise ValueError(f"prefill_batch needs distinct slots, one token list each: {slots}, {len(token_lists)} lists")
        for slot, tokens in zip(slots, token_lists):
            self._check_prefill(slot, tokens)
        longest = max((len(t) for t in token_lists), default=0)
        for start in range(0, longest, self.prefill_chunk):
            part = [(s, list(t[start : start + self.prefill_chunk])) for s, t in zip(slots, token_lists) if len(t) > start]
            chunk_slots = [s for s, _ in part]
            counts = [len(c) for _, c in part]
            n = max(counts)
            lengths = [self.length(s) for s in chunk_slots]
            write = self.cache.set_write(chunk_slots, n)
            # [B, n] ids (padding 0) and positions; [B, 1, n, kv_len] mask: column j visible to
            # row i of slot b when j <= length_b + i (its prefix, then causal)
            ids = torch.tensor([c + [0] * (n - len(c)) for _, c in part], dtype=torch.long, device=self.device)
            first = torch.tensor(lengths, dtype=torch.long, device=self.device)[:, None]
            positions = first + torch.arange(n, device=self.device)[None]
            visible = torch.arange(write.kv_len, device=self.device)[None, None, :] <= positions[:, :, None]
            mask = self._additive_mask(visible)
            try:
                self._decode(chunk_slots, ids, positions, mask[:, None])
            finally:
                self.cache.end_write(counts)
            for slot, count in zip(chunk_slots, counts):
                self.cache.commit(slot, range(count))

    def _check_prefill(self, slot: int, tokens: Sequence[int]) -> None:
        """``ValueError`` unless ``tokens`` can be prefilled into ``slot``: an allocated slot
        with nothing pending, token ids in the vocabulary, room in the context window."""
        self.cache._check(slot)
        if self.cache.pending[slot]:
            raise ValueError(f"slot {slot} has {self.cache.pending[slot]} pending rows; commit or discard them before prefilling")
        self._check_tokens(tokens)
        if self.length(slot) + len(tokens) > self.max_positions:
            raise ValueError(f"{self.length(slot) + len(tokens)} tokens exceed the context window of {self.max_positions}")

    def forward_rows(
        self,
        slot: int,
        tokens: Sequence[int] | torch.Tensor,
        parent_rows: Sequence[int] | torch.Tensor,
        output_hidden: bool = False,
        hidden_layer: int | None = None,
    ) -> RowsOutput:
        """Feed ``tokens`` as new pending rows of ``slot``; new row ``i`` hangs from pending row
        ``parent_rows[i]`` (an earlier pending row, old or new; -1 = only the committed prefix).

        ``tokens`` and ``parent_rows`` may be device tensors (a draft model drafting on the GPU
        does not sync to build them). Returns the logits ``[n, V]`` of the new rows (and their
        hidden states of ``hidden_layer`` with ``output_hidden``).
        """
        return self.forward_batch(range(slot, slot + 1), [tokens], [parent_rows], output_hidden, hidden_layer)[0]

    def forward_tree(
        self, slot: int, root: int, tree: DraftTree, output_hidden: bool = False, hidden_layer: int | None = None
    ) -> RowsOutput:
        """The verify pass: rows ``[root, node 0, ..., node N-1]`` (row ``i + 1`` is node ``i``)."""
        return self.forward_rows(slot, [root, *tree.tokens], [-1, *(p + 1 for p in tree.parents)], output_hidden, hidden_layer)

    @torch.inference_mode()
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
        """:meth:`forward_rows` for the slots ``slots`` (distinct, any order) in one forward.

        ``logits_from[b]`` (default 0) is slot ``b``'s first row whose logits (and hidden states)
        are returned: the rows before it only fill the cache. The engine feeds a short prompt's
        prefill as a chain in the first step's forward (:meth:`SpecEngine.start`) and needs no
        ``[T, V]`` logits for it (~20 ms a row for a 1.5B model's 152k-token head on a 2-core CPU).
        ``fill_outputs``: also return what a prefill would of those rows, as ``RowsOutput.fill``
        (their final hidden states, and with ``output_hidden`` those of ``hidden_layer``; copies,
        which a drafter may keep), for drafters whose prefill outputs a fused start deferred.

        Each slot's rows are padded to the longest (with CUDA graphs, further up to a power of
        two: :meth:`DecoderGraphs.rows <specgraft.models.graphs.DecoderGraphs.rows>`); padding
        rows see only themselves, are written past the slot's pending rows and never become
        pending, so nothing ever sees them. The mask is ``[B, 1, n_max, kv_len]`` with each slot's own committed length.
        Everything is checked and every mask built before any state changes, so an error
        leaves every slot as it was.

        Positions (``length + depth``) must stay inside the context window; rows may exceed
        it (a draft model's layers feed several rows per depth). For parent rows given as host
        lists the deepest position is checked here; a caller passing device tensors bounds
        its depths itself (the draft-model drafter does), so no host sync is needed.
        """
        if len(tokens) != len(slots) or len(parent_rows) != len(slots):
            raise ValueError(f"{len(tokens)} token lists and {len(parent_rows)} parent lists for {len(slots)} slots")
        if len(set(slots)) != len(slots):
            raise ValueError(f"a batch forward needs distinct slots, got {list(slots)}")
        self._check_layer(hidden_layer)
        dev = self.device
        for b, slot in enumerate(slots):
            self._check_rows(slot, tokens[b], parent_rows[b])
        counts = [len(t) for t in tokens]
        starts = [0] * len(slots) if logits_from is None else [int(f) for f in logits_from]
        if len(starts) != len(slots) or any(not 0 <= f <= n for f, n in zip(starts, counts)):
            raise ValueError(f"logits_from {list(starts)} does not fit the row counts {counts}")
        n_max = max(counts)
        if n_max == 0:
            return [RowsOutput(torch.empty(0, self.vocab_size, device=dev)) for _ in slots]
        # rows fed: with graphs, padded up to a few row counts (DecoderGraphs.rows), so trees of
        # every size replay a handful of graphs instead of each new size running eagerly twice
        n_rows = self.graphs.rows(n_max) if self.graphs is not None else n_max
        plain = n_rows == 1 and min(counts) == 1 and not any(self.cache.pending[s] for s in slots)
        if (
            self.options.host_tree_inputs and len(slots) == 1 and not plain and not self.cache.pending[slots[0]]
            and not isinstance(tokens[0], torch.Tensor) and not isinstance(parent_rows[0], torch.Tensor)
        ):
            ids, positions, masks = self._host_tree_inputs(slots[0], tokens[0], parent_rows[0], n_rows)
        else:
            toks = [torch.as_tensor(t, dtype=torch.long).to(dev) for t in tokens]
            pars = [torch.as_tensor(p, dtype=torch.long).to(dev) for p in parent_rows]
            if self.options.plain_fast_path and plain:
                ids, positions, masks = self._plain_inputs(slots, toks)
            elif self.options.batched_tree_inputs and len(slots) > 1 and len({self.cache.pending[s] for s in slots}) == 1:
                ids, positions, masks = self._batch_tree_inputs(slots, toks, pars, counts, n_rows)
            else:
                ids, positions, masks = self._tree_inputs(slots, toks, pars, counts, n_rows)
        write = self.cache.set_write(slots, n_rows)
        layer = hidden_layer if output_hidden else None
        try:
            if self.graphs is not None:
                final, hidden = self.graphs.run(write, ids, positions, masks, layer)
            else:
                final, hidden = self._decode(slots, ids, positions, masks, layer)
        finally:
            self.cache.end_write(counts)
        if n_rows > n_max:  # padding rows: no logits, no hidden states
            final, hidden = final[:, :n_max], hidden[:, :n_max]
        if not any(starts):
            logits = self._logits(final)
            return [
                RowsOutput(logits=logits[b, :n], hidden=hidden[b, :n] if output_hidden else None) for b, n in enumerate(counts)
            ]
        return [
            RowsOutput(
                logits=self._logits(final[b, f:n]),
                hidden=hidden[b, f:n] if output_hidden else None,
                fill=PrefillOutput(
                    hidden=hidden[b, :f].clone() if output_hidden else None, final_hidden=final[b, :f].clone()
                ) if fill_outputs and f else None,
            )
            for b, (f, n) in enumerate(zip(starts, counts))
        ]

    def _check_rows(self, slot: int, tokens: Sequence[int] | torch.Tensor, parent_rows: Sequence[int] | torch.Tensor) -> None:
        """``ValueError`` for rows that cannot be fed: lengths, token ids, parent rows and the
        deepest position (host lists only; see :meth:`forward_batch`)."""
        if len(tokens) != len(parent_rows):
            raise ValueError(f"{len(tokens)} tokens but {len(parent_rows)} parent rows")
        if isinstance(tokens, torch.Tensor) or isinstance(parent_rows, torch.Tensor):
            return
        self._check_tokens(tokens)
        pend, length = self.cache.pending[slot], self.length(slot)
        depth: list[int] = []
        for i, p in enumerate(parent_rows):
            if not -1 <= p < pend + i:
                raise ValueError(f"parent row {p} of new row {pend + i} is not an earlier pending row (nor -1)")
            if p >= pend:
                depth.append(depth[p - pend] + 1)
            elif p >= 0:
                depth.append(-1)  # under an old pending row: its depth is on the device
            else:
                depth.append(0)
        if pend == 0 and depth and length + max(depth) >= self.max_positions:
            raise ValueError(
                f"slot {slot}: position {length + max(depth)} is past the context window of {self.max_positions} positions"
            )

    def commit(self, slot: int, keep_rows: Sequence[int]) -> None:
        """Keep the pending rows ``keep_rows`` (a chain from the first: each row's parent is the one
        before it, the first has none; row 0 = the first pending row), drop the rest.

        ``ValueError`` when the rows are not such a chain (one small host transfer of their
        ancestor sets)."""
        keep = list(keep_rows)
        pend = self.cache.pending[slot]
        # the first pending row alone is always a chain (its parent is a committed row or none):
        # a plain step's commit skips the check's two host transfers (device syncs on a GPU)
        if keep != [0] and keep and all(0 <= r < pend for r in keep):
            # [m, m] and [m]: each kept row sees exactly the kept rows up to itself (on the host
            # when the ancestor sets were built there: no device sync)
            seen = self._ancestors[slot][keep]
            if isinstance(seen, np.ndarray):
                chain = np.array_equal(seen[:, keep], np.tril(np.ones((len(keep), len(keep)), dtype=bool)))
                sizes = seen.sum(axis=-1).tolist()
            else:
                chain = seen[:, keep].tolist() == torch.ones(len(keep), len(keep), dtype=torch.bool).tril_().tolist()
                sizes = seen.sum(dim=-1).tolist()
            if not chain or sizes != list(range(1, len(keep) + 1)):
                raise ValueError(f"pending rows {keep} of slot {slot} are not a chain from the first pending row")
        self.cache.commit(slot, keep)
        self._ancestors[slot] = self._empty_ancestors()

    def discard(self, slot: int) -> None:
        """Drop ``slot``'s pending rows."""
        self.cache.discard(slot)
        self._ancestors[slot] = self._empty_ancestors()

    def _check_tokens(self, tokens: Sequence[int]) -> None:
        if len(tokens) and (min(tokens) < 0 or max(tokens) >= self.vocab_size):
            bad = next(t for t in tokens if not 0 <= t < self.vocab_size)
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab_size}) of model {self.name!r}")
