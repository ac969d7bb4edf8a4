"""``try_methods.py`` with the draft model replaced by a pruned-vocabulary copy from
``draft_vocab_probe.py`` (a prototype: the draft's loader is patched in this process only).

The draft sees the target's ids mapped to the copy's: a dropped token is fed as the kept token
whose text is its longest prefix. Its logits are spread back over the full vocabulary, with
-inf for the dropped ids. ``full`` in place of the file runs the draft as shipped:

    python benchmarks/experiments/llamacpp/draft_vocab_try.py PRUNED.gguf SOURCE.gguf --methods draft-tree \\
        --suite spec-bench:1,humaneval:1,code-edit:1
    python benchmarks/experiments/llamacpp/draft_vocab_try.py full SOURCE.gguf --methods draft-tree ...
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import numpy as np
import torch

import specgraft.api as api
from specgraft.types import RowsOutput

PRUNED, SOURCE = sys.argv.pop(1), sys.argv.pop(1)
shipped = api.load_draft_gguf


class MappedDraft:
    """The pruned draft behind the target's vocabulary (prefill, forward_rows, forward_batch mapped)."""

    def __init__(self, lm, keep: list[int], vocab: int, texts: list[str]):
        self.lm, self.vocab_size = lm, vocab
        self.keep = torch.tensor(keep, dtype=torch.long)
        self.to_draft = np.full(vocab, -1, dtype=np.int64)
        self.to_draft[keep] = np.arange(len(keep))
        kept = {texts[i]: j for j, i in enumerate(keep)}
        for t in np.flatnonzero(self.to_draft < 0):
            text = texts[t]
            self.to_draft[t] = next((kept[text[:n]] for n in range(len(text) - 1, 0, -1) if text[:n] in kept), 0)

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def _ids(self, tokens) -> list[int]:
        return self.to_draft[np.asarray(tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens, dtype=np.int64)].tolist()

    def _spread(self, out: RowsOutput) -> RowsOutput:
        full = torch.full((out.logits.shape[0], self.vocab_size), float("-inf"))
        full[:, self.keep] = out.logits
        return RowsOutput(logits=full)

    def prefill(self, slot, tokens, *args, **kw):
        return self.lm.prefill(slot, self._ids(tokens), *args, **kw)

    def forward_rows(self, slot, tokens, parents, *args, **kw):
        return self._spread(self.lm.forward_rows(slot, self._ids(tokens), parents, *args, **kw))

    def forward_batch(self, slots, tokens, parents, *args, **kw):
        return [self._spread(o) for o in self.lm.forward_batch(slots, [self._ids(t) for t in tokens], parents, *args, **kw)]


def load(name, target, cache_dir=None, progress=True, quant="auto"):
    if PRUNED == "full":
        return shipped(name, target, cache_dir=cache_dir, progress=progress, quant=quant)
    from gguf import GGUFReader

    from specgraft.models.llamacpp import LlamaCppTarget

    keep = np.load(PRUNED + ".keep.npy").tolist()
    texts = GGUFReader(SOURCE).get_field("tokenizer.ggml.tokens").contents()
    return MappedDraft(LlamaCppTarget(PRUNED, threads=target.threads, name=name), keep, target.vocab_size, texts)


api.load_draft_gguf = load
sys.argv[0] = str(Path(__file__).with_name("try_methods.py"))
runpy.run_path(sys.argv[0], run_name="__main__")
