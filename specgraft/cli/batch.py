"""`specgraft profile | bench-serve`: a model's batched forward costs, and batched throughput.

Examples (2-core CPU; minutes)::

    specgraft profile --model qwen2.5-coder-1.5b-instruct --threads 2
    specgraft bench-serve --model qwen2.5-coder-1.5b-instruct --draft-model qwen2.5-coder-0.5b-instruct \\
        --methods ar,pld,recycling,draft-tree --batch-sizes 1,2,4,8 --suite spec-bench:1 --out bench-serve-out
"""

from __future__ import annotations

from typing import Optional

import typer

from specgraft.cli.options import BACKEND, DATASTORE, READER_SHAPE, STRICT, int_list


def profile(
    model: str = typer.Option(..., "--model", "-m", help="Model: catalog name, local directory, Hugging Face id or .gguf file."),
    batch_sizes: str = typer.Option("1,2,4,8", "--batch-sizes", help="Comma list of batch sizes."),
    rows: str = typer.Option("1,2,4,8,16,32", "--rows", help="Comma list of rows per sequence (a tree of n - 1 nodes + the root)."),
    context: int = typer.Option(512, "--context", help="Cached tokens per sequence before each measured forward."),
    reps: int = typer.Option(3, "--reps", help="Measured rounds (after one warm-up round); the median is kept."),
    out_path: Optional[str] = typer.Option(None, "--out", help="Table JSON to write (default: the user cost directory, where serve and bench-serve look)."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, bfloat16, float16 or float32."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads (recorded; tables are looked up by thread count)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    backend: str = typer.Option(
        "auto", "--backend", help="hf, llamacpp (its own table: a GGUF's rows cost differently) or auto (llamacpp for a .gguf file)."
    ),
) -> None:
    """Measure one target forward of B x n rows for every batch size B and row count n: the cost table that budgets and cuts read."""
    from rich.console import Console

    from specgraft.budget.costs import table_name, user_cost_dir
    from specgraft.budget.profile import measure_costs
    from specgraft.cli.options import set_threads
    from specgraft.models.device import resolve_device
    from specgraft.models.hf import HFTarget
    from specgraft.models.loading import load_causal_lm
    from specgraft.models.resolve import load_errors, resolve_model

    console = Console(stderr=True)
    sizes, counts = int_list(batch_sizes, "--batch-sizes"), int_list(rows, "--rows")
    if reps < 1 or context < 1:
        raise ValueError("--reps and --context must be >= 1")
    set_threads(threads)
    from specgraft.models.backends import gguf_path, resolve_backend

    if resolve_backend(backend, model) == "llamacpp":
        from specgraft.models.llamacpp import LlamaCppTarget

        if dtype != "auto":
            raise ValueError(f"--dtype {dtype}: the llama.cpp backend computes in the GGUF's own quantization; drop --dtype")
        cells = max(sizes) * (context + max(counts)) + 64  # every slot holds the context and its rows
        target = LlamaCppTarget(gguf_path(model), threads=threads, n_ctx=cells, name=model)
    else:
        dev = resolve_device(device)
        with load_errors(model):
            target = HFTarget(load_causal_lm(resolve_model(model), dtype, dev))
    with console.status("profiling") as status:
        table = measure_costs(target, sizes, counts, context=context, reps=reps, progress=status.update)

    dest = out_path or str(user_cost_dir() / table_name(target.name, target.cost_device, target.threads))
    table.save(dest)
    for b in sizes:
        console.print(f"B={b}: " + ", ".join(f"{n} rows {1000 * table.seconds[b][n]:.0f} ms" for n in counts), highlight=False)
    console.print(f"wrote {dest}", highlight=False)


def bench_serve(
    model: str = typer.Option(..., "--model", "-m", help="Target: catalog name, local directory, Hugging Face id or .gguf file."),
    draft_model: Optional[str] = typer.Option(None, "--draft-model", help="Draft model for draft-model methods."),
    methods: str = typer.Option("ar,pld,recycling", "--methods", help="Comma list of methods (ar always runs first)."),
    batch_sizes: str = typer.Option("1,2,4,8", "--batch-sizes", help="Comma list of batch sizes (max requests in flight)."),
    suite: str = typer.Option("spec-bench:1", "--suite", help="Prompt suites as for `specgraft bench` (first turns are used)."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Tokens per request (without --stop-on-eos EOS does not stop: equal work)."),
    stop_on_eos: bool = typer.Option(
        False, "--stop-on-eos",
        help="A request ends at its EOS, as a server's does (every method still produces ar's tokens, so the work is equal); "
        "for suites whose answers are shorter than --max-new-tokens.",
    ),
    cost_table: Optional[str] = typer.Option(
        None, "--cost-table",
        help="Cost table JSON (default: the measured or shipped one for the model): each batch size's budget, and each method's default budget.",
    ),
    draft_quant: str = typer.Option("auto", "--draft-quant", help="Numerics of the draft model only: auto, int8, int8-tensor, bf16, fp16 or none (a GGUF draft: auto, q4_0, q8_0 or none)."),
    recycling_state: Optional[str] = typer.Option(
        None, "--recycling-state", help="Successor matrix .npz from `specgraft warmup` for recycling (default: an empty one per request).",
    ),
    datastore: Optional[list[str]] = DATASTORE,
    reader_shape: Optional[str] = READER_SHAPE,
    hf: Optional[bool] = typer.Option(
        None, "--hf/--no-hf", help="Also run Hugging Face generate on padded batches (default: on the hf backend; llama.cpp has no such peer).",
    ),
    bracket: bool = typer.Option(
        True, "--bracket/--no-bracket", help="Run ar again after the methods at each batch size (ar-end); ratios against the mean of both passes.",
    ),
    rounds: int = typer.Option(
        1, "--rounds", min=1,
        help="Passes per method at each batch size, alternating the order every round (2 or more: ratios over summed passes; --bracket is then not needed and ignored).",
    ),
    warmup: Optional[bool] = typer.Option(
        None, "--warmup/--no-warmup",
        help="An untimed plain pass (ar, hf) of a few tokens at each batch size before the timed ones (default: on a GPU only).",
    ),
    out: str = typer.Option(..., "--out", help="Output directory: results.jsonl, run.json, report.md."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, bfloat16, float16 or float32."),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads, and llama.cpp's on that backend (recorded)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    backend: str = BACKEND,
    strict: bool = STRICT,
) -> None:
    """Batched throughput, latency and memory of methods at several batch sizes against batched ar and HF generate.

    On ``--backend llamacpp`` the requests of a batch share one llama.cpp context (a sequence
    id each), as the server runs them; Hugging Face's padded batches do not run there."""
    import torch
    from rich.console import Console

    from specgraft.api import SpecDecoder
    from specgraft.budget.costs import CostTable
    from specgraft.bench.batched import bench_batches, resolve_warmup, write_rows
    from specgraft.bench.environment import environment
    from specgraft.cli.options import cost_table_value, resolve_model_dtype, set_threads, split_paths
    from specgraft.methods import GraftOptions, MethodOptions, get_method
    from specgraft.methods.reader import reader_config, tuned_policy
    from specgraft.suites import load_suite

    console = Console(stderr=True, highlight=False)
    sizes = int_list(batch_sizes, "--batch-sizes")
    names = ["ar"] + [m for m in (x.strip() for x in methods.split(",")) if m and m != "ar"]
    for name in names:
        spec = get_method(name)
        if spec.needs_draft_model and not draft_model:
            raise ValueError(f"method {name} needs --draft-model")
    set_threads(threads)
    from specgraft.models.backends import resolve_backend

    backend = resolve_backend(backend, model)
    dtype = resolve_model_dtype(dtype, device, backend)
    if backend == "llamacpp" and hf:
        raise ValueError("--hf: Hugging Face generate does not run a GGUF on llama.cpp; drop --hf")
    hf = backend == "hf" if hf is None else hf
    graft = GraftOptions(draft_model=draft_model, draft_dtype=dtype, draft_quant=draft_quant) if draft_model else GraftOptions()
    # the same table gives each method's default budget (budget/defaults.py) and each batch size's
    # a bad cost table or recycling state path fails here
    options = MethodOptions(
        graft=graft, cost_table=cost_table_value(cost_table or "auto"), recycling_state=recycling_state, datastores=split_paths(datastore),
        reader=reader_config(reader_shape, model, draft_model, graft.preset),
    )
    for name in names:
        get_method(name).check(options)  # a missing or broken datastore, before the target loads
    tuned = {name: policy for name in names[1:] if (policy := tuned_policy(name, reader_shape)) is not None}
    ar = SpecDecoder.from_pretrained(
        model, method="ar", dtype=dtype, device=device, options=options, backend=backend, threads=threads, strict=strict
    )
    decoders = {"ar": ar} | {n: ar.with_method(n) for n in names[1:]}
    path = ar.options.cost_table
    costs = CostTable.load(path) if path else None
    if costs is None:
        console.print("no cost table for this model and device: budgets stay each method's own (run `specgraft profile`)")
    prompts = []
    for p in load_suite(suite).prompts:
        ids = ar.encode(p.turns[0], chat=p.chat)
        if len(ids) + max_new_tokens > ar.target.max_positions:
            console.print(f"skipped {p.id}: {len(ids)} prompt tokens + {max_new_tokens} exceed the context window of {ar.target.max_positions}")
            continue
        prompts.append(ids)
    if not prompts:
        raise ValueError("no prompt of the suite fits the context window")
    warmup = resolve_warmup(warmup, ar.target.device)
    rows = bench_batches(
        decoders, prompts, sizes, max_new_tokens, costs, hf=hf, log=console.print, bracket=bracket, rounds=rounds, warmup=warmup,
        stop_on_eos=stop_on_eos, tuned=tuned,
    )
    dtype_name = str(ar.target.dtype).replace("torch.", "")
    meta = {
        "model": model, "draft_model": draft_model, "methods": names, "batch_sizes": sizes, "suite": suite, "prompts": len(prompts),
        "max_new_tokens": max_new_tokens, "stop_on_eos": stop_on_eos, "cost_table": str(path) if path else None,
        "threads": ar.target.threads if backend == "llamacpp" else torch.get_num_threads(),
        "device": str(ar.target.device), "dtype": dtype_name, "backend": backend, "strict": strict, "draft_quant": draft_quant if draft_model else None,
        "bracket": bracket and rounds == 1, "rounds": rounds, "recycling_state": recycling_state, "warmup": warmup,
        "datastores": list(options.datastores), "reader_shape": reader_shape,
        "environment": environment(dtype_name),
    }
    typer.echo(write_rows(rows, out, meta).read_text())
