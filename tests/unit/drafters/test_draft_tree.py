"""The draft-model tree drafter (``draft-tree``): draft cache, EAGLE-2 shape, losslessness, sampling.

Tiny fp32 models; the draft model is the target with its weights perturbed (so drafts are often,
not always, right). Stubs (``tests.helpers.stubs.TableLM``) stand in for the draft model where a test
needs to set the draft distribution exactly.
"""

from __future__ import annotations

import math
import random
from typing import Callable

import pytest
import torch

from specgraft.composers.graft import GraftComposer

from specgraft.methods.graft import graft_config
from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.drafters.draft_model import PRESETS, DraftModelDrafter, DraftTreeConfig, trim
from specgraft.tree.paths import best_first
from specgraft.engine import SpecEngine
from specgraft.methods.graft import GraftOptions, build_graft_method
from specgraft.models.hf import HFTarget
from specgraft.types import DraftTree, StepResult, VerifyResult

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS, perturbed, tiny_llama
from tests.helpers.sampling import PROMPT, SyntheticTarget, sample_sequences, total_variation, tv_bound
from tests.helpers.stubs import TableLM, begin, peaked_table, random_table, sampling_config

MAX_NEW = 24
N_PROMPTS = 20


pytestmark = pytest.mark.usefixtures("one_thread")


# ---- the draft model's cache --------------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_incremental_rows_equal_plain_forwards(arch):
    """The one adapter, fed row by row as the draft model is: each row's logits equal a plain
    forward of its path; commit keeps a chain; the next rows catch up in one forward."""
    model = TINY_MODELS[arch]()
    lm = HFTarget(model)
    prompt = [5, 7, 9, 11, 13]

    def plain(tokens):
        with torch.no_grad():
            return model(torch.tensor([tokens])).logits[0, -1]

    slot = lm.allocate()
    lm.prefill(slot, prompt[:-1])
    torch.testing.assert_close(lm.forward_rows(slot, [13], [-1]).logits[0], plain(prompt))
    rows = lm.forward_rows(slot, [20, 21], [0, 0]).logits
    torch.testing.assert_close(rows[1], plain(prompt + [21]))
    rows = lm.forward_rows(slot, [30, 31], [2, 1]).logits
    torch.testing.assert_close(rows[0], plain(prompt + [21, 30]))
    torch.testing.assert_close(rows[1], plain(prompt + [20, 31]))
    lm.commit(slot, [0, 2, 3])  # root 13, then 21, 30 accepted
    assert lm.length(slot) == 7
    # the next root comes with two accepted tokens never fed: caught up in one forward (a chain)
    ctx = prompt + [21, 30, 40, 41, 42]
    torch.testing.assert_close(lm.forward_rows(slot, [40, 41, 42], [-1, 0, 1]).logits[-1], plain(ctx))
    with pytest.raises(ValueError, match="not a chain"):
        lm.commit(slot, [1, 0])


def test_draft_cache_stays_in_step_with_the_target():
    """After a generation the draft slot equals a fresh prefill of the committed tokens."""
    model = tiny_llama()
    draft = perturbed(model)
    drafter = DraftModelDrafter(draft, DraftTreeConfig(depth=3, top_k=3), target_vocab=96)
    engine = SpecEngine(HFTarget(model), [drafter], GraftComposer(graft_config("draft-tree")))
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    seq = engine.start(prompt, GenerationConfig(max_new_tokens=30, budget=12))
    while not seq.done:
        engine.step(seq)
    assert seq.stats.mat > 1.5, "drafts must be accepted for this test to mean anything"
    lm, state = drafter.lm, seq.drafter_states[0]
    committed = lm.length(state.slot)
    context = seq.context
    assert len(prompt) <= committed < len(context)
    fresh = HFTarget(draft)
    slot = fresh.allocate()
    fresh.prefill(slot, context[:committed])
    for got, want in zip(lm.cache.layers, fresh.cache.layers, strict=True):
        torch.testing.assert_close(got.keys[state.slot, :, :committed], want.keys[slot, :, :committed])
        torch.testing.assert_close(got.values[state.slot, :, :committed], want.values[slot, :, :committed])
    used = state.slot
    engine.finish(seq)
    assert lm.cache.free and used in lm.cache.free and state.slot is None, "finishing frees the draft model's slot"


# ---- the tree's shape ---------------------------------------------------------------------


def docstring_table(path: tuple[int, ...]) -> torch.Tensor:
    """The module docstring's example over tokens r=0, a=1, b=2, c=3, d=4, e=5, f=6 (+ filler 7)."""
    rows = {0: {1: 0.6, 2: 0.3}, 1: {3: 0.5, 4: 0.4}, 2: {5: 0.9, 6: 0.05}}
    probs = torch.full((8,), 1e-6)
    for tok, p in rows.get(path[-1], {7: 1.0}).items():
        probs[tok] = p
    return probs.log()


def test_eagle2_tree_matches_the_docstring_example():
    lm = TableLM(docstring_table, 8)
    drafter = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=2))
    state = begin(drafter, [0])
    pool = drafter.draft_pool(state, [0])
    assert lm.forwards == 2, "one draft forward per depth"
    assert pool.tokens == [1, 2, 3, 4, 5, 6] and pool.parents == [-1, -1, 0, 0, 1, 1] and pool.layer_sizes == [2, 4]
    draft = drafter.propose(state, [0], budget=4)
    assert draft.tokens == [1, 2, 3, 5] and draft.parents == [-1, -1, 0, 1]
    assert draft.draft_probs is None, "deterministic top-k children carry no draft_probs"


def test_best_first_keeps_parents_and_trim_of_sampled_drafts_keeps_prefixes():
    parents = [-1, -1, 0, 0, 1, 2]
    scores = [-1.0, -0.1, -1.1, -5.0, -0.2, -1.2]
    assert best_first(parents, scores, 4) == [0, 1, 2, 4]
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 12)
        par = [rng.randint(-1, i - 1) for i in range(n)]
        sc = [rng.uniform(-3, 0) for _ in range(n)]
        for i, p in enumerate(par):  # path scores never increase downwards
            if p >= 0:
                sc[i] = min(sc[i], sc[p])
        kept = best_first(par, sc, rng.randint(0, n))
        assert all(par[i] in kept or par[i] < 0 for i in kept)
        by_score = sorted(range(n), key=lambda i: (-sc[i], i))[: len(kept)]
        assert sorted(by_score) == kept


def test_gates_stop_drafting():
    # every row puts 0.5 on one token: c_0 = 0.5, c_1 = 0.25, c_2 = 0.125
    lm = TableLM(peaked_table(0.5, vocab=64), 64)
    for thresholds, stage, forwards in [((0.6, 0.0, 0.0), 0, 1), ((0.4, 0.3, 0.0), 1, 2), ((0.4, 0.2, 0.2), 2, 3), ((0.4, 0.2, 0.1), None, 4)]:
        drafter = DraftModelDrafter(lm, DraftTreeConfig(depth=4, top_k=3, checkpoints=(0, 1, 2), thresholds=thresholds))
        state = begin(drafter, [1, 2])
        lm.forwards = 0
        draft = drafter.draft_pool(state, [1, 2])
        assert draft.stage == stage and lm.forwards == forwards
        assert len(draft.layer_sizes) == forwards
        assert draft.confidences == pytest.approx([0.5, 0.25, 0.125][: len(draft.confidences)])


def chain_table(probs: dict[int, float], vocab: int = 16) -> Callable[[tuple[int, ...]], torch.Tensor]:
    """After token ``t`` the draft puts ``probs[t]`` (default 0.5) on ``t + 1`` and the rest on
    ``t + 2`` (mod ``vocab``): a chain whose confidence the test sets per token."""

    def fn(path: tuple[int, ...]) -> torch.Tensor:
        t = path[-1]
        p = torch.full((vocab,), 1e-9, dtype=torch.float64)
        p[(t + 1) % vocab] = probs.get(t, 0.5)
        p[(t + 2) % vocab] = 1 - probs.get(t, 0.5)
        return p.log().float()

    return fn


def test_extension_continues_the_best_path_while_it_is_confident():
    # root 0 -> 1 (0.9) -> 2 (0.9): depth 2 ends at S = log 0.81; extension feeds 2 -> 3 (0.9,
    # S = log .729), feeds 3 -> 4 (0.5, S = log .36), feeds 4 -> 5 (0.5, S = log .18 < 0.3): stop
    lm = TableLM(chain_table({0: 0.9, 1: 0.9, 2: 0.9, 3: 0.5, 4: 0.5}), 16)
    plain = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=1))
    state = begin(plain, [0])
    lm.forwards = 0
    assert plain.draft_pool(state, [0]).tokens == [1, 2] and lm.forwards == 2
    drafter = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=1, extend=8, extend_min=0.3))
    state = begin(drafter, [0])
    lm.forwards = 0
    pool = drafter.draft_pool(state, [0])
    assert pool.tokens == [1, 2, 3, 4, 5] and pool.parents == [-1, 0, 1, 2, 3]
    assert lm.forwards == 2 + 3, "three extension forwards: after 2, 3 and 4"
    assert pool.scores == pytest.approx([math.log(x) for x in (0.9, 0.81, 0.729, 0.3645, 0.18225)], rel=1e-5)
    assert pool.layer_sizes == [1, 1, 1, 1, 1]
    # at most `extend` forwards
    once = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=1, extend=1))
    assert once.draft_pool(begin(once, [0]), [0]).tokens == [1, 2, 3]
    # a budget the extension node would not enter stops it: budget 2 keeps [1, 2] already
    state = begin(drafter, [0])
    lm.forwards = 0
    assert drafter.propose(state, [0], budget=2).tokens == [1, 2] and lm.forwards == 2
    with pytest.raises(ValueError, match="extend must be an integer >= 0"):
        DraftTreeConfig(extend=-1)
    with pytest.raises(ValueError, match="extend must be an integer >= 0"):
        GraftOptions(extend=-2)
    with pytest.raises(ValueError, match="extend_min must lie in"):
        DraftTreeConfig(extend_min=1.5)


def test_extension_cap_follows_what_the_target_accepted():
    # a confident chain (0.95 per token): depth 2, then up to `extend` extension nodes
    lm = TableLM(chain_table({t: 0.95 for t in range(16)}), 16)
    drafter = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=1, extend=4, extend_adapt=True))
    state = begin(drafter, [0])
    assert state.extend_cap == 4

    def step(context: list[int], accept: int, bonus: int) -> tuple[list[int], list[int]]:
        draft = drafter.propose(state, context, budget=16)
        tree = DraftTree(tokens=draft.tokens, parents=draft.parents, sources=["draft"] * len(draft.tokens))
        new = [*draft.tokens[:accept], bonus]
        drafter.observe(state, StepResult(context[-1], tree, VerifyResult(list(range(accept)), bonus), None, context + new))
        return draft.tokens, context + new

    tokens, context = step([0], accept=2, bonus=9)
    assert tokens == [1, 2, 3, 4, 5, 6], "the full extension: 4 nodes past depth 2"
    assert state.extend_cap == 1, "none of the chain accepted: one node next time"
    tokens, context = step(context, accept=3, bonus=3)
    assert tokens == [10, 11, 12] and state.extend_cap == 3, "the chain accepted: +2"
    tokens, context = step(context, accept=4, bonus=9)
    assert tokens == [4, 5, 6, 7, 8] and state.extend_cap == 2, "2 of 3 rejected: one past the accepted one"
    drafter = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=1, extend=4))  # the default: no adaptation
    state = begin(drafter, [0])
    tokens, context = step([0], accept=2, bonus=9)
    assert tokens == [1, 2, 3, 4, 5, 6] and state.extend_cap == 4
    tokens, context = step(context, accept=0, bonus=3)
    assert tokens == [10, 11, 12, 13, 14, 15], "a rejected chain changes nothing: always 4"
    with pytest.raises(ValueError, match="extend_adapt must be a bool"):
        DraftTreeConfig(extend_adapt=1)


def test_extension_is_skipped_when_gated_or_sampled():
    lm = TableLM(chain_table({t: 0.95 for t in range(16)}), 16)
    gated = DraftModelDrafter(lm, DraftTreeConfig(depth=3, top_k=1, checkpoints=(0,), thresholds=(0.99,), extend=4))
    lm.forwards = 0
    pool = gated.draft_pool(begin(gated, [0]), [0])
    assert pool.stage == 0 and len(pool.tokens) == 1 and lm.forwards == 1, "a gated draft is not extended"
    sampled = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=1, sample=True, extend=4))
    state = begin(sampled, [0], sampling_config(temperature=1.0, seed=3))
    lm.forwards = 0
    pool = sampled.draft_pool(state, [0])
    assert lm.forwards == 2 and len(pool.layer_sizes) == 2, "sampled drafts are not extended"


def hashed_table(vocab: int = 12, seed: int = 0) -> Callable[[tuple[int, ...]], torch.Tensor]:
    """A draft whose logits for each path are random (fixed per path and seed)."""

    def fn(path: tuple[int, ...]) -> torch.Tensor:
        g = torch.Generator().manual_seed(hash((seed, path)) % (1 << 31))
        return torch.randn(vocab, generator=g) * 2.0

    return fn


@pytest.mark.parametrize("seed", range(6))
def test_a_small_budget_drafts_only_the_layers_it_can_keep(seed):
    """``budget < depth``: the drafter drafts ``budget`` layers (gated drafts: as many as their
    gates read) and the trimmed tree is the one the full depth gives, for top-k drafts, gated
    drafts (same stage) and sampled drafts (same draws)."""
    lm = TableLM(hashed_table(seed=seed), 12)
    configs = [
        DraftTreeConfig(depth=4, top_k=2, extend=4, extend_min=0.0),
        DraftTreeConfig(depth=4, top_k=2, checkpoints=(0, 1, 2), thresholds=(0.05, 0.02, 0.01)),
        DraftTreeConfig(depth=4, top_k=2, sample=True, seed=seed),
    ]
    for cfg in configs:
        drafter = DraftModelDrafter(lm, cfg)
        sampling = sampling_config(temperature=1.0, seed=seed) if cfg.sample else None
        for budget in range(1, 7):
            full_state = begin(drafter, [0, 1], sampling) if sampling else begin(drafter, [0, 1])
            lm.forwards = 0
            full = trim(drafter.draft_pool(full_state, [0, 1]), budget)
            full_forwards = lm.forwards
            state = begin(drafter, [0, 1], sampling) if sampling else begin(drafter, [0, 1])
            lm.forwards = 0
            capped = drafter.propose(state, [0, 1], budget)
            assert (capped.tokens, capped.parents) == (full.tokens, full.parents), f"{cfg}, budget {budget}"
            assert capped.stage == full.stage
            if capped.draft_probs is not None:  # each node drawn from the same distribution
                for i in range(len(capped)):
                    torch.testing.assert_close(capped.draft_probs[capped.prob_rows[i]], full.draft_probs[full.prob_rows[i]])
            if cfg.thresholds is not None:  # the gates read layers 1 .. 3
                assert lm.forwards == min(full_forwards, max(budget, 3))
            elif budget < 4:
                assert lm.forwards == budget < full_forwards, "layers past the budget are not drafted"


def assert_batch_equals_plain(engine: SpecEngine, model, prompts: list, config: GenerationConfig) -> None:
    """Sequences stepped together (one draft forward per layer for all) give plain greedy outputs."""
    seqs = [engine.start(p, config) for p in prompts]
    while not all(s.done for s in seqs):
        engine.step_batch(seqs)
    for s, p in zip(seqs, prompts):
        assert s.context[len(p):len(p) + MAX_NEW] == hf_greedy(model, p, MAX_NEW)
        engine.finish(s)


def test_early_stop_skips_the_layers_under_an_unlikely_path():
    # root 0 -> 1 (0.9) -> 2 (0.6) -> 3 (0.6) -> 4 (0.6) ...: the best path's probability
    # after each layer is 0.9, 0.54, 0.324, 0.194 (top-1: one node per layer)
    lm = TableLM(chain_table({t: 0.9 if t == 0 else 0.6 for t in range(16)}), 16)
    for stop_min, forwards in [(0.0, 4), (0.2, 4), (0.4, 3), (0.6, 2), (0.95, 1)]:
        drafter = DraftModelDrafter(lm, DraftTreeConfig(depth=4, top_k=1, stop_min=stop_min, extend=4, extend_min=0.0))
        lm.forwards = 0
        pool = drafter.draft_pool(begin(drafter, [0]), [0])
        extended = forwards == 4  # the full depth reached: the extension runs
        assert lm.forwards == forwards + (4 if extended else 0), f"stop_min {stop_min}"
        assert pool.tokens == [1, 2, 3, 4, 5, 6, 7, 8][: forwards + (4 if extended else 0)]
        assert pool.stage is None, "an early stop is not a Graft stage (the budget share stays)"
    # sampled drafts never stop early (their children lists must not depend on drawn values)
    sampled = DraftModelDrafter(lm, DraftTreeConfig(depth=3, top_k=1, sample=True, stop_min=0.95))
    lm.forwards = 0
    sampled.draft_pool(begin(sampled, [0], sampling_config(temperature=1.0, seed=3)), [0])
    assert lm.forwards == 3
    with pytest.raises(ValueError, match="stop_min must lie in"):
        DraftTreeConfig(stop_min=-0.1)


def test_narrow_expansion_feeds_one_row_per_layer():
    # after t: t + 1 at 0.7, t + 2 at 0.3. top_k 2 children per node; expand 1: only the best
    # node of each layer is fed, so layers 2.. have the best node's two children only
    lm = TableLM(chain_table({t: 0.7 for t in range(16)}), 16)
    narrow = DraftModelDrafter(lm, DraftTreeConfig(depth=3, top_k=2, expand=1))
    pool = narrow.draft_pool(begin(narrow, [0]), [0])
    assert pool.tokens == [1, 2, 2, 3, 3, 4]
    assert pool.parents == [-1, -1, 0, 0, 2, 2]
    assert pool.layer_sizes == [2, 2, 2]
    assert [len(p) for p in lm.last_paths] == [3], "the last forward fed one row (the best of layer 2)"
    assert lm.last_paths == [(0, 1, 2)]
    wide = DraftModelDrafter(lm, DraftTreeConfig(depth=3, top_k=2))  # EAGLE-2: expand = top_k
    pool = wide.draft_pool(begin(wide, [0]), [0])
    assert pool.layer_sizes == [2, 4, 4] and len(lm.last_paths) == 2
    # the narrow tree is the wide one's best nodes along its best path, with the same scores
    assert trim(narrow.draft_pool(begin(narrow, [0]), [0]), 3).tokens == trim(pool, 3).tokens
    with pytest.raises(ValueError, match="expand must be an integer >= 1"):
        DraftTreeConfig(expand=0)


@pytest.mark.parametrize("expand", [None, 1], ids=["wide", "narrow"])
@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_early_stopped_draft_tree_greedy_equals_plain_decoding(arch, expand):
    """Early stop on (tiny random models are unconfident, so a small bound stops most trees
    after one or two layers), expanding ``top_k`` nodes per layer or one: greedy outputs equal
    plain decoding, single and batched."""
    model = TINY_MODELS[arch]()
    draft = perturbed(model, scale=0.02)
    target = HFTarget(model)
    options = GraftOptions(depth=3, top_k=2, expand=expand, extend=4, extend_min=0.0, stop_min=0.02)
    drafters, composer = build_graft_method("draft-tree", target, options, draft_model=draft)
    assert drafters[0].config.stop_min == 0.02 and drafters[0].config.expand == expand
    engine = SpecEngine(target, drafters, composer, method="draft-tree")
    config = GenerationConfig(max_new_tokens=MAX_NEW, budget=8)
    prompts = make_prompts(N_PROMPTS, model.config.vocab_size)
    for prompt, _ in prompts:
        assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, MAX_NEW), f"{arch}: diverged on {prompt}"
    assert_batch_equals_plain(engine, model, [p for p, _ in prompts[:4]], config)


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_extended_draft_tree_greedy_equals_plain_decoding_and_batches_alike(arch):
    """Extension on: greedy outputs equal plain decoding, extension nodes get accepted (MAT
    above the fixed depth's cap), and a batch of sequences drafts exactly as each alone."""
    model = TINY_MODELS[arch]()
    draft = perturbed(model, scale=0.02)
    vocab = model.config.vocab_size
    target = HFTarget(model)
    options = GraftOptions(depth=2, top_k=2, extend=6, extend_min=0.0, stop_min=0.0)  # tiny random models are unconfident
    drafters, composer = build_graft_method("draft-tree", target, options, draft_model=draft)
    engine = SpecEngine(target, drafters, composer, method="draft-tree")
    config = GenerationConfig(max_new_tokens=MAX_NEW, budget=12)
    prompts = make_prompts(N_PROMPTS, vocab)
    deepest = 0
    for prompt, _ in prompts:
        seq = engine.start(prompt, config)
        while not seq.done:
            before = len(seq.context)
            engine.step(seq)
            deepest = max(deepest, len(seq.context) - before)
        got = seq.context[len(prompt):]
        engine.finish(seq)
        assert got == hf_greedy(model, prompt, MAX_NEW), f"{arch}/extended draft-tree diverged from plain greedy on {prompt}"
    assert deepest > 3, f"{arch}: no step accepted past depth 2 (+ bonus): the extension never paid ({deepest})"
    assert_batch_equals_plain(engine, model, [p for p, _ in prompts[:4]], config)


def test_vocabulary_mismatch_is_a_clear_error():
    draft = tiny_llama(vocab=80)
    with pytest.raises(ValueError, match="vocabulary has 80 tokens but the target's has 96"):
        DraftModelDrafter(draft, target_vocab=96)
    with pytest.raises(ValueError, match="vocabulary"):
        build_graft_method("draft-tree", HFTarget(tiny_llama()), GraftOptions(), draft_model=draft)


def test_presets_and_config_validation():
    assert (PRESETS["gpu"].depth, PRESETS["gpu"].top_k, PRESETS["gpu"].budget, PRESETS["gpu"].checkpoints) == (8, 10, 60, (0, 1, 5))
    assert PRESETS["cpu"].checkpoints[-1] < PRESETS["cpu"].depth - 1, "the last forward never saves anything by stopping"
    with pytest.raises(ValueError, match="checkpoint 4 needs depth > 4"):
        DraftTreeConfig(depth=4, checkpoints=(0, 4))
    with pytest.raises(ValueError, match="2 thresholds for 3 checkpoints"):
        DraftTreeConfig(depth=8, checkpoints=(0, 1, 5), thresholds=(0.1, 0.2))
    with pytest.raises(ValueError, match="unknown draft preset"):
        GraftOptions(preset="tpu")
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="seed must be an integer >= 0"):
            DraftTreeConfig(seed=bad)
        with pytest.raises(ValueError, match="seed must be an integer >= 0"):
            GraftOptions(seed=bad)


# ---- losslessness -------------------------------------------------------------------------


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_draft_tree_greedy_equals_plain_decoding(arch):
    model = TINY_MODELS[arch]()
    draft = perturbed(model)
    vocab = model.config.vocab_size
    target = HFTarget(model)
    # no cost-aware cut: a random model's flat distributions would cut every node
    # (test_cost_aware_cut_verifies_fewer_nodes_and_equals_plain_greedy covers it)
    drafters, composer = build_graft_method("draft-tree", target, GraftOptions(row_cost=0), draft_model=draft)
    engine = SpecEngine(target, drafters, composer, method="draft-tree")
    config = GenerationConfig(max_new_tokens=MAX_NEW, budget=16)
    mats = []
    for prompt, _ in make_prompts(N_PROMPTS, vocab):
        got = engine.generate_ids(prompt, config)
        assert got == hf_greedy(model, prompt, MAX_NEW), f"{arch}/draft-tree diverged from plain greedy on {prompt}"
        mats.append(engine.last_stats.mat)
    assert sum(mats) / len(mats) > 1.8, f"{arch}: mean MAT {sum(mats) / len(mats):.2f}; drafts were not accepted"


# ---- sampling -----------------------------------------------------------------------------


def test_sampled_drafts_carry_their_distribution_and_are_seeded():
    model = tiny_llama()
    draft = perturbed(model)
    target = HFTarget(model)
    options = GraftOptions(sample_drafts=True, seed=3)
    drafters, composer = build_graft_method("draft-tree", target, options, draft_model=draft)
    drafter = drafters[0]
    state = begin(drafter, [4, 5, 6], sampling_config(1.0))
    d = drafter.propose(state, [4, 5, 6], budget=12)
    assert d.scores is None and d.draft_probs is not None and d.draft_probs.shape[1] == 96
    assert d.draft_probs.shape[0] < len(d), "one q row per expanded parent, not per node"
    for i, p in enumerate(d.parents):
        assert float(d.draft_probs[d.prob_rows[i], d.tokens[i]]) > 0
        siblings = [j for j, q in enumerate(d.parents) if q == p]
        assert all(d.prob_rows[j] == d.prob_rows[i] for j in siblings), "siblings share one q row"
    assert torch.allclose(d.draft_probs.sum(-1), torch.ones(d.draft_probs.shape[0]), atol=1e-4)
    # a greedy generation drafts the top-k even with sampled drafts configured
    greedy = begin(drafter, [4, 5, 6], GenerationConfig())
    assert drafter.propose(greedy, [4, 5, 6], budget=12).draft_probs is None

    engine = SpecEngine(target, drafters, composer, method="draft-tree")
    config = GenerationConfig(max_new_tokens=20, budget=12, sampling=SamplingConfig(temperature=1.0, seed=11))
    prompt = [5, 6, 7, 5, 6, 7, 5]
    first = engine.generate_ids(prompt, config)
    assert engine.generate_ids(prompt, config) == first, "same seeds, same output"
    assert engine.last_stats.steps < 20, "rejection sampling must accept some sampled draft nodes"


def test_sampled_drafts_follow_the_generation_sampling_config():
    """q is the draft's distribution processed like the target's (top-k here): a token outside
    the draft row's top 2 is never drawn, and q is 0 there."""
    lm = TableLM(peaked_table(0.4, vocab=16), 16)
    drafter = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=4, sample=True))
    state = begin(drafter, [3, 4], sampling_config(1.0, top_k=2))
    d = drafter.propose(state, [3, 4], budget=64)
    assert all(int((row > 0).sum()) == 2 for row in d.draft_probs)
    assert all(float(d.draft_probs[d.prob_rows[i], t]) > 0 for i, t in enumerate(d.tokens))


N_STAT = 3000


def sampled_drafter(lm: TableLM, config: DraftTreeConfig) -> tuple[DraftModelDrafter, dict, "Callable[[], None]"]:
    """A sampling drafter, a holder of its current state, and ``new_sequence`` for :func:`sample_sequences`."""
    drafter = DraftModelDrafter(lm, config)
    holder: dict = {}

    def new_sequence() -> None:
        if "state" in holder:
            drafter.end(holder["state"])
        holder["state"] = begin(drafter, PROMPT, sampling_config(1.0))

    return drafter, holder, new_sequence


def as_tree(d) -> DraftTree:
    return DraftTree(tokens=d.tokens, parents=d.parents, sources=["draft"] * len(d), draft_probs=d.draft_probs, prob_rows=d.prob_rows)


def test_sampled_draft_tree_matches_target_law():
    """Statistical losslessness of rejection sampling over the drafter's sampled trees (bound as
    in ``test_sampling_stats.py``): depth 2, budget cuts, a V = 4 synthetic target."""
    target = SyntheticTarget(SamplingConfig(temperature=1.0), seed=2)
    law = target.exact_law()
    drafter, holder, new_sequence = sampled_drafter(TableLM(random_table(4, seed=5), 4), DraftTreeConfig(depth=2, top_k=3, sample=True, seed=1))

    def make_tree(context):
        return as_tree(drafter.propose(holder["state"], context, budget=5)), [(drafter, holder["state"])]

    counts, per_step = sample_sequences(target, make_tree, N_STAT, 3, seed=4, new_sequence=new_sequence)
    tv, bound = total_variation(counts, law, N_STAT), tv_bound(law, N_STAT)
    assert per_step > 1.3, f"sampled drafts must be accepted often ({per_step:.2f} tokens/step)"
    assert tv <= bound, f"TV {tv:.4f} exceeds the derived bound {bound:.4f}"


def test_value_dependent_cut_of_sampled_children_is_caught():
    """Negative control: keeping sampled children by their own scores (instead of a prefix)
    biases rejection sampling, and the same bound catches it."""
    target = SyntheticTarget(SamplingConfig(temperature=1.0), seed=2)
    law = target.exact_law()
    drafter, holder, new_sequence = sampled_drafter(TableLM(random_table(4, seed=5), 4), DraftTreeConfig(depth=1, top_k=4, sample=True, seed=1))

    def make_tree(context):
        pool = drafter.propose(holder["state"], context, budget=1 << 10)
        log_q = [float(pool.draft_probs[pool.prob_rows[i], t].log()) for i, t in enumerate(pool.tokens)]
        # WRONG: keep the single most likely sampled child
        return as_tree(pool.subset(best_first(pool.parents, log_q, 1))), [(drafter, holder["state"])]

    counts, _ = sample_sequences(target, make_tree, N_STAT, 3, seed=4, new_sequence=new_sequence)
    tv, bound = total_variation(counts, law, N_STAT), tv_bound(law, N_STAT)
    assert tv > bound, f"a biased cut passed (TV {tv:.4f} <= bound {bound:.4f}); the test has no teeth"


def test_trim_keeps_prefixes_of_sampled_children():
    lm = TableLM(random_table(4, seed=5), 4)
    drafter = DraftModelDrafter(lm, DraftTreeConfig(depth=3, top_k=3, sample=True))
    state = begin(drafter, [0, 1], sampling_config(1.0))
    pool = drafter.draft_pool(state, [0, 1])
    for n in range(len(pool) + 1):
        kept = trim(pool, n)
        assert kept.tokens == pool.tokens[:n] and kept.parents == pool.parents[:n] and kept.prob_rows == pool.prob_rows[:n]


def test_long_chains_keep_confident_nodes_past_the_tree_budget():
    """``tree_budget``: unsure nodes past it are dropped, confident ones kept up to the budget;
    a generation with it equals plain greedy decoding."""
    lm = TableLM(chain_table({t: 0.95 for t in range(2, 14)}), 16)
    loose = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=2, extend=8, extend_min=0.3))
    long = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=2, extend=8, extend_min=0.3, tree_budget=3))
    context = [1, 2]
    a = loose.propose(begin(loose, context), context, 12)
    b = long.propose(begin(long, context), context, 12)
    probs = [math.exp(s) for s in b.scores]
    assert len(b) < len(a) and all(p >= 0.3 for p in sorted(probs, reverse=True)[3:]), "past the tree budget only confident nodes"
    assert len(b) > 3, "a confident chain grows past the tree budget"
    model = tiny_llama()
    drafter = DraftModelDrafter(perturbed(model), DraftTreeConfig(depth=3, top_k=2, extend=6, tree_budget=4), target_vocab=96)
    engine = SpecEngine(HFTarget(model), [drafter], GraftComposer(graft_config("draft-tree")))
    config = GenerationConfig(max_new_tokens=MAX_NEW, budget=12)
    for prompt, _ in make_prompts(20):
        assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, MAX_NEW)


@pytest.mark.preset_cut
def test_cpu_preset_gives_draft_tree_long_chains_and_graft_its_budget():
    from specgraft.methods import MethodOptions
    from specgraft.methods.registry import method_budget

    fixed = MethodOptions(cost_table=None)
    assert method_budget("draft-tree", fixed) == PRESETS["cpu"].long_budget == 16
    assert method_budget("graft-prune", fixed) == method_budget("graft", fixed) == PRESETS["cpu"].budget == 8
    lm = tiny_llama()
    for variant, tree_budget, extend, row_cost in (("draft-tree", 8, 12, 0.05), ("graft-prune", None, 8, None)):
        drafters, _ = build_graft_method(variant, HFTarget(lm), GraftOptions(), draft_model=perturbed(lm))
        cfg = drafters[0].config
        assert (cfg.tree_budget, cfg.extend, cfg.row_cost, cfg.copy_ahead) == (tree_budget, extend, row_cost, 7), variant
    drafters, _ = build_graft_method("draft-tree", HFTarget(lm), GraftOptions(copy_ahead=0), draft_model=perturbed(lm))
    assert drafters[0].config.copy_ahead == 0, "0 turns copy-ahead off"
    with pytest.raises(ValueError, match="copy_ahead must be"):
        GraftOptions(copy_ahead=-1)
    for given, row_cost in ((0, None), (0.1, 0.1)):
        drafters, _ = build_graft_method("draft-tree", HFTarget(lm), GraftOptions(row_cost=given), draft_model=perturbed(lm))
        assert drafters[0].config.row_cost == row_cost, "0 turns the cut off; a value overrides the preset's"
    with pytest.raises(ValueError, match="row_cost must be >= 0"):
        GraftOptions(row_cost=-0.1)
    with pytest.raises(ValueError, match="row_cost must be >= 0"):
        DraftTreeConfig(row_cost=float("nan"))


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_cost_aware_cut_verifies_fewer_nodes_and_equals_plain_greedy(arch):
    """``row_cost``: a step verifies the best-first prefix of its kept nodes that maximises
    expected tokens per cost (path probabilities as acceptance), so unlikely nodes are not
    verified, some likely ones are, and every output still equals plain greedy decoding. The
    target's output layer is scaled up so that its distributions (and the perturbed draft's)
    are peaked enough for the cut to fall inside the trees."""
    model = TINY_MODELS[arch]()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    draft, target = perturbed(model), HFTarget(model)
    config = GenerationConfig(max_new_tokens=MAX_NEW, budget=16)
    nodes = {}
    for row_cost in (0, 0.05):
        drafters, composer = build_graft_method("draft-tree", target, GraftOptions(row_cost=row_cost), draft_model=draft)
        engine = SpecEngine(target, drafters, composer, method="draft-tree")
        total = steps = 0
        for prompt, _ in make_prompts(10, model.config.vocab_size):
            assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, MAX_NEW), f"{arch}, row_cost {row_cost}"
            total, steps = total + engine.last_stats.tree_nodes, steps + engine.last_stats.steps
        nodes[row_cost] = total / steps
    assert 0 < nodes[0.05] < nodes[0], nodes


def test_copy_ahead_drafts_the_same_chain_in_fewer_forwards():
    """``copy_ahead``: an extension forward also feeds the tokens that followed the path's last
    n-gram earlier in the context; the chain keeps them while the draft's own top token equals
    the guess, so the pool is the plain extension's, drafted in fewer forwards, whether the
    guess holds all the way, breaks off mid-way, or never starts."""
    lm = TableLM(chain_table({t: 0.95 for t in range(16)}, vocab=32), 32)
    # the chain after root 0 is 1, 2, 3, ...; the context holds 0, 1, 2, 3, 4, 5 (a 3-gram match
    # for the path's 0, 1, 2) followed by the chain (a) or breaking off after 4 (b), or no match (c)
    contexts = {
        "whole": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 20, 0],
        "breaks": [0, 1, 2, 3, 4, 30, 31, 20, 0],
        "none": [20, 21, 22, 0],
    }
    for name, context in contexts.items():
        pools, forwards = {}, {}
        for ahead in (0, 4):
            drafter = DraftModelDrafter(lm, DraftTreeConfig(depth=2, top_k=1, extend=8, extend_min=0.3, copy_ahead=ahead))
            lm.forwards = 0
            pools[ahead] = drafter.draft_pool(begin(drafter, context), context)
            forwards[ahead] = lm.forwards
        assert pools[4].tokens == pools[0].tokens == list(range(1, 11)), name
        assert pools[4].parents == pools[0].parents and pools[4].scores == pytest.approx(pools[0].scores), name
        assert forwards[0] == 2 + 8, name
        # whole: 8 extension nodes in forwards of 1 + 4 rows: 5 + 3 nodes; breaks: the guess
        # [3, 4, 30, 31] holds for 3, 4 (three nodes), then 1 + 4 rows guessing nothing more
        assert forwards[4] == {"whole": 2 + 2, "breaks": 2 + 6, "none": 2 + 8}[name], (name, forwards)
    # an extension that stops on confidence stops at the same node with or without guesses
    weak = TableLM(chain_table({0: 0.95, 1: 0.95, 2: 0.95, 3: 0.6, 4: 0.6}, vocab=32), 32)
    got = {}
    for ahead in (0, 6):
        drafter = DraftModelDrafter(weak, DraftTreeConfig(depth=2, top_k=1, extend=8, extend_min=0.3, copy_ahead=ahead))
        got[ahead] = drafter.draft_pool(begin(drafter, contexts["whole"]), contexts["whole"]).tokens
    assert got[6] == got[0] == [1, 2, 3, 4, 5, 6], "fed 5 at path probability .31, not 6 at .15"
    with pytest.raises(ValueError, match="copy_ahead must be"):
        DraftTreeConfig(copy_ahead=-1)
    with pytest.raises(ValueError, match="copy_ngram must be"):
        DraftTreeConfig(copy_ngram=0)


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_copy_ahead_draft_tree_greedy_equals_plain_decoding_and_its_plain_twin(arch):
    """With guessed rows in the extension forwards, outputs equal plain greedy decoding, every
    step verifies the same tree as without them (same steps and nodes), and some drafting
    forwards are saved on prompts that repeat themselves."""
    model = TINY_MODELS[arch]()
    draft = perturbed(model, scale=0.02)
    target = HFTarget(model)
    config = GenerationConfig(max_new_tokens=MAX_NEW, budget=12)
    stats = {}
    for ahead in (0, 6):
        options = GraftOptions(depth=2, top_k=2, extend=6, extend_min=0.0, stop_min=0.0, copy_ahead=ahead)
        drafters, composer = build_graft_method("draft-tree", target, options, draft_model=draft)
        engine = SpecEngine(target, drafters, composer, method="draft-tree")
        steps = nodes = forwards = 0
        for prompt, _ in make_prompts(20, model.config.vocab_size):
            seq = engine.start(prompt, config)
            while not seq.done:
                engine.step(seq)
                forwards += len(seq.drafter_states[0].forward_s)
            got = seq.context[len(prompt):]
            engine.finish(seq)
            assert got == hf_greedy(model, prompt, MAX_NEW), f"{arch}, copy_ahead {ahead}"
            steps, nodes = steps + engine.last_stats.steps, nodes + engine.last_stats.tree_nodes
        stats[ahead] = (steps, nodes, forwards)
    assert stats[6][:2] == stats[0][:2], stats
    assert stats[6][2] < stats[0][2], stats
