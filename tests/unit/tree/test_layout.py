import torch

from specgraft.composers.base import MergeComposer
from specgraft.tree.build import merge_drafts, truncate_depth
from specgraft.tree.layout import depth_from_mask, pending_ancestors, tree_layout
from specgraft.tree.templates import FULL_ENVELOPE, STAGE_TEMPLATES, node_priors, rank_template, scale_template
from specgraft.types import Draft, DraftTree


def test_chain_layout():
    lay = tree_layout([-1, 0, 1])
    assert lay.depth.tolist() == [0, 1, 2, 3]
    assert torch.equal(lay.ancestor_mask, torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_two_by_two_layout():
    # root -> n0 -> {n2, n3}; root -> n1
    lay = tree_layout([-1, -1, 0, 0])
    assert lay.depth.tolist() == [0, 1, 1, 2, 2]
    assert lay.ancestor_mask.int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 1, 0, 0, 1],
    ]
    assert torch.equal(depth_from_mask(lay.ancestor_mask), lay.depth)


def test_pending_ancestors_equal_the_plain_layout():
    """The device doubling (the adapter's) against the plain loop, on random trees, fed whole or
    in several incremental calls (as a draft model feeds its layers)."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(0, 40)
        parents = [rng.randint(-1, i - 1) for i in range(n)]
        want = tree_layout(parents).ancestor_mask[1:, 1:]
        # whole (rows are the nodes; the root is not a pending row here)
        got = pending_ancestors(torch.zeros(0, 0, dtype=torch.bool), torch.tensor(parents, dtype=torch.long))
        assert torch.equal(got, want)
        # incremental: split into consecutive calls, each closed over what came before
        old = torch.zeros(0, 0, dtype=torch.bool)
        start = 0
        while start < n:
            stop = rng.randint(start + 1, n)
            seen = pending_ancestors(old, torch.tensor(parents[start:stop], dtype=torch.long))
            old = torch.cat([torch.cat([old, seen.new_zeros(start, stop - start)], dim=1), seen])
            start = stop
        assert torch.equal(old, want)


def test_empty_layout():
    lay = tree_layout([])
    assert lay.depth.tolist() == [0] and lay.ancestor_mask.tolist() == [[True]]


def test_merge_dedupes_shared_prefixes_and_respects_budget():
    a = Draft.chain("pld", [5, 9, 4])
    b = Draft("recycling", tokens=[5, 9, 2], parents=[-1, 0, 0])
    t = merge_drafts([a, b], budget=8)
    assert (t.tokens, t.parents, t.sources) == ([5, 9, 4, 2], [-1, 0, 1, 0], ["pld", "pld", "pld", "recycling"])
    assert merge_drafts([a, b], budget=3).tokens == [5, 9, 4]
    assert merge_drafts([a, b], budget=0).tokens == []


def test_merge_best_first_keeps_tree_closed():
    # scores prefer the second branch; its parent must still come first
    d = Draft("x", tokens=[1, 2, 3, 4], parents=[-1, 0, -1, 2], scores=[1.0, 0.5, 3.0, 2.0])
    t = merge_drafts([d], budget=3)
    assert t.tokens == [3, 4, 1] and t.parents == [-1, 0, -1]


def test_merge_composer_fast_path_equals_merge():
    d = Draft("recycling", tokens=[5, 6, 7, 8], parents=[-1, -1, 0, 2])
    fast = MergeComposer().build([d], budget=10)
    slow = merge_drafts([d], budget=10)
    assert (fast.tokens, fast.parents, fast.sources) == (slow.tokens, slow.parents, slow.sources)


def test_truncate_depth():
    t = DraftTree(tokens=[5, 9, 4, 2], parents=[-1, 0, 1, 0], sources=["pld"] * 4)
    s = truncate_depth(t, 2)
    assert (s.tokens, s.parents) == ([5, 9, 2], [-1, 0, 0])
    assert truncate_depth(t, 0).tokens == []


def test_templates_follow_table7():
    assert sum(FULL_ENVELOPE) == 80
    assert rank_template(FULL_ENVELOPE, k=8).depth_counts() == list(FULL_ENVELOPE)
    for counts in STAGE_TEMPLATES.values():
        t = rank_template(counts, k=8)
        assert t.depth_counts() == list(counts)
        # the rank-0 chain reaches the full depth; higher ranks never get more children
        assert tuple([0] * len(counts)) in t.rank_paths
    full = rank_template(FULL_ENVELOPE, k=8)
    kids = [sum(1 for p in full.rank_paths if p[:-1] == (r,)) for r in range(8)]
    assert kids == sorted(kids, reverse=True) and kids[0] > kids[-1]


def test_scale_template_keeps_the_most_promising_subtree():
    full = rank_template(FULL_ENVELOPE, k=8)
    full_prior = dict(zip(full.rank_paths, node_priors(full), strict=True))
    for budget in (1, 2, 4, 5, 8, 9, 16, 24, 40, 79):
        t = scale_template(FULL_ENVELOPE, budget)
        assert len(t) == budget
        # a closed tree of envelope nodes: every parent kept, and before its children
        assert all(p < i for i, p in enumerate(t.parents))
        assert all(path[:-1] in t.rank_paths for path in t.rank_paths if len(path) > 1)
        # no node left out has a higher prior than a node kept
        kept = {full_prior[p] for p in t.rank_paths}
        left = [v for p, v in full_prior.items() if p not in set(t.rank_paths)]
        assert max(left) <= min(kept) + 1e-12
    assert scale_template(FULL_ENVELOPE, 80).depth_counts() == list(FULL_ENVELOPE)
    assert scale_template(FULL_ENVELOPE, 200).depth_counts() == list(FULL_ENVELOPE)
    # small budgets are a short rank-0 chain with its best siblings, not a rank-0 chain of B
    assert scale_template(FULL_ENVELOPE, 4).rank_paths == [(0,), (1,), (0, 0), (0, 0, 0)]
    assert scale_template(FULL_ENVELOPE, 8).depth_counts() == [3, 3, 1, 1]
