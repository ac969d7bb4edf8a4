"""specgraft: lossless tree speculative decoding for Hugging Face causal LMs.

    from specgraft import SpecDecoder
    dec = SpecDecoder.from_pretrained("smollm2-135m-instruct", method="recycling")
    print(dec.generate("Write a haiku about caches.", chat=True, max_new_tokens=64).text)

Names are imported on first use, so ``import specgraft`` (and the CLI's start-up) stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "SpecDecoder": "specgraft.api",
    "GenerationOutput": "specgraft.api",
    "SpecEngine": "specgraft.engine",
    "GenerationConfig": "specgraft.config",
    "SamplingConfig": "specgraft.config",
    "MethodOptions": "specgraft.methods",
    "METHODS": "specgraft.methods",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from specgraft.api import GenerationOutput, SpecDecoder
    from specgraft.config import GenerationConfig, SamplingConfig
    from specgraft.engine import SpecEngine
    from specgraft.methods import METHODS, MethodOptions


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specgraft' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
