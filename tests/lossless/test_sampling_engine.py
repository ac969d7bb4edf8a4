"""Sampling through the whole engine on tiny fp32 models.

Sample-and-match draws exactly one token from the target distribution per emitted token, in
emission order, so with the same seed a speculative method must reproduce plain sampling
(``ar``) token for token, whatever was drafted. That is a much sharper check than a statistical
one (which ``test_sampling_stats.py`` does at the verifier level).
"""

import random

import pytest

from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.engine import SpecEngine
from specgraft.methods import GraftOptions, MethodOptions, get_method
from specgraft.models.hf import HFTarget

from tests.helpers.models import TINY_MODELS, perturbed


def engine(model, name: str, draft_model=None) -> SpecEngine:
    target = HFTarget(model)
    # greedy drafts (no --sample-drafts): every node is verified by sample-and-match
    options = MethodOptions(graft=GraftOptions(thresholds=(0.02, 0.01, 0.005)))
    drafters, composer = get_method(name).build(target, options, draft_model)
    return SpecEngine(target, drafters, composer, method=name)


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
@pytest.mark.parametrize("sampling", [
    SamplingConfig(temperature=0.4, seed=3),
    SamplingConfig(temperature=0.7, top_k=20, seed=5),
    SamplingConfig(temperature=0.5, top_p=0.9, seed=7),
])
def test_seeded_sampling_equals_plain_sampling(arch, sampling):
    model = TINY_MODELS[arch]()
    rng = random.Random(11)
    engines = {name: engine(model, name) for name in ("ar", "pld", "recycling")}
    accepted = 0
    for _ in range(6):
        unit = [rng.randrange(3, 96) for _ in range(rng.randint(2, 5))]
        prompt = (unit * 8)[: rng.randint(8, 30)]
        config = GenerationConfig(max_new_tokens=20, budget=12, sampling=sampling)
        plain = engines["ar"].generate_ids(prompt, config)
        for name in ("pld", "recycling"):
            got = engines[name].generate_ids(prompt, config)
            assert got == plain, f"{arch}/{name} sampled differently from plain sampling with the same seed"
            accepted += engines[name].last_stats.new_tokens - engines[name].last_stats.steps
        # the same seed twice gives the same output
        assert engines["pld"].generate_ids(prompt, config) == plain
    assert accepted > 0, "no drafted token was ever accepted; the test would not exercise speculation"


@pytest.mark.parametrize("method", ["draft-tree", "graft", "graft-tail"])
def test_deterministic_draft_trees_sample_exactly_like_plain_sampling(method):
    """Draft-model trees with top-k (not sampled) drafts are verified by sample-and-match, one
    target draw per emitted token: with the same seed they reproduce ``ar`` token for token."""
    model = TINY_MODELS["llama"]()
    draft = perturbed(model)
    ar, spec = engine(model, "ar"), engine(model, method, draft)
    rng = random.Random(3)
    accepted = 0
    for _ in range(5):
        unit = [rng.randrange(3, 96) for _ in range(rng.randint(2, 5))]
        prompt = (unit * 8)[: rng.randint(8, 30)]
        config = GenerationConfig(max_new_tokens=20, budget=12, sampling=SamplingConfig(temperature=0.3, top_k=10, seed=9))
        assert spec.generate_ids(prompt, config) == ar.generate_ids(prompt, config)
        accepted += spec.last_stats.new_tokens - spec.last_stats.steps
    assert accepted > 0, "no draft node was accepted"
