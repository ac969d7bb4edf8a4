"""`specgraft calibrate`: warm up Graft's successor matrix and calibrate its pruning thresholds.

Heavy imports happen inside the command so that ``specgraft --help`` stays fast. Example::

    specgraft calibrate --model qwen2.5-coder-1.5b-instruct \\
        --draft-model qwen2.5-coder-0.5b-instruct \\
        --corpus ../shared/data/bench/datastore/gpteacher_codegen.jsonl \\
        --corpus ../shared/data/bench/datastore/alpaca_eval_llama3_8b_instruct_outputs.jsonl \\
        --by-task --out calib/graft.json

Corpus records whose prompt is also a benchmark prompt (any turn of the packaged suites, and of
EAGLE's alpaca set when it is found) are dropped first, so that calibration never sees text the
benchmarks are scored on. ``--by-task`` holds ``--prompts`` records out of every task subset
and, besides the pooled thresholds (the ones ``generate`` and ``bench`` use), fits each
subset's own and prints them side by side (the paper's Table 11).
"""

from __future__ import annotations

import time
from typing import Optional

import typer

from specgraft.cli.options import CHAT_RECORDS, draft_quant_option

#: The presets as ``--preset``'s help describes them (``tests/unit/cli/test_calibrate_cli.py`` checks
#: this against ``drafters.draft_model.PRESETS``, which this module does not import: torch).
PRESET_HELP = "cpu (depth 4, top-k 2, 8 nodes) or gpu (the paper's depth 8, top-k 10, 60 nodes)"


def calibrate(
    method: list[str] = typer.Option(
        ["graft", "graft-prune"], "--method",
        help="Graft variant(s) to calibrate thresholds for (repeatable; default both: graft and graft-prune).",
    ),
    model: str = typer.Option(..., "--model", "-m", help="Target model: catalog name, local directory or Hugging Face id."),
    draft_model: str = typer.Option(..., "--draft-model", help="Draft model sharing the target's tokenizer."),
    corpus: list[str] = typer.Option(..., help="JSONL with `turns` and `response` (repeatable), disjoint from benchmarks."),
    out_path: str = typer.Option(..., "--out", help="Calibration JSON to write (the matrix goes beside it as .npz)."),
    limit: int = typer.Option(200, help="Records per corpus (per task with --by-task) teacher-forced into the successor matrix (0 = none)."),
    prompts: int = typer.Option(8, help="Further records per corpus (per task with --by-task) decoded to calibrate the thresholds."),
    skip: int = typer.Option(
        0, "--skip",
        help="Leave out the first N records per corpus (per task) before --limit and --prompts: recalibrating from an earlier "
        "run's --matrix with --skip <its limit> --limit 0 decodes the records it held out, without teaching the matrix twice.",
    ),
    by_task: bool = typer.Option(
        False, "--by-task",
        help="Group records by task (--task-field, else the corpus file name), hold --prompts out of each, and also fit "
        "each task's thresholds on its own (reported beside the pooled ones, which stay the ones used).",
    ),
    task_field: str = typer.Option("task", help="Record field naming its task, for --by-task (e.g. category)."),
    exclude: list[str] = typer.Option(
        [], "--exclude", help="More prompt JSONL files (`turns`) whose prompts must not be calibrated on (repeatable)."
    ),
    matrix: Optional[str] = typer.Option(
        None, "--matrix", help="Start from this successor matrix (.npz from an earlier calibration or `specgraft warmup`)."
    ),
    max_new_tokens: int = typer.Option(64, help="Tokens decoded per calibration prompt."),
    preset: str = typer.Option("cpu", help=f"Draft preset: {PRESET_HELP}."),
    budget: Optional[int] = typer.Option(
        None, help="Verification budget (default: the preset's, the one generate and bench use without --budget: cpu 8, gpu 60)."
    ),
    draft_depth: Optional[int] = typer.Option(
        None, "--draft-depth", help="Override the preset's draft depth (generate and bench then need the same --draft-depth)."
    ),
    draft_top_k: Optional[int] = typer.Option(None, "--draft-top-k", help="Override the preset's top-k (likewise)."),
    tie_se: float = typer.Option(
        1.0, help="Threshold vectors within this many standard errors of the best predicted tokens/s count as ties; "
        "the least pruning one wins (0 = plain argmax)."
    ),
    dtype: str = typer.Option("auto", help="Target dtype: auto (float32 on a CPU, bfloat16 on a GPU; printed resolved), bfloat16 or float32."),
    draft_dtype: Optional[str] = typer.Option(None, help="Draft model dtype (default: the target's)."),
    draft_quant: str = draft_quant_option(),
    chat: Optional[bool] = CHAT_RECORDS,
    k: int = typer.Option(8, help="Successors per token in the matrix."),
    threads: Optional[int] = typer.Option(None, help="torch threads (default: torch's choice)."),
    device: str = typer.Option("auto", help="auto (cuda when available, else cpu), cpu, cuda or cuda:N; the draft model's too."),
) -> None:
    """Warm up Graft's successor matrix on a corpus and calibrate its pruning thresholds."""
    import torch
    from rich.console import Console

    from specgraft.api import SpecDecoder
    from specgraft.calibration import CALIBRATED_VARIANTS, run_calibration, save_calibration, thresholds_table
    from specgraft.calibration.corpus import benchmark_turns, read_task_corpus, split_corpus
    from specgraft.cli.options import chat_mode, prompt_format, resolve_dtype, set_threads
    from specgraft.drafters.draft_model import check_vocab, get_preset
    from specgraft.methods import GraftOptions, preset_budget
    from specgraft.models.device import resolve_device
    from specgraft.models.loading import load_draft_model
    from specgraft.models.quant import resolve_draft_quant

    err = Console(stderr=True, highlight=False)
    variants = list(dict.fromkeys(method))
    for v in variants:
        if v not in CALIBRATED_VARIANTS:
            raise ValueError(f"calibration is for {' or '.join(CALIBRATED_VARIANTS)}, not {v!r}")
    p = get_preset(preset)
    GraftOptions(depth=draft_depth, top_k=draft_top_k)  # ValueError for a depth or top-k < 1
    depth, top_k = draft_depth or p.depth, draft_top_k or p.top_k
    checkpoints = p.checkpoints  # as a run with these overrides drafts (methods.graft.run_draft_settings)
    if budget is None:
        # what generate and bench verify without --budget (SpecDecoder: the preset's budget)
        budget = preset_budget(GraftOptions(preset=preset))
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if limit < 0 or skip < 0 or prompts < 1 or max_new_tokens < 1:
        raise ValueError("limit and skip must be >= 0, prompts and max_new_tokens >= 1")
    if not tie_se >= 0:
        raise ValueError(f"tie-se must be >= 0, got {tie_se}")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, str(device))  # printed and recorded resolved, never "auto"
    draft_dtype = resolve_dtype(draft_dtype or dtype, str(device))
    draft_quant = resolve_draft_quant(draft_quant, device)
    set_threads(threads)
    # groups: corpus files, or tasks; per group the first records warm up, the next are decoded
    banned = benchmark_turns(exclude)
    groups: dict[str, list] = {}
    dropped = 0
    for path in corpus:
        for rec in read_task_corpus(path, task_field):
            if rec.prompt.strip() in banned:
                dropped += 1
                continue
            groups.setdefault(rec.task if by_task else path, []).append(rec)
    warm_recs, held_out = split_corpus({name: recs[skip:] for name, recs in groups.items()}, limit, prompts)
    warm = [(r.prompt, r.response) for r in warm_recs]
    start = None
    if matrix is not None:
        from specgraft.drafters.recycling import SuccessorMatrix

        start = SuccessorMatrix.load(matrix)
        if start.k != k:
            raise ValueError(f"matrix {matrix!r} has k={start.k} successors per token, but --k is {k}")
    dec = SpecDecoder.from_pretrained(model, method="ar", dtype=dtype, device=device)
    chat = chat_mode(dec, chat, model)
    if start is not None:
        if start.vocab_size != dec.target.vocab_size:
            raise ValueError(f"matrix {matrix!r} has {start.vocab_size} rows but the model's vocabulary is {dec.target.vocab_size}")
        if warm:
            from specgraft.calibration.warmup import warm_up_matrix

            warm_up_matrix(dec.target, dec.tokenizer, warm, start, chat=chat, progress=True)
    draft = load_draft_model(draft_model, draft_dtype, device, target_tokenizer=dec.tokenizer, quant=draft_quant)
    check_vocab(dec.target.vocab_size, draft.get_output_embeddings().out_features)
    decoded = [r for r in held_out if r.prompt]
    prompt_ids = [dec.encode(r.prompt, chat=chat) for r in decoded]
    tasks = list(groups) if by_task else []
    err.print(
        f"calibrate {', '.join(variants)}: target {model} ({dtype}), draft {draft_model} ({draft_dtype}, {draft_quant}), preset {preset} "
        f"(depth {depth}, top-k {top_k}, checkpoints {checkpoints}), budget {budget}, "
        f"{len(warm)} warm-up records, {len(prompt_ids)} prompts x {max_new_tokens} tokens"
        + (f" over tasks {', '.join(tasks)}" if by_task else "")
        + f", {dropped} corpus records dropped as benchmark prompts, {prompt_format(chat)}, threads {torch.get_num_threads()}, {device}"
    )
    t0 = time.perf_counter()
    cal = run_calibration(
        dec.target, draft, dec.tokenizer, warm, prompt_ids,
        depth=depth, top_k=top_k, checkpoints=checkpoints, budget=budget,
        max_new_tokens=max_new_tokens, k=k, chat=chat, progress=True, matrix=start,
        variants=variants, prompt_tasks=[r.task for r in decoded] if by_task else None, tie_se=tie_se,
        meta={"methods": variants, "model": model, "draft_model": draft_model, "dtype": dtype, "draft_dtype": draft_dtype, "draft_quant": draft_quant,
              "preset": preset, "corpus": list(corpus), "warm_records": len(warm), "prompts": len(prompt_ids),
              "by_task": by_task, "task_field": task_field if by_task else None, "tasks": tasks,
              "dropped_benchmark_prompts": dropped, "skip": skip, "exclude": list(exclude), "start_matrix": matrix,
              "max_new_tokens": max_new_tokens, "threads": torch.get_num_threads(), "device": str(device)},
    )
    cal.draft["preset"] = preset
    path = save_calibration(cal, out_path)
    rows = int((cal.matrix.table[:, 0] >= 0).sum())
    err.print(
        f"costs: draft forward {1e3 * cal.costs['draft_forward_s']:.1f} ms, "
        f"verify of {budget} nodes {1e3 * cal.costs['verify_s']:.1f} ms; "
        f"matrix rows known {rows}; {cal.report['steps']} steps in {time.perf_counter() - t0:.1f}s"
    )
    for variant in variants:
        r = cal.report[variant]
        err.print(
            f"{variant}: thresholds {[round(t, 4) for t in r['thresholds']]} at checkpoints {list(cal.checkpoints)}; "
            f"predicted {r['predicted_tokens_per_s']:.2f} tok/s (best on the grid {r['predicted_best_tokens_per_s']:.2f}, "
            f"dense {r['predicted_dense_tokens_per_s']:.2f}); stage share {r['stage_share']} (last = not pruned)"
        )
    if by_task:
        steps = ", ".join(f"{t} {e['prompts']} prompts / {e['steps']} steps" for t, e in cal.report["by_task"].items())
        for variant in variants:
            err.print(f"\n{variant} thresholds by task ({steps}):")
            # unwrapped, so that the markdown table can be pasted as it is
            err.print(thresholds_table(cal, variant), soft_wrap=True, markup=False)
    err.print(f"-> {path} (+ {path.with_suffix('.npz').name})")
