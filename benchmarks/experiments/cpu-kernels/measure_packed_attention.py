"""Grouped-query attention packed (``specgraft_sdpa``) against ``transformers``' ``sdpa`` (which
copies each key/value head per query head): forward costs and ``draft-tree`` generations.

One process loads the 1.5B target and the int8 0.5B draft (``--draft-quant auto``), then
switches both models between the two implementations (``set_attn_implementation``):

1. ``--forwards``: the draft's forward over 1 / 2 / 8 rows and the target's over 1 / 8 / 16 at
   ``--context`` cached tokens, each implementation twice in alternation, with the largest logit
   difference between them;
2. ``draft-tree`` (greedy, 128 tokens, EOS stops) on held-out Spec-Bench prompts (items 41+ of
   ``--tasks``, ``--per-task`` each), the two implementations in an order that alternates from
   prompt to prompt, with drafting and verify-forward seconds and whether the outputs agree::

    python benchmarks/experiments/cpu-kernels/measure_packed_attention.py --forwards --per-task 2 --tasks summarization,rag \
        --out benchmarks/experiments/cpu-kernels/raw/results-issue14/packed-attention/zen3.json

On a GPU (``--device cuda``; our loaders keep ``sdpa`` there) the forwards are timed with the
device synchronised, over more rows (1 to 64) and ``--context`` cached tokens; ``--per-task 0``
skips the generations (random weights of the catalog shapes, ``random_models.py``, make them
meaningless)::

    python benchmarks/experiments/cpu-kernels/measure_packed_attention.py --device cuda --dtype bfloat16 --forwards --per-task 0 \
        --model /tmp/rm/qwen2.5-coder-1.5b-instruct --draft-model /tmp/rm/qwen2.5-coder-0.5b-instruct --out gpu.json
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/, for tools/


def main() -> None:
    import torch
    from tools.alternate import alternate
    from tools.common import load_base, load_draft, model_arguments, task_tuning_prompts, timed_generate

    from specgraft.methods import MethodOptions
    from specgraft.models.attention import PACKED_SDPA, register_packed_sdpa
    from specgraft.models.hf import HFTarget

    parser = model_arguments(__doc__.splitlines()[0])
    parser.add_argument("--forwards", action="store_true", help="time single forwards first")
    parser.add_argument("--context", type=int, default=600, help="cached tokens for --forwards")
    parser.add_argument("--tasks", default="summarization,rag")
    parser.add_argument("--per-task", type=int, default=2, help="prompts per task for the generations (0: none)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    register_packed_sdpa()
    base = load_base(args, device=args.device)
    gpu = base.target.device.type == "cuda"

    def clock() -> float:
        if gpu:
            torch.cuda.synchronize()
        return time.perf_counter()

    draft = load_draft(args, base)
    models = (base.model, draft)

    def use(impl: str) -> None:
        for m in models:
            m.set_attn_implementation(impl)

    impls = ("sdpa", PACKED_SDPA)
    record: dict[str, list] = {"forwards": [], "generations": []}
    if args.forwards:
        words = base.encode("Summarize: " + "The quick brown fox jumps over the lazy dog. " * 200, chat=bool(base.tokenizer.chat_template))
        ids = words[: args.context + 16]
        for name, lm, rows_list, n in (("draft", HFTarget(draft), (1, 2, 8, 32) if gpu else (1, 2, 8), 12),
                                     ("target", base.engine.target, (1, 8, 16, 32, 64) if gpu else (1, 8, 16), 12 if gpu else 4)):
            slot = lm.allocate()
            lm.prefill(slot, ids[:-16])

            def forward(rows: int) -> torch.Tensor:
                out = lm.forward_rows(slot, ids[-rows:], list(range(-1, rows - 1)))
                lm.discard(slot)
                return out.logits

            for rows in rows_list:
                ms: dict[str, list[float]] = {i: [] for i in impls}
                for impl in impls * 2:
                    use(impl)
                    forward(rows)
                    t0 = clock()
                    for _ in range(n):
                        forward(rows)
                    ms[impl].append(round((clock() - t0) / n * 1000, 2))
                use("sdpa")
                a = forward(rows)
                use(PACKED_SDPA)
                b = forward(rows)
                diff = (a - b).abs().max().item()
                record["forwards"].append({"model": name, "cached": lm.length(slot), "rows": rows, "ms": ms, "max_logit_difference": diff})
                print(f"{name} at {lm.length(slot)} cached tokens, {rows} rows: ms {ms}, max |logit difference| {diff:.3g}", flush=True)
            lm.release(slot)
    if args.per_task == 0:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
        return
    dec = base.with_method("draft-tree", MethodOptions(graft=base.options.graft, cost_table=None), draft_model=draft)
    warm = base.encode("Say hello.", chat=True)
    for impl in impls:
        use(impl)
        timed_generate(dec, warm, 8, 16, stop_on_eos=True)
    totals = {impl: [0.0, 0.0, 0.0] for impl in impls}
    for i, prompt in enumerate(task_tuning_prompts(args.per_task, args.tasks.split(","))):
        ids = base.encode(prompt.turns[0], chat=prompt.chat)
        outputs = {}
        for impl in alternate(impls, i):
            use(impl)
            seconds, out = timed_generate(dec, ids, 128, 16, stop_on_eos=True)
            st = out.stats
            outputs[impl] = out.tokens
            record["generations"].append({"id": prompt.id, "impl": impl, "s": seconds, "draft_s": st.draft_s, "forward_s": st.forward_s, "steps": st.steps})
            for k, v in enumerate((seconds, st.draft_s, st.forward_s)):
                totals[impl][k] += v
            print(f"{prompt.id} ({len(ids)} tokens) {impl}: {seconds:.1f} s, drafting {st.draft_s:.2f} s, verify forwards "
                  f"{st.forward_s:.2f} s, {st.steps} steps", flush=True)
        equal = outputs["sdpa"] == outputs[PACKED_SDPA]
        record["generations"][-1]["equal"] = equal
        print(f"  outputs equal: {equal}", flush=True)
    for impl, (seconds, drafting, forwards) in totals.items():
        print(f"{impl}: {seconds:.1f} s, drafting {drafting:.1f} s, verify forwards {forwards:.1f} s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({**record, "totals": totals}, indent=1) + "\n")


if __name__ == "__main__":
    main()
