"""How a slot cache's tree forward gets its inputs: token ids, positions and the 4-D attention mask
of each slot's pending rows (ancestor sets), built on the device or on the host, one slot at a time
or several at once (:class:`TreeInputs`, which :class:`~specgraft.models.hf.HFTarget` is built on).

The fast paths keep their twins (``TargetOptions.plain_fast_path``, ``batched_tree_inputs``,
``host_tree_inputs``); the tests check they build the same inputs bit for bit.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from specgraft.tree.layout import depth_from_mask, host_ancestors, pending_ancestors



class TreeInputs:
    """The input builders of :class:`~specgraft.models.hf.HFTarget` (a mixin: it reads the target's
    ``cache``, ``_ancestors``, ``device``, ``dtype`` and ``length``)."""

    def _additive_mask(self, visible: torch.Tensor) -> torch.Tensor:
        """The additive attention mask of a boolean one: 0 where visible, the dtype's minimum elsewhere."""
        return torch.zeros(visible.shape, dtype=self.dtype, device=visible.device).masked_fill_(~visible, torch.finfo(self.dtype).min)

    def _device_ancestors(self, slot: int) -> torch.Tensor:
        """``slot``'s pending ancestor sets on the device (moved there once if built on the host)."""
        seen = self._ancestors[slot]
        if isinstance(seen, np.ndarray):
            seen = self._ancestors[slot] = torch.from_numpy(seen).to(self.device)
        return seen

    def _host_tree_inputs(
        self, slot: int, tokens: Sequence[int], parents: Sequence[int], n_rows: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_tree_inputs` for one slot with nothing pending whose rows come as host lists
        (the engine's verify pass, a fused start's prompt chain included): the ancestor sets,
        depths and visibility built with numpy (:func:`~specgraft.tree.layout.host_ancestors`) and
        sent in two copies, ids with positions and the boolean visibility, instead of the dozen
        small device ops the device path launches (~1 ms a tree step on an H200, a sixth of the
        step). The ancestor sets stay on the host, so :meth:`commit`'s chain check needs no device
        sync. The same tensors; ``TargetOptions(host_tree_inputs=False)`` takes the device path (the twin
        ``tests/unit/models/test_tree_attention.py`` compares with).

        Example: one committed row, rows ``[root, a, b]`` with ``b`` under ``a`` and padding to 4:
        ids ``[r, a, b, 0]``, positions ``[1, 2, 3, 1]``; the padding row sees only its own column.
        """
        n, length = len(tokens), self.length(slot)
        kv_len = length + n_rows
        seen, depth = host_ancestors(parents)
        visible = np.zeros((n_rows, kv_len), dtype=bool)
        visible[:n, :length] = True
        visible[:n, length : length + n] = seen
        pad = np.arange(n, n_rows)
        visible[pad, length + pad] = True  # padding rows see themselves (no empty softmax)
        ints = np.zeros(2 * n_rows, dtype=np.int64)
        ints[:n] = tokens
        ints[n_rows : n_rows + n] = length + depth
        ints[n_rows + n :] = length
        ints_d = torch.from_numpy(ints).to(self.device)
        mask = self._additive_mask(torch.from_numpy(visible).to(self.device))
        self._ancestors[slot] = seen
        return ints_d[None, :n_rows], ints_d[None, n_rows:], mask[None, None]

    def _tree_inputs(
        self, slots: Sequence[int], toks: list[torch.Tensor], pars: list[torch.Tensor], counts: list[int], n_rows: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``[B, n_max]`` ids and positions and the ``[B, 1, n_max, kv_len]`` mask of a
        :meth:`forward_batch`, slot by slot; records each slot's new pending ancestor sets.
        ``n_max`` is ``n_rows`` (default ``max(counts)``): each slot's rows past its count are padding."""
        dev, n_max = self.device, n_rows or max(counts)
        kv_len = max(self.length(s) + self.cache.pending[s] for s in slots) + n_max
        min_value = torch.finfo(self.dtype).min
        masks, positions, ids, seen_sets = [], [], [], []
        for b, slot in enumerate(slots):
            length, pend, n = self.length(slot), self.cache.pending[slot], counts[b]
            # [n, pend + n] pending rows each new row sees
            seen = pending_ancestors(self._device_ancestors(slot), pars[b])
            seen_sets.append(seen)
            # [n_max, kv_len] additive mask: committed prefix, then the pending rows seen
            mask = torch.full((n_max, kv_len), min_value, dtype=self.dtype, device=dev)
            mask[:n, :length] = 0.0
            mask[:n, length : length + pend + n].masked_fill_(seen, 0.0)
            pad = torch.arange(n, n_max, device=dev)
            mask[pad, length + pend + pad] = 0.0  # padding rows see themselves (no empty softmax)
            masks.append(mask)
            depth = depth_from_mask(seen)
            positions.append(torch.cat([length + depth, torch.full((n_max - n,), length, device=dev, dtype=torch.long)]))
            ids.append(torch.cat([toks[b], torch.zeros(n_max - n, dtype=torch.long, device=dev)]))
        for b, slot in enumerate(slots):
            pend, n = self.cache.pending[slot], counts[b]
            old = self._device_ancestors(slot)
            self._ancestors[slot] = torch.cat([torch.cat([old, seen_sets[b].new_zeros(pend, n)], dim=1), seen_sets[b]], dim=0)
        return torch.stack(ids), torch.stack(positions), torch.stack(masks)[:, None]

    def _batch_tree_inputs(
        self, slots: Sequence[int], toks: list[torch.Tensor], pars: list[torch.Tensor], counts: list[int], n_rows: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_tree_inputs` for slots that all hold ``P`` pending rows (a batch's verify pass:
        none; a draft model's batch drafting one depth after another: as many), built for all
        slots at once: one batched :func:`pending_ancestors` and a few whole-batch ops instead of
        a dozen small ops a slot, which on a GPU cost more than the forward they feed once it is
        replayed as a CUDA graph (a tree step at 16 sequences cost twice a plain one). The same
        tensors; ``TargetOptions(batched_tree_inputs=False)`` takes the slot-by-slot path (the twin the tests
        compare with).

        Each slot's rows are padded to ``n = n_rows`` (default ``max(counts)``) with parent -1: a
        padding row sees only itself (at column ``length + P + i``, as in :meth:`_tree_inputs`)
        and no real row sees it, so slot ``b``'s real rows get exactly its own ancestor sets.
        """
        dev, n = self.device, n_rows or max(counts)
        p = self.cache.pending[slots[0]]
        b = len(slots)
        committed = [self.length(s) for s in slots]
        kv_len = max(committed) + p + n
        # [B, n] ids and parents, padded (token 0, parent -1)
        pad = n - max(counts)
        ids = torch.nn.functional.pad(torch.nn.utils.rnn.pad_sequence(toks, batch_first=True, padding_value=0), (0, pad), value=0)
        parents = torch.nn.functional.pad(torch.nn.utils.rnn.pad_sequence(pars, batch_first=True, padding_value=-1), (0, pad), value=-1)
        # [B, P, P] -> [B, n, P + n] pending rows each new row sees
        old = torch.stack([self._device_ancestors(s) for s in slots])
        seen = pending_ancestors(old, parents)
        lengths = torch.tensor(committed, device=dev)[:, None]
        positions = lengths + depth_from_mask(seen)  # a padding row: depth 0, at the slot's length
        # [B, n, kv_len]: real rows see the committed prefix, every row its pending ancestors
        real = torch.arange(n, device=dev)[None, :] < torch.tensor(counts, device=dev)[:, None]
        visible = (torch.arange(kv_len, device=dev)[None, None, :] < lengths[:, :, None]) & real[:, :, None]
        columns = (lengths + torch.arange(p + n, device=dev)[None]).unsqueeze(1).expand(b, n, p + n)
        visible.scatter_(2, columns, seen)
        mask = self._additive_mask(visible)
        # [B, P + n, P + n] closed relation after this forward; slot b keeps its real rows' corner
        closed = torch.cat([torch.cat([old, old.new_zeros(b, p, n)], dim=2), seen], dim=1)
        for i, slot in enumerate(slots):
            self._ancestors[slot] = closed[i, : p + counts[i], : p + counts[i]]
        return ids, positions, mask[:, None]

    def _plain_inputs(self, slots: Sequence[int], toks: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_tree_inputs` when every slot feeds one row with nothing pending (plain batched
        decoding: ``ar``, or any method at budget 0), built for all slots at once instead of
        slot by slot (a dozen small ops per sequence, which on a GPU cost more than the
        forward's own launches at 16 sequences). The same tensors; ``TargetOptions(plain_fast_path=False)``
        takes the slot-by-slot path (the twin the tests compare with)."""
        dev = self.device
        committed = [self.length(s) for s in slots]
        lengths = torch.tensor(committed, device=dev)
        # [B, kv_len]: each slot's committed prefix and its new row (column = its length)
        visible = torch.arange(max(committed) + 1, device=dev)[None, :] <= lengths[:, None]
        mask = self._additive_mask(visible)
        seen = torch.ones(1, 1, dtype=torch.bool, device=dev)
        for slot in slots:
            self._ancestors[slot] = seen
        return torch.stack(toks), lengths[:, None], mask[:, None, None, :]

