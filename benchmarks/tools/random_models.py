"""Random-weight copies of models, from their ``config.json`` and tokenizer files alone.

A GPU machine that cannot download weights can still measure what depends only on a model's
shape: the cost of a forward of ``B x n`` rows (``specgraft profile``), the engine's time per
step, the memory it takes. This writes, for each source directory (a pulled catalog model or a
folder holding just its config and tokenizer files), a loadable model directory of the same
name whose weights are the architecture's own random initialisation, in ``--dtype``::

    python benchmarks/tools/random_models.py ~/.cache/specgraft/models/qwen2.5-coder-1.5b-instruct --out /tmp/rm
    specgraft profile --model /tmp/rm/qwen2.5-coder-1.5b-instruct --device cuda   # table named like the real one

What such a model generates means nothing (its acceptance rates are not a real model's), so
only costs measured with it are reported; token-for-token exactness against plain decoding is
still checked on it (the same arithmetic runs whatever the weights are).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json", "special_tokens_map.json")


def write_random_model(source: Path, out: Path, dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> Path:
    """Write ``out/<source name>``: ``source``'s config and tokenizer with random weights."""
    dest = out / source.name
    config = AutoConfig.from_pretrained(source)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(dest)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, dest / name)
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="+", type=Path, help="Model directories holding config.json and tokenizer files.")
    ap.add_argument("--out", type=Path, required=True, help="Folder the random-weight models are written to.")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = ap.parse_args()
    for source in args.sources:
        t0 = time.perf_counter()
        dest = write_random_model(source, args.out, getattr(torch, args.dtype))
        print(f"{dest}: random {args.dtype} weights in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
