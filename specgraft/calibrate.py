"""Graft warm-up and calibration: fill the successor matrix, then pick the checkpoints' thresholds.

**Warm-up.** The target is teacher-forced over corpus records (:func:`specgraft.warmup.warm_up_matrix`):
every position's top-k successors fill its token's row, as Token Recycling's prefill does.

**Recording.** On held-out prompts (records not used for the warm-up, so retrieval is not
scored on text it has memorised) we decode greedily for ``max_new_tokens`` tokens per prompt.
At every step the draft model drafts the *dense* tree (every layer) and records the confidence
``c_d`` of every checkpoint; from that one draft we build the tree each stage would verify (the
``K_draft(s)`` best nodes of the layers drafted before checkpoint ``s`` stops, plus, for
``graft``, the stage's retrieved nodes) and the dense tree, verify their union in one target
forward and read off each tree's accepted length ``a_s`` (greedy acceptance of a sub-tree only
depends on its own nodes' rows). We also measure the time of one draft forward ``t_draft`` and
of a verify forward of ``n`` nodes ``t_verify(n)`` for every ``n <= K``.

The union holds several trees' worth of rows, but a real step verifies one tree of at most
``K`` nodes. So the successor matrix is refreshed only from the rows a real dense step verifies
(the root and the ``K`` nodes of the dense tree: exactly what ``draft-tree`` and an unpruned
``graft`` step verify) plus the union's accepted path (a real decode commits the same tokens and
refreshes their rows in a later step, as a root or an accepted node). Refreshing from the whole
union would fill the matrix from several times more verified rows than serving ever does and
make retrieval's acceptance, hence pruning, look better than it is. (A pruned ``graft`` step
verifies retrieved nodes instead of the pruned draft nodes: as many rows, other tokens.)

**Threshold rule.** A threshold vector ``tau`` sends a step to stage ``s(tau) =`` the first
checkpoint with ``c_d <= tau_d`` (else the dense tree), where it would cost
``t_verify(n_s) + f_s * t_draft`` (``n_s`` = nodes of that step's stage tree, ``f_s`` = draft
forwards done before stopping: ``d + 1`` at checkpoint ``d``) and yield ``a_s + 1`` tokens. The
predicted throughput of ``tau`` is

    R(tau) = sum over steps (a_s(tau) + 1)  /  sum over steps (t_verify(n_s(tau)) + f_s(tau) * t_draft)

Verify time by node count matters on CPUs, where each row of a pass costs a few percent of a
decode step: a ``graft-prune`` tree cut to ``K_draft`` nodes is cheaper to verify than a full
``graft`` tree of ``K`` nodes (on a GPU ``t_verify`` is flat up to ``K``). This is the paper's
objective (Eq. 3: MAT loss against latency saving) measured on this machine, with steps treated
as samples of decoding states. The search:

1. *Grid.* Per checkpoint the candidates are 0 (never prune there), the observed ``c_d`` at the
   deciles 10%..90%, and 1 (always prune there): 11 values (the first version tried 21, every
   5% from 5% to 95%, jointly, and its thresholds followed the noise of ~100 steps).
2. *Monotone.* Only ``tau_0 >= tau_1 >= ...`` (shallowest checkpoint first) is searched: the
   paper sets "stricter thresholds at shallow checkpoints so that uncertain branches are pruned
   before drafting errors compound" (section 3.1). Since ``c_d`` is a product of draft
   probabilities it only falls with depth, so an equal threshold is already stricter, relative
   to the confidences, at the shallower checkpoint. A checkpoint's candidates then include the
   deeper checkpoints' ones, so that pruning deep while (almost) never at the root stays possible.
   (The paper's own Table 11, 0.15 / 0.13 / 0.51 at d0 / d1 / d5 on Qwen3-8B, does not keep this
   order at d5; the report's ``argmax_unconstrained`` shows what dropping it would give here.)
3. *Near-ties go to the least pruning.* ``R`` is estimated from a few hundred correlated steps,
   so vectors whose ``R`` differ by less than its noise are not told apart by the data. We take
   the best ``R`` and, among every vector within ``tie_se`` standard errors of it (default 1:
   the "one-standard-error rule" used to choose a pruned tree in CART, Breiman et al. 1984,
   and in Hastie et al., *Elements of Statistical Learning*, 7.10), the most permissive one:
   fewest pruned steps, then the latest stages, then the lowest thresholds. The standard error
   is that of the *paired* difference ``R(best) - R(tau)`` over the same steps (delta method
   for a ratio of sums), with the steps of one prompt summed together because consecutive
   steps of one decode are correlated. Pruning is only chosen where the recording shows it pays.

``graft`` and ``graft-prune`` are calibrated separately from the same recording (pruning is
worth more when retrieval refills the budget). Per-step bookkeeping (retrieval, merge, verify
rule, commit: a few ms) is left out of the cost model. The pruning depths themselves come from
the preset (the paper also calibrates them; we keep them fixed). The report also gives the plain
argmax of ``R`` with and without the monotone constraint, to show what the two rules cost.

**Per task** (the paper's Table 11). Given each prompt's task, the same recording (one warm-up,
one matrix) is also fitted separately on each task's steps, on the pooled grid so that the
values compare; they go to ``Calibration.thresholds_by_task`` beside the pooled thresholds,
which stay the ones ``generate`` and ``bench`` use. :func:`thresholds_table` prints them side by
side with each checkpoint's range across tasks.

**File.** ``save_calibration(cal, "graft.json")`` writes the JSON and the matrix next to it
(``graft.npz``); :func:`load_calibration` reads both back and raises ``ValueError`` for a
missing, unreadable or inconsistent file. ``draft`` records the depth, top-k and budget the
thresholds belong to; :mod:`specgraft.methods_graft` refuses to apply them to other ones.
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

from specgraft.composers.graft import GraftComposer, GraftConfig, GraftRetrieval, StagePlanner
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
    thresholds_by_task: dict[str, dict[str, tuple[float, ...]]] = field(default_factory=dict)
    """Per calibrated variant, per task subset: ``tau_d`` fitted on that subset's steps only
    (``calibrate --by-task``; the Table 11 analogue). Reported, never applied."""

    def thresholds_for(self, variant: str) -> tuple[float, ...]:
        if variant not in self.thresholds:
            raise ValueError(
                f"this calibration has thresholds for {sorted(self.thresholds)}, not {variant!r} "
                f"(specgraft calibrate --method {variant}; without --method it calibrates both)"
            )
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
        "thresholds_by_task": {v: {t: list(taus) for t, taus in by.items()} for v, by in cal.thresholds_by_task.items()},
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
        by_task = {
            str(v): {str(t): tuple(float(x) for x in taus) for t, taus in dict(by).items()}
            for v, by in dict(data.get("thresholds_by_task", {})).items()
        }
    except (TypeError, ValueError) as e:
        raise ValueError(f"calibration file {str(path)!r} has malformed checkpoints or thresholds ({e})") from e
    named = [(repr(v), taus) for v, taus in thresholds.items()]
    named += [(f"{v!r} on task {t!r}", taus) for v, by in by_task.items() for t, taus in by.items()]
    for name, taus in named:
        if len(taus) != len(checkpoints) or any(not 0.0 <= t <= 1.0 for t in taus):
            raise ValueError(
                f"calibration file {str(path)!r}: thresholds of {name} must be {len(checkpoints)} values in [0, 1], "
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
        thresholds_by_task=by_task,
    )


# ---- the threshold rule -------------------------------------------------------------------

#: Quantiles of the observed ``c_d`` tried as ``tau_d`` (besides 0 and 1).
DECILES = tuple(round(q, 1) for q in np.linspace(0.1, 0.9, 9))


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
    # [steps] index of the prompt each step decodes
    prompt_of_step: list[int] = field(default_factory=list)
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
    best_tokens_per_s: float = 0.0
    """The best predicted throughput on the grid; the choice is within ``tie_se`` standard errors of it."""
    standard_error: float = 0.0
    """Standard error of ``best_tokens_per_s - tokens_per_s`` (0 when the choice is the best)."""


def threshold_grid(confidences: np.ndarray, quantiles: Sequence[float] = DECILES) -> list[np.ndarray]:
    """Candidate ``tau_d`` per checkpoint: 0 (never prune), the observed ``c_d`` at ``quantiles``, 1 (always).

    >>> [g.tolist() for g in threshold_grid(np.array([[0.9, 0.3], [0.7, 0.1]]), quantiles=(0.5,))]
    [[0.0, 0.7, 1.0], [0.0, 0.1, 1.0]]
    """
    conf = np.asarray(confidences, dtype=np.float64)
    return [np.unique(np.concatenate([[0.0, 1.0], np.quantile(conf[:, j], quantiles, method="lower")])) for j in range(conf.shape[1])]


def choose_thresholds(
    confidences: np.ndarray,
    accepted: np.ndarray,
    forwards: Sequence[int],
    t_verify: float | np.ndarray,
    t_draft: float,
    *,
    candidates: Sequence[Sequence[float]] | None = None,
    clusters: Sequence[int] | None = None,
    tie_se: float = 1.0,
    monotone: bool = True,
) -> ThresholdChoice:
    """The ``tau`` of the module docstring's rule: the most permissive vector within ``tie_se``
    standard errors of the best predicted throughput, over ``candidates`` (default:
    :func:`threshold_grid`), only ``tau_0 >= tau_1 >= ...`` when ``monotone``.

    ``t_verify`` is a scalar or ``[steps, J + 1]`` (per step and stage); ``clusters`` groups
    steps whose noise is shared (the prompt they decode; default: every step alone).

    Example: one checkpoint (at the root), two steps with ``c = [0.1, 0.9]``; stopping at the
    root accepts ``[1, 0]`` nodes with 1 draft forward, the dense tree ``[1, 3]`` with 4;
    ``t_verify = 1``, ``t_draft = 0.5``. Never pruning: 6 tokens in 6 s; ``tau = 0.1`` prunes
    the first step: ``2 + 4`` tokens in ``1.5 + 3`` s, the best (``tie_se=0``: the plain argmax):

    >>> c = choose_thresholds(np.array([[0.1], [0.9]]), np.array([[1, 1], [0, 3]]), [1, 4], 1.0, 0.5, tie_se=0)
    >>> c.thresholds, round(c.tokens_per_s, 3), c.dense_tokens_per_s
    ((0.1,), 1.333, 1.0)

    Four steps where the root stop accepts nothing and the dense tree ``1, 2, 0, 3`` nodes:
    pruning the first three (``tau = 0.8``) predicts 0.93 tokens/s against 0.83 dense, but
    the steps disagree so much that the gap is within one standard error, and the rule keeps
    the dense tree. The same steps seen 20 times each make the gain clear:

    >>> c, a = np.array([[0.1], [0.2], [0.8], [0.9]]), np.array([[0, 1], [0, 2], [0, 0], [0, 3]])
    >>> [choose_thresholds(c, a, [1, 4], 1.0, 0.5, tie_se=t).thresholds for t in (0, 1)]
    [(0.8,), (0.0,)]
    >>> choose_thresholds(np.repeat(c, 20, axis=0), np.repeat(a, 20, axis=0), [1, 4], 1.0, 0.5).thresholds
    (0.8,)
    """
    conf = np.asarray(confidences, dtype=np.float64)
    acc = np.asarray(accepted, dtype=np.float64)
    steps, n_checkpoints = conf.shape
    assert acc.shape == (steps, n_checkpoints + 1), f"accepted must be [steps, {n_checkpoints + 1}], got {acc.shape}"
    assert steps > 0, "no calibration steps were recorded"
    assert tie_se >= 0, f"tie_se must be >= 0, got {tie_se}"
    # [steps, J + 1]
    step_time = np.broadcast_to(np.asarray(t_verify, dtype=np.float64), acc.shape) + np.asarray(forwards, dtype=np.float64) * t_draft
    grid = threshold_grid(conf) if candidates is None else [np.asarray(c, dtype=np.float64) for c in candidates]
    assert len(grid) == n_checkpoints, f"{len(grid)} candidate lists for {n_checkpoints} checkpoints"
    # a checkpoint also takes the deeper ones' candidates: tau_0 = tau_2 = (a low c_2 value) must
    # stay possible under the monotone constraint, i.e. pruning deep while (almost) never at the root
    grid = [np.unique(np.concatenate(grid[j:])) for j in range(n_checkpoints)]
    # [C, J]
    combos = np.array(
        [t for t in itertools.product(*grid) if not monotone or all(a >= b for a, b in zip(t, t[1:]))], dtype=np.float64
    ).reshape(-1, n_checkpoints)
    rows = np.arange(steps)

    def policies(chunk: slice) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """[c, steps] stage, tokens and time of every step under the vectors ``combos[chunk]``."""
        # [c, steps, J] -> [c, steps]: first failing checkpoint, or J (dense)
        fails = conf[None, :, :] <= combos[chunk, None, :]
        stage = np.where(fails.any(axis=2), fails.argmax(axis=2), n_checkpoints)
        return stage, acc[rows, stage] + 1, step_time[rows, stage]

    def influence(tokens: np.ndarray, times: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """[c, steps] each step's influence on the ratio-of-sums rate (delta method)."""
        return (tokens - rate[:, None] * times) / times.mean(axis=1, keepdims=True)

    # chunks bound the memory: [chunk, steps, J] at a time
    chunks = [slice(i, i + 256) for i in range(0, len(combos), 256)]
    rate, pruned, stage_sum = (np.empty(len(combos)) for _ in range(3))
    for chunk in chunks:
        stage, tokens, times = policies(chunk)
        rate[chunk] = tokens.sum(axis=1) / times.sum(axis=1)
        pruned[chunk] = (stage < n_checkpoints).sum(axis=1)
        stage_sum[chunk] = stage.sum(axis=1)
    # most permissive first: fewest pruned steps, then latest stages, then lowest thresholds
    order = np.lexsort((*combos.T[::-1], combos.sum(axis=1), -stage_sum, pruned))
    best = int(order[np.argmax(rate[order])])
    _, tokens, times = policies(slice(best, best + 1))
    best_influence = influence(tokens, times, rate[best : best + 1])[0]
    se = np.concatenate([
        paired_standard_error(best_influence, influence(*policies(chunk)[1:], rate[chunk]), clusters) for chunk in chunks
    ])
    near = rate[best] - rate <= tie_se * se + 1e-12 * rate[best]
    chosen = int(next(i for i in order if near[i]))
    stage, tokens, _ = policies(slice(chosen, chosen + 1))
    dense = float((acc[:, -1] + 1).sum() / step_time[:, -1].sum())
    return ThresholdChoice(
        thresholds=tuple(float(t) for t in combos[chosen]),
        tokens_per_s=float(rate[chosen]),
        dense_tokens_per_s=dense,
        stage_share=tuple(float((stage[0] == s).mean()) for s in range(n_checkpoints + 1)),
        mean_tokens=float(tokens[0].mean()),
        best_tokens_per_s=float(rate[best]),
        standard_error=float(se[chosen]),
    )


def paired_standard_error(best: np.ndarray, influence: np.ndarray, clusters: Sequence[int] | None = None) -> np.ndarray:
    """``[C]`` standard error of ``rate(best) - rate(c)`` from the per-step influences of the best
    policy ``[steps]`` and of others ``[C, steps]``, summing the steps of each cluster first
    (cluster-robust); 0 where a policy's steps equal the best's, else ``inf`` with a single step."""
    n_policies, steps = influence.shape
    # [C, steps]
    diff = best[None, :] - influence
    groups = np.arange(steps) if clusters is None else np.unique(np.asarray(clusters), return_inverse=True)[1]
    n_groups = int(groups.max()) + 1 if steps else 0
    if n_groups < 2:
        groups, n_groups = np.arange(steps), steps
    if n_groups < 2:
        return np.where((diff == 0).all(axis=1), 0.0, np.inf)
    # [C, G]
    sums = np.zeros((n_policies, n_groups))
    np.add.at(sums.T, groups, diff.T)
    return np.sqrt(n_groups / (n_groups - 1) * (sums**2).sum(axis=1)) / steps


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
    it: Any = enumerate(prompts)
    if progress:
        from rich.progress import track

        it = track(it, total=len(prompts), description="calibration")
    for index, prompt in it:
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
            dense = trim_tree(pool, budget)
            trees: list[DraftTree] = [dense]
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
                rec.prompt_of_step.append(index)
                dense_accepted = greedy_accepted(dense, row_of, argmax)
                for variant, per_stage in stage_trees.items():
                    rec.accepted[variant].append([greedy_accepted(t, row_of, argmax) for t in per_stage] + [dense_accepted])
                    rec.sizes[variant].append([len(t) for t in per_stage] + [len(dense)])
            step = StepResult(root_token=context[-1], tree=union, verify=result, logits=out.logits, context=context)
            new = step.new_tokens
            context.extend(new)
            generated += len(new)
            # the draft model's cache follows the committed path of the union
            drafter.observe(step)
            # the matrix learns only from the rows a real step verifies (module docstring)
            keep = sorted({row_of[p] - 1 for p in _paths(dense)} | set(result.accepted))
            retrieval.observe(sub_step(step, keep))
    target.reset()
    return rec


def sub_step(step: StepResult, keep: Sequence[int]) -> StepResult:
    """``step`` restricted to the tree nodes ``keep`` (ascending, closed under parents): their
    logits rows (and the root's) and greedy verification of the smaller tree.

    >>> t = DraftTree(tokens=[5, 6, 7], parents=[-1, 0, -1], sources=["d"] * 3)
    >>> s = sub_step(StepResult(1, t, verify_greedy(t, torch.eye(8)[[5, 6, 0, 0]]), torch.eye(8)[[5, 6, 0, 0]], [1]), [0, 1])
    >>> s.tree.tokens, s.logits.argmax(-1).tolist(), s.verify.accepted
    ([5, 6], [5, 6, 0], [0, 1])
    """
    new_index = {old: new for new, old in enumerate(keep)}
    tree = step.tree
    sub = DraftTree(
        tokens=[tree.tokens[i] for i in keep],
        parents=[new_index[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in keep],
        sources=[tree.sources[i] for i in keep],
    )
    # [len(keep) + 1, V]
    logits = step.logits[[0, *(i + 1 for i in keep)]]
    return StepResult(root_token=step.root_token, tree=sub, verify=verify_greedy(sub, logits), logits=logits, context=step.context)


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
    variants: Sequence[str] = CALIBRATED_VARIANTS,
    prompt_tasks: Sequence[str] | None = None,
    tie_se: float = 1.0,
) -> Calibration:
    """Warm the matrix up on ``warm_records``, record greedy decodes of ``prompts``, choose the
    thresholds of ``variants`` (module docstring).

    ``matrix`` (already warmed up) skips the warm-up when given. ``prompt_tasks`` (the task of
    each prompt) also fits every task's steps on their own: ``Calibration.thresholds_by_task``.
    """
    from specgraft.warmup import warm_up_matrix

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
    composers = {v: GraftComposer(GraftConfig(variant=v, k=matrix.k), matrix=matrix) for v in variants}
    # the envelope is graft's; graft-prune alone still refreshes the matrix through it
    retrieval = GraftRetrieval(target.vocab_size, StagePlanner(GraftConfig(variant="graft", k=matrix.k)), matrix)
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


@dataclass
class StepFit:
    """:func:`choose_thresholds` over a subset of a recording's steps, with shared costs and grid."""

    rec: Recording
    # [budget + 1] verify time by node count
    t_verify_by_nodes: np.ndarray
    budget: int
    t_draft: float
    grid: list[np.ndarray]
    tie_se: float

    def choose(self, variant: str, mask: np.ndarray, tie_se: float | None = None, monotone: bool = True) -> ThresholdChoice:
        sizes = np.asarray(self.rec.sizes[variant])[mask]
        return choose_thresholds(
            np.asarray(self.rec.confidences)[mask],
            np.asarray(self.rec.accepted[variant])[mask],
            self.rec.forwards,
            # [steps, J + 1] verify time of each step's tree at each stage
            self.t_verify_by_nodes[np.minimum(sizes, self.budget)],
            self.t_draft,
            candidates=self.grid,
            clusters=np.asarray(self.rec.prompt_of_step)[mask],
            tie_se=self.tie_se if tie_se is None else tie_se,
            monotone=monotone,
        )


def choice_report(choice: ThresholdChoice) -> dict[str, Any]:
    return {
        "thresholds": list(choice.thresholds),
        "predicted_tokens_per_s": round(choice.tokens_per_s, 4),
        "predicted_best_tokens_per_s": round(choice.best_tokens_per_s, 4),
        "standard_error": round(choice.standard_error, 4),
        "predicted_dense_tokens_per_s": round(choice.dense_tokens_per_s, 4),
        "predicted_tokens_per_step": round(choice.mean_tokens, 4),
        "stage_share": [round(s, 4) for s in choice.stage_share],
    }


def thresholds_table(cal: Calibration, variant: str) -> str:
    """Markdown table of ``variant``'s thresholds per task subset (the paper's Table 11): one row
    per checkpoint, one column per task, the range across tasks, and the pooled thresholds.

    >>> cal = Calibration((0, 1), {"graft": (0.3, 0.1)}, SuccessorMatrix(4, 2),
    ...                   thresholds_by_task={"graft": {"code": (0.35, 0.1), "chat": (0.25, 0.05)}})
    >>> print(thresholds_table(cal, "graft"))
    | gate | code | chat | range | pooled |
    |---|---|---|---|---|
    | d0 | 0.350 | 0.250 | 0.100 | 0.300 |
    | d1 | 0.100 | 0.050 | 0.050 | 0.100 |
    """
    by_task = cal.thresholds_by_task.get(variant, {})
    tasks = list(by_task)
    lines = ["| gate | " + " | ".join([*tasks, "range", "pooled"]) + " |", "|" + "---|" * (len(tasks) + 3)]
    for j, d in enumerate(cal.checkpoints):
        values = [by_task[t][j] for t in tasks]
        spread = f"{max(values) - min(values):.3f}" if values else "-"
        cells = [f"{v:.3f}" for v in values] + [spread, f"{cal.thresholds_for(variant)[j]:.3f}"]
        lines.append(f"| d{d} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- corpus -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusRecord:
    prompt: str
    response: str
    task: str
    """The record's task field, else the corpus file's stem."""


def read_task_corpus(path: str | Path, task_field: str = "task") -> list[CorpusRecord]:
    """Records of a corpus read as :func:`specgraft.warmup.read_corpus` does (JSONL ``turns`` +
    ``response``, or one text file), each with its task: the ``task_field`` value when the
    record has one, else the file's stem."""
    from specgraft.warmup import read_corpus

    path = Path(path)
    if path.suffix != ".jsonl":
        return [CorpusRecord(p, r, path.stem) for p, r in read_corpus(path)]
    tasks: list[str] = []
    with path.open() as f:
        for line in f:
            if line.strip():
                value = json.loads(line).get(task_field)
                tasks.append(str(value) if value not in (None, "") else path.stem)
    return [CorpusRecord(p, r, t) for (p, r), t in zip(read_corpus(path), tasks, strict=True)]


def split_corpus(
    groups: dict[str, list[CorpusRecord]], limit: int, prompts: int
) -> tuple[list[CorpusRecord], list[CorpusRecord]]:
    """Per group (a corpus file, or a task): of its first ``limit + prompts`` records, the last
    ``prompts`` are held out for decoding, the others warm the matrix up. ``ValueError`` when a
    group has fewer than ``prompts`` records plus one to warm up with (unless ``limit`` is 0).

    >>> recs = [CorpusRecord(str(i), "", "t") for i in range(5)]
    >>> warm, held = split_corpus({"t": recs}, limit=2, prompts=2)
    >>> [r.prompt for r in warm], [r.prompt for r in held]
    (['0', '1'], ['2', '3'])
    """
    warm: list[CorpusRecord] = []
    held_out: list[CorpusRecord] = []
    need = prompts + min(limit, 1)
    for name, records in groups.items():
        records = records[: limit + prompts]
        if len(records) < need:
            raise ValueError(f"{name!r} has {len(records)} records; need at least {need} (--prompts {prompts}, --limit {limit})")
        warm += records[: len(records) - prompts]
        held_out += records[len(records) - prompts :]
    return warm, held_out
