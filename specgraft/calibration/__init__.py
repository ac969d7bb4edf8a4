"""Graft warm-up and calibration: fill the successor matrix, then pick the checkpoints' thresholds.

The package, by stage:

- :mod:`~specgraft.calibration.warmup` and :mod:`~specgraft.calibration.corpus`: the corpus and
  the matrix warm-up. The target is teacher-forced over corpus records (:func:`~specgraft.calibration.warmup.warm_up_matrix`):
every position's top-k successors fill its token's row, as Token Recycling's prefill does.
- :mod:`~specgraft.calibration.record`: greedy decodes of held-out prompts through the engine,
  every stage's tree verified in one pass.
- :mod:`~specgraft.calibration.costs`: verify cost by node count, measured on this machine.
- :mod:`~specgraft.calibration.fit`: the threshold rule (predicted throughput, monotone, one
  standard error), pooled and per task.
- :mod:`~specgraft.methods.calibration_file`: the file (JSON + the matrix as ``.npz``), which
  the methods read (so it lives below this package).

:func:`run_calibration` puts them together; ``specgraft calibrate`` (``cli/calibrate.py``) is its
command line.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

import numpy as np
import torch

from specgraft.calibration.costs import measure_verify_s
from specgraft.calibration.fit import DECILES, StepFit, choice_report, threshold_grid
from specgraft.methods.calibration_file import CALIBRATED_VARIANTS, Calibration, load_calibration, save_calibration, thresholds_table
from specgraft.calibration.record import record_steps
from specgraft.calibration.warmup import warm_up_matrix
from specgraft.composers.graft import GraftComposer, StagePlanner
from specgraft.methods.graft import graft_config
from specgraft.drafters.base import Learning
from specgraft.drafters.draft_model import DraftModelDrafter, DraftTreeConfig
from specgraft.drafters.graft_retrieval import GraftRetrieval
from specgraft.drafters.recycling import SuccessorMatrix
from specgraft.models.base import TargetModel

__all__ = ["CALIBRATED_VARIANTS", "Calibration", "load_calibration", "run_calibration", "save_calibration", "thresholds_table"]


def run_calibration(
    target: TargetModel,
    draft_model: torch.nn.Module,
    tokenizer,
    warm_records: Sequence[tuple[str, str]],
    prompts: Sequence[Sequence[int]],
    *,
    depth: int,
    top_k: int,
    checkpoints: tuple[int, ...],
    budget: int,
    max_new_tokens: int = 64,
    k: int = 8,
    chat: bool = True,
    progress: bool = True,
    matrix: SuccessorMatrix | None = None,
    meta: dict[str, Any] | None = None,
    variants: Sequence[str] = CALIBRATED_VARIANTS,
    prompt_tasks: Sequence[str] | None = None,
    tie_se: float = 1.0,
) -> Calibration:
    """Warm the matrix up on ``warm_records``, record greedy decodes of ``prompts``, choose the
    thresholds of ``variants`` (module docstring).

    ``matrix`` (already warmed up) skips the warm-up when given. ``prompt_tasks`` (the task of
    each prompt) also fits every task's steps on their own: ``Calibration.thresholds_by_task``.
    """
    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    unknown = [v for v in variants if v not in CALIBRATED_VARIANTS]
    if unknown or not variants:
        raise ValueError(f"calibration is for {' or '.join(CALIBRATED_VARIANTS)}, not {', '.join(map(repr, unknown)) or 'nothing'}")
    if prompt_tasks is not None and len(prompt_tasks) != len(prompts):
        raise ValueError(f"{len(prompt_tasks)} prompt tasks for {len(prompts)} prompts")
    if not tie_se >= 0:
        raise ValueError(f"tie_se must be >= 0, got {tie_se}")
    if matrix is None:
        matrix = SuccessorMatrix(target.vocab_size, k)
        warm_up_matrix(target, tokenizer, warm_records, matrix, chat=chat, progress=progress)
    config = DraftTreeConfig(depth=depth, top_k=top_k, checkpoints=checkpoints)
    drafter = DraftModelDrafter(draft_model, config, target_vocab=target.vocab_size)
    composers = {v: GraftComposer(graft_config(v, k=matrix.k)) for v in variants}
    # the envelope is graft's; graft-prune alone still refreshes the matrix through it. The
    # matrix keeps learning across the calibration prompts (the warm-up's state, shared)
    retrieval = GraftRetrieval(target.vocab_size, StagePlanner(graft_config("graft", k=matrix.k)), matrix, Learning.SHARED)
    t_verify_by_nodes = measure_verify_s(target, prompts[0], budget)
    rec = record_steps(target, drafter, retrieval, composers, prompts, max_new_tokens, budget, progress=progress)
    if not rec.confidences:
        raise ValueError("calibration recorded no steps (prompts too long for the context window?)")
    t_draft = statistics.median(rec.draft_forward_s)
    conf = np.asarray(rec.confidences)
    prompt_of_step = np.asarray(rec.prompt_of_step)
    grid = threshold_grid(conf)
    fit = StepFit(rec, np.asarray(t_verify_by_nodes), budget, t_draft, grid, tie_se)
    thresholds: dict[str, tuple[float, ...]] = {}
    report: dict[str, Any] = {
        "steps": len(rec.confidences),
        "rule": {"grid_quantiles": list(DECILES), "monotone": True, "tie_se": tie_se, "clusters": "prompt"},
    }
    for variant in variants:
        choice = fit.choose(variant, np.ones(len(conf), dtype=bool))
        thresholds[variant] = choice.thresholds
        acc = np.asarray(rec.accepted[variant])
        report[variant] = {
            **choice_report(choice),
            "mean_accepted_per_stage": [round(float(a), 4) for a in acc.mean(axis=0)],
            "mean_nodes_per_stage": [round(float(n), 2) for n in np.asarray(rec.sizes[variant]).mean(axis=0)],
            # what the rule's two safeguards cost in predicted tokens/s
            "argmax": choice_report(fit.choose(variant, np.ones(len(conf), dtype=bool), tie_se=0.0)),
            "argmax_unconstrained": choice_report(fit.choose(variant, np.ones(len(conf), dtype=bool), tie_se=0.0, monotone=False)),
        }
    report["confidence_quantiles"] = {
        str(d): [round(float(x), 4) for x in np.quantile(conf[:, j], [0.1, 0.25, 0.5, 0.75, 0.9])]
        for j, d in enumerate(checkpoints)
    }
    thresholds_by_task: dict[str, dict[str, tuple[float, ...]]] = {}
    if prompt_tasks is not None:
        task_of_step = np.asarray([prompt_tasks[i] for i in prompt_of_step], dtype=object)
        by_task: dict[str, Any] = {}
        for task in dict.fromkeys(prompt_tasks):
            mask = task_of_step == task
            entry: dict[str, Any] = {"prompts": sum(t == task for t in prompt_tasks), "steps": int(mask.sum())}
            if mask.any():
                for variant in variants:
                    choice = fit.choose(variant, mask)
                    thresholds_by_task.setdefault(variant, {})[task] = choice.thresholds
                    entry[variant] = choice_report(choice)
            by_task[task] = entry
        report["by_task"] = by_task
    return Calibration(
        checkpoints=tuple(checkpoints),
        thresholds=thresholds,
        matrix=matrix,
        draft={"depth": depth, "top_k": top_k, "budget": budget},
        costs={
            "draft_forward_s": round(t_draft, 6),
            "verify_s": round(t_verify_by_nodes[budget], 6),
            "verify_s_by_nodes": [round(t, 6) for t in t_verify_by_nodes],
        },
        report=report,
        meta=dict(meta or {}),
        thresholds_by_task=thresholds_by_task,
    )
