"""Graft warm-up and calibration: fill the successor matrix, then pick the checkpoints' thresholds.

**Warm-up.** The target is teacher-forced over corpus records (:func:`specgraft.warmup.warm_up_matrix`):
every position's top-k successors fill its token's row, as Token Recycling's prefill does.

**Calibration rule.** On held-out prompts (records not used for the warm-up, so retrieval is
not scored on text it has memorised) we decode greedily for ``max_new_tokens`` tokens per
prompt. At every step the draft model drafts the *dense* tree (every layer) and records the
confidence ``c_d`` of every checkpoint; from that one draft we build the tree each stage would
verify (the ``K_draft(s)`` best nodes of the layers drafted before checkpoint ``s`` stops,
plus, for ``graft``, the stage's retrieved nodes) and the dense tree, verify their union in one
target forward and read off each tree's accepted length ``a_s`` (greedy acceptance of a
sub-tree only depends on its own nodes' rows). We also measure the time of one draft forward
``t_draft`` and of a verify forward of ``n`` nodes ``t_verify(n)`` for every ``n <= K``. A
threshold vector ``tau`` sends a step to stage ``s(tau) =`` the first checkpoint with
``c_d <= tau_d`` (else the dense tree), where it would cost ``t_verify(n_s) + f_s * t_draft``
(``n_s`` = nodes of that step's stage tree, ``f_s`` = draft forwards done before stopping:
``d + 1`` at checkpoint ``d``) and yield ``a_s + 1`` tokens. We choose, jointly over the
checkpoints, the ``tau`` maximising the predicted throughput

    sum over steps (a_s(tau) + 1)  /  sum over steps (t_verify(n_s(tau)) + f_s(tau) * t_draft)

Verify time by node count matters on CPUs, where each row of a pass costs a few percent of a
decode step: a ``graft-prune`` tree cut to ``K_draft`` nodes is cheaper to verify than a full
``graft`` tree of ``K`` nodes. (On a GPU ``t_verify`` is flat up to ``K`` and this reduces to
the scalar model.)

over candidates ``{0 (never prune), the observed c_d at quantiles 5%..95%, 1 (always)}`` per
checkpoint (ties go to the least pruning). This is the paper's objective (Eq. 3: MAT loss
against latency saving) measured on this machine, with steps treated as samples of decoding
states. ``graft`` and ``graft-prune`` are calibrated separately from the same recording
(pruning is worth more when retrieval refills the budget). Per-step bookkeeping (retrieval,
merge, verify rule, commit: a few ms) is left out of the cost model. The pruning depths
themselves come from the preset (the paper also calibrates them; we keep them fixed).

**File.** ``save_calibration(cal, "graft.json")`` writes the JSON and the matrix next to it
(``graft.npz``); :func:`load_calibration` reads both back and raises ``ValueError`` for a
missing, unreadable or inconsistent file.
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from specgraft.composers.graft import GraftComposer, GraftConfig, GraftRetrieval
from specgraft.drafters.draft_model import DraftModelDrafter, DraftTreeConfig, ModelDraft, trim
from specgraft.drafters.recycling import SuccessorMatrix
from specgraft.models.hf import HFTarget
from specgraft.tree.build import merge_drafts
from specgraft.types import Draft, DraftTree, StepResult
from specgraft.verify.greedy import verify_greedy

FORMAT = "specgraft-graft-calibration"
VERSION = 1
#: Variants whose thresholds a calibration holds.
CALIBRATED_VARIANTS = ("graft", "graft-prune")


@dataclass
class Calibration:
    checkpoints: tuple[int, ...]
    """Pruning depths the thresholds belong to."""
    thresholds: dict[str, tuple[float, ...]]
    """``tau_d`` per checkpoint, per calibrated variant (``graft``, ``graft-prune``)."""
    matrix: SuccessorMatrix
    """The warmed-up successor matrix."""
    draft: dict[str, Any] = field(default_factory=dict)
    """Draft settings used: depth, top_k, budget, preset."""
    costs: dict[str, float] = field(default_factory=dict)
    """Measured ``draft_forward_s`` and ``verify_s``."""
    report: dict[str, Any] = field(default_factory=dict)
    """Per variant: predicted tokens/s for the chosen and the dense policy, stage shares, steps."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Models, corpus, dtype: what produced the file."""

    def thresholds_for(self, variant: str) -> tuple[float, ...]:
        if variant not in self.thresholds:
            raise ValueError(f"this calibration has thresholds for {sorted(self.thresholds)}, not {variant!r}")
        return self.thresholds[variant]


# ---- file ---------------------------------------------------------------------------------


def matrix_path(json_path: str | Path) -> Path:
    return Path(json_path).with_suffix(".npz")


def save_calibration(cal: Calibration, path: str | Path) -> Path:
    """Write ``path`` (JSON) and the matrix beside it (same name, ``.npz``); returns the JSON path."""
    path = Path(path)
    if path.suffix == ".npz":
        raise ValueError(f"give the calibration a .json name, not {str(path)!r} (the matrix is written as .npz beside it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    cal.matrix.save(matrix_path(path))
    data = {
        "format": FORMAT,
        "version": VERSION,
        "checkpoints": list(cal.checkpoints),
        "thresholds": {k: list(v) for k, v in cal.thresholds.items()},
        "matrix": matrix_path(path).name,
        "vocab_size": cal.matrix.vocab_size,
        "k": cal.matrix.k,
        "draft": cal.draft,
        "costs": cal.costs,
        "report": cal.report,
        "meta": cal.meta,
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def load_calibration(path: str | Path, vocab_size: int | None = None) -> Calibration:
    """Read a calibration written by :func:`save_calibration`; ``ValueError`` on any problem."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"calibration file {str(path)!r} does not exist; write one with `specgraft calibrate`")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"calibration file {str(path)!r} is not valid JSON ({e})") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a specgraft Graft calibration file (no \"format\": {FORMAT!r})")
    if data.get("version") != VERSION:
        raise ValueError(
            f"calibration file {str(path)!r} has version {data.get('version')!r}; this specgraft reads version {VERSION}"
        )
    missing = [key for key in ("checkpoints", "thresholds", "matrix") if key not in data]
    if missing:
        raise ValueError(f"calibration file {str(path)!r} lacks {', '.join(missing)}")
    try:
        checkpoints = tuple(int(d) for d in data["checkpoints"])
        thresholds = {str(k): tuple(float(t) for t in v) for k, v in dict(data["thresholds"]).items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"calibration file {str(path)!r} has malformed checkpoints or thresholds ({e})") from e
    for variant, taus in thresholds.items():
        if len(taus) != len(checkpoints) or any(not 0.0 <= t <= 1.0 for t in taus):
            raise ValueError(
                f"calibration file {str(path)!r}: thresholds of {variant!r} must be {len(checkpoints)} values in [0, 1], "
                f"got {list(taus)}"
            )
    mpath = path.parent / str(data["matrix"])
    if not mpath.is_file():
        raise ValueError(f"successor matrix {str(mpath)!r} of calibration {str(path)!r} does not exist")
    try:
        matrix = SuccessorMatrix.load(mpath)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, ValueError) as e:
        raise ValueError(f"successor matrix {str(mpath)!r} of calibration {str(path)!r} is unreadable ({e})") from e
    if vocab_size is not None and matrix.vocab_size != vocab_size:
        raise ValueError(
            f"calibration {str(path)!r} has a successor matrix for {matrix.vocab_size} tokens "
            f"but the model's vocabulary is {vocab_size}"
        )
    return Calibration(
        checkpoints=checkpoints,
        thresholds=thresholds,
        matrix=matrix,
        draft=dict(data.get("draft", {})),
        costs=dict(data.get("costs", {})),
        report=dict(data.get("report", {})),
        meta=dict(data.get("meta", {})),
    )


# ---- the threshold rule -------------------------------------------------------------------


@dataclass
class Recording:
    """What the calibration decodes measure, one row per step."""

    # [steps, J] confidence c_d at each checkpoint
    confidences: list[list[float]] = field(default_factory=list)
    # variant -> [steps, J + 1] accepted nodes of each stage's tree (last column: the dense tree)
    accepted: dict[str, list[list[int]]] = field(default_factory=dict)
    # [J + 1] draft forwards spent by each stage (last: the dense tree)
    forwards: list[int] = field(default_factory=list)
    # variant -> [steps, J + 1] nodes of each stage's tree (last column: the dense tree)
    sizes: dict[str, list[list[int]]] = field(default_factory=dict)
    draft_forward_s: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class ThresholdChoice:
    thresholds: tuple[float, ...]
    tokens_per_s: float
    """Predicted throughput of the chosen policy."""
    dense_tokens_per_s: float
    """Predicted throughput of never pruning (same recording, same costs)."""
    stage_share: tuple[float, ...]
    """Fraction of steps at each stage (last: not pruned)."""
    mean_tokens: float
    """Predicted tokens per step (bonus included)."""


def choose_thresholds(
    confidences: np.ndarray,
    accepted: np.ndarray,
    forwards: Sequence[int],
    t_verify: float | np.ndarray,
    t_draft: float,
    quantiles: Sequence[float] = tuple(np.linspace(0.05, 0.95, 19)),
) -> ThresholdChoice:
    """The ``tau`` maximising predicted throughput (module docstring).

    Example: one checkpoint (at the root), two steps with ``c = [0.1, 0.9]``; stopping at the
    root accepts ``[1, 0]`` nodes with 1 draft forward, the dense tree ``[1, 3]`` with 4;
    ``t_verify = 1`` (a scalar, or ``[steps, J + 1]`` per step and stage), ``t_draft = 0.5``.
    Never pruning: 6 tokens in 6 s; ``tau = 0.1`` prunes
    the first step: ``2 + 4`` tokens in ``1.5 + 3`` s, the best:

    >>> c = choose_thresholds(np.array([[0.1], [0.9]]), np.array([[1, 1], [0, 3]]), [1, 4], 1.0, 0.5)
    >>> c.thresholds, round(c.tokens_per_s, 3), c.dense_tokens_per_s
    ((0.1,), 1.333, 1.0)
    """
    conf = np.asarray(confidences, dtype=np.float64)
    acc = np.asarray(accepted, dtype=np.float64)
    steps, n_checkpoints = conf.shape
    assert acc.shape == (steps, n_checkpoints + 1), f"accepted must be [steps, {n_checkpoints + 1}], got {acc.shape}"
    assert steps > 0, "no calibration steps were recorded"
    # [J + 1]
    # [steps, J + 1]
    step_time = np.broadcast_to(np.asarray(t_verify, dtype=np.float64), acc.shape) + np.asarray(forwards, dtype=np.float64) * t_draft
    rows = np.arange(steps)
    candidates = [
        np.unique(np.concatenate([[0.0, 1.0], np.quantile(conf[:, j], quantiles, method="lower")])) for j in range(n_checkpoints)
    ]
    best: tuple[float, tuple[float, ...], np.ndarray] | None = None
    for taus in itertools.product(*candidates):
        # [steps, J]
        fails = conf <= np.asarray(taus)
        # [steps]: first failing checkpoint, or J (dense)
        stage = np.where(fails.any(axis=1), fails.argmax(axis=1), n_checkpoints)
        rate = float((acc[rows, stage] + 1).sum() / step_time[rows, stage].sum())
        if best is None or rate > best[0] * (1 + 1e-9):
            best = (rate, tuple(float(t) for t in taus), stage)
    rate, taus, stage = best
    dense = float((acc[:, -1] + 1).sum() / step_time[:, -1].sum())
    share = tuple(float((stage == s).mean()) for s in range(n_checkpoints + 1))
    mean_tokens = float((acc[rows, stage] + 1).mean())
    return ThresholdChoice(thresholds=taus, tokens_per_s=rate, dense_tokens_per_s=dense, stage_share=share, mean_tokens=mean_tokens)


# ---- recording ----------------------------------------------------------------------------


def _paths(tree: DraftTree) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for tok, p in zip(tree.tokens, tree.parents, strict=True):
        paths.append((paths[p] if p >= 0 else ()) + (tok,))
    return paths


def greedy_accepted(tree: DraftTree, row_of: dict[tuple[int, ...], int], argmax: list[int]) -> int:
    """Nodes of ``tree`` greedy verification accepts, given the argmax of every row of a super-tree.

    ``row_of`` maps a token path from the root to its row in the super-tree's verify pass (``()``
    is the root, row 0). Tree attention makes a node's row depend only on its own path, so the
    answer equals verifying ``tree`` alone.
    """
    paths = set(_paths(tree))
    path: tuple[int, ...] = ()
    while (nxt := path + (argmax[row_of[path]],)) in paths:
        path = nxt
    return len(path)


def record_steps(
    target: HFTarget,
    drafter: DraftModelDrafter,
    retrieval: GraftRetrieval,
    composers: dict[str, GraftComposer],
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    budget: int,
    progress: bool = False,
) -> Recording:
    """Greedy decoding of ``prompts`` with the union of every stage tree; see the module docstring."""
    checkpoints = drafter.config.checkpoints
    assert drafter.config.thresholds is None, "record with an ungated drafter (thresholds=None)"
    rec = Recording(accepted={v: [] for v in composers}, sizes={v: [] for v in composers})
    rec.forwards = [d + 1 for d in checkpoints] + [drafter.config.depth]
    it = prompts
    if progress:
        from rich.progress import track

        it = track(prompts, description="calibration")
    for prompt in it:
        target.reset()
        topk = target.prefill(list(prompt[:-1]), topk=retrieval.prefill_topk_k())
        drafter.begin(prompt, None)
        retrieval.begin(prompt, topk)
        context = list(prompt)
        generated = 0
        while generated < max_new_tokens and target.past_len + budget + 1 < target.max_positions:
            pool = drafter.draft_pool(context)
            rec.draft_forward_s += drafter.forward_s
            envelope = retrieval.propose(context, budget)
            trees: list[DraftTree] = [trim_tree(pool, budget)]
            stage_trees: dict[str, list[DraftTree]] = {}
            for variant, composer in composers.items():
                per_stage = []
                for j, d in enumerate(checkpoints):
                    # what the drafter returns when it stops at checkpoint j
                    stopped = trim(pool.subset(range(sum(pool.layer_sizes[: d + 1]))), budget)
                    per_stage.append(composer.compose(stopped, envelope, budget, j))
                stage_trees[variant] = per_stage
                trees += per_stage
            union = merge_drafts([Draft("union", t.tokens, t.parents) for t in trees], sum(len(t) for t in trees))
            out = target.forward_tree(context[-1], union)
            result = verify_greedy(union, out.logits)
            target.commit([0, *(i + 1 for i in result.accepted)])
            argmax = out.logits.argmax(dim=-1).tolist()
            row_of = {p: i + 1 for i, p in enumerate(_paths(union))}
            row_of[()] = 0
            if len(pool.confidences) == len(checkpoints):
                rec.confidences.append(list(pool.confidences))
                dense = greedy_accepted(trees[0], row_of, argmax)
                for variant, per_stage in stage_trees.items():
                    rec.accepted[variant].append([greedy_accepted(t, row_of, argmax) for t in per_stage] + [dense])
                    rec.sizes[variant].append([len(t) for t in per_stage] + [len(trees[0])])
            step = StepResult(root_token=context[-1], tree=union, verify=result, logits=out.logits, context=context)
            new = step.new_tokens
            context.extend(new)
            generated += len(new)
            drafter.observe(step)
            retrieval.observe(step)
    target.reset()
    return rec


def trim_tree(draft: ModelDraft, budget: int) -> DraftTree:
    """The dense tree: the draft's ``budget`` best nodes."""
    kept = trim(draft, budget)
    return DraftTree(tokens=kept.tokens, parents=kept.parents, sources=[kept.source] * len(kept))


def measure_verify_s(target: HFTarget, prompt: Sequence[int], budget: int, reps: int = 3) -> list[float]:
    """Median wall time of a verify forward of ``n`` nodes after ``prompt``, for ``n = 0 .. budget``
    (chains; the shape does not change the cost). Sizes are interleaved across repetitions so a
    drift of the machine's speed spreads over all of them."""
    target.reset()
    target.prefill(list(prompt[:-1]))
    root = int(prompt[-1])
    times: list[list[float]] = [[] for _ in range(budget + 1)]
    for rep in range(reps + 1):
        for n in range(budget + 1):
            chain = DraftTree(tokens=[root] * n, parents=list(range(-1, n - 1)), sources=["x"] * n)
            t0 = time.perf_counter()
            target.forward_tree(root, chain)
            elapsed = time.perf_counter() - t0
            target.commit([0])
            # drop the committed root again: every pass sees the same cache
            for layer in target.cache.layers:
                layer.keys = layer.keys[..., : target.past_len - 1, :]
                layer.values = layer.values[..., : target.past_len - 1, :]
            target.past_len -= 1
            if rep:
                times[n].append(elapsed)
    target.reset()
    return [statistics.median(t) for t in times]


def run_calibration(
    target: HFTarget,
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
) -> Calibration:
    """Warm the matrix up on ``warm_records``, record greedy decodes of ``prompts``, choose thresholds.

    ``matrix`` (already warmed up) skips the warm-up when given.
    """
    from specgraft.warmup import warm_up_matrix

    if not prompts:
        raise ValueError("calibration needs at least one prompt")
    if matrix is None:
        matrix = SuccessorMatrix(target.vocab_size, k)
        warm_up_matrix(target, tokenizer, warm_records, matrix, chat=chat, progress=progress)
    config = DraftTreeConfig(depth=depth, top_k=top_k, checkpoints=checkpoints)
    drafter = DraftModelDrafter(draft_model, config, target_vocab=target.vocab_size)
    composers = {v: GraftComposer(GraftConfig(variant=v, k=matrix.k), matrix=matrix) for v in CALIBRATED_VARIANTS}
    retrieval = GraftRetrieval(target.vocab_size, composers["graft"].planner, matrix)
    t_verify_by_nodes = measure_verify_s(target, prompts[0], budget)
    rec = record_steps(target, drafter, retrieval, composers, prompts, max_new_tokens, budget, progress=progress)
    if not rec.confidences:
        raise ValueError("calibration recorded no steps (prompts too long for the context window?)")
    t_draft = statistics.median(rec.draft_forward_s)
    thresholds: dict[str, tuple[float, ...]] = {}
    report: dict[str, Any] = {"steps": len(rec.confidences)}
    conf = np.asarray(rec.confidences)
    for variant in CALIBRATED_VARIANTS:
        acc = np.asarray(rec.accepted[variant])
        # [steps, J + 1] verify time of each step's tree at each stage
        t_verify = np.asarray(t_verify_by_nodes)[np.minimum(np.asarray(rec.sizes[variant]), budget)]
        choice = choose_thresholds(conf, acc, rec.forwards, t_verify, t_draft)
        thresholds[variant] = choice.thresholds
        report[variant] = {
            "thresholds": list(choice.thresholds),
            "predicted_tokens_per_s": round(choice.tokens_per_s, 4),
            "predicted_dense_tokens_per_s": round(choice.dense_tokens_per_s, 4),
            "predicted_tokens_per_step": round(choice.mean_tokens, 4),
            "stage_share": [round(s, 4) for s in choice.stage_share],
            "mean_accepted_per_stage": [round(float(a), 4) for a in acc.mean(axis=0)],
            "mean_nodes_per_stage": [round(float(n), 2) for n in np.asarray(rec.sizes[variant]).mean(axis=0)],
        }
    report["confidence_quantiles"] = {
        str(d): [round(float(x), 4) for x in np.quantile(conf[:, j], [0.1, 0.25, 0.5, 0.75, 0.9])]
        for j, d in enumerate(checkpoints)
    }
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
    )
