"""Target adapter for any Hugging Face causal LM (tested on Llama and Qwen2 architectures).

One verify pass feeds ``[root] + tree.tokens`` after the cached prefix, with explicit position
ids (``past_len + depth``) and a 4-D additive attention mask: every row sees the whole cached
prefix and, inside the tree, only its ancestors and itself (``tree/layout.py``). transformers 5
passes a 4-D mask through unchanged (``masking_utils._preprocess_mask_arguments``), and an
additive float mask works for both the ``sdpa`` and ``eager`` attention implementations.

The decoder (``model.get_decoder()``) and the output embedding are called separately so that
hidden states come for free and prefill logits can be reduced to top-k in chunks instead of
materialising ``[prompt_len, vocab]`` at once.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.cache_utils import DynamicCache

from specgraft.cache.commit import commit_cache
from specgraft.models.base import TreeOutput
from specgraft.models.kernels import auto_dtype, use_onednn_linears
from specgraft.tree.layout import tree_layout
from specgraft.types import DraftTree

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def parse_dtype(name: str | torch.dtype, device: str = "cpu") -> torch.dtype:
    """``"bfloat16"``, ``"float32"``, ``"float16"`` or ``"auto"`` (see :func:`kernels.auto_dtype`)."""
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        name = auto_dtype(device)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of auto, {', '.join(sorted(DTYPES))}")
    return DTYPES[name]


def load_causal_lm(name_or_path: str, dtype: str | torch.dtype = "auto", device: str = "cpu", fast_kernels: bool = True) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained`` + optional oneDNN linears on CPU (``models/kernels.py``)."""
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=parse_dtype(dtype, device)).to(device).eval()
    if fast_kernels and device == "cpu":
        use_onednn_linears(model)
    return model


class HFTarget:
    """Wraps an ``AutoModelForCausalLM`` with one ``DynamicCache``.

    Example::

        target = HFTarget(model)
        target.prefill(prompt_ids[:-1])              # cache all but the root
        out = target.forward_tree(prompt_ids[-1], tree)
        target.commit([0, 1, 2])                     # root, node 0, node 1 accepted
    """

    def __init__(self, model: PreTrainedModel, prefill_chunk: int = 512):
        self.model = model.eval()
        self.config = model.config.get_text_config(decoder=True)
        for attr in ("final_logit_softcapping", "logit_scale"):
            if getattr(self.config, attr, None) not in (None, 1.0):
                raise ValueError(f"models with {attr} are not supported yet")
        self.decoder = model.get_decoder()
        self.lm_head = model.get_output_embeddings()
        self.vocab_size: int = self.lm_head.weight.shape[0]
        self.max_positions: int = int(getattr(self.config, "max_position_embeddings", 1 << 30))
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.prefill_chunk = prefill_chunk
        self.cache = DynamicCache(config=model.config)
        self.past_len = 0
        self._pending = 0  # rows appended by the last forward_tree and not yet committed

    @classmethod
    def from_pretrained(cls, name_or_path: str, dtype: str | torch.dtype = "auto", device: str = "cpu", fast_kernels: bool = True) -> "HFTarget":
        return cls(load_causal_lm(name_or_path, dtype, device, fast_kernels))

    def reset(self) -> None:
        self.cache = DynamicCache(config=self.model.config)
        self.past_len = 0
        self._pending = 0

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    @torch.inference_mode()
    def prefill(self, tokens: Sequence[int], topk: int = 0) -> torch.Tensor | None:
        """Append ``tokens`` to the cache (plain causal attention).

        Returns ``[len(tokens), topk]`` ids of the most likely successor of each token when
        ``topk > 0`` (Token Recycling fills its matrix from them), else ``None``.
        """
        assert self._pending == 0, "commit the last verify pass before prefilling"
        if not tokens:
            return torch.empty(0, topk, dtype=torch.long) if topk else None
        top = []
        for start in range(0, len(tokens), self.prefill_chunk):
            chunk = list(tokens[start : start + self.prefill_chunk])
            # [1, T]
            ids = torch.tensor([chunk], dtype=torch.long, device=self.device)
            pos = torch.arange(self.past_len, self.past_len + len(chunk), device=self.device)[None]
            out = self.decoder(input_ids=ids, position_ids=pos, past_key_values=self.cache, use_cache=True)
            self.past_len += len(chunk)
            if topk:
                # [T, topk]
                top.append(self._logits(out.last_hidden_state[0]).topk(topk, dim=-1).indices.cpu())
        return torch.cat(top) if topk else None

    def tree_mask(self, ancestor_mask: torch.Tensor) -> torch.Tensor:
        """[1, 1, N + 1, past_len + N + 1] additive mask: 0 where attention is allowed."""
        n1 = ancestor_mask.shape[0]
        allowed = torch.ones(n1, self.past_len + n1, dtype=torch.bool)
        allowed[:, self.past_len :] = ancestor_mask
        mask = torch.zeros(n1, self.past_len + n1, dtype=self.dtype)
        mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return mask[None, None].to(self.device)

    @torch.inference_mode()
    def forward_tree(self, root: int, tree: DraftTree, output_hidden: bool = False) -> TreeOutput:
        assert self._pending == 0, "commit the last verify pass before the next one"
        n1 = len(tree) + 1
        layout = tree_layout(tree.parents)
        # [1, N + 1]
        ids = torch.tensor([[root, *tree.tokens]], dtype=torch.long, device=self.device)
        pos = layout.position_ids(self.past_len)[None].to(self.device)
        # A single root row needs no mask: it attends to everything cached.
        mask = self.tree_mask(layout.ancestor_mask) if n1 > 1 else None
        out = self.decoder(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self.cache, use_cache=True)
        self._pending = n1
        # [N + 1, H]
        hidden = out.last_hidden_state[0]
        return TreeOutput(logits=self._logits(hidden), hidden=hidden if output_hidden else None)

    def commit(self, keep_rows: Sequence[int]) -> None:
        assert self._pending, "nothing to commit"
        assert all(0 <= r < self._pending for r in keep_rows), f"rows {list(keep_rows)} outside the last pass"
        commit_cache(self.cache, self.past_len, keep_rows)
        self.past_len += len(keep_rows)
        self._pending = 0
