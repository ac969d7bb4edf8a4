"""`specgraft tune`: READER's tree shape for this machine (READER Appendix F), per batch size.

Examples (about 10 minutes each on the 2-core CPU)::

    specgraft tune --model qwen2.5-coder-1.5b-instruct --draft-model qwen2.5-coder-0.5b-instruct \\
        --datastore ~/.cache/specgraft/datastores/code --out benchmarks/calib/reader_shape.json
    specgraft tune --model qwen2.5-coder-1.5b-instruct --method reader-search --batch-size 1,4,8 \\
        --prompts benchmarks/experiments/rag-cite/tune.jsonl --datastore datastore --out search.json

Runs READER greedily with an over-provisioned seed shape on tuning prompts that no benchmark
run uses (by default Spec-Bench items from the 41st of each task and HumanEval 100 onwards;
``--prompts`` for a prompt file of your own, e.g. a suite's disjoint tuning set), records which
slots of every tree the target accepted, measures this machine's verify cost per node count
at every ``--batch-size`` and the drafting time, and writes the shape with the best predicted
tokens/s at the smallest batch size, and with several batch sizes each one's budget (0 where
plain decoding predicts more) (``calibration/reader_shape.py``). ``generate``, ``bench``,
``bench-serve`` and ``serve`` take the file with ``--reader-shape``; the last two apply the
budget of each batch size (``TunedBudget``) in place of the adaptive policy.

``--method reader-search`` tunes the retrieval-only setting (no draft model): the size of the
best-first retrieved tree (its depth and keys stay as seeded).
"""

from __future__ import annotations

import time
from typing import Optional

import typer

from specgraft.cli.options import DATASTORE


def tune(
    model: str = typer.Option(..., "--model", "-m", help="Target model: catalog name, local directory or Hugging Face id."),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="Draft model sharing the target's tokenizer (reader)."),
    out_path: str = typer.Option(..., "--out", help="Shape JSON to write."),
    method: str = typer.Option("reader", "--method", help="reader (draft model + retrieval) or reader-search (retrieval only)."),
    datastore: Optional[list[str]] = DATASTORE,
    prompts_file: Optional[str] = typer.Option(
        None, "--prompts", help="Tuning prompts (JSONL: id, task, turns); default: Spec-Bench items 41 on and HumanEval 100 on."
    ),
    per_task: int = typer.Option(1, help="Tuning prompts per Spec-Bench task (items 41 onwards; without --prompts)."),
    code_prompts: int = typer.Option(3, help="Tuning prompts from HumanEval 100 onwards (without --prompts)."),
    max_new_tokens: int = typer.Option(48, help="Tokens decoded per tuning prompt."),
    batch_size: str = typer.Option("1", "--batch-size", help="Comma list of batch sizes to tune for (the smallest gives the shape; each its budget)."),
    seed_draft_nodes: int = typer.Option(16, help="Draft nodes of the seed shape (draft-tree's budget under the cpu preset)."),
    seed_search: int = typer.Option(16, help="Widening depth of the seed shape (reader-search: the retrieved tree's depth)."),
    seed_deep: int = typer.Option(8, help="Deepening depth of the seed shape."),
    seed_search_nodes: int = typer.Option(24, help="reader-search: nodes of the seed's retrieved tree."),
    min_match: Optional[int] = typer.Option(
        None, help="A retrieved path stops (a tree level is not expanded) at a level answered on a shorter key (default: reader 1, reader-search 2)."
    ),
    deepen_depth: int = typer.Option(2, help="reader: the deepening path hangs from the best draft path's node at this depth (large: its tip)."),
    preset: str = typer.Option("cpu", help="Draft preset (depth and top-k of the draft tree)."),
    dtype: str = typer.Option("auto", help="auto, bfloat16 or float32."),
    threads: Optional[int] = typer.Option(None, help="torch threads."),
    device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
) -> None:
    """Tune READER's tree shape (draft nodes, widening and deepening depths; reader-search: tree size) for this machine and batch sizes."""
    import torch
    from rich.console import Console
    from rich.progress import Progress

    from specgraft.api import SpecDecoder
    from specgraft.calibration.costs import measure_verify_s
    from specgraft.calibration.reader_shape import (
        BatchTuning, SearchRecord, SlotRecord, plain_choice, save_shape, search_shape, search_tree_size,
    )
    from specgraft.cli.options import int_list, set_threads, split_paths
    from specgraft.config import GenerationConfig
    from specgraft.drafters.reader_retrieval import ReaderConfig
    from specgraft.methods import GraftOptions, MethodOptions
    from specgraft.methods.reader import TUNABLE, needs_draft_model, reader_shape
    from specgraft.suites import conversation_ids, read_prompt_file, tuning_prompts

    console = Console(stderr=True, highlight=False)
    if method not in TUNABLE:
        raise ValueError(f"--method must be one of {', '.join(TUNABLE)}, got {method!r}")
    search = not needs_draft_model(method)  # the retrieval-only tree
    if not search and not draft_model:
        raise ValueError("--method reader needs --draft-model (reader-search tunes the retrieval-only tree without one)")
    if search and draft_model:
        raise ValueError("reader-search drafts without a model: drop --draft-model")
    sizes = sorted(set(int_list(batch_size, "--batch-size")))  # the smallest affords the most nodes: it gives the shape
    set_threads(threads)
    stores = split_paths(datastore)
    if search:
        seed = (0, seed_search, 0)
        keys = {"min_match": 2 if min_match is None else min_match}
        shape = ReaderConfig(draft_nodes=0, d_search=seed_search, d_deep=0, search_nodes=seed_search_nodes, **keys)
        graft = GraftOptions(preset=preset)
        seed_nodes = seed_search_nodes
    else:
        seed = (seed_draft_nodes, seed_search, seed_deep)
        keys = {"min_match": 1 if min_match is None else min_match, "deepen_depth": deepen_depth}
        shape = ReaderConfig(draft_nodes=seed[0], d_search=seed[1], d_deep=seed[2], **keys)
        graft = GraftOptions(draft_model=draft_model, draft_dtype=dtype, preset=preset)
        seed_nodes = sum(seed)
    # what the tuning fixed and the shape file must keep; defaults are left out
    defaults = ReaderConfig()
    fixed = {k: v for k, v in keys.items() if v != getattr(defaults, k)}
    options = MethodOptions(graft=graft, reader=shape, datastores=stores)
    decoder = SpecDecoder.from_pretrained(model, method=method, dtype=dtype, device=device, options=options)
    prompts = read_prompt_file(prompts_file, "tune") if prompts_file else tuning_prompts(per_task, code_prompts)
    if not prompts:
        raise ValueError("no tuning prompts")
    engine, composer = decoder.engine, decoder.engine.composer
    record: SlotRecord | SearchRecord = SearchRecord() if search else SlotRecord()
    config = GenerationConfig(max_new_tokens=max_new_tokens, budget=seed_nodes)
    t0 = time.perf_counter()
    has_template = bool(getattr(decoder.tokenizer, "chat_template", None))
    ids: list[int] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("seed runs", total=len(prompts))
        for prompt in prompts:
            ids = conversation_ids(decoder.tokenizer, prompt.turns[:1], [], prompt.chat and has_template)
            seq = engine.start(ids, config)
            try:
                while not seq.done:
                    before = seq.stats.draft_s
                    new = engine.step(seq)
                    parts = composer.last
                    if parts is None or not new:
                        continue
                    spent = seq.stats.draft_s - before
                    if isinstance(record, SearchRecord):
                        record.add(parts.search_paths, new[:-1], spent, seed_nodes)
                    else:
                        record.add(parts.draft_paths, parts.widen, parts.deep_prefix, parts.deep, new[:-1], spent, seed)
            finally:
                engine.finish(seq)
            progress.advance(task)
            console.print(f"{prompt.id}: {seq.stats.steps} steps, MAT {seq.stats.mat:.2f}")
    steps = len(record.nodes if isinstance(record, SearchRecord) else record.draft)
    console.print(f"recorded {steps} steps in {time.perf_counter() - t0:.0f}s; measuring verify costs at batch sizes {sizes}")
    tuned: dict[int, BatchTuning] = {}
    ranked: dict[int, list] = {}
    for b in sizes:
        verify_s = measure_verify_s(decoder.target, ids, seed_nodes, batch=b)
        if isinstance(record, SearchRecord):
            choices = search_tree_size(record, verify_s, seed_nodes, seed_search, batch=b)
        else:
            choices = search_shape(record, verify_s, seed, batch=b)
        tuned[b], ranked[b] = BatchTuning(choices[0], plain_choice(verify_s, b), verify_s), choices
        for c in choices[:3]:
            size = f"tree {c.search_nodes:2d}" if search else f"draft {c.draft_nodes:2d} widen {c.d_search:2d} deep {c.d_deep:2d}"
            console.print(
                f"B={b} {size}: {c.predicted_tokens_per_step:.2f} tokens/step a sequence, {c.predicted_step_s * 1000:.0f} ms/step, "
                f"{c.predicted_tokens_per_s:.2f} tokens/s (plain {tuned[b].plain.predicted_tokens_per_s:.2f})",
                soft_wrap=True,
            )
    first = tuned[sizes[0]]
    if not search:
        default = reader_shape("reader", MethodOptions(graft=GraftOptions(preset=preset)))  # draft nodes resolved
        known = next((c for c in ranked[sizes[0]] if (c.draft_nodes, c.d_search, c.d_deep) == (default.draft_nodes, default.d_search, default.d_deep)), None)
        if known is not None and not fixed:
            console.print(f"default shape ({default.draft_nodes}, {default.d_search}, {default.d_deep}): {known.predicted_tokens_per_s:.2f} tokens/s predicted")
    identity = {"model": model, "draft_model": draft_model, "preset": preset, "device": str(decoder.target.device.type)}
    extra = {
        "method": method, "prompts": [p.id for p in prompts], "prompts_file": prompts_file, "max_new_tokens": max_new_tokens,
        "datastores": list(stores), "threads": torch.get_num_threads(),
        "predicted_ar_tokens_per_s": round(first.plain.predicted_tokens_per_s, 4),
    }
    path = save_shape(
        out_path, identity, first.best, record, first.verify_s, seed, extra, by_batch=tuned if len(sizes) > 1 else None,
        shape_extra=fixed or None,
    )
    best = first.best
    console.print(
        f"wrote {path}: draft_nodes {best.draft_nodes}, d_search {best.d_search}, d_deep {best.d_deep}"
        + (f", search_nodes {best.search_nodes}" if search else "")
        + f" (predicted {best.predicted_tokens_per_s / first.plain.predicted_tokens_per_s:.2f}x plain decoding at B={sizes[0]})",
        soft_wrap=True,
    )
    if len(sizes) > 1:
        console.print("budget per batch size: " + ", ".join(f"B={b} {t.budget}" for b, t in tuned.items()))
