"""The oracle bounds (``benchmarks/tools/measure_copy_bound.py``, ``benchmarks/tools/measure_reader_oracle.py``).

A bound is only worth its name if no real run beats it. On the tiny models: the copy bounds'
replayed steps are at most what `pld` and `adapld` really took on the same outputs, and the
READER oracle keeps outputs equal to plain decoding while every retrieved node it proposes is
accepted (it proposes only the truth).
"""

from __future__ import annotations

import doctest

import pytest
import torch

from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import MethodOptions, get_method, method_budget
from specgraft.models.hf import HFTarget

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS, perturbed
from tests.helpers.scripts import benchmark_script


def test_copy_bound_examples():
    assert doctest.testmod(benchmark_script("measure_copy_bound")).failed == 0


def test_copy_bounds_are_never_beaten():
    bound = benchmark_script("measure_copy_bound")
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    engines = {}
    for name in ("pld", "adapld"):
        drafters, composer = get_method(name).build(target, MethodOptions())
        engines[name] = SpecEngine(target, drafters, composer, method=name)
    n = 24
    totals = {name: 0 for name in (*engines, *bound.BOUNDS)}
    for prompt, _ in make_prompts(n=30, vocab=model.config.vocab_size):
        output = hf_greedy(model, prompt, n)
        real = {}
        for name, engine in engines.items():
            assert engine.generate_ids(prompt, GenerationConfig(max_new_tokens=n, budget=get_method(name).default_budget)) == output
            real[name] = engine.last_stats.steps
        with torch.no_grad():
            top = model(torch.tensor([prompt + output])).logits[0].topk(8, dim=-1).indices.numpy()
        similar = bound.similar_tokens(prompt + output, model.get_input_embeddings().weight.detach(), 0.5)
        conv = bound.Conversation(("p", 0), "t", list(prompt), output, top, similar)
        steps = {b: bound.replay(conv, b, 30) for b in bound.BOUNDS}
        assert steps["oracle-anywhere"] <= min(real.values()), (prompt, steps, real)
        assert steps["oracle-lexical"] <= real["pld"] and steps["oracle-pld"] <= real["pld"], (prompt, steps, real)
        assert steps["oracle-adapld"] <= real["adapld"], (prompt, steps, real)
        for name, s in (real | steps).items():
            totals[name] += s
    # the oracles do better than the real methods somewhere, and plain copying is no oracle
    assert totals["oracle-lexical"] < totals["pld"] and totals["oracle-adapld"] < totals["adapld"]
    assert totals["oracle-adapld"] <= totals["oracle-lexical"] <= totals["oracle-pld"] <= totals["pld-chain"]
    assert totals["oracle-anywhere"] <= totals["oracle-lexical"]


@pytest.mark.parametrize("mode", ["clairvoyant", "retrievable"])
def test_reader_oracle_is_lossless_and_proposes_only_the_truth(mode, datastore_dir):
    oracle = benchmark_script("measure_reader_oracle")
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    options = MethodOptions(datastores=(datastore_dir,))
    drafters, composer = get_method("reader").build(target, options, perturbed(model, scale=0.5))
    engine = SpecEngine(target, drafters, composer, method="reader", default_budget=method_budget("reader", options))
    stores = next(d for d in drafters if isinstance(d, oracle.ReaderRetrieval)).datastores
    proposed = accepted = 0
    oracle.use_oracle(True)
    try:
        for prompt, _ in make_prompts(n=12, vocab=model.config.vocab_size):
            output = hf_greedy(model, prompt, 16)
            oracle.TRUTH = oracle.Truth(list(prompt), output, mode, stores)
            assert engine.generate_ids(prompt, GenerationConfig(max_new_tokens=16)) == output
            stats = engine.last_stats
            for source in ("trie", "datastore"):
                proposed += stats.proposed_by_source[source]
                accepted += stats.accepted_by_source[source]
    finally:
        oracle.use_oracle(False)
    assert proposed > 0 and accepted == proposed
    # READER's own search is back
    assert oracle.ReaderRetrieval.search is oracle._search


def test_reader_oracle_search_cuts_where_no_key_of_min_key_tokens_leads():
    """Level by level: each next token must follow the last ``min_key`` tokens somewhere."""
    from types import SimpleNamespace

    from specgraft.drafters.reader_retrieval import ReaderConfig
    from specgraft.retrieval import Datastore

    oracle = benchmark_script("measure_reader_oracle")
    me = SimpleNamespace(config=ReaderConfig())
    state = SimpleNamespace(oracle_len=6, searches=0)
    # context [1 2 3 4 1 2], truth ahead [3 4 9 7]: "1 2 3" and "2 3 4" occur, "3 4 9" does not
    oracle.TRUTH = oracle.Truth([1, 2, 3, 4, 1, 2], [3, 4, 9, 7], "retrievable", (), min_key=2)
    assert oracle.oracle_search(me, state, [], (), 8).tokens == (3, 4)
    # a datastore holding "3 4 9 7" carries it on (and says where each token came from)
    store = Datastore.from_documents([[3, 4, 9, 7, 0]])
    oracle.TRUTH = oracle.Truth([1, 2, 3, 4, 1, 2], [3, 4, 9, 7], "retrievable", (store,), min_key=2)
    path = oracle.oracle_search(me, state, [], (), 8)
    assert path.tokens == (3, 4, 9, 7) and path.sources == ("trie", "trie", "datastore", "datastore")
    # a wrong draft prefix gets nothing; a right one gets what follows it; clairvoyance ignores the stores
    assert oracle.oracle_search(me, state, [], (5,), 8).tokens == ()
    assert oracle.oracle_search(me, state, [], (3,), 2).tokens == (4, 9)
    oracle.TRUTH = oracle.Truth([1, 2, 3, 4, 1, 2], [3, 4, 9, 7], "clairvoyant")
    assert oracle.oracle_search(me, state, [], (), 3).tokens == (3, 4, 9)
    assert state.searches == 5
