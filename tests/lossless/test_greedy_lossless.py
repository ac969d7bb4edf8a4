"""Greedy losslessness: every method's output equals plain greedy decoding token for token.

Tiny random fp32 Llama and Qwen2 models; 50 prompts each (half of them repetitive, so drafts
are really accepted, which is asserted through MAT).
"""

import pytest

from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import MethodOptions, get_method
from specgraft.models.hf import HFTarget

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS

MAX_NEW = 24


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_greedy_equals_plain_decoding(arch):
    model = TINY_MODELS[arch]()
    vocab = model.config.vocab_size
    engines = {}
    target = HFTarget(model)  # one adapter: every method's sequences get their own slots
    for name in ("ar", "pld", "recycling", "ptd"):
        drafters, composer = get_method(name).build(target, MethodOptions())
        engines[name] = SpecEngine(target, drafters, composer, method=name)
    config = GenerationConfig(max_new_tokens=MAX_NEW, budget=16)
    mats = {"pld": [], "recycling": [], "ptd": []}
    for prompt, repetitive in make_prompts(vocab=vocab):
        reference = hf_greedy(model, prompt, MAX_NEW)
        for name, engine in engines.items():
            got = engine.generate_ids(prompt, config)
            assert got == reference, f"{arch}/{name} diverged from plain greedy on prompt {prompt}"
            stats = engine.last_stats
            assert stats.new_tokens == MAX_NEW == sum(k * v for k, v in stats.tokens_per_step.items())
            if name != "ar" and repetitive:
                mats[name].append(stats.mat)
            if name == "ar":
                assert stats.steps == MAX_NEW
    for name, values in mats.items():
        mean = sum(values) / len(values)
        assert mean > 1.2, f"{arch}/{name}: mean MAT {mean:.2f} on repetitive prompts; drafts were not accepted"
