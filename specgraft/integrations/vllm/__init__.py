"""specgraft's token-level drafters as vLLM ``custom_class`` proposers (vLLM 0.32).

vLLM verifies the drafts with its own rejection sampler, so outputs are vLLM's own (greedy: token
for token its plain output; sampling: its distribution). Use::

    from vllm import LLM
    llm = LLM(model=DIR, speculative_config={"method": "custom_class",
              "model": "specgraft.integrations.vllm.PLDProposer", "num_speculative_tokens": 5})

or ``speculative_config=specgraft.integrations.vllm.speculative_config("pld", 5)``.

**What vLLM 0.32 gives a proposer** (``vllm/v1/spec_decode/custom_class_proposer.py``,
``GPUModelRunner.propose_draft_token_ids``, which the CPU runner inherits): the class is built
as ``cls(vllm_config)``; ``load_model(model)`` is called once (the CPU runner calls it
unconditionally); every step ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
slot_mappings=...)`` returns one draft chain per row of the input batch, at most
``num_speculative_tokens`` long. Row ``i`` holds one request: ``token_ids_cpu[i, :n]`` with
``n = num_tokens_no_spec[i]`` are its committed tokens (prompt + output, this step's sampled
tokens included) and ``sampled_token_ids[i]`` the tokens this step appended: the draft tokens
vLLM accepted, then its own (bonus) token, or ``[]`` when the row sampled nothing (a prefill
chunk). So ``len(sampled) - 1`` of the chain proposed for the row last step were accepted: this
is what PLD's copy rates learn from.

**Requests.** vLLM passes no request ids to a ``custom_class`` proposer, and rows move when
requests finish (the batch is condensed). A request is therefore recognised by its tokens: the
state kept for a row last step is the one whose committed tokens are exactly
``token_ids_cpu[i, :n - len(sampled)]`` (checked in full) and whose proposal the accepted tokens
continue. State not claimed by any row in a step belongs to a request that left the batch
(finished, aborted or preempted) and is freed then; a preempted request that comes back starts
from the priors again over its whole context. Requests share only read-only state (the priors,
the datastores); nothing one request learns reaches another.

**Proposers** (each reuses the specgraft drafter named, no copy of its logic):

- :class:`PLDProposer`: ``drafters/pld.py``'s tree; the chain with the largest expected number
  of accepted tokens net of what verifying it costs vLLM (:class:`ChainCost`: the measured cost
  of a step verifying each number of draft tokens), at most ``num_speculative_tokens`` long;
  no draft when no chain pays for its verification, so a weak match costs vLLM nothing.
- :class:`ReaderProposer`: READER's retrieval path (``drafters/reader_retrieval.py``): a
  ``TokenTrie`` per request over its own tokens, plus the long-term suffix-array datastores named
  in the environment variable ``SPECGRAFT_VLLM_DATASTORE`` (directories separated by ``:`` or
  ``,``; memory-mapped, shared and read-only; checked against the served model's tokenizer).
  READER's draft-model tree is not part of it (vLLM runs one proposer).
- :class:`AdaPLDProposer`: AdaPLD's lexical part (``drafters/adapld/`` with
  ``AdaPLDConfig.lexical_only``): the most recent earlier occurrence of the last token, its main
  copy with learned copy rates, under the same :class:`ChainCost`.

**What cannot run through this interface** (``UNSUPPORTED``): methods that need the target's
logits or hidden states, which ``propose`` does not receive.
"""

from __future__ import annotations

from typing import Any

from specgraft.integrations.vllm.chains import CPU_DEFAULT, ChainCost, best_chain, best_chains
from specgraft.integrations.vllm.env import CHAIN_COST_ENV, DATASTORE_ENV, SUPPORTED_VLLM, require_vllm
from specgraft.integrations.vllm.proposers import AdaPLDProposer, PLDProposer, ReaderProposer, SpecgraftProposer

__all__ = [
    "CHAIN_COST_ENV",
    "CPU_DEFAULT",
    "DATASTORE_ENV",
    "PROPOSERS",
    "SUPPORTED_VLLM",
    "UNSUPPORTED",
    "AdaPLDProposer",
    "ChainCost",
    "PLDProposer",
    "ReaderProposer",
    "SpecgraftProposer",
    "best_chain",
    "best_chains",
    "require_vllm",
    "speculative_config",
]


PROPOSERS: dict[str, str] = {
    "pld": "specgraft.integrations.vllm.PLDProposer",
    "reader": "specgraft.integrations.vllm.ReaderProposer",
    "adapld": "specgraft.integrations.vllm.AdaPLDProposer",
}

UNSUPPORTED: dict[str, str] = {
    "recycling": "its successor matrix is refreshed from the target's logits at every verified node",
    "adapld (semantic fallback, reranking, branches)": "they need the target's input embeddings, hidden states and next-token distributions",
    "graft, draft-tree, reader (draft-model tree)": "a draft model with its own cache slot and the target's verify-pass logits (Graft's successor matrix)",
    "ptd": "its probe nodes ride in the target's verify pass, which vLLM builds itself from one chain",
}
"""specgraft methods that need the target's logits or hidden states (or a verify pass shaped as a
tree), which vLLM's ``custom_class`` ``propose`` is not given, and why."""


def speculative_config(method: str, num_speculative_tokens: int = 5) -> dict[str, Any]:
    """The ``speculative_config`` for ``LLM(...)`` / ``vllm serve --speculative-config``.

    >>> speculative_config("pld", 5)["model"]
    'specgraft.integrations.vllm.PLDProposer'
    """
    if method not in PROPOSERS:
        raise ValueError(f"no vLLM proposer for {method!r}; choose one of {', '.join(PROPOSERS)}")
    if num_speculative_tokens < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
    return {"method": "custom_class", "model": PROPOSERS[method], "num_speculative_tokens": int(num_speculative_tokens)}


