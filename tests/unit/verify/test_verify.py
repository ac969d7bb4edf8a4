"""Verifiers on hand-written trees, fast == reference on random trees, target_probs by hand,
and sample-and-match == plain sampling draw for draw."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specgraft.config import SamplingConfig
from specgraft.types import DraftTree, VerifyResult
from specgraft.verify import sample_token, target_probs, verify, verify_greedy, verify_rejection, verify_sample_match
from specgraft.verify.reference import (
    reference_greedy,
    reference_rejection,
    reference_sample_match,
    reference_target_probs,
)
from specgraft.verify.sampling import shared_draft_row

NEG_INF = float("-inf")
GREEDY = SamplingConfig(temperature=0.0)
CONFIGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=3),
    SamplingConfig(temperature=1.3, top_p=0.8),
    SamplingConfig(temperature=0.9, top_k=4, top_p=0.6),
]


def tree_of(
    tokens: list[int], parents: list[int], draft_probs: torch.Tensor | None = None, prob_rows: list[int] | None = None
) -> DraftTree:
    """A tree; with ``draft_probs`` and no ``prob_rows``, node ``i`` uses row ``i``."""
    if draft_probs is not None and prob_rows is None:
        prob_rows = list(range(len(tokens)))
    return DraftTree(tokens=tokens, parents=parents, sources=["test"] * len(tokens), draft_probs=draft_probs, prob_rows=prob_rows)


def one_hot_logits(best: list[int], vocab: int = 10) -> torch.Tensor:
    """[len(best), V] logits whose row i puts all probability on best[i] (at any temperature)."""
    logits = torch.full((len(best), vocab), NEG_INF)
    logits[range(len(best)), best] = 0.0
    return logits


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- hand-written trees -----------------------------------------------------------------------

CHAIN = ([5, 9, 4], [-1, 0, 1])
TWO_BY_TWO = ([5, 6, 9, 4], [-1, -1, 0, 0])
HAND_CASES = [
    # (tokens, parents, per-row target token, expected accepted, expected bonus)
    (*CHAIN, [5, 9, 4, 7], [0, 1, 2], 7),
    (*CHAIN, [5, 9, 3, 7], [0, 1], 3),
    (*TWO_BY_TWO, [5, 4, 1, 3, 8], [0, 3], 8),
    (*TWO_BY_TWO, [6, 4, 2, 3, 8], [1], 2),
    (*TWO_BY_TWO, [7, 4, 1, 3, 8], [], 7),  # miss at the root
    ([], [], [3], [], 3),  # empty tree
]


@pytest.mark.parametrize("tokens, parents, best, accepted, bonus", HAND_CASES)
def test_hand_trees_every_verifier(tokens, parents, best, accepted, bonus):
    tree = tree_of(tokens, parents)
    logits = one_hot_logits(best)
    expected = VerifyResult(accepted=accepted, bonus_token=bonus)
    assert verify_greedy(tree, logits) == expected
    assert reference_greedy(tree, logits) == expected
    for sampling in [GREEDY, *CONFIGS]:
        assert verify(tree, logits, sampling, gen()) == expected
    for sampling in CONFIGS:
        for fn in (verify_sample_match, verify_rejection, reference_sample_match, reference_rejection):
            assert fn(tree, logits, sampling, gen()) == expected, fn.__name__


def test_greedy_ties_go_to_lowest_token():
    tree = tree_of([2, 1], [-1, -1])
    # [3, V]: tokens 1 and 2 tie at the root; tokens 0 and 1 tie at node 1
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [0.0, 0.0, 0.0, 5.0], [1.0, 1.0, 0.0, 0.0]])
    assert verify_greedy(tree, logits) == reference_greedy(tree, logits) == VerifyResult([1], 0)


def test_rejection_hand_examples():
    vocab = 4
    # [2, V]: both children have draft row q = [0.5, 0.5, 0, 0]
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    tree = tree_of([0, 1], [-1, -1], draft_probs=q, prob_rows=[0, 0])
    plain = SamplingConfig(temperature=1.0)
    for seed in range(5):
        # target puts everything on 2: both children fail (p = 0 there), bonus from the residual = 2
        assert verify_rejection(tree, one_hot_logits([2, 0, 0], vocab), plain, gen(seed)) == VerifyResult([], 2)
        # target on 1: child 0 rejected, residual [0, 1, 0, 0], q_2 = [0, 1, 0, 0] -> child 1 surely accepted
        assert verify_rejection(tree, one_hot_logits([1, 0, 3], vocab), plain, gen(seed)) == VerifyResult([1], 3)
    assert torch.equal(tree.draft_probs, q), "verification must not modify draft_probs"


def test_shared_draft_row_decides_the_rule():
    q = [0.25, 0.25, 0.25, 0.25]
    table = torch.tensor([q, [0.1, 0.7, 0.1, 0.1]])
    shared = tree_of([0, 1, 2], [-1, -1, 0], draft_probs=table, prob_rows=[0, 0, -1])
    assert torch.equal(shared_draft_row(shared, [0, 1]), torch.tensor(q))
    assert shared_draft_row(shared, [2]) is None, "row -1 = deterministic candidate"
    assert shared_draft_row(shared, []) is None, "a leaf samples"
    mixed = tree_of([0, 1], [-1, -1], draft_probs=table, prob_rows=[0, -1])
    assert shared_draft_row(mixed, [0, 1]) is None, "a deterministic sibling makes the node sample-and-match"
    differing = tree_of([0, 1], [-1, -1], draft_probs=table, prob_rows=[0, 1])
    assert shared_draft_row(differing, [0, 1]) is None, "children from different q cannot be rejection-sampled"
    assert shared_draft_row(tree_of([0], [-1]), [0]) is None, "no draft_probs at all"
    with pytest.raises(ValueError, match="prob_rows must index"):
        tree_of([0], [-1], draft_probs=table, prob_rows=[2])
    with pytest.raises(ValueError, match="go together"):
        DraftTree([0], [-1], ["x"], prob_rows=[0])


def test_tree_invariants_are_errors():
    """What a drafter hands the verifier is checked on construction (also under python -O)."""
    with pytest.raises(ValueError, match="siblings must carry distinct tokens"):
        tree_of([4, 4], [-1, -1])
    with pytest.raises(ValueError, match="parents must come before children"):
        tree_of([4, 5], [1, -1])
    with pytest.raises(ValueError, match="token ids are integers >= 0"):
        tree_of([-1], [-1], draft_probs=torch.tensor([[0.5, 0.5]]))
    tree = tree_of([3, 7], [-1, 0])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        verify(tree, torch.zeros(3, 5), SamplingConfig(temperature=1.0), gen())
    with pytest.raises(ValueError, match="logits for a tree of 2 nodes"):
        verify_greedy(tree, torch.zeros(2, 10))


def test_zero_draft_probability_for_own_token_is_an_error():
    tree = tree_of([3], [-1], draft_probs=torch.tensor([[0.5, 0.5, 0.0, 0.0]]), prob_rows=[0])
    logits = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="draft probability"):
        verify_rejection(tree, logits, SamplingConfig(temperature=1.0), gen())
    with pytest.raises(ValueError, match="draft probability"):
        reference_rejection(tree, logits, SamplingConfig(temperature=1.0), gen())


def test_verify_dispatch():
    rng = random.Random(7)
    torch.manual_seed(7)
    tree, logits = random_case(rng, vocab=6, draft_kind=None)
    sampled_tree, _ = random_case(rng, vocab=6, draft_kind="sampled")
    sampled_logits = torch.randn(len(sampled_tree) + 1, 6)
    plain = SamplingConfig(temperature=1.0)
    assert verify(tree, logits, GREEDY, None) == verify_greedy(tree, logits)
    assert verify(tree, logits, plain, gen(3)) == verify_sample_match(tree, logits, plain, gen(3))
    assert verify(sampled_tree, sampled_logits, plain, gen(3)) == verify_rejection(sampled_tree, sampled_logits, plain, gen(3))


# ---- fast == reference on random trees --------------------------------------------------------


def random_tree(rng: random.Random, vocab: int, max_nodes: int) -> tuple[list[int], list[int]]:
    """Random parents (a parent before its children) and distinct sibling tokens."""
    tokens: list[int] = []
    parents: list[int] = []
    used: dict[int, set[int]] = {-1: set()}
    for i in range(rng.randint(0, max_nodes)):
        open_parents = [p for p in range(-1, i) if len(used.setdefault(p, set())) < vocab]
        # favour recent nodes so trees get deep, not only wide
        parent = rng.choice(open_parents[-3:]) if rng.random() < 0.6 else rng.choice(open_parents)
        token = rng.choice([t for t in range(vocab) if t not in used[parent]])
        used[parent].add(token)
        tokens.append(token)
        parents.append(parent)
    return tokens, parents


def random_draft_probs(rng: random.Random, tokens: list[int], parents: list[int], vocab: int) -> tuple[torch.Tensor, list[int]]:
    """``([P, V], [N])``: per parent, children share one random q row (positive everywhere), or
    are deterministic (row -1), or mix a deterministic child in, or carry different rows."""
    rows: list[list[float]] = [random_simplex(rng, vocab)]  # never empty: a table has a row
    prob_rows = [-1] * len(tokens)
    for parent in sorted(set(parents)):
        kids = [i for i, p in enumerate(parents) if p == parent]
        kind = rng.choice(["shared", "shared", "shared", "nan", "mixed", "differing"])
        shared = len(rows)
        rows.append(random_simplex(rng, vocab))
        for j, kid in enumerate(kids):
            if kind == "nan" or (kind == "mixed" and j == len(kids) - 1):
                continue
            if kind == "differing" and j > 0:
                rows.append(random_simplex(rng, vocab))
                prob_rows[kid] = len(rows) - 1
            else:
                prob_rows[kid] = shared
    dtype = rng.choice([torch.float32, torch.float64])
    return torch.tensor(rows, dtype=dtype), prob_rows


def random_simplex(rng: random.Random, vocab: int) -> list[float]:
    weights = [rng.expovariate(1.0) + 1e-3 for _ in range(vocab)]
    return [w / sum(weights) for w in weights]


def random_case(rng: random.Random, vocab: int, draft_kind: str | None) -> tuple[DraftTree, torch.Tensor]:
    tokens, parents = random_tree(rng, vocab, max_nodes=12)
    n = len(tokens)
    if rng.random() < 0.3:
        # [N + 1, V] small integers: many exact ties
        logits = torch.randint(0, 3, (n + 1, vocab)).float()
    else:
        logits = torch.randn(n + 1, vocab) * rng.choice([0.5, 2.0, 4.0])
    # make the target agree with some child of most rows, so paths get accepted
    for i, p in enumerate(parents):
        if rng.random() < 0.4:
            logits[p + 1, tokens[i]] += 3.0
    if draft_kind == "sampled":
        return tree_of(tokens, parents, *random_draft_probs(rng, tokens, parents, vocab)), logits
    return tree_of(tokens, parents), logits


def test_greedy_fast_equals_reference():
    rng = random.Random(0)
    torch.manual_seed(0)
    accepted = 0
    for _ in range(400):
        tree, logits = random_case(rng, vocab=rng.choice([2, 3, 6]), draft_kind=None)
        fast = verify_greedy(tree, logits)
        assert fast == reference_greedy(tree, logits), (tree, logits)
        accepted += len(fast.accepted)
    assert accepted > 200, "random cases must exercise acceptance"


@pytest.mark.parametrize("sampling", CONFIGS, ids=str)
def test_sample_match_fast_equals_reference(sampling):
    rng = random.Random(1)
    torch.manual_seed(1)
    accepted = 0
    for seed in range(120):
        tree, logits = random_case(rng, vocab=rng.choice([3, 6]), draft_kind=None)
        g_fast, g_ref = gen(seed), gen(seed)
        fast = verify_sample_match(tree, logits, sampling, g_fast)
        assert fast == reference_sample_match(tree, logits, sampling, g_ref)
        assert torch.equal(g_fast.get_state(), g_ref.get_state()), "both must consume the generator alike"
        accepted += len(fast.accepted)
    assert accepted > 40, "random cases must exercise acceptance"


@pytest.mark.parametrize("sampling", CONFIGS, ids=str)
def test_rejection_fast_equals_reference(sampling):
    rng = random.Random(2)
    torch.manual_seed(2)
    accepted = 0
    for seed in range(120):
        tree, logits = random_case(rng, vocab=rng.choice([3, 6]), draft_kind="sampled")
        g_fast, g_ref = gen(seed), gen(seed)
        fast = verify_rejection(tree, logits, sampling, g_fast)
        assert fast == reference_rejection(tree, logits, sampling, g_ref)
        assert torch.equal(g_fast.get_state(), g_ref.get_state()), "both must consume the generator alike"
        accepted += len(fast.accepted)
    assert accepted > 40, "random cases must exercise acceptance"


def test_seeded_runs_are_deterministic():
    rng = random.Random(3)
    sampling = SamplingConfig(temperature=1.0, top_k=4)
    for kind in (None, "sampled"):
        for seed in range(20):
            tree, logits = random_case(rng, vocab=6, draft_kind=kind)
            assert verify(tree, logits, sampling, gen(seed)) == verify(tree, logits, sampling, gen(seed))


# ---- target_probs -----------------------------------------------------------------------------


def probs_of(logits: list[float], **kwargs) -> list[float]:
    return target_probs(torch.tensor(logits), SamplingConfig(**kwargs)).tolist()


@pytest.mark.parametrize(
    "logits, kwargs, expected",
    [
        ([0.0, math.log(2), math.log(3)], dict(temperature=1.0), [1 / 6, 2 / 6, 3 / 6]),
        ([0.0, math.log(2), math.log(3)], dict(temperature=0.5), [1 / 14, 4 / 14, 9 / 14]),
        ([0.0, math.log(2), math.log(3)], dict(temperature=1.0, top_k=2), [0.0, 2 / 5, 3 / 5]),
        ([2.0, 1.0, 1.0, 0.0], dict(temperature=1.0, top_k=2), [math.e / (math.e + 2), 1 / (math.e + 2), 1 / (math.e + 2), 0.0]),
        ([math.log(0.5), math.log(0.3), math.log(0.2)], dict(temperature=1.0, top_p=0.7), [0.625, 0.375, 0.0]),
        ([math.log(0.5), math.log(0.3), math.log(0.2)], dict(temperature=1.0, top_p=0.45), [1.0, 0.0, 0.0]),
        ([math.log(0.5), math.log(0.3), math.log(0.2)], dict(temperature=1.0, top_p=0.85), [0.5, 0.3, 0.2]),
        # top-k first: [0.4, 0.3, 0.2] renormalised to [4/9, 3/9, 2/9]; top-p 0.7 then stops at 7/9
        ([math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1)], dict(temperature=1.0, top_k=3, top_p=0.7), [4 / 7, 3 / 7, 0.0, 0.0]),
        # ties at the nucleus boundary are all kept: [0.4, 0.3, 0.3] with top_p 0.5
        ([math.log(0.4), math.log(0.3), math.log(0.3)], dict(temperature=1.0, top_p=0.5), [0.4, 0.3, 0.3]),
        # the top token alone is always kept
        ([5.0, 0.0, 0.0], dict(temperature=1.0, top_p=0.01), [1.0, 0.0, 0.0]),
    ],
)
def test_target_probs_by_hand(logits, kwargs, expected):
    assert probs_of(logits, **kwargs) == pytest.approx(expected, abs=1e-6)


def test_target_probs_properties():
    torch.manual_seed(4)
    # [5, 7, 11]
    logits = torch.randn(5, 7, 11) * 3
    for sampling in CONFIGS:
        batched = target_probs(logits, sampling)
        assert batched.dtype == torch.float32 and batched.shape == logits.shape
        assert torch.allclose(batched.sum(-1), torch.ones(5, 7))
        assert torch.equal(batched[2, 3], target_probs(logits[2, 3], sampling)), "rows are independent"
        perm = torch.randperm(11)
        assert torch.allclose(target_probs(logits[..., perm], sampling), batched[..., perm]), "no dependence on token ids"
        for row in logits.reshape(-1, 11)[:10]:
            expected = reference_target_probs(row.tolist(), sampling)
            assert target_probs(row, sampling).tolist() == pytest.approx(expected, abs=1e-6)
    assert target_probs(logits.bfloat16(), CONFIGS[1]).dtype == torch.float32
    with pytest.raises(ValueError, match="greedy"):
        target_probs(logits, GREEDY)


def test_growing_top_k_nucleus_equals_the_full_sort():
    """The nucleus found among the largest probabilities (doubling k from 64) equals the full
    sort's, bit for bit, on vocabularies larger than the first k, with ties at the boundary."""
    from specgraft.verify.processing import _nucleus, _nucleus_sorted

    g = torch.Generator().manual_seed(5)
    for vocab in (10, 100, 5000):
        for scale in (0.5, 3.0, 8.0):
            logits = torch.randn(6, vocab, generator=g) * scale
            logits[0, :40] = 1.0  # a wide tie
            probs = torch.softmax(logits, dim=-1)
            for top_p in (0.1, 0.5, 0.9, 0.99, 0.999999):
                assert torch.equal(_nucleus(probs, top_p, 0), _nucleus_sorted(probs, top_p, 0)), (vocab, scale, top_p)
                assert torch.equal(_nucleus(probs, top_p, 7), _nucleus_sorted(probs, top_p, 7))


def test_sample_token():
    assert sample_token(torch.tensor([0.0, 1.0, 0.0]), gen()) == 1
    row = torch.tensor([0.1, 0.2, 0.7])
    assert [sample_token(row, gen(s)) for s in range(10)] == [sample_token(row, gen(s)) for s in range(10)]


# ---- sample-and-match is plain sampling, draw for draw ---------------------------------------


class TableModel:
    """Next-token logits as a fixed random table of the previous two tokens."""

    def __init__(self, vocab: int, seed: int) -> None:
        self.vocab = vocab
        # [V * V, V]: row a * V + b scores the token after (..., a, b)
        self.table = torch.randn(vocab * vocab, vocab, generator=gen(seed)) * 2.0

    def row(self, a: int, b: int) -> torch.Tensor:
        return self.table[a * self.vocab + b]

    def tree_logits(self, context: list[int], tree: DraftTree) -> torch.Tensor:
        """[N + 1, V] exact logits for the root and every node, like a verify pass."""
        pairs = [(context[-2], context[-1])]
        for tok, parent in zip(tree.tokens, tree.parents, strict=True):
            pairs.append((pairs[parent + 1][1], tok))
        return self.table[[a * self.vocab + b for a, b in pairs]]


def draft_candidates(model: TableModel, context: list[int], sampling: SamplingConfig, rng: random.Random) -> DraftTree:
    """Deterministic candidates (to the verifier): chains and branches, often the target's likely tokens."""
    tokens: list[int] = []
    parents: list[int] = []
    frontier = [(-1, context[-2], context[-1], 0)]
    while frontier:
        node, a, b, depth = frontier.pop()
        if depth == 4:
            continue
        probs = target_probs(model.row(a, b), sampling).tolist()
        picks = dict.fromkeys(rng.choices(range(model.vocab), weights=probs, k=rng.choice((1, 2))))
        for tok in picks:
            tokens.append(tok)
            parents.append(node)
            frontier.append((len(tokens) - 1, b, tok, depth + 1))
    return tree_of(tokens, parents)


@pytest.mark.parametrize("sampling", [CONFIGS[0], CONFIGS[3]], ids=str)
def test_sample_match_equals_plain_sampling(sampling):
    model = TableModel(vocab=8, seed=5)
    rng = random.Random(5)
    for seed in range(10):
        spec_gen = gen(seed)
        context, steps = [0, 1], 0
        while len(context) < 2 + 30:
            tree = draft_candidates(model, context, sampling, rng)
            result = verify_sample_match(tree, model.tree_logits(context, tree), sampling, spec_gen)
            context += [tree.tokens[i] for i in result.accepted] + [result.bonus_token]
            steps += 1
        plain_gen, plain = gen(seed), [0, 1]
        while len(plain) < len(context):
            plain.append(sample_token(target_probs(model.row(plain[-2], plain[-1]), sampling), plain_gen))
        assert context == plain, f"seed {seed}: speculative and plain sampling diverged"
        assert torch.equal(spec_gen.get_state(), plain_gen.get_state()), "exactly one draw per emitted token"
        assert steps < len(context) - 2, "the drafts must be accepted sometimes"
