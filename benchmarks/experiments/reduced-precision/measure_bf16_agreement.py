"""How often each method's greedy output equals plain decoding's in bfloat16, with and without
the final norm and output head in float32, against float32 (the exact default on a CPU).

For each variant (``float32``, ``bfloat16``, ``bfloat16+fp32-head``) the script loads the model,
generates ``--tokens`` greedy tokens for ``--prompts`` chat prompts of the Spec-Bench set with
``ar`` and each of ``--methods``, and records: outputs equal to that variant's ``ar`` (whole
outputs, and the share of equal tokens position by position), each method's first divergences,
outputs of the variant's ``ar`` equal to float32 ``ar``'s, and ``ar``'s tokens/s.
``--model tiny`` runs the tests' tiny random Llama on repetitive token prompts instead.

Why a float32 head: in bf16 the logits themselves are rounded to 8 bits of mantissa (at a
logit of 20, two tokens within 0.125 tie), and which of two near-tied tokens wins then depends
on rounding noise that differs between a one-row and a many-row forward. The float32 head
removes that last rounding; the body's rounding stays. Results: NOTES.md.

    python benchmarks/experiments/reduced-precision/measure_bf16_agreement.py --model smollm2-135m-instruct \\
        --prompts 30 --tokens 64 --out benchmarks/experiments/reduced-precision/smollm2.json
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch
from torch import nn


class Float32Norm(nn.Module):
    """An RMSNorm (Llama's, Qwen2's) computed and returned in float32, whatever its input dtype."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = nn.Parameter(norm.weight.detach().float().clone(), requires_grad=False)
        self.variance_epsilon = norm.variance_epsilon

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # [..., H] float32
        h = hidden.float()
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def float32_head(model: nn.Module) -> nn.Module:
    """Replace ``model``'s final norm and output head by float32 copies (in place). The head's
    weight is copied: ``V x H x 4`` bytes (113 MB for SmolLM2-135M, 933 MB for Qwen2.5-1.5B)."""
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    decoder.norm = Float32Norm(decoder.norm)
    fp32 = nn.Linear(head.in_features, head.out_features, bias=head.bias is not None, dtype=torch.float32)
    with torch.no_grad():
        fp32.weight.copy_(head.weight.float())
    fp32.requires_grad_(False)
    model.set_output_embeddings(fp32)
    return model


def prompts_for(model_name: str, count: int, vocab: int) -> tuple[list[list[int]], str]:
    """Token-id prompts: chat-templated Spec-Bench first turns, or repetitive random ids (tiny)."""
    if model_name == "tiny":
        rng = random.Random(0)
        out = []
        for _ in range(count):
            unit = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 5))]
            out.append((unit * 8)[: rng.randint(8, 30)])
        return out, ""
    from transformers import AutoTokenizer

    from specgraft.models.resolve import resolve_model
    from specgraft.suites import load_suite

    path = resolve_model(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    turns = [p.turns[0] for p in load_suite("spec-bench").prompts]
    turns = turns[:: max(1, len(turns) // count)][:count]
    ids = [
        tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False),
                  add_special_tokens=False)["input_ids"]
        for t in turns
    ]
    return ids, path


def load(model_name: str, path: str, variant: str) -> nn.Module:
    from specgraft.models.loading import load_causal_lm

    dtype = torch.float32 if variant == "float32" else torch.bfloat16
    if model_name == "tiny":
        from tests.helpers.models import tiny_llama

        model = tiny_llama().to(dtype)
    else:
        model = load_causal_lm(path, dtype, "cpu")
    if variant.endswith("fp32-head"):
        float32_head(model)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct", help="Catalog name, directory, or 'tiny'.")
    ap.add_argument("--prompts", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--methods", default="pld,recycling")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from specgraft.config import GenerationConfig
    from specgraft.engine import SpecEngine
    from specgraft.methods import MethodOptions, get_method
    from specgraft.models.hf import HFTarget

    torch.set_num_threads(args.threads)
    methods = args.methods.split(",")
    config = GenerationConfig(max_new_tokens=args.tokens, stop_on_eos=args.model != "tiny")
    ids_list, path = prompts_for(args.model, args.prompts, 96)
    results: dict[str, dict] = {}
    reference: list[list[int]] = []
    for variant in ("float32", "bfloat16", "bfloat16+fp32-head"):
        # the float32 head replaces the norm module: Hugging Face's forward calls it (the lean one reads its weight)
        target = HFTarget(load(args.model, path, variant), lean=False)
        engines = {m: SpecEngine(target, *get_method(m).build(target, MethodOptions()), method=m) for m in ["ar", *methods]}
        outs: dict[str, list[list[int]]] = {m: [] for m in engines}
        seconds = dict.fromkeys(engines, 0.0)
        for ids in ids_list:
            for m, engine in engines.items():
                t0 = time.perf_counter()
                outs[m].append(engine.generate_ids(ids, config))
                seconds[m] += time.perf_counter() - t0
        if variant == "float32":
            reference = outs["ar"]
        res: dict = {
            "ar_equals_float32_ar": sum(x == y for x, y in zip(outs["ar"], reference)),
            "ar_tokens_per_s": round(sum(map(len, outs["ar"])) / seconds["ar"], 3),
        }
        for m in methods:
            pairs = list(zip(outs[m], outs["ar"]))
            res[m] = sum(x == y for x, y in pairs)
            res[m + "_first_divergence"] = [
                next(i for i, (p, q) in enumerate(zip(x, y)) if p != q) for x, y in pairs if x != y and any(p != q for p, q in zip(x, y))
            ]
            res[m + "_tokens_equal"] = round(sum(p == q for x, y in pairs for p, q in zip(x, y)) / sum(len(y) for y in outs["ar"]), 4)
        results[variant] = res
        print(variant, json.dumps(res), flush=True)
    if args.out:
        meta = {"model": args.model, "prompts": len(ids_list), "tokens": args.tokens, "threads": args.threads}
        with open(args.out, "w") as f:
            json.dump({**meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
