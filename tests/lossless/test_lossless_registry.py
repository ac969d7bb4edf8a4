"""Every registered method is lossless: greedy output equals plain decoding token for token.

The suite is parametrized over the registry itself (``method_names()`` at collection), so a new
method is covered by registering it (``specgraft.methods.register``): no test to edit.
``test_a_registered_method_is_covered`` registers a toy method and runs the same check on it.
Draft-model methods draft with a perturbed copy of the target.
"""

from __future__ import annotations

import random

import pytest

from specgraft.composers.base import MergeComposer
from specgraft.config import GenerationConfig
from specgraft.drafters.base import StatelessDrafter
from specgraft.engine import SpecEngine
from specgraft.methods import METHODS, MethodOptions, MethodSpec, get_method, method_names, register, unregister
from specgraft.models.hf import HFTarget
from specgraft.types import Draft

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS, perturbed

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_NEW = 16
PROMPTS = 12


def assert_lossless(method: str, arch: str = "llama") -> int:
    """``method``'s greedy output equals plain greedy decoding on :data:`PROMPTS` prompts of a tiny
    model; returns the draft nodes it had accepted (a method that never drafts proves little)."""
    model = TINY_MODELS[arch]()
    target = HFTarget(model)
    spec = get_method(method)
    drafters, composer = spec.build(target, MethodOptions(), perturbed(model) if spec.needs_draft_model else None)
    engine = SpecEngine(target, drafters, composer, method=method)
    config = GenerationConfig(max_new_tokens=MAX_NEW, budget=8, stop_on_eos=False)
    accepted = 0
    for prompt, _ in make_prompts(n=PROMPTS, vocab=model.config.vocab_size):
        assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, MAX_NEW), f"{method} diverged on {prompt}"
        accepted += engine.last_stats.new_tokens - engine.last_stats.steps
    return accepted


@pytest.mark.parametrize("method", method_names())
def test_every_registered_method_is_lossless(method):
    accepted = assert_lossless(method)
    if method != "ar":
        assert accepted > 0, f"{method} had no draft node accepted: the check would not test its trees"


class EchoDrafter(StatelessDrafter):
    """A toy source: proposes the last ``budget`` tokens of the context again, as a chain."""

    name = "echo"

    def begin(self, prompt, prefill, config):
        return None

    def propose(self, state, context, budget):
        tokens = list(context[-budget:]) if budget else []
        return Draft(self.name, tokens, list(range(-1, len(tokens) - 1)))

    def observe(self, state, step):
        pass


def test_a_registered_method_is_covered():
    """A method registered from outside (a plugin, here a toy) is one more name of the registry,
    which the suite above is parametrized over; the same check passes for it."""
    spec = MethodSpec("toy-echo", "re-propose the last tokens (a test's toy)", lambda target, options, draft=None: ([EchoDrafter()], MergeComposer()), 4)
    register(spec)
    try:
        assert "toy-echo" in method_names() and METHODS["toy-echo"] is spec
        assert assert_lossless("toy-echo") > 0
        with pytest.raises(ValueError, match="already registered"):
            register(spec)
    finally:
        unregister("toy-echo")
    assert "toy-echo" not in method_names()


def test_random_budgets_keep_every_method_lossless():
    """The same check at a random budget per method (a tree cut anywhere stays lossless)."""
    rng = random.Random(3)
    model = TINY_MODELS["qwen2"]()
    target = HFTarget(model)
    draft = perturbed(model)
    prompt, _ = make_prompts(n=2, vocab=model.config.vocab_size)[0]
    expected = hf_greedy(model, prompt, MAX_NEW)
    for method in method_names():
        spec = get_method(method)
        engine = SpecEngine(target, *spec.build(target, MethodOptions(), draft if spec.needs_draft_model else None), method=method)
        config = GenerationConfig(max_new_tokens=MAX_NEW, budget=rng.randint(1, 24), stop_on_eos=False)
        assert engine.generate_ids(prompt, config) == expected, (method, config.budget)
