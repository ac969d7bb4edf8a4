"""Tree attention correctness and cache commit, on tiny Llama and Qwen2 models in fp32."""

import random

import torch

from specgraft.cache.commit import commit_cache, commit_cache_reference
from specgraft.models.hf import HFTarget
from specgraft.types import DraftTree


def random_tree(rng: random.Random, n: int, vocab: int) -> DraftTree:
    parents, tokens, used = [], [], set()
    for i in range(n):
        p = rng.randint(-1, i - 1)
        tok = rng.randrange(3, vocab)
        while (p, tok) in used:
            tok = rng.randrange(3, vocab)
        used.add((p, tok))
        parents.append(p)
        tokens.append(tok)
    return DraftTree(tokens=tokens, parents=parents, sources=["t"] * n)


def branch(tree: DraftTree, node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(tree.tokens[node])
        node = tree.parents[node]
    return out[::-1]


def test_tree_logits_equal_plain_branch_logits(tiny_model):
    rng = random.Random(0)
    target = HFTarget(tiny_model)
    for trial in range(3):
        prompt = [rng.randrange(3, 96) for _ in range(7 + trial)]
        tree = random_tree(rng, 12, 96)
        target.reset()
        target.prefill(prompt[:-1])
        out = target.forward_tree(prompt[-1], tree, output_hidden=True)
        assert out.logits.shape == (13, 96) and out.hidden.shape[0] == 13
        with torch.no_grad():
            root_ref = tiny_model(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(out.logits[0], root_ref, rtol=1e-4, atol=1e-4)
            for i in range(len(tree)):
                ref = tiny_model(torch.tensor([prompt + branch(tree, i)])).logits[0, -1]
                torch.testing.assert_close(out.logits[i + 1], ref, rtol=1e-4, atol=1e-4)
        target.commit([0])


def test_commit_equals_fresh_prefill(tiny_model):
    rng = random.Random(1)
    prompt = [rng.randrange(3, 96) for _ in range(9)]
    tree = DraftTree(tokens=[11, 12, 13, 14, 15, 16], parents=[-1, 0, 0, -1, 3, 4], sources=["t"] * 6)
    for accepted in ([], [0], [0, 2], [3, 4, 5]):
        target = HFTarget(tiny_model)
        target.prefill(prompt[:-1])
        target.forward_tree(prompt[-1], tree)
        target.commit([0, *(i + 1 for i in accepted)])
        fresh = HFTarget(tiny_model)
        fresh.prefill(prompt + [tree.tokens[i] for i in accepted])
        assert target.past_len == fresh.past_len == len(prompt) + len(accepted)
        for a, b in zip(target.cache.layers, fresh.cache.layers, strict=True):
            torch.testing.assert_close(a.keys, b.keys, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(a.values, b.values, rtol=1e-5, atol=1e-5)


def test_commit_fast_equals_reference(tiny_model):
    target = HFTarget(tiny_model)
    target.prefill([5, 6, 7, 8])
    tree = DraftTree(tokens=[11, 12, 13, 14], parents=[-1, 0, -1, 2], sources=["t"] * 4)
    target.forward_tree(9, tree)
    twin = HFTarget(tiny_model)
    twin.prefill([5, 6, 7, 8])
    twin.forward_tree(9, tree)
    commit_cache(target.cache, 4, [0, 3, 4])
    commit_cache_reference(twin.cache, 4, [0, 3, 4])
    for a, b in zip(target.cache.layers, twin.cache.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
