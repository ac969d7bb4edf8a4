"""`specgraft serve`: the OpenAI-compatible server (``specgraft/serve/``) under uvicorn."""

from __future__ import annotations

import logging
from typing import Optional

import typer

from specgraft.cli.options import BACKEND, CALIBRATION, DATASTORE, DEVICE, DRAFT_COPY_AHEAD, DRAFT_DEPTH, DRAFT_EXTEND, DRAFT_MODEL, DRAFT_ROW_COST, DRAFT_STOP_MIN, DRAFT_TOP_K, DTYPE, LEARNING, PRESET, READER_SHAPE, RECYCLING_STATE, ROW_COST, STRICT, THREADS, method_help, draft_quant_option, err, method_options, resolve_model_dtype, row_cost_value, set_threads


def serve(
    model: str = typer.Option(..., "--model", "-m", help="Catalog name, local directory, Hugging Face id or .gguf file."),
    method: Optional[str] = typer.Option(None, help=method_help()),
    max_batch: int = typer.Option(8, "--max-batch", help="Sequences decoded together, one target forward per step."),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests waiting for a place in the batch; one more gets 429."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
    served_model_name: Optional[str] = typer.Option(
        None, "--served-model-name", help="The model id clients send and /v1/models lists (default: --model as given)."
    ),
    default_max_tokens: int = typer.Option(
        256, "--default-max-tokens", help="max_tokens of requests that give none (capped by what the context window leaves)."
    ),
    budget: Optional[int] = typer.Option(None, help="Tree nodes verified per step and sequence (default: the method's default budget)."),
    cost_table: Optional[str] = typer.Option(
        None, "--cost-table",
        help="Cost table JSON (`specgraft profile`): pick each batch size's budget from measured costs and acceptance, "
        "0 (plain decoding) when speculation would not pay. Default: the table measured for this model, device and "
        "thread count (yours, else a shipped one); 'none' = every sequence verifies its own budget. The same table "
        "gives the method's default budget (the one with the best predicted tokens/s for one sequence).",
    ),
    shutdown_timeout: float = typer.Option(
        30.0, "--shutdown-timeout", help="On SIGINT/SIGTERM, seconds in-flight requests may take to finish before they are cancelled."
    ),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn's log level: critical, error, warning, info, debug."),
    dtype: str = DTYPE,
    device: str = DEVICE,
    threads: Optional[int] = THREADS,
    draft_model: Optional[str] = DRAFT_MODEL,
    calibration: Optional[str] = CALIBRATION,
    preset: str = PRESET,
    draft_depth: Optional[int] = DRAFT_DEPTH,
    draft_top_k: Optional[int] = DRAFT_TOP_K,
    draft_extend: Optional[int] = DRAFT_EXTEND,
    draft_stop_min: Optional[float] = DRAFT_STOP_MIN,
    draft_row_cost: Optional[float] = DRAFT_ROW_COST,
    draft_copy_ahead: Optional[int] = DRAFT_COPY_AHEAD,
    draft_quant: str = draft_quant_option(),
    recycling_state: Optional[str] = RECYCLING_STATE,
    learning: str = LEARNING,
    datastore: Optional[list[str]] = DATASTORE,
    reader_shape: Optional[str] = READER_SHAPE,
    row_cost: Optional[str] = ROW_COST,
    backend: str = BACKEND,
    strict: bool = STRICT,
) -> None:
    """Serve a model over OpenAI's completions and chat completions API (continuous batching)."""
    from specgraft.api import SpecDecoder
    from specgraft.budget.adaptive import AdaptiveBudget
    from specgraft.budget.costs import CostTable
    from specgraft.methods import default_method, get_method
    from specgraft.methods.reader import tuned_policy
    from specgraft.serve import ServerConfig, create_app
    from specgraft.serve.run import server

    if method is not None:
        get_method(method)
    if not 1 <= port <= 65535:
        raise ValueError(f"port must be in 1..65535, got {port}")
    if shutdown_timeout < 0:
        raise ValueError(f"shutdown timeout must be >= 0, got {shutdown_timeout}")
    config = ServerConfig(
        model_name=served_model_name or model, max_batch=max_batch, max_queue=max_queue, default_max_tokens=default_max_tokens,
        budget=budget,
    )
    set_threads(threads)
    from specgraft.models.backends import resolve_backend

    backend = resolve_backend(backend, model)
    dtype = resolve_model_dtype(dtype, device, backend)  # the draft model's too: recorded resolved, never "auto"
    options = method_options(
        model, dtype, draft_model=draft_model, calibration=calibration, preset=preset, draft_depth=draft_depth,
        draft_top_k=draft_top_k, recycling_state=recycling_state, learning=learning, datastore=datastore, reader_shape=reader_shape,
        draft_quant=draft_quant, row_cost=row_cost_value(row_cost, model, device, threads, backend), draft_extend=draft_extend,
        draft_stop_min=draft_stop_min, draft_row_cost=draft_row_cost, draft_copy_ahead=draft_copy_ahead, cost_table="auto" if cost_table is None else cost_table,  # an explicit table is read here, before the model loads
    )
    method = method if method is not None else default_method(options)
    decoder = SpecDecoder.from_pretrained(
        model, method=method, dtype=dtype, device=device, options=options, backend=backend, threads=threads, strict=strict
    )
    # the decoder resolved `auto` to this model's table on its device: the same table gives the
    # default budget (budget/defaults.py) and each batch size's budget (AdaptiveBudget)
    cost_table = decoder.options.cost_table
    table = CostTable.load(cost_table) if cost_table else None
    # READER's budgets tuned per batch size (`specgraft tune --batch-size`) decide where given;
    # else the method's measured gains are the adaptive policy's prior (the generic one for a
    # method without them)
    tuned = tuned_policy(method, reader_shape)
    policy = tuned or (AdaptiveBudget.for_method(table, method, get_method(method).gains_from) if table is not None else None)
    resolved = decoder.resolved_config(SpecDecoder.make_config(budget=budget))
    if tuned is not None:
        adaptive = f"budgets tuned per batch size in {reader_shape} ({tuned.budgets})"
    else:
        adaptive = f"adaptive budget from {cost_table} (prior: {policy.prior})" if policy is not None else "fixed budget"
    err.print(
        f"specgraft serve: {config.model_name} ({model}), method {method}, budget {resolved['generation']['budget']}, "
        f"{adaptive}, max_batch {max_batch}, max_queue {max_queue}, "
        f"{resolved['dtype']} on {resolved['device']}" + (" (llama.cpp)" if backend == "llamacpp" else "")
        + f", threads {resolved['threads']}; http://{host}:{port}/v1",
        soft_wrap=True,  # one line in a log, however narrow the terminal
    )
    app = create_app(decoder, config, policy)
    # the server's own log lines, beside uvicorn's and in its format
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
    serve_log = logging.getLogger("specgraft.serve")
    serve_log.addHandler(handler)
    serve_log.setLevel(log_level.upper())
    serve_log.propagate = False
    server(app, host=host, port=port, log_level=log_level, grace=shutdown_timeout).run()
