"""What a draft model's output matrix costs a draft forward on llama.cpp: writes a copy of a draft
GGUF whose vocabulary keeps only some token ids (the lowest ``--keep`` ids, the special tokens
and, to keep the row count a multiple of 256, a few more), for ``llama-bench`` beside the full
file, and prints what share of the target's tokens in a benchmark's records the kept ids cover.

    python benchmarks/experiments/llamacpp/draft_vocab_probe.py DRAFT.gguf OUT.gguf --keep 65536 \\
        --records benchmarks/experiments/llamacpp/q4-draft-issue-set/results.jsonl
    llama-bench -m DRAFT.gguf,OUT.gguf -t 2 -n 32 -p 0 -fa 1 -r 5

Only the draft's speed is measured: nothing here maps token ids for a generation. The file's
token ``j`` is the source's ``keep[j]`` (saved beside it as ``OUT.gguf.keep.npy``).
"""

from __future__ import annotations

import argparse
import json

import gguf
import numpy as np

ROWS = 256  # a row count that is not a multiple of this took llama.cpp's AMX build off its fast path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("out")
    ap.add_argument("--keep", type=int, default=65536, help="keep token ids below this (plus the special tokens)")
    ap.add_argument("--records", help="a bench results.jsonl: the share of its ar tokens the kept ids cover")
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.source)
    types = reader.get_field("tokenizer.ggml.token_type").contents()
    special = [i for i, t in enumerate(types) if t != 1 and i >= args.keep]  # 1 = a normal token
    below = -(-(args.keep + len(special)) // ROWS) * ROWS - len(special)
    keep = sorted(set(range(min(below, len(types)))) | set(special))
    new_id = {old: new for new, old in enumerate(keep)}
    writer = gguf.GGUFWriter(args.out, arch=reader.get_field("general.architecture").contents())
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        value = f.contents()
        if f.name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            value = [value[i] for i in keep]
        elif f.name.startswith("tokenizer.ggml.") and f.name.endswith("_token_id"):
            value = new_id.get(int(value), 0)
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, value, f.types[0], sub_type=sub)
    tensors = []
    for t in reader.tensors:
        # a quantized matrix's rows are whole blocks: its rows can be picked as bytes
        data = np.ascontiguousarray(t.data[keep]) if t.name in ("token_embd.weight", "output.weight") else t.data
        tensors.append(data)
        writer.add_tensor_info(t.name, data.shape, data.dtype, data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for data in tensors:
        writer.write_tensor_data(data)
    writer.close()
    np.save(args.out + ".keep.npy", np.array(keep))
    print(f"kept {len(keep)} of {len(types)} tokens: {args.out}")
    if args.records:
        kept = set(keep)
        tokens = [t for line in open(args.records) if (r := json.loads(line))["method"] == "ar" for t in r["tokens"]]
        print(f"{sum(t in kept for t in tokens) / len(tokens):.2%} of {len(tokens)} ar tokens in {args.records} are kept")


if __name__ == "__main__":
    main()
