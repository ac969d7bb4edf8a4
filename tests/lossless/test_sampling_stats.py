"""Statistical losslessness of the sampling verifiers, with a bound derived from n alone.

A synthetic target over ``V = 4`` tokens gives next-token logits as a fixed random function of
the previous two tokens, so the exact law of every length-``L = 3`` continuation is a product
of three ``target_probs`` rows, computable by enumerating ``V ** L = 64`` sequences. We run
speculative generation (draft a random tree, score every row from the table, verify, append
accepted + bonus, repeat) ``n`` times and compare the empirical law with the exact one.

The bound (no tuning): for n i.i.d. samples, with ``TV = 1/2 sum_i |p̂_i - p_i|``,

- ``E[TV] <= 1/2 sum_i sqrt(p_i (1 - p_i) / n)`` (Jensen: ``E|p̂_i - p_i| <= sd(p̂_i)``);
- changing one sample moves TV by at most ``1/n``, so McDiarmid gives
  ``P(TV - E[TV] >= t) <= exp(-2 n t^2)``, i.e. ``t = sqrt(ln(1/delta) / (2n))``.

So a lossless verifier exceeds ``bound = E-bound + t`` with probability at most
``delta = 1e-6``. Seeds are fixed, so every run is the same run. Two wrong verifiers must
exceed the same bound, which shows it has teeth: one accepts any drafted child in the
target's top 2, the other is SpecInfer's fixed-``q`` rule applied to deduplicated children.

``n = 4000`` keeps the file near 10 s on 2 cores (each sample runs ~2 real verify calls);
the bound is then about 0.07-0.09 in TV, so biases well below that would go unseen here.
Sample-and-match under top-k/top-p is also proven exactly, draw for draw against plain
sampling, in ``tests/unit/verify/test_verify.py``.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Callable

import pytest
import torch

from specgraft.config import SamplingConfig
from specgraft.tree.build import merge_drafts
from specgraft.types import Draft, DraftTree, VerifyResult
from specgraft.verify import sample_token, target_probs, verify_rejection, verify_sample_match
from specgraft.verify.greedy import child_index
from specgraft.verify.processing import draw_uniforms
from specgraft.verify.sampling import shared_draft_row

from tests.helpers.sampling import L, PROMPT, V, Pair, SyntheticTarget, node_pairs, tv_bound

N_SAMPLES = 4_000
# i.i.d. draft samples per expanded node (then deduplicated); with V = 4 duplicates are common
DRAWS = 6

Verifier = Callable[[DraftTree, torch.Tensor, SamplingConfig, torch.Generator], VerifyResult]


# ---- drafters ---------------------------------------------------------------------------------


def draft_deterministic(target: SyntheticTarget, root: Pair, rng: random.Random) -> DraftTree:
    """Up to depth 3, 1-2 distinct children per node, tokens chosen from the target (or uniformly)."""
    tokens: list[int] = []
    parents: list[int] = []
    frontier = [(-1, root, 0)]
    while frontier:
        node, (a, b), depth = frontier.pop()
        if depth == L:
            continue
        weights = target.probs[a][b] if rng.random() < 0.7 else None
        picks = dict.fromkeys(rng.choices(range(V), weights=weights, k=rng.choice((1, 2, 2))))
        for tok in picks:
            tokens.append(tok)
            parents.append(node)
            frontier.append((len(tokens) - 1, (b, tok), depth + 1))
    return DraftTree(tokens=tokens, parents=parents, sources=["det"] * len(tokens))


def sampled_draft(target: SyntheticTarget, root: Pair, rng: random.Random, draws: int) -> Draft:
    """Children of a node are the distinct values of ``draws`` i.i.d. samples from the draft row,
    in order of first appearance; the first child is always expanded, others sometimes. One
    ``q`` row per expanded node, shared by its children (``Draft.prob_rows``)."""
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[list[float]] = []
    prob_rows: list[int] = []
    frontier = [(-1, root, 0)]
    while frontier:
        node, (a, b), depth = frontier.pop(0)
        if depth == L:
            continue
        q = target.draft_rows[a][b]
        rows.append(q)
        for j, tok in enumerate(dict.fromkeys(rng.choices(range(V), weights=q, k=draws))):
            tokens.append(tok)
            parents.append(node)
            prob_rows.append(len(rows) - 1)
            if j == 0 or rng.random() < 0.3:
                frontier.append((len(tokens) - 1, (b, tok), depth + 1))
    return Draft(source="draft", tokens=tokens, parents=parents, draft_probs=torch.tensor(rows, dtype=torch.float64), prob_rows=prob_rows)


def draft_sampled(target: SyntheticTarget, root: Pair, rng: random.Random) -> DraftTree:
    d = sampled_draft(target, root, rng, draws=DRAWS)
    return DraftTree(tokens=d.tokens, parents=d.parents, sources=[d.source] * len(d), draft_probs=d.draft_probs, prob_rows=d.prob_rows)


def draft_mixed(target: SyntheticTarget, root: Pair, rng: random.Random) -> DraftTree:
    """A sampled draft and a deterministic chain merged under a budget, in random priority order:
    nodes without rows, parents whose children mix both kinds, and cut-off children all occur."""
    sampled = sampled_draft(target, root, rng, draws=DRAWS)
    chain, (a, b) = [], root
    for _ in range(rng.choice((1, 2, 3))):
        tok = rng.choices(range(V), weights=target.probs[a][b])[0]
        chain.append(tok)
        a, b = b, tok
    drafts = [sampled, Draft.chain("lookup", chain)]
    rng.shuffle(drafts)
    return merge_drafts(drafts, budget=rng.choice((4, 6, 16)))


# ---- wrong verifiers (negative controls) ------------------------------------------------------


def verify_top2_wrong(tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> VerifyResult:
    """WRONG: accept the first child whose token is in the target's top 2, else sample-and-match."""
    index, children = child_index(tree), tree.children()
    accepted: list[int] = []
    node = -1
    while True:
        probs = target_probs(logits[node + 1], sampling)
        top2 = set(torch.topk(probs, 2).indices.tolist())
        child = next((c for c in children[node + 1] if tree.tokens[c] in top2), None)
        if child is None:
            token = sample_token(probs, generator)
            child = index.get((node, token))
            if child is None:
                return VerifyResult(accepted=accepted, bonus_token=token)
        accepted.append(child)
        node = child


def verify_fixed_q_wrong(tree: DraftTree, logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator) -> VerifyResult:
    """WRONG on deduplicated children: SpecInfer's rule with ``q`` never renormalised."""
    index, children = child_index(tree), tree.children()
    accepted: list[int] = []
    node = -1
    while True:
        kids = children[node + 1]
        p = target_probs(logits[node + 1], sampling).double()
        q = shared_draft_row(tree, kids)
        child, token = None, None
        if q is None:
            token = sample_token(p.float(), generator)
            child = index.get((node, token))
        else:
            for kid, u in zip(kids, draw_uniforms(generator, len(kids)).tolist(), strict=True):
                if u * float(q[tree.tokens[kid]]) < float(p[tree.tokens[kid]]):
                    child = kid
                    break
                residual = (p - q).clamp(min=0.0)
                if float(residual.sum()) > 0:
                    p = residual / residual.sum()
            if child is None:
                token = sample_token(p, generator)
        if child is None:
            return VerifyResult(accepted=accepted, bonus_token=token)
        accepted.append(child)
        node = child


# ---- the experiment ---------------------------------------------------------------------------


def generate(target: SyntheticTarget, drafter, verifier: Verifier, rng: random.Random, gen: torch.Generator) -> tuple[tuple[int, ...], int]:
    """One speculative generation of L tokens; returns (tokens, number of verify steps)."""
    out = list(PROMPT)
    steps = 0
    while len(out) - len(PROMPT) < L:
        root = (out[-2], out[-1])
        tree = drafter(target, root, rng)
        logits = target.rows(node_pairs(root, tree.tokens, tree.parents))
        result = verifier(tree, logits, target.sampling, gen)
        out += [tree.tokens[i] for i in result.accepted] + [result.bonus_token]
        steps += 1
    return tuple(out[len(PROMPT) : len(PROMPT) + L]), steps


def run_experiment(sampling: SamplingConfig, drafter, verifier: Verifier, seed: int) -> tuple[float, float, float]:
    """(empirical TV, bound, tokens per step)."""
    target = SyntheticTarget(sampling, seed=seed)
    law = target.exact_law()
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    counts: Counter = Counter()
    steps = 0
    with torch.inference_mode():
        for _ in range(N_SAMPLES):
            seq, s = generate(target, drafter, verifier, rng, gen)
            counts[seq] += 1
            steps += s
    tv = 0.5 * sum(abs(counts[seq] / N_SAMPLES - p) for seq, p in law.items())
    assert sum(counts.values()) == N_SAMPLES and set(counts) <= set(law), "samples must be length-L sequences"
    return tv, tv_bound(law, N_SAMPLES), N_SAMPLES * L / steps


PROCESSED = SamplingConfig(temperature=0.9, top_k=3, top_p=0.9)
PLAIN = SamplingConfig(temperature=1.0)


@pytest.mark.parametrize(
    "name, sampling, drafter, verifier",
    [
        ("sample_match_plain", PLAIN, draft_deterministic, verify_sample_match),
        ("rejection_plain", PLAIN, draft_sampled, verify_rejection),
        ("rejection_mixed_tree_processed", PROCESSED, draft_mixed, verify_rejection),
    ],
)
def test_verifier_matches_target_law(name, sampling, drafter, verifier):
    tv, bound, per_step = run_experiment(sampling, drafter, verifier, seed=1)
    assert per_step > 1.3, f"{name}: the trees must actually be accepted often ({per_step:.2f} tokens/step)"
    assert tv <= bound, f"{name}: TV {tv:.4f} exceeds the derived bound {bound:.4f}"


@pytest.mark.parametrize(
    "name, sampling, drafter, verifier",
    [
        # same drafter and sampling as the passing cases above, only the verifier differs
        ("top2_wrong", PLAIN, draft_deterministic, verify_top2_wrong),
        ("fixed_q_wrong", PLAIN, draft_sampled, verify_fixed_q_wrong),
    ],
)
def test_wrong_verifier_fails_the_bound(name, sampling, drafter, verifier):
    tv, bound, _ = run_experiment(sampling, drafter, verifier, seed=1)
    assert tv > bound, f"{name}: a biased verifier passed (TV {tv:.4f} <= bound {bound:.4f}); the test has no teeth"
