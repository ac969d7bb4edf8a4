"""Choosing the pruning thresholds from a recording: predicted throughput, monotone, one standard error.

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
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from specgraft.calibration.record import Recording

#: Quantiles of the observed ``c_d`` tried as ``tau_d`` (besides 0 and 1).
DECILES = tuple(round(q, 1) for q in np.linspace(0.1, 0.9, 9))


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
    if acc.shape != (steps, n_checkpoints + 1):
        raise ValueError(f"accepted must be [steps, {n_checkpoints + 1}] = [{steps}, {n_checkpoints + 1}], got {list(acc.shape)}")
    if steps == 0:
        raise ValueError("no calibration steps were recorded")
    if not tie_se >= 0:
        raise ValueError(f"tie_se must be >= 0, got {tie_se}")
    # [steps, J + 1]
    step_time = np.broadcast_to(np.asarray(t_verify, dtype=np.float64), acc.shape) + np.asarray(forwards, dtype=np.float64) * t_draft
    grid = threshold_grid(conf) if candidates is None else [np.asarray(c, dtype=np.float64) for c in candidates]
    if len(grid) != n_checkpoints:
        raise ValueError(f"{len(grid)} candidate lists for {n_checkpoints} checkpoints")
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
