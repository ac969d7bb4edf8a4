"""`specgraft tune`: READER's tree shape for this machine (READER Appendix F).

Example (about 10 minutes on the 2-core CPU)::

    specgraft tune --model qwen2.5-coder-1.5b-instruct --draft-model qwen2.5-coder-0.5b-instruct \\
        --datastore ~/.cache/specgraft/datastores/code --out benchmarks/calib/reader_shape.json

Runs READER greedily with an over-provisioned seed shape on tuning prompts that no benchmark
run uses (Spec-Bench items from the 41st of each task, HumanEval 100 onwards), records which
slots of every tree the target accepted, measures this machine's verify cost per node count
and the drafting time, and writes the shape with the best predicted tokens/s
(``calibration/reader_shape.py``). ``generate --reader-shape`` and ``bench --reader-shape`` use it.
"""

from __future__ import annotations

import time
from typing import Optional

import typer


def tune(
    model: str = typer.Option(..., "--model", "-m", help="Target model: catalog name, local directory or Hugging Face id."),
    draft_model: str = typer.Option(..., "--draft-model", help="Draft model sharing the target's tokenizer."),
    out_path: str = typer.Option(..., "--out", help="Shape JSON to write."),
    datastore: Optional[list[str]] = typer.Option(None, "--datastore", help="Datastore directory (repeat or comma list)."),
    per_task: int = typer.Option(1, help="Tuning prompts per Spec-Bench task (items 41 onwards)."),
    code_prompts: int = typer.Option(3, help="Tuning prompts from HumanEval 100 onwards."),
    max_new_tokens: int = typer.Option(48, help="Tokens decoded per tuning prompt."),
    seed_draft_nodes: int = typer.Option(16, help="Draft nodes of the seed shape (draft-tree's budget under the cpu preset)."),
    seed_search: int = typer.Option(16, help="Widening depth of the seed shape."),
    seed_deep: int = typer.Option(8, help="Deepening depth of the seed shape."),
    preset: str = typer.Option("cpu", help="Draft preset (depth and top-k of the draft tree)."),
    dtype: str = typer.Option("auto", help="auto, bfloat16 or float32."),
    threads: Optional[int] = typer.Option(None, help="torch threads."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
) -> None:
    """Tune READER's tree shape (draft nodes, widening and deepening depths) for this machine."""
    import torch
    from rich.console import Console

    from specgraft.api import SpecDecoder
    from specgraft.suites import conversation_ids
    from specgraft.calibration.costs import measure_verify_s
    from specgraft.calibration.reader_shape import SlotRecord, save_shape, search_shape
    from specgraft.cli.options import split_paths
    from specgraft.config import GenerationConfig
    from specgraft.drafters.reader_retrieval import ReaderConfig
    from specgraft.methods import GraftOptions, MethodOptions
    from specgraft.suites import DATA_DIR, read_prompt_file

    console = Console(stderr=True)
    if threads:
        torch.set_num_threads(threads)
    seed = (seed_draft_nodes, seed_search, seed_deep)
    stores = split_paths(datastore)
    options = MethodOptions(
        graft=GraftOptions(draft_model=draft_model, draft_dtype=dtype, preset=preset),
        reader=ReaderConfig(draft_nodes=seed[0], d_search=seed[1], d_deep=seed[2]),
        datastores=stores,
    )
    decoder = SpecDecoder.from_pretrained(model, method="reader", dtype=dtype, device=device, options=options)
    prompts = []
    by_task: dict[str, list] = {}
    for p in read_prompt_file(DATA_DIR / "spec_bench.jsonl", "spec-bench"):
        by_task.setdefault(p.task, []).append(p)
    for items in by_task.values():
        prompts += items[40 : 40 + per_task]
    prompts += read_prompt_file(DATA_DIR / "humaneval.jsonl", "humaneval")[100 : 100 + code_prompts]
    engine, composer = decoder.engine, decoder.engine.composer
    record = SlotRecord()
    config = GenerationConfig(max_new_tokens=max_new_tokens, budget=sum(seed))
    t0 = time.perf_counter()
    has_template = bool(getattr(decoder.tokenizer, "chat_template", None))
    ids = []
    for i, prompt in enumerate(prompts):
        ids = conversation_ids(decoder.tokenizer, prompt.turns[:1], [], prompt.chat and has_template)
        seq = engine.start(ids, config)
        try:
            while not seq.done:
                before = seq.stats.draft_s
                new = engine.step(seq)
                parts = composer.last
                if parts is None or not new:
                    continue
                record.add(parts.draft_paths, parts.widen, parts.deep_prefix, parts.deep, new[:-1], seq.stats.draft_s - before, seed)
        finally:
            engine.finish(seq)
        console.print(f"[{i + 1}/{len(prompts)}] {prompt.id}: {seq.stats.steps} steps, MAT {seq.stats.mat:.2f}")
    console.print(f"recorded {len(record.draft)} steps in {time.perf_counter() - t0:.0f}s; measuring verify costs")
    verify_s = measure_verify_s(decoder.target, ids, sum(seed))
    choices = search_shape(record, verify_s, seed)
    best = choices[0]
    for c in choices[:5]:
        console.print(
            f"draft {c.draft_nodes:2d} widen {c.d_search:2d} deep {c.d_deep:2d}: {c.predicted_tokens_per_step:.2f} tokens/step, "
            f"{c.predicted_step_s * 1000:.0f} ms/step, {c.predicted_tokens_per_s:.2f} tokens/s"
        )
    ar = 1.0 / verify_s[0]
    from specgraft.drafters.reader_retrieval import ReaderConfig as Default

    d = Default()
    default = next((c for c in choices if (c.draft_nodes, c.d_search, c.d_deep) == (d.draft_nodes, d.d_search, d.d_deep)), None)
    if default is not None:
        console.print(f"default shape ({d.draft_nodes}, {d.d_search}, {d.d_deep}): {default.predicted_tokens_per_s:.2f} tokens/s predicted")
    identity = {"model": model, "draft_model": draft_model, "preset": preset, "device": str(decoder.target.device.type)}
    path = save_shape(out_path, identity, best, record, verify_s, seed, {
        "prompts": [p.id for p in prompts], "max_new_tokens": max_new_tokens, "datastores": list(stores),
        "threads": torch.get_num_threads(), "predicted_ar_tokens_per_s": round(ar, 4),
    })
    console.print(f"wrote {path}: draft_nodes {best.draft_nodes}, d_search {best.d_search}, d_deep {best.d_deep} "
                  f"(predicted {best.predicted_tokens_per_s / ar:.2f}x plain decoding)")
