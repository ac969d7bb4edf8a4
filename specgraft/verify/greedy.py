"""Greedy verification: keep the longest path that the target's argmax agrees with.

Example, root then the 2x2 tree ``tokens=[5, 6, 9, 4], parents=[-1, -1, 0, 0]``
(node 0 = 5 and node 1 = 6 under the root; node 2 = 9 and node 3 = 4 under node 0), with
per-row argmax ``[5, 4, 1, 3, 8]`` (rows: root, n0, n1, n2, n3):

- at the root the argmax is 5 -> node 0 accepted;
- at node 0 (row 1) the argmax is 4 -> node 3 accepted;
- at node 3 (row 4) the argmax is 8 and node 3 has no children -> bonus token 8.

Result: ``VerifyResult(accepted=[0, 3], bonus_token=8)``.
"""

from __future__ import annotations

import torch

from specgraft.types import DraftTree, VerifyResult


def child_index(tree: DraftTree) -> dict[tuple[int, int], int]:
    """``{(parent, token): node}`` over the candidate nodes (probes are never accepted); siblings
    carry distinct tokens (``DraftTree`` checks it), so each key is unique."""
    return {(p, t): i for i, (p, t) in enumerate(zip(tree.parents, tree.tokens, strict=True)) if not tree.is_probe(i)}


def check_rows(tree: DraftTree, logits: torch.Tensor) -> None:
    """``ValueError`` unless ``logits`` has a row per verify-pass row and every tree token is in its vocabulary."""
    if logits.dim() != 2 or logits.shape[0] != len(tree) + 1:
        raise ValueError(f"expected [{len(tree) + 1}, vocab] logits for a tree of {len(tree)} nodes, got {tuple(logits.shape)}")
    tree.check_vocab(logits.shape[-1])


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> VerifyResult:
    """Accept the longest path whose every node equals the target's argmax at its parent.

    ``logits`` is ``[N + 1, V]`` (row 0 = root, row i + 1 = node i). Ties go to the lowest
    token id (``torch.argmax`` returns the first maximum), as in plain greedy decoding. Probe
    nodes are never accepted.
    """
    check_rows(tree, logits)
    # [N + 1]
    best = logits.argmax(dim=-1).tolist()
    index = child_index(tree)
    accepted: list[int] = []
    node = -1
    while (child := index.get((node, best[node + 1]))) is not None:
        accepted.append(child)
        node = child
    return VerifyResult(accepted=accepted, bonus_token=best[node + 1])
