"""`specgraft calibrate`: warm up Graft's successor matrix and calibrate its pruning thresholds.

Registered in ``cli.py`` with ``app.command()(calibrate)``. Heavy imports happen inside the
command so that ``specgraft --help`` stays fast. Example::

    specgraft calibrate --method graft --model qwen2.5-coder-1.5b-instruct \\
        --draft-model qwen2.5-coder-0.5b-instruct \\
        --corpus ../shared/data/bench/datastore/gpteacher_codegen.jsonl --out calib/graft.json
"""

from __future__ import annotations

import time
from typing import Optional

import typer


def calibrate(
    method: str = typer.Option("graft", help="Graft variant the file is for (graft or graft-prune; both are calibrated)."),
    model: str = typer.Option(..., "--model", "-m", help="Target model: catalog name, local directory or Hugging Face id."),
    draft_model: str = typer.Option(..., "--draft-model", help="Draft model sharing the target's tokenizer."),
    corpus: list[str] = typer.Option(..., help="JSONL with `turns` and `response` (repeatable), disjoint from benchmarks."),
    out_path: str = typer.Option(..., "--out", help="Calibration JSON to write (the matrix goes beside it as .npz)."),
    limit: int = typer.Option(200, help="Records per corpus teacher-forced into the successor matrix (0 = none)."),
    prompts: int = typer.Option(8, help="Further records per corpus decoded to calibrate the thresholds."),
    matrix: Optional[str] = typer.Option(
        None, "--matrix", help="Start from this successor matrix (.npz from an earlier calibration or `specgraft warmup`)."
    ),
    max_new_tokens: int = typer.Option(64, help="Tokens decoded per calibration prompt."),
    preset: str = typer.Option("cpu", help="Draft preset: cpu (depth 4, top-k 6) or gpu (depth 8, top-k 10)."),
    budget: Optional[int] = typer.Option(
        None, help="Verification budget (default: the method's default budget, the one generate and bench use without --budget)."
    ),
    dtype: str = typer.Option("auto", help="Target dtype: auto (float32 on CPUs without native bf16), bfloat16 or float32."),
    draft_dtype: Optional[str] = typer.Option(None, help="Draft model dtype (default: the target's)."),
    chat: bool = typer.Option(True, help="Wrap records in the chat template."),
    k: int = typer.Option(8, help="Successors per token in the matrix."),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: torch's choice)."),
) -> None:
    """Warm up Graft's successor matrix on a corpus and calibrate its pruning thresholds."""
    import torch
    from rich.console import Console

    from specgraft.api import SpecDecoder
    from specgraft.calibrate import CALIBRATED_VARIANTS, run_calibration, save_calibration
    from specgraft.drafters.draft_model import check_vocab, get_preset
    from specgraft.methods import get_method
    from specgraft.methods_graft import load_draft_model
    from specgraft.models.hf import parse_dtype
    from specgraft.warmup import read_corpus

    err = Console(stderr=True, highlight=False)
    if method not in CALIBRATED_VARIANTS:
        raise ValueError(f"calibration is for {' or '.join(CALIBRATED_VARIANTS)}, not {method!r}")
    p = get_preset(preset)
    budget = get_method(method).default_budget if budget is None else budget
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if limit < 0 or prompts < 1 or max_new_tokens < 1:
        raise ValueError("limit must be >= 0, prompts and max_new_tokens >= 1")
    parse_dtype(dtype)
    draft_dtype = draft_dtype or dtype
    parse_dtype(draft_dtype)  # "auto" resolves per device at load time
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(threads)
    # per corpus: the first `limit` records warm the matrix up, the next `prompts` are decoded
    warm, held_out = [], []
    for path in corpus:
        records = read_corpus(path, limit=limit + prompts)
        need = prompts + min(limit, 1)  # the prompts, and a warm-up record unless --limit 0
        if len(records) < need:
            raise ValueError(f"corpus {path!r} has {len(records)} records; need at least {need} (--prompts {prompts}, --limit {limit})")
        warm += records[: len(records) - prompts]
        held_out += records[len(records) - prompts :]
    start = None
    if matrix is not None:
        from specgraft.drafters.recycling import SuccessorMatrix

        start = SuccessorMatrix.load(matrix)
        if start.k != k:
            raise ValueError(f"matrix {matrix!r} has k={start.k} successors per token, but --k is {k}")
    dec = SpecDecoder.from_pretrained(model, method="ar", dtype=dtype)
    if start is not None:
        if start.vocab_size != dec.target.vocab_size:
            raise ValueError(f"matrix {matrix!r} has {start.vocab_size} rows but the model's vocabulary is {dec.target.vocab_size}")
        if warm:
            from specgraft.warmup import warm_up_matrix

            warm_up_matrix(dec.target, dec.tokenizer, warm, start, chat=chat, progress=True)
    draft = load_draft_model(draft_model, draft_dtype, target_tokenizer=dec.tokenizer)
    check_vocab(dec.target.vocab_size, draft.get_output_embeddings().weight.shape[0])
    prompt_ids = [dec.encode(prompt, chat=chat) for prompt, _ in held_out if prompt]
    err.print(
        f"calibrate: target {model} ({dtype}), draft {draft_model} ({draft_dtype}), preset {preset} "
        f"(depth {p.depth}, top-k {p.top_k}, checkpoints {p.checkpoints}), budget {budget}, "
        f"{len(warm)} warm-up records, {len(prompt_ids)} prompts x {max_new_tokens} tokens, threads {torch.get_num_threads()}"
    )
    t0 = time.perf_counter()
    cal = run_calibration(
        dec.target, draft, dec.tokenizer, warm, prompt_ids,
        depth=p.depth, top_k=p.top_k, checkpoints=p.checkpoints, budget=budget,
        max_new_tokens=max_new_tokens, k=k, chat=chat, progress=True, matrix=start,
        meta={"method": method, "model": model, "draft_model": draft_model, "dtype": dtype, "draft_dtype": draft_dtype,
              "preset": preset, "corpus": list(corpus), "warm_records": len(warm), "prompts": len(prompt_ids),
              "start_matrix": matrix,
              "max_new_tokens": max_new_tokens, "threads": torch.get_num_threads()},
    )
    cal.draft["preset"] = preset
    path = save_calibration(cal, out_path)
    rows = int((cal.matrix.table[:, 0] >= 0).sum())
    err.print(
        f"costs: draft forward {1e3 * cal.costs['draft_forward_s']:.1f} ms, "
        f"verify of {budget} nodes {1e3 * cal.costs['verify_s']:.1f} ms; "
        f"matrix rows known {rows}; {cal.report['steps']} steps in {time.perf_counter() - t0:.1f}s"
    )
    for variant in CALIBRATED_VARIANTS:
        r = cal.report[variant]
        err.print(
            f"{variant}: thresholds {r['thresholds']} at checkpoints {list(cal.checkpoints)}; "
            f"predicted {r['predicted_tokens_per_s']:.2f} tok/s "
            f"vs {r['predicted_dense_tokens_per_s']:.2f} dense; stage share {r['stage_share']} (last = not pruned)"
        )
    err.print(f"-> {path} (+ {path.with_suffix('.npz').name})")
