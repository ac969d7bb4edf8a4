"""AdaPLD (``drafters/adapld/``): retrieval rules on hand-made memories, the adapter's layer
hidden states and top-k, greedy losslessness of every variant, exact seeded sampling."""

import random

import numpy as np
import pytest
import torch

from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.drafters.adapld import AdaPLDConfig, AdaPLDDrafter, AdaPLDState, build_adapld
from specgraft.drafters.pld import CopyRates
from specgraft.engine import PrefillFusion, SpecEngine
from specgraft.methods import MethodOptions, get_method
from specgraft.methods.model_free import ADAPLD_METHODS
from specgraft.models.hf import HFTarget
from specgraft.types import DraftTree, PrefillRequest, StepResult, VerifyResult

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS

H = 4


def state_for(tokens, hidden, top_ids=None, top_probs=None, k=3) -> AdaPLDState:
    n = len(hidden)
    cfg = AdaPLDConfig()
    return AdaPLDState(
        tokens=np.asarray(tokens, dtype=np.int64),
        hidden=np.asarray(hidden, dtype=np.float32),
        top_ids=np.asarray(top_ids if top_ids is not None else np.zeros((n, k)), dtype=np.int64),
        top_probs=np.asarray(top_probs if top_probs is not None else np.zeros((n, k)), dtype=np.float32),
        known=n,
        rates=CopyRates(cfg.prior_first, cfg.prior_later, cfg.prior_strength),
        branch_rate=CopyRates((1.0,), (1.0,), 8.0),
        successor_rate=CopyRates((0.4,), (0.4,), 8.0),
    )


def unit(*v):
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


def drafter(vocab=16, **kw) -> AdaPLDDrafter:
    return AdaPLDDrafter(torch.eye(vocab, 16), layer=1, config=AdaPLDConfig(**kw))


E1, E2 = unit(1, 0, 0, 0), unit(0, 1, 0, 0)


def test_reranking_picks_the_anchor_whose_preceding_state_matches():
    # memory 9 5 7 1 | 5 2 8 3 | 5 (root, position 8): lexical anchors of 5 at 1 and 4. The state
    # after x_0 matches the one after x_7 (the query's preceding context); the one after x_3 does not
    tokens = [9, 5, 7, 1, 5, 2, 8, 3, 5]
    hidden = [E1, E2, E2, E2, E2, E2, E2, E1]  # positions 0..7 known
    draft = drafter(min_prob=0.0, branches=False).propose(state_for(tokens, hidden), tokens, budget=64)
    assert draft.tokens == [7, 1, 5, 2, 8, 3, 5] and draft.parents == list(range(-1, 6))
    # PLD's rule, the most recent anchor, without reranking
    plain = drafter(min_prob=0.0, branches=False, rerank=False).propose(state_for(tokens, hidden), tokens, budget=64)
    assert plain.tokens == [2, 8, 3, 5]
    # max_copy caps the copy; an anchor at position 0 has no preceding state and ranks last
    assert drafter(min_prob=0.0, branches=False, max_copy=2).propose(state_for(tokens, hidden), tokens, 64).tokens == [7, 1]
    tokens0 = [5, 7, 1, 5, 2, 5]
    hidden0 = [E1, E1, E1, E1, E1]
    assert drafter(min_prob=0.0, branches=False).propose(state_for(tokens0, hidden0), tokens0, 64).tokens == [2, 5]


def test_kept_search_set_finds_what_the_plain_twin_finds():
    """The semantic fallback over ``state.seen`` (distinct tokens kept as the memory grows) gives
    the plain twin's candidates for every query and end, at every memory length."""
    rng = np.random.default_rng(0)
    emb = torch.randn(40, 8)
    emb[20:] = emb[:20] + 0.3 * torch.randn(20, 8)  # near neighbours, so the fallback finds some
    d = AdaPLDDrafter(emb, 1, AdaPLDConfig(threshold=0.7))
    full = rng.integers(0, 40, 120)
    st = state_for(full[:1], [E1], [[0, 1, 2]], [[0.6, 0.3, 0.1]])
    semantic = 0
    for length in range(1, len(full) + 1):
        mem = full[:length]
        for end in {length - 1, length // 2, 1}:
            for query in rng.integers(0, 40, 6):
                kept, lex = d.candidates(st, mem, int(query), end)
                plain, plex = d.candidates_plain(mem, int(query), end)
                assert lex == plex and kept.tolist() == plain.tolist(), (length, end, query)
                semantic += not lex and len(kept) > 0
    assert semantic > 50 and st.seen.n == len(set(full.tolist()))


def test_semantic_fallback_only_without_a_lexical_anchor():
    emb = torch.zeros(16, 4)
    emb[3] = torch.tensor([1.0, 0, 0, 0])
    emb[4] = torch.tensor([0.9, 0.1, 0, 0])  # close to 3
    emb[5] = torch.tensor([0, 1.0, 0, 0])
    emb[9] = torch.tensor([0, 0, 1.0, 0])
    d = AdaPLDDrafter(emb, 1, AdaPLDConfig(threshold=0.8, min_prob=0.0))
    mem = np.array([5, 4, 9, 5, 3])
    hidden = [E1] * 4
    top_ids = [[0, 1, 2]] * 4
    top_ids[1] = [7, 8, 6]
    top_probs = [[0.6, 0.3, 0.1]] * 4
    st = state_for(mem, hidden, top_ids, top_probs)
    cands, lexical = d.candidates(st, mem, 3, 4)
    assert not lexical and cands.tolist() == [1]
    cands, lexical = d.candidates(st, mem, 5, 4)
    assert lexical and cands.tolist() == [0, 3]
    assert d.candidates(st, mem, 3, 4)[0].tolist() == [1]
    off = AdaPLDDrafter(emb, 1, AdaPLDConfig(threshold=0.8, fallback=False))
    assert off.candidates(st, mem, 3, 4)[0].tolist() == []
    # a semantic anchor gives no main copy, only branches from its distribution
    st = state_for(mem, hidden, top_ids, top_probs)
    draft = AdaPLDDrafter(emb, 1, AdaPLDConfig(threshold=0.8, min_prob=0.0, successors=False, branch_k=3)).propose(st, mem.tolist(), 64)
    assert draft.tokens == [7, 8, 6] and draft.parents == [-1, -1, -1]
    assert st.anchors["semantic"] == 1


def test_branches_skip_the_main_token_and_get_successors():
    # memory: 1 2 3 | 6 4 | 1 (root). Anchor 0 (token 1): main copy 2 3 6 4 1; the anchor's
    # top-3 are 2 (= main's first, dropped), 6, 9; successor of 6: 4 (after position 3), 9: none
    tokens = [1, 2, 3, 6, 4, 1]
    hidden = [E1] * 5
    top_ids = [[2, 6, 9]] + [[0, 0, 0]] * 4
    top_probs = [[0.5, 0.3, 0.2]] + [[0.0, 0.0, 0.0]] * 4
    st = state_for(tokens, hidden, top_ids, top_probs)
    d = drafter(min_prob=0.0, branch_k=3, fallback=False)
    draft = d.propose(st, tokens, 64)
    assert draft.tokens == [2, 3, 6, 4, 1, 6, 4, 9]
    assert draft.parents == [-1, 0, 1, 2, 3, -1, 5, -1]
    # estimated acceptance only shrinks along a path, branches follow the anchor's probabilities
    s = draft.scores
    assert s[5] == pytest.approx(0.3) and s[7] == pytest.approx(0.2) and s[6] < s[5]
    assert all(s[i] <= (s[p] if p >= 0 else 1.0) for i, p in enumerate(draft.parents))
    # pruning keeps a tree and the best nodes
    pruned = drafter(min_prob=0.25, branch_k=3, fallback=False).propose(state_for(tokens, hidden, top_ids, top_probs), tokens, 64)
    assert all(p < i for i, p in enumerate(pruned.parents)) and min(pruned.scores) >= 0.25
    capped = d.propose(state_for(tokens, hidden, top_ids, top_probs), tokens, 3)
    assert len(capped) == 3


def test_observe_keeps_the_memory_in_step_and_learns():
    tokens = [1, 2, 3, 1]
    st = state_for(tokens, [E1] * 3, [[2, 5, 6]] * 3, [[0.7, 0.2, 0.1]] * 3)
    d = drafter(vocab=16, min_prob=0.0, branch_k=2, fallback=False)
    draft = d.propose(st, tokens, 64)  # main copy 2 3 1, branch 5
    tree = DraftTree(tokens=draft.tokens, parents=draft.parents, sources=["adapld"] * len(draft))
    logits = torch.randn(len(draft) + 1, 16)
    hidden = torch.randn(len(draft) + 1, H)
    # the target accepted the main copy's 2 and 3, then said 7
    step = StepResult(root_token=1, tree=tree, verify=VerifyResult(accepted=[0, 1], bonus_token=7), logits=logits,
                      context=tokens + [2, 3, 7], hidden=hidden)
    before = st.rates.rate(1, 1)
    d.observe(st, step)
    assert st.known == len(step.context) - 1 == 6
    assert st.top_ids[4].tolist() == logits[1].topk(3).indices.tolist()  # position 4 = row 1 (node 0)
    assert np.allclose(st.hidden[3], (hidden[0] / hidden[0].norm()).numpy(), atol=1e-6)
    assert st.rates.rate(1, 1) > before  # a right first copy


def test_packed_rows_equal_the_three_copies():
    """observe's one device-to-host copy (``rows_to_host``) gives what ``top_rows`` and ``unit_rows`` give
    (the probabilities through ``log_softmax``: equal to a sum of 151,936 float32 terms' rounding)."""
    from specgraft.drafters.adapld import rows_to_host, top_rows, unit_rows

    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(5, 151_936, generator=gen) * 4).to(dtype)
        hidden = torch.randn(5, 64, generator=gen).to(dtype)
        ids, probs, units = rows_to_host(logits, hidden, 9)
        ids_plain, probs_plain = top_rows(logits, 9)
        assert ids.dtype == ids_plain.dtype and np.array_equal(ids, ids_plain)
        assert np.allclose(probs, probs_plain, rtol=1e-4, atol=1e-9)
        assert np.array_equal(units, unit_rows(hidden))
        ids_only, probs_only, none = rows_to_host(logits, None, 9)
        assert np.array_equal(ids_only, ids_plain) and np.array_equal(probs_only, probs) and none is None


def test_prefill_and_verify_give_layer_states_and_topk_like_a_full_forward():
    model = TINY_MODELS["qwen2"](layers=3)
    target = HFTarget(model, prefill_chunk=5)
    prompt = list(range(3, 15))
    slot = target.allocate()
    out = target.prefill(slot, prompt, PrefillRequest(topk=4, hidden=True, topk_probs=True, hidden_layer=2))
    with torch.no_grad():
        full = model(torch.tensor([prompt]), output_hidden_states=True)
    assert torch.allclose(out.hidden, full.hidden_states[2][0], atol=1e-5)
    probs = full.logits[0].softmax(-1)
    assert out.topk.tolist() == probs.topk(4).indices.tolist()
    assert torch.allclose(out.topk_probs, probs.topk(4).values, atol=1e-5)
    tree = DraftTree(tokens=[20, 21], parents=[-1, 0], sources=["x", "x"])
    rows = target.forward_tree(slot, 15, tree, output_hidden=True, hidden_layer=2)
    with torch.no_grad():
        chain = model(torch.tensor([prompt + [15, 20, 21]]), output_hidden_states=True)
    assert torch.allclose(rows.hidden, chain.hidden_states[2][0, -3:], atol=1e-5)
    with pytest.raises(ValueError, match="hidden layer 3"):
        target.forward_tree(slot, 15, tree, output_hidden=True, hidden_layer=3)
    with pytest.raises(ValueError, match="two layers"):
        PrefillRequest(hidden=True, hidden_layer=1).union(PrefillRequest(hidden=True, hidden_layer=2))


def test_build_checks_the_layer():
    target = HFTarget(TINY_MODELS["llama"]())
    assert build_adapld(target, AdaPLDConfig()).hidden_layer == 1
    with pytest.raises(ValueError, match="layer 2 is not in 1 .. 1"):
        build_adapld(target, AdaPLDConfig(layer=2))
    with pytest.raises(ValueError, match="threshold"):
        AdaPLDConfig(threshold=2.0)


@pytest.mark.parametrize("name", sorted(ADAPLD_METHODS))
def test_greedy_equals_plain_decoding(name):
    """>= 50 prompts per variant (half repetitive), alternating the two tiny architectures."""
    arch = sorted(TINY_MODELS)[sorted(ADAPLD_METHODS).index(name) % 2]
    model = TINY_MODELS[arch]()
    target = HFTarget(model)
    drafters, composer = get_method(name).build(target, MethodOptions())
    engine = SpecEngine(target, drafters, composer, method=name)
    config = GenerationConfig(max_new_tokens=16, budget=get_method(name).default_budget)
    mats = []
    for prompt, repetitive in make_prompts(vocab=model.config.vocab_size):
        assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, 16), f"{arch}/{name} diverged on {prompt}"
        if repetitive:
            mats.append(engine.last_stats.mat)
    assert sum(mats) / len(mats) > 1.3, f"{name}: drafts were not accepted"


@pytest.mark.parametrize("name", ["adapld", "adapld-full"])
def test_seeded_sampling_equals_plain_sampling(name):
    """AdaPLD's nodes are deterministic, so each parent uses sample-and-match: one target draw per
    emitted token, in order. With the same seed the output is ``ar``'s token for token, which
    proves the output law is the target's (sharper than a statistical test)."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    engines = {}
    for m in ("ar", name):
        drafters, composer = get_method(m).build(target, MethodOptions())
        engines[m] = SpecEngine(target, drafters, composer, method=m)
    rng = random.Random(5)
    accepted = 0
    for seed in range(6):
        unit_ = [rng.randrange(3, 96) for _ in range(rng.randint(2, 5))]
        prompt = (unit_ * 8)[: rng.randint(8, 30)]
        config = GenerationConfig(max_new_tokens=20, budget=16, sampling=SamplingConfig(temperature=0.5, top_p=0.95, seed=seed))
        assert engines[name].generate_ids(prompt, config) == engines["ar"].generate_ids(prompt, config)
        accepted += engines[name].last_stats.new_tokens - engines[name].last_stats.steps
    assert accepted > 0


def test_prompt_logits_on_demand_equal_a_full_forward():
    """The prefill keeps final hidden states, not the prompt's [T, V] logits; an anchor's top-k
    computed from them on first use equals the full forward's (through the target's own head:
    ``anchor_logits="exact"``, the twin of the int8 drafting head)."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    drafter = build_adapld(target, AdaPLDConfig(anchor_logits="exact"))
    request = drafter.prefill_request()
    assert request.topk == 0 and request.final_hidden
    prompt = [5, 9, 12, 5, 40, 33, 5]
    slot = target.allocate()
    state = drafter.begin(prompt, target.prefill(slot, prompt[:-1], request), GenerationConfig())
    assert state.known == 6 and not state.has_top.any()
    with torch.no_grad():
        probs = model(torch.tensor([prompt[:-1]])).logits[0].softmax(-1)
    ids, p = drafter.top_of(state, 3)
    assert ids.tolist() == probs[3].topk(drafter.top_k).indices.tolist()
    assert np.allclose(p, probs[3].topk(drafter.top_k).values.numpy(), atol=1e-5)
    assert state.has_top.tolist() == [False, False, False, True, False, False]


def test_prompt_logits_at_once_give_the_on_demand_trees():
    """``prompt_logits="at-once"`` (a GPU's default) computes every prompt position's top-k when
    the prompt's rows arrive and reads it on first use: the same top-k as on demand (to float32
    rounding of a batched head), hence the same trees, steps and tokens, equal to plain decoding."""
    model = TINY_MODELS["qwen2"]()
    target = HFTarget(model)
    config = GenerationConfig(max_new_tokens=16, budget=16)
    runs = {}
    for mode in ("on-demand", "at-once"):
        cfg = AdaPLDConfig(anchor_logits="exact", prompt_logits=mode, min_prob=0.0)
        drafter = build_adapld(target, cfg)
        # the prompt's rows at begin (no fused start): the memory is inspected after
        engine = SpecEngine(target, [drafter], get_method("adapld").build(target, MethodOptions())[1], method="adapld",
                            fusion=PrefillFusion.OFF)
        out = []
        for prompt, _ in make_prompts(12, model.config.vocab_size):
            seq = engine.start(prompt, config)
            state = seq.drafter_states[0]
            assert (state.prompt_top is not None) == (mode == "at-once")
            while not seq.done:
                engine.step(seq)
            used = np.flatnonzero(state.has_top[: len(prompt) - 1])
            out.append((list(seq.new_tokens), seq.stats.steps, used.tolist(), state.top_ids[used].tolist(), state.top_probs[used]))
            engine.finish(seq)
            assert out[-1][0] == hf_greedy(model, prompt, 16)
        runs[mode] = out
    assert any(len(r[2]) for r in runs["on-demand"]), "no prompt anchor's distribution was used"
    for a, b in zip(runs["on-demand"], runs["at-once"], strict=True):
        assert a[:4] == b[:4]
        assert np.allclose(a[4], b[4], rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="prompt_logits"):
        AdaPLDConfig(prompt_logits="sometimes")


def test_lazy_successors_equal_the_whole_tree_cut_after():
    """``lazy`` (the default) looks a successor up only when it can pass ``min_prob``, or in
    ``observe`` when its branch was right; the plain twin builds every successor and cuts after.
    Same trees, step by step, and the same learned rates, on generations where successors are
    deferred (a successor prior of 0.15 keeps most of them under the cut)."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    config = GenerationConfig(max_new_tokens=24, budget=16)
    runs = {}
    for lazy in (True, False):
        cfg = AdaPLDConfig(lazy=lazy, prior_successor=0.15, min_prob=0.05)
        drafter = build_adapld(target, cfg)
        drafts, rates, deferred = [], [], []
        propose, observe = drafter.propose, drafter.observe

        def recording_propose(state, context, budget, propose=propose, drafts=drafts, deferred=deferred):
            draft = propose(state, context, budget)
            drafts.append((draft.tokens, draft.parents, [round(s, 9) for s in draft.scores]))
            deferred.append(len(state.last[4]) if state.last else 0)
            return draft

        def recording_observe(state, step, observe=observe, rates=rates):
            observe(state, step)
            rates.append([r.hits.ravel().tolist() + r.tries.ravel().tolist() for r in (state.rates, state.branch_rate, state.successor_rate)])

        drafter.propose, drafter.observe = recording_propose, recording_observe
        engine = SpecEngine(target, [drafter], get_method("adapld").build(target, MethodOptions())[1], method="adapld")
        for prompt, _ in make_prompts(vocab=model.config.vocab_size)[:20]:
            engine.generate_ids(prompt, config)
        runs[lazy] = drafts, rates, deferred
    assert runs[True][0] == runs[False][0] and runs[True][1] == runs[False][1]
    assert sum(runs[True][2]) > 0 and sum(runs[False][2]) == 0  # successors were deferred, and only lazily


def test_a_deferred_successor_is_learned_when_its_branch_was_right():
    # memory 1 2 3 6 4 1 (root): branch 6 (q 0.3) has the successor 4, whose estimate 0.3 * 0.15
    # is under the cut: the lazy drafter leaves it out, and learns it when 6 and then 4 come true
    tokens = [1, 2, 3, 6, 4, 1]
    top_ids, top_probs = [[2, 6, 9]] + [[0, 0, 0]] * 4, [[0.5, 0.3, 0.2]] + [[0.0, 0.0, 0.0]] * 4
    learned = {}
    for lazy in (True, False):
        d = drafter(min_prob=0.1, branch_k=2, fallback=False, lazy=lazy, prior_successor=0.15)
        st = state_for(tokens, [E1] * 5, top_ids, top_probs)
        st.successor_rate = CopyRates((0.15,), (0.15,), 8.0)
        draft = d.propose(st, tokens, 64)
        assert 4 not in draft.tokens[5:]  # the successor is not proposed either way
        assert (len(st.last[4]), len(st.last[0])) == ((2, 7) if lazy else (0, 8))  # deferred: 6 and 9
        tree = DraftTree(tokens=draft.tokens, parents=draft.parents, sources=["adapld"] * len(draft))
        node6 = draft.tokens.index(6)
        step = StepResult(root_token=1, tree=tree, verify=VerifyResult(accepted=[node6], bonus_token=4),
                          logits=torch.randn(len(draft) + 1, 16), context=tokens + [6, 4], hidden=torch.randn(len(draft) + 1, H))
        d.observe(st, step)
        learned[lazy] = st.successor_rate.hits.tolist(), st.successor_rate.tries.tolist()
    assert learned[True] == learned[False] == ([[1.0, 0.0]], [[1.0, 0.0]])


def test_no_prompt_logits_when_no_branch_can_pass_the_cut():
    """A branch's estimate ``c * q`` never exceeds ``c``: with ``c`` under the cut a prompt anchor's
    logits (a row of the output embedding) are not computed and it gets no branches; a generated
    anchor's distribution is at hand and its branches are still built (and learned from)."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    calls = []
    drafter = build_adapld(target, AdaPLDConfig(prior_branch=0.05, min_prob=0.1))
    logits_of = drafter.logits_of
    drafter.logits_of = lambda h: calls.append(len(h)) or logits_of(h)
    prompt = [5, 9, 12, 5, 40, 33, 5]
    slot = target.allocate()
    state = drafter.begin(prompt, target.prefill(slot, prompt[:-1], drafter.prefill_request()), GenerationConfig())
    draft = drafter.propose(state, prompt, 16)
    assert calls == [] and state.last[2] == [0] * len(state.last[2])  # main copy only: 40 33 5
    assert draft.tokens == [40, 33, 5][: len(draft)]
    # above the cut the anchor's logits are computed once, its branches built
    eager = build_adapld(target, AdaPLDConfig(prior_branch=1.0, min_prob=0.1))
    eager.logits_of = drafter.logits_of
    state = eager.begin(prompt, target.prefill(target.allocate(), prompt[:-1], eager.prefill_request()), GenerationConfig())
    eager.propose(state, prompt, 16)
    assert calls == [1] and 1 in state.last[2]


def test_the_drafting_head_is_an_int8_copy_close_to_the_target_head():
    """``anchor_logits="draft"`` (the default) computes a prompt anchor's distribution through
    ``HFTarget.draft_head()``, an int8 copy of the output embedding on a CPU; ``"exact"`` is the
    plain twin. The copy's logits stay within a few percent of the head's range, the top tokens
    agree where the head has a margin, and greedy outputs are plain decoding's either way."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    head = target.draft_head()
    assert head != target.logits_of and target.draft_head() is head, "built once, kept"
    hidden = torch.randn(64, model.config.hidden_size, generator=torch.Generator().manual_seed(0)) * 3
    exact, approx = target.logits_of(hidden), head(hidden)
    assert approx.dtype == torch.float32 and approx.shape == exact.shape
    scale = exact.abs().amax(-1, keepdim=True)
    # int8 weights, 7-bit activations: within 3% of a row's range here (5% on the qwen2 tiny model)
    assert ((approx - exact).abs() <= 0.06 * scale).all()
    top2 = exact.topk(2).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.1 * scale[:, 0]
    assert clear.sum() > 10 and (approx.argmax(-1) == exact.argmax(-1))[clear].all()
    for anchor_logits in ("draft", "exact"):
        drafter = build_adapld(target, AdaPLDConfig(anchor_logits=anchor_logits))
        assert drafter.logits_of == (head if anchor_logits == "draft" else target.logits_of)
        engine = SpecEngine(target, [drafter], method="adapld")
        for prompt, _ in make_prompts(20, vocab=model.config.vocab_size):
            assert engine.generate_ids(prompt, GenerationConfig(max_new_tokens=12, budget=16)) == hf_greedy(model, prompt, 12)
    with pytest.raises(ValueError, match="anchor_logits"):
        AdaPLDConfig(anchor_logits="int4")
