"""The tools people use, as benchmark methods: Hugging Face ``generate`` in three forms.

- ``hf``: plain ``model.generate`` (greedy when the temperature is 0).
- ``hf-pld``: ``generate(prompt_lookup_num_tokens=10)``, HF's prompt lookup decoding.
- ``hf-assisted``: ``generate(assistant_model=D)``, HF's assisted generation with a draft model.

Every generation setting is passed explicitly so that a model's ``generation_config.json``
(Qwen2.5 ships ``repetition_penalty=1.05``, ``top_k=20``, ``do_sample=True``) cannot change
what is compared: same ``max_new_tokens``, no forced minimum, stop at the same EOS ids as our
engine, repetition penalty 1. New tokens are counted from the output ids; HF does not expose
its steps, so peers report no steps, MAT or tokens-per-step histogram.

Example::

    peer = HFPeer("hf-pld", model, eos_token_ids=[2], max_new_tokens=32)
    run = peer.run([1, 5, 6, 7])          # MethodRun(tokens=[...], time_s=..., stats=None)
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Sequence

import torch

from specgraft.bench.contract import MethodRun, until_eos
from specgraft.models.base import synchronize
from specgraft.models.device import attention_backends

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PROMPT_LOOKUP_NUM_TOKENS = 10

PEERS: dict[str, str] = {
    "hf": "Hugging Face generate, plain",
    "hf-pld": f"Hugging Face generate(prompt_lookup_num_tokens={PROMPT_LOOKUP_NUM_TOKENS})",
    "hf-assisted": "Hugging Face generate(assistant_model=draft model)",
}


class HFPeer:
    """One Hugging Face ``generate`` configuration over an already loaded model."""

    is_peer = True

    def __init__(
        self,
        name: str,
        model: PreTrainedModel,
        eos_token_ids: Sequence[int],
        max_new_tokens: int,
        temperature: float = 0.0,
        seed: int | None = None,
        assistant_model: PreTrainedModel | None = None,
    ):
        if name not in PEERS:
            raise ValueError(f"unknown peer {name!r}; choose one of {', '.join(PEERS)}")
        if name == "hf-assisted" and assistant_model is None:
            raise ValueError("hf-assisted needs a draft model (--draft-model)")
        if not eos_token_ids:
            raise ValueError("peers need at least one EOS token id")
        self.name = name
        self.model = model
        self.eos_token_ids = sorted(int(t) for t in eos_token_ids)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.seed = seed
        self.assistant_model = assistant_model if name == "hf-assisted" else None

    def generate_kwargs(self) -> dict[str, Any]:
        """Everything passed to ``generate`` besides the inputs (and the assistant model)."""
        kw: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "eos_token_id": self.eos_token_ids,
            "pad_token_id": self.eos_token_ids[0],
            "repetition_penalty": 1.0,
            "use_cache": True,
        }
        if self.temperature > 0:
            kw.update(do_sample=True, temperature=self.temperature, top_k=0, top_p=1.0)
        else:
            kw.update(do_sample=False)
        if self.name == "hf-pld":
            kw["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_NUM_TOKENS
        return kw

    def run(self, ids: Sequence[int], max_new_tokens: int | None = None) -> MethodRun:
        kw = self.generate_kwargs()
        if max_new_tokens is not None:
            kw["max_new_tokens"] = max_new_tokens
        if self.assistant_model is not None:
            kw["assistant_model"] = self.assistant_model
        inputs = torch.tensor([list(ids)], dtype=torch.long, device=self.model.device)
        if self.temperature > 0 and self.seed is not None:
            torch.manual_seed(self.seed)
        # the same SDPA backends as our forwards (no cuDNN attention on a GPU: a plan per new key
        # length made Hugging Face's padded batches 8x slower on an H100, models/hf.py)
        with torch.inference_mode(), attention_backends(self.model.device):
            synchronize(self.model.device)
            t0 = time.perf_counter()
            out = self.model.generate(inputs, attention_mask=torch.ones_like(inputs), **kw)
            synchronize(self.model.device)
            elapsed = time.perf_counter() - t0
        tokens = out[0, inputs.shape[1] :].tolist()
        # batch of one: nothing is padded, but cut defensively after the first EOS
        return MethodRun(tokens=until_eos(tokens, self.eos_token_ids), time_s=elapsed, stats=None, config=self.resolved_config())

    def resolved_config(self) -> dict[str, Any]:
        return {
            "method": self.name,
            "peer": PEERS[self.name],
            "generate_kwargs": self.generate_kwargs(),
            "assistant_model": getattr(getattr(self.assistant_model, "config", None), "_name_or_path", None),
            "dtype": str(next(self.model.parameters()).dtype).replace("torch.", ""),
            "threads": torch.get_num_threads(),
        }
