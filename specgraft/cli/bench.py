"""`specgraft bench | report`: the benchmark as typer commands. Imports no torch: the runner is
imported when the command runs. The method options are the shared ones (``cli/options.py``)."""

from __future__ import annotations

import dataclasses
from typing import Optional

import typer

from specgraft.cli.options import (
    BACKEND,
    CALIBRATION,
    COST_TABLE,
    DATASTORE,
    DRAFT_COPY_AHEAD,
    DRAFT_DEPTH,
    DRAFT_EXTEND,
    DRAFT_MODEL,
    DRAFT_ROW_COST,
    DRAFT_STOP_MIN,
    DRAFT_TOP_K,
    LEARNING,
    PRESET,
    READER_SHAPE,
    RECYCLING_STATE,
    ROW_COST,
    SAMPLE_DRAFTS,
    STRICT,
    check_seed,
    draft_quant_option,
    resolve_cost_table,
    row_cost_value,
)
from specgraft.methods import method_names  # imports no torch


def bench(
    model: str = typer.Option(..., "--model", "-m", help="Target: catalog name, local directory or Hugging Face id."),
    draft_model: Optional[str] = DRAFT_MODEL,
    draft_quant: str = draft_quant_option(),
    methods: str = typer.Option(
        "ar,pld,recycling", "--methods",
        help=f"Comma list of registry methods ({', '.join(method_names())}), peers hf, hf-pld, hf-assisted, llama.cpp peers "
        "llamacpp, llamacpp-pld (llama-cpp-python), llama-speculative, llama-lookup (llama.cpp's programs: --llamacpp-tools), "
        "and vLLM peers vllm, vllm-ngram, vllm-specgraft-pld, vllm-specgraft-reader (run in vLLM's venv: --vllm-python). "
        "'all' = every registry method and HF peer (llama.cpp peers on --backend llamacpp; those needing a draft model only "
        "with --draft-model). ar always runs (the baseline); hf runs whenever an HF peer does, llamacpp whenever a llama.cpp peer does.",
    ),
    suite: str = typer.Option(
        "spec-bench", "--suite",
        help="spec-bench, humaneval, mt-bench, eagle, code-edit or a JSONL path (id, task, turns); a comma list, "
        "each optionally NAME:N for its own prompts per task, e.g. spec-bench:3,humaneval:6.",
    ),
    per_task: Optional[int] = typer.Option(None, "--per-task", help="First N prompts of each task, in file order."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", help="New tokens per generation."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    dtype: str = typer.Option(
        "auto", "--dtype", help="auto (float32 on a CPU, bfloat16 on a GPU; the resolved dtype is recorded), bfloat16, float16 or float32; "
        "not with --backend llamacpp (the GGUF's quantization computes)."
    ),
    seed: int = typer.Option(0, "--seed", callback=check_seed, help="Sampling seed and torch's global seed, in [0, 2**63)."),
    budget: Optional[int] = typer.Option(
        None, "--budget",
        help="Tree nodes verified per step (default: each method's default budget, the preset's for draft-model methods; recorded).",
    ),
    preset: str = PRESET,
    sample_drafts: bool = SAMPLE_DRAFTS,
    draft_depth: Optional[int] = DRAFT_DEPTH,
    draft_top_k: Optional[int] = DRAFT_TOP_K,
    draft_extend: Optional[int] = DRAFT_EXTEND,
    draft_stop_min: Optional[float] = DRAFT_STOP_MIN,
    draft_row_cost: Optional[float] = DRAFT_ROW_COST,
    draft_copy_ahead: Optional[int] = DRAFT_COPY_AHEAD,
    threads: Optional[int] = typer.Option(
        None, "--threads",
        help="torch threads (default: torch's choice), and llama.cpp's (decode and batch; our backend, its peers and programs; "
        "default: the CPU count); recorded.",
    ),
    device: str = typer.Option("auto", "--device", help="auto (cuda when available, else cpu), cpu, cuda or cuda:N; recorded."),
    learning: str = LEARNING,
    datastore: Optional[list[str]] = DATASTORE,
    reader_shape: Optional[str] = READER_SHAPE,
    row_cost: Optional[str] = ROW_COST,
    cost_table: str = COST_TABLE,
    vllm_python: Optional[str] = typer.Option(
        None, "--vllm-python",
        help="Python of the vLLM venv that runs the vLLM peers (default: $SPECGRAFT_VLLM_PYTHON, else .venv-vllm/bin/python in the working directory, as docs/vllm.md creates it).",
    ),
    vllm_spec_tokens: int = typer.Option(5, "--vllm-spec-tokens", help="num_speculative_tokens of the speculative vLLM peers."),
    peer_process: str = typer.Option(
        "separate", "--peer-process",
        help="Where the Hugging Face and llama-cpp-python peers run: separate (a child process with its own copy of the models, "
        "so that their generate cannot slow our methods in this one; twice the memory) or shared (this process; recorded).",
    ),
    backend: str = BACKEND,
    strict: bool = STRICT,
    llamacpp_tools: Optional[str] = typer.Option(
        None, "--llamacpp-tools",
        help="Folder of llama.cpp's llama-speculative and llama-lookup, built from llama.cpp's source (benchmarks/README.md); "
        "default: $SPECGRAFT_LLAMACPP_TOOLS.",
    ),
    llamacpp_draft_max: Optional[int] = typer.Option(
        None, "--llamacpp-draft-max",
        help="Draft tokens per step of llama-speculative and llama-lookup (--spec-draft-n-max) and llamacpp-pld's num_pred_tokens "
        "(default: their own, 3, 3 and 10; recorded).",
    ),
    out: str = typer.Option(..., "--out", help="Output directory: results.jsonl, run.json, report.md, plots/."),
    resume: bool = typer.Option(False, "--resume", help="Continue a run in --out, skipping finished rows."),
    bracket: bool = typer.Option(
        True, "--bracket/--no-bracket",
        help="Run ar again after the other methods on every prompt and use the mean of the two ar times as the baseline.",
    ),
    rounds: int = typer.Option(
        1, "--rounds",
        help="Run every prompt's methods this many times, reversing the order of those between ar and ar-end every other "
        "round; rows keep the mean time (each round's in round_times_s). 2 cancels a drifting machine's order effect.",
    ),
    alpaca_path: Optional[str] = typer.Option(
        None, "--alpaca-path",
        help="EAGLE's alpaca set (CC BY-NC 4.0, not packaged) for --suite eagle; "
        "default ../shared/data/bench/alpaca_eagle80.jsonl when it exists, else skipped.",
    ),
    recycling_state: Optional[str] = RECYCLING_STATE,
    calibration: Optional[str] = CALIBRATION,
) -> None:
    """Benchmark methods against plain decoding, Hugging Face generate and llama.cpp on real prompt sets."""
    from specgraft.bench.config import BenchConfig
    from specgraft.bench.runner import run_benchmark
    from specgraft.cli.options import split_paths
    from specgraft.methods.settings import MethodSettings
    from specgraft.models.backends import resolve_backend

    resolved = resolve_backend(backend, model)

    settings = MethodSettings(
        draft_model=draft_model, draft_quant=draft_quant, preset=preset, calibration=calibration, draft_depth=draft_depth,
        draft_top_k=draft_top_k, draft_extend=draft_extend, draft_stop_min=draft_stop_min, draft_row_cost=draft_row_cost,
        draft_copy_ahead=draft_copy_ahead, sample_drafts=sample_drafts, recycling_state=recycling_state, learning=learning,
        datastores=split_paths(datastore), reader_shape=reader_shape,
    )
    config = BenchConfig(
        model=model, out=out, methods=methods, suite=suite, settings=settings, per_task=per_task, max_new_tokens=max_new_tokens,
        temperature=temperature, dtype=dtype, seed=seed, budget=budget, threads=threads, resume=resume, bracket=bracket, rounds=rounds,
        alpaca_path=alpaca_path, device=device, vllm_python=vllm_python, vllm_spec_tokens=vllm_spec_tokens, peer_process=peer_process,
        backend=backend, strict=strict, llamacpp_tools=llamacpp_tools, llamacpp_draft_max=llamacpp_draft_max,
    )
    # after the options are checked: the row cost and budgets it derives are recorded with the run
    settings = dataclasses.replace(
        settings, row_cost=row_cost_value(row_cost, model, device, threads, resolved),
        cost_table=resolve_cost_table(cost_table, model, device, threads, resolved),
    )
    config = dataclasses.replace(config, settings=settings)
    report = run_benchmark(config)
    typer.echo(report.read_text())


def report(
    out: str = typer.Argument(..., help="A benchmark output directory (the --out of `specgraft bench`)."),
) -> None:
    """Render report.md and plots/ again from DIR/results.jsonl (an interrupted, stopped or resumed run).

    Example: ``specgraft report benchmarks/results`` after stopping a long run with Ctrl-C; the
    rows measured so far are reported, and ``specgraft bench ... --resume`` continues the run.
    """
    from specgraft.bench.report import write_report

    typer.echo(write_report(out).read_text())
