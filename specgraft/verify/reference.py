"""Slow, obviously correct twins of the verifiers, for tests only.

Each recomputes everything per node with plain Python lists. To agree with the fast
versions draw for draw, the sampling twins share exactly two primitives with them:
``target_probs`` (which has its own pure-Python twin here, ``reference_target_probs``, checked
to agree within rounding) and the generator calls ``sample_token`` / ``draw_uniforms``, made
in the same order on rows of the same dtype.
"""

from __future__ import annotations

import math

import torch

from specgraft.config import SamplingConfig
from specgraft.types import DraftTree, VerifyResult
from specgraft.verify.processing import draw_uniforms, sample_token, target_probs


def reference_target_probs(logits: list[float], sampling: SamplingConfig) -> list[float]:
    """Temperature, top-k, top-p on one row, in float64 Python, straight from the definitions."""
    assert not sampling.greedy, "greedy decoding uses argmax"
    scaled = [x / sampling.temperature for x in logits]
    vocab = len(scaled)
    if 0 < sampling.top_k < vocab:
        kth = sorted(scaled, reverse=True)[sampling.top_k - 1]
        scaled = [x if x >= kth else -math.inf for x in scaled]
    top = max(scaled)
    weights = [math.exp(x - top) for x in scaled]
    probs = [w / sum(weights) for w in weights]
    if sampling.top_p < 1.0:
        # keep token x when the mass of strictly more likely tokens is below top_p
        probs = [pi if sum(pj for pj in probs if pj > pi) < sampling.top_p else 0.0 for pi in probs]
        probs = [pi / sum(probs) for pi in probs]
    return probs


def _argmax(row: list[float]) -> int:
    """First index of the maximum, like ``torch.argmax``."""
    return max(range(len(row)), key=row.__getitem__)


def _children(tree: DraftTree, node: int) -> list[int]:
    """Candidate children of ``node`` (-1 = root) in node order, by scanning every node."""
    probe = tree.probe or [False] * len(tree)
    return [i for i in range(len(tree)) if tree.parents[i] == node and not probe[i]]


def _root_to_leaf_paths(tree: DraftTree) -> list[list[int]]:
    paths = []
    for leaf in range(len(tree)):
        if not (tree.probe and tree.probe[leaf]) and not _children(tree, leaf):
            path = [leaf]
            while tree.parents[path[-1]] != -1:
                path.append(tree.parents[path[-1]])
            paths.append(path[::-1])
    return paths


def reference_greedy(tree: DraftTree, logits: torch.Tensor) -> VerifyResult:
    """Longest prefix of any root-to-leaf path that matches the per-row argmax.

    Siblings carry distinct tokens, so at most one child of a node matches its argmax and all
    paths whose matched prefixes are equally long share that prefix: the first longest one
    is the only answer.
    """
    best = [_argmax(row) for row in logits.tolist()]
    accepted: list[int] = []
    for path in _root_to_leaf_paths(tree):
        matched: list[int] = []
        for node in path:
            parent_row = tree.parents[node] + 1
            if tree.tokens[node] != best[parent_row]:
                break
            matched.append(node)
        if len(matched) > len(accepted):
            accepted = matched
    last_row = accepted[-1] + 1 if accepted else 0
    return VerifyResult(accepted=accepted, bonus_token=best[last_row])


def _match_child(tree: DraftTree, node: int, token: int) -> int | None:
    matches = [c for c in _children(tree, node) if tree.tokens[c] == token]
    assert len(matches) <= 1, f"node {node} has several children with token {token}"
    return matches[0] if matches else None


def reference_sample_match(
    tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
) -> VerifyResult:
    """Draw at the current node, follow the matching child, stop at the first miss."""
    accepted: list[int] = []
    node = -1
    while True:
        token = sample_token(target_probs(logits[node + 1], sampling), generator)
        child = _match_child(tree, node, token)
        if child is None:
            return VerifyResult(accepted=accepted, bonus_token=token)
        accepted.append(child)
        node = child


def _shared_draft_row(tree: DraftTree, kids: list[int]) -> list[float] | None:
    if tree.prob_rows is None or not kids:
        return None
    rows = {tree.prob_rows[c] for c in kids}
    if len(rows) != 1 or min(rows) < 0:
        return None
    return tree.draft_probs[rows.pop()].tolist()


def reference_rejection(
    tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None
) -> VerifyResult:
    """Recursive rejection sampling (``q`` renormalised over untried children) node by node."""
    accepted: list[int] = []
    node = -1
    while True:
        kids = _children(tree, node)
        probs = target_probs(logits[node + 1], sampling)
        draft = _shared_draft_row(tree, kids)
        if draft is None:
            token = sample_token(probs, generator)
            child = _match_child(tree, node, token)
        else:
            total = sum(probs.tolist())
            p = [x / total for x in probs.tolist()]
            q_left = list(draft)
            uniforms = draw_uniforms(generator, len(kids)).tolist()
            child = None
            for kid, u in zip(kids, uniforms, strict=True):
                token = tree.tokens[kid]
                if q_left[token] <= 0.0:
                    raise ValueError(f"node {kid} has draft probability 0 for its own token")
                q_now = [x / sum(q_left) for x in q_left]
                if u < p[token] / q_now[token]:
                    child = kid
                    break
                residual = [max(pi - qi, 0.0) for pi, qi in zip(p, q_now, strict=True)]
                if sum(residual) > 0.0:
                    p = [r / sum(residual) for r in residual]
                q_left[token] = 0.0
            if child is None:
                token = sample_token(torch.tensor(p, dtype=torch.float64), generator)
        if child is None:
            return VerifyResult(accepted=accepted, bonus_token=token)
        accepted.append(child)
        node = child
