"""PTD (progressive tree drafting) and probe nodes: mechanics, greedy and sampling losslessness."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.drafters.ptd import PerturbationTree, PoolNode, PTDConfig, PTDDrafter, merge_into_pool, pool_candidates
from specgraft.engine import SpecEngine
from specgraft.models.hf import HFTarget
from specgraft.tree.build import merge_drafts, truncate_depth
from specgraft.types import Draft, DraftTree, GenerationStats, StepResult, VerifyResult
from specgraft.verify import verify_greedy, verify_sample_match
from specgraft.verify.reference import reference_greedy, reference_sample_match

from tests.conftest import TINY_MODELS
from tests.test_greedy_lossless import hf_greedy, make_prompts
from tests.test_sampling_stats import PROMPT, SyntheticTarget, node_pairs, tv_bound


# ---- probe nodes in trees, merging and verification ---------------------------------------


def test_probe_nodes_are_never_accepted():
    # root -> 5 (candidate), root -> 6 (probe) -> 7 (probe); argmax after root is 6
    tree = DraftTree(tokens=[5, 6, 7], parents=[-1, -1, 1], sources=["ptd"] * 3, probe=[False, True, True])
    logits = torch.full((4, 10), -1.0)
    logits[0, 6] = 1.0  # root: the probe's token
    logits[2, 7] = 1.0  # at the probe: its child's token
    assert verify_greedy(tree, logits) == VerifyResult(accepted=[], bonus_token=6)
    assert reference_greedy(tree, logits) == verify_greedy(tree, logits)
    for seed in range(5):
        sampling = SamplingConfig(temperature=1.0)
        g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        assert verify_sample_match(tree, logits, sampling, g1) == reference_sample_match(tree, logits, sampling, g2)
        assert verify_sample_match(tree, logits, sampling, torch.Generator().manual_seed(seed)).accepted == []
    assert tree.num_candidates == 1 and tree.children()[0] == [0]


def test_candidate_under_probe_is_rejected():
    with pytest.raises(AssertionError, match="hangs under probe"):
        DraftTree(tokens=[5, 6], parents=[-1, 0], sources=["x"] * 2, probe=[True, False])


def test_merge_shares_rows_between_probes_and_candidates():
    probes = Draft("ptd", tokens=[5, 9, 4], parents=[-1, 0, 0], probe=[True] * 3)
    cands = Draft.chain("pld", [5, 9, 8])
    tree = merge_drafts([probes, cands], budget=16)
    # 5 and 9 are shared (now candidates), 4 stays a probe, 8 is a new candidate under 9
    assert tree.tokens == [5, 9, 4, 8] and tree.parents == [-1, 0, 0, 1]
    assert tree.probe == [False, False, True, False]
    other = merge_drafts([cands, probes], budget=16)
    assert sorted(zip(other.tokens, other.probe)) == sorted(zip(tree.tokens, tree.probe))
    cut = truncate_depth(tree, 1)
    assert cut.tokens == [5] and cut.probe == [False]
    assert merge_drafts([cands], 8).probe is None


def test_stats_count_probes_apart():
    tree = DraftTree(tokens=[5, 6, 7], parents=[-1, -1, 1], sources=["ptd"] * 3, probe=[False, True, True])
    stats = GenerationStats()
    step = StepResult(root_token=1, tree=tree, verify=VerifyResult([0], 3), logits=torch.zeros(4, 10), context=[1])
    stats.record_step(step, 2)
    assert stats.proposed_by_source == Counter({"ptd": 1}) and stats.accepted_by_source == Counter({"ptd": 1})
    assert stats.tree_nodes == 3 and stats.probe_nodes == 2


# ---- the draft tree, the pool and the candidates -------------------------------------------


def test_expand_respects_width_and_existing_children():
    tree = PerturbationTree([10, 11, 12])  # top 10 with children 11, 12
    top = tree.top
    a, b = top.children
    added = tree.expand({id(top): 11, id(a): 20, id(b): 21}, max_children=4)
    assert added == 2, "11 is already a child of the top"
    assert [c.token for c in top.children] == [11, 12]
    assert [c.token for c in a.children] == [20] and [c.token for c in b.children] == [21]
    tree.expand({id(top): 13}, max_children=3)
    tree.expand({id(top): 14}, max_children=3)
    assert [c.token for c in top.children] == [11, 12, 13], "width limit"
    assert tree.depth() == 3


def test_stepping_keeps_the_earliest_child():
    tree = PerturbationTree([10, 11, 12])
    tree.expand({id(tree.top.children[0]): 20, id(tree.top.children[1]): 21}, max_children=4)
    tree.step()
    assert tree.top.token == 11 and tree.top.parent is None
    assert [n.token for n in tree.nodes()] == [11, 20]


def test_cap_drops_newest_leaves_off_the_main_line():
    tree = PerturbationTree([10, 11, 12, 13])  # main line 10 -> 11
    a = tree.top.children[0]
    tree.expand({id(a): 20}, max_children=4)  # main line 10 -> 11 -> 20
    tree.cap(3)
    assert [n.token for n in tree.nodes()] == [10, 11, 20], "12 and 13 go first, newest first"
    tree.cap(1)
    assert [n.token for n in tree.nodes()] == [10, 11, 20], "the main line is never cut"


def test_merge_into_pool_is_the_papers_merge():
    pool: dict[int, PoolNode] = {}
    t1 = PerturbationTree([5, 9])
    t1.expand({id(t1.top.children[0]): 4}, 4)  # 5 -> 9 -> 4
    merge_into_pool(pool, t1.top, now=1)
    t2 = PerturbationTree([5, 9, 7])  # 5 -> {9, 7}
    merge_into_pool(pool, t2.top, now=2)
    trie = pool[5]
    assert set(trie.children) == {9, 7} and set(trie.children[9].children) == {4}
    assert trie.children[9].count == 2 and trie.children[9].last == 2 and trie.children[9].children[4].last == 1
    # best first by recency: 9 and 7 (pass 2) before 4 (pass 1)
    assert pool_candidates(trie, 2) == ([9, 7], [-1, -1])
    assert pool_candidates(trie, 3) == ([9, 7, 4], [-1, -1, 0])


def test_proposal_maps_probe_rows_back_after_a_shared_row():
    drafter = PTDDrafter(PTDConfig(init_width=0, probe_share=0.5))
    drafter.begin([3, 3, 3], None)  # the initial tree is one random prompt token: 3
    assert [n.token for n in drafter.tree.nodes()] == [3]
    drafter.pool = {1: PoolNode()}
    drafter.pool[1].children[3] = PoolNode()  # candidate 3 after the root token 1: same row as the probe
    d = drafter.propose([3, 1], budget=4)
    assert d.tokens == [3] and d.probe is None, "the probe shares the candidate's row"
    tree = DraftTree(tokens=d.tokens, parents=d.parents, sources=["ptd"], probe=d.probe)
    logits = torch.zeros(2, 10)
    logits[1, 8] = 5.0  # greedy token at the shared row
    step = StepResult(root_token=1, tree=tree, verify=VerifyResult([], 0), logits=logits, context=[3, 1, 0])
    drafter.observe(step)
    assert [n.token for n in drafter.tree.nodes()] == [3, 8]
    assert set(drafter.pool[3].children) == {8}


def test_a_capped_tree_keeps_sliding():
    """With fewer probe rows than the depth limit, stepping happens at the cap: the tree moves on."""
    drafter = PTDDrafter(PTDConfig(init_width=0, max_depth=6, seed=1))
    drafter.begin([3], None)
    tokens = iter(range(10, 100))
    tops = []
    for _ in range(8):
        d = drafter.propose([3, 1], budget=6)  # 3 probe rows
        tree = DraftTree(tokens=d.tokens, parents=d.parents, sources=["ptd"] * len(d), probe=d.probe)
        logits = torch.zeros(len(d) + 1, 100)
        for row in range(1, len(d) + 1):
            logits[row, next(tokens)] = 1.0  # a new greedy token at every fed node
        drafter.observe(StepResult(root_token=1, tree=tree, verify=VerifyResult([], 0), logits=logits, context=[3, 1, 0]))
        assert drafter.tree.depth() <= 3
        tops.append(drafter.tree.top.token)
    assert len(set(tops[-4:])) == 4, f"the top must advance every pass once the tree is full, got {tops}"


def test_config_validation():
    for bad in (dict(max_children=0), dict(max_depth=0), dict(init_width=5), dict(probe_share=1.0)):
        with pytest.raises(ValueError):
            PTDConfig(**bad)


# ---- through the engine ---------------------------------------------------------------------


def ptd_engine(model, **kw) -> SpecEngine:
    return SpecEngine(HFTarget(model), [PTDDrafter(PTDConfig(**kw))], method="ptd")


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_ptd_greedy_equals_plain_decoding(arch):
    model = TINY_MODELS[arch]()
    engine = ptd_engine(model)
    target = engine.target
    max_new = 24
    config = GenerationConfig(max_new_tokens=max_new, budget=12)
    mats = []
    for prompt, repetitive in make_prompts(vocab=model.config.vocab_size):
        got = engine.generate_ids(prompt, config)
        assert got == hf_greedy(model, prompt, max_new), f"{arch}/ptd diverged from plain greedy on {prompt}"
        stats = engine.last_stats
        assert stats.probe_nodes > 0, "the draft tree must be fed"
        # probe rows are never committed: the cache holds the prompt and the emitted tokens only
        assert target.past_len == len(prompt) + max_new - 1
        if repetitive:
            mats.append(stats.mat)
    assert sum(mats) / len(mats) > 1.2, f"{arch}: PTD drafts were not accepted (mean MAT {sum(mats) / len(mats):.2f})"


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.3, top_k=5, seed=5), SamplingConfig(temperature=0.15, top_k=10, top_p=0.9, seed=5)])
def test_ptd_seeded_sampling_equals_plain_sampling(sampling):
    model = TINY_MODELS["llama"]()
    ar = SpecEngine(HFTarget(model), [], method="ar")
    ptd = ptd_engine(model)
    rng = random.Random(7)
    accepted = 0
    for _ in range(6):
        unit = [rng.randrange(3, 96) for _ in range(rng.randint(2, 5))]
        prompt = (unit * 8)[: rng.randint(8, 30)]
        config = GenerationConfig(max_new_tokens=40, budget=10, sampling=sampling)
        plain = ar.generate_ids(prompt, config)
        assert ptd.generate_ids(prompt, config) == plain, "sample-and-match reproduces plain sampling draw for draw"
        accepted += ptd.last_stats.new_tokens - ptd.last_stats.steps
    # tiny random models are nearly flat, so sampled text rarely follows greedy drafts; a few must
    assert accepted > 0, "no PTD candidate was accepted"


def test_ptd_is_deterministic():
    model = TINY_MODELS["qwen2"]()
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    config = GenerationConfig(max_new_tokens=16, budget=8)
    a, b = ptd_engine(model, seed=4), ptd_engine(model, seed=4)
    assert a.generate_ids(prompt, config) == b.generate_ids(prompt, config)
    assert a.last_stats.tokens_per_step == b.last_stats.tokens_per_step


# ---- statistical losslessness on a synthetic target ------------------------------------------

N_STAT = 3000
LENGTH = 3


def sample_with_ptd(target: SyntheticTarget, n: int, verifier, seed: int) -> tuple[Counter, float]:
    """``n`` generations of ``LENGTH`` tokens with PTD on the synthetic target; (counts, tokens/step).

    The drafter keeps its pool across samples (``begin`` once), so candidates come from many
    earlier contexts, as they would in a long generation.
    """
    gen = torch.Generator().manual_seed(seed)
    drafter = PTDDrafter(PTDConfig(init_width=2, probe_share=0.5, seed=seed))
    drafter.begin(list(PROMPT) * 3, None)
    counts: Counter = Counter()
    steps = 0
    for _ in range(n):
        out = list(PROMPT)
        while len(out) - len(PROMPT) < LENGTH:
            d = drafter.propose(out, budget=8)
            tree = DraftTree(tokens=d.tokens, parents=d.parents, sources=["ptd"] * len(d), probe=d.probe)
            logits = target.rows(node_pairs((out[-2], out[-1]), tree.tokens, tree.parents))
            result = verifier(tree, logits, target.sampling, gen)
            step = StepResult(root_token=out[-1], tree=tree, verify=result, logits=logits, context=out)
            out += step.new_tokens
            drafter.observe(step)
            steps += 1
        counts[tuple(out[len(PROMPT) : len(PROMPT) + LENGTH])] += 1
    return counts, n * LENGTH / steps


def verify_accepting_probes_wrong(tree, logits, sampling, generator):
    """WRONG: treats probes as candidates and accepts the first child in the target's top 2."""
    from specgraft.verify import sample_token, target_probs

    accepted, node = [], -1
    while True:
        probs = target_probs(logits[node + 1], sampling)
        top2 = set(torch.topk(probs, 2).indices.tolist())
        child = next((c for c in range(len(tree)) if tree.parents[c] == node and tree.tokens[c] in top2), None)
        if child is None:
            return VerifyResult(accepted=accepted, bonus_token=sample_token(probs, generator))
        accepted.append(child)
        node = child


def test_ptd_sampling_matches_target_law():
    target = SyntheticTarget(SamplingConfig(temperature=1.0), seed=3)
    law = target.exact_law()
    counts, per_step = sample_with_ptd(target, N_STAT, verify_sample_match, seed=2)
    tv = 0.5 * sum(abs(counts[s] / N_STAT - p) for s, p in law.items())
    assert per_step > 1.15, f"PTD candidates must be accepted ({per_step:.2f} tokens/step)"
    assert tv <= tv_bound(law, N_STAT), f"TV {tv:.4f} exceeds the derived bound {tv_bound(law, N_STAT):.4f}"


def test_wrong_verifier_on_ptd_trees_fails_the_bound():
    target = SyntheticTarget(SamplingConfig(temperature=1.0), seed=3)
    law = target.exact_law()
    counts, _ = sample_with_ptd(target, N_STAT, verify_accepting_probes_wrong, seed=2)
    tv = 0.5 * sum(abs(counts[s] / N_STAT - p) for s, p in law.items())
    assert tv > tv_bound(law, N_STAT), "a biased verifier passed; the test has no teeth"
