"""vLLM ``custom_class`` proposers (``integrations/vllm.py``) without vLLM: they are fed exactly
what vLLM 0.32's ``GPUModelRunner.propose_draft_token_ids`` passes (``sampled_token_ids`` as
lists, the input batch's whole ``num_tokens_no_spec`` ``[max_num_reqs]`` and ``token_ids_cpu``
``[max_num_reqs, max_model_len]`` int32 buffers, ``slot_mappings``), by a small stand-in for its
input batch that adds, verifies, condenses and removes rows as vLLM does. The end-to-end test in
vLLM itself is ``tests/integration/test_vllm_e2e.py``."""

import json
import subprocess
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest

from specgraft.config import GenerationConfig
from specgraft.drafters.adapld import AdaPLDConfig, AdaPLDDrafter
from specgraft.drafters.pld import PLDDrafter
from specgraft.integrations import vllm as integ
from specgraft.integrations.vllm import (
    CPU_DEFAULT,
    AdaPLDProposer,
    ChainCost,
    PLDProposer,
    ReaderProposer,
    best_chain,
    speculative_config,
)
from specgraft.types import DraftTree, PrefillOutput, StepResult, VerifyResult

from tests.helpers.scripts import ROOT, benchmark_script
from tests.helpers.stubs import IntTokenizer

K = 5
MAX_LEN = 256


def vllm_config(k=K, max_model_len=MAX_LEN, device_type="cuda"):
    """The parts of vLLM's config a proposer reads (``cuda``: no chain cost unless the environment says)."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, method="custom_class", model="x.Y"),
        model_config=SimpleNamespace(max_model_len=max_model_len, tokenizer="unused"),
        device_config=SimpleNamespace(device_type=device_type),
    )


@pytest.fixture(autouse=True)
def _no_chain_cost_override(monkeypatch):
    monkeypatch.delenv(integ.CHAIN_COST_ENV, raising=False)


class Batch:
    """vLLM's input batch as a proposer sees it: one row per running request, condensed when one
    leaves (the last row moves into the hole), and a target whose greedy output is known
    (``truth``): each step accepts the longest prefix of a row's draft that matches it, then emits
    the target's own next token, exactly what ``sampled_token_ids`` then holds."""

    def __init__(self, proposer, max_num_reqs=4, max_model_len=MAX_LEN):
        self.proposer = proposer
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(max_num_reqs, dtype=np.int32)
        self.req_ids: list[str] = []
        self.truth: dict[str, list[int]] = {}
        self.done: dict[str, int] = {}  # tokens generated
        self.drafts: dict[str, list[int]] = {}
        self.accepted: dict[str, int] = {}

    def add(self, req, prompt, truth):
        row = len(self.req_ids)
        self.req_ids.append(req)
        self.token_ids_cpu[row, : len(prompt)] = prompt
        self.num_tokens_no_spec[row] = len(prompt)
        self.truth[req], self.done[req], self.drafts[req], self.accepted[req] = list(truth), 0, [], 0

    def remove(self, req):
        row = self.req_ids.index(req)
        last = len(self.req_ids) - 1
        if row != last:  # condense: the last row moves into the hole
            self.token_ids_cpu[row] = self.token_ids_cpu[last]
            self.num_tokens_no_spec[row] = self.num_tokens_no_spec[last]
            self.req_ids[row] = self.req_ids[last]
        self.req_ids.pop()

    def step(self, prefilling=()):
        """One engine step: verify every row's draft, append the sampled tokens, call propose."""
        sampled_token_ids = []
        for row, req in enumerate(self.req_ids):
            if req in prefilling:
                sampled_token_ids.append([])
                continue
            truth, pos, draft = self.truth[req], self.done[req], self.drafts[req]
            a = 0
            while a < len(draft) and pos + a + 1 < len(truth) and draft[a] == truth[pos + a]:
                a += 1
            sampled = truth[pos : pos + a + 1]
            self.accepted[req] += a
            n = int(self.num_tokens_no_spec[row])
            self.token_ids_cpu[row, n : n + len(sampled)] = sampled
            self.num_tokens_no_spec[row] = n + len(sampled)
            self.done[req] += len(sampled)
            sampled_token_ids.append(sampled)
        drafts = self.proposer.propose(sampled_token_ids, self.num_tokens_no_spec, self.token_ids_cpu, slot_mappings={})
        assert len(drafts) == len(self.req_ids)
        for row, req in enumerate(self.req_ids):
            assert len(drafts[row]) <= self.proposer.num_speculative_tokens
            self.drafts[req] = list(drafts[row])
        return drafts

    def finished(self, req):
        return self.done[req] >= len(self.truth[req])


def copy_task(seed, passage_len=20, noise=12, vocab=50):
    """A prompt holding a passage, and an output that repeats it (with a changed token)."""
    rng = np.random.default_rng(seed)
    passage = rng.integers(3, vocab, passage_len).tolist()
    prompt = rng.integers(3, vocab, noise).tolist() + passage + [1]
    truth = passage[:8] + [2] + passage[9:] + passage[:6]
    return prompt, truth


def test_importing_specgraft_does_not_import_vllm():
    code = "import sys, specgraft, specgraft.integrations.vllm, specgraft.integrations.vllm_worker; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_or_unsupported_vllm_is_one_clear_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(ImportError, match=r"needs vLLM 0\.32") as e:
        PLDProposer(vllm_config())
    assert "\n" not in str(e.value)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.31.2"))
    with pytest.raises(ImportError, match=r"supports vLLM 0\.32 .*found 0\.31\.2") as e:
        integ.require_vllm()
    assert "\n" not in str(e.value)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.32.0"))
    assert integ.require_vllm() == "0.32.0"
    PLDProposer(vllm_config())  # constructed the way vLLM does: cls(vllm_config)


def test_speculative_config_names_importable_classes():
    for method in integ.PROPOSERS:
        cfg = speculative_config(method, 4)
        assert cfg["method"] == "custom_class" and cfg["num_speculative_tokens"] == 4
        module, name = cfg["model"].rsplit(".", 1)
        assert getattr(sys.modules[module], name).name == method
    with pytest.raises(ValueError, match="recycling"):
        speculative_config("recycling")


def test_best_chain_maximises_expected_accepted_tokens():
    assert best_chain([], []) == []
    assert best_chain([-1, 0, 1], [0.9, 0.8, 0.7], max_len=2) == [0, 1]
    # the branch under the weaker first token runs deeper
    assert best_chain([-1, -1, 1, 2], [0.6, 0.5, 0.45, 0.4]) == [1, 2, 3]
    assert best_chain([-1, -1, 1, 2], [0.6, 0.5, 0.45, 0.4], max_len=1) == [0]


def test_best_chain_stops_where_one_more_token_costs_more_than_it_is_expected_to_bring():
    parents, scores = [-1, 0, 1, 2, -1], [0.9, 0.5, 0.2, 0.1, 0.3]
    assert best_chain(parents, scores) == [0, 1, 2, 3]
    assert best_chain(parents, scores, token_cost=0.15) == [0, 1, 2]
    assert best_chain(parents, scores, token_cost=0.3) == [0, 1]
    assert best_chain(parents, scores, token_cost=0.95) == [0]  # the caller decides whether it pays
    # a deeper branch wins only while its extra tokens pay for themselves
    parents, scores = [-1, -1, 1, 2], [0.6, 0.5, 0.2, 0.2]
    assert best_chain(parents, scores) == [1, 2, 3]
    assert best_chain(parents, scores, token_cost=0.25) == [0]


def test_chain_cost_gates_whole_chains_and_follows_the_device_and_environment(monkeypatch):
    cost = ChainCost(0.25, 0.065)
    assert not cost.pays([]) and not cost.pays([0.3]) and cost.pays([0.8, 0.64])
    assert ChainCost().pays([0.01]) and not ChainCost().pays([])
    with pytest.raises(ValueError, match=">= 0"):
        ChainCost(-0.1, 0.0)
    with pytest.raises(ValueError, match="STEP,TOKEN"):
        ChainCost.parse("0.25")
    assert ChainCost.for_device("cpu") == CPU_DEFAULT and ChainCost.for_device("cuda") == ChainCost()
    monkeypatch.setenv(integ.CHAIN_COST_ENV, "0.1,0.02")
    assert ChainCost.for_device("cuda") == ChainCost(0.1, 0.02) == PLDProposer(vllm_config(), check_vllm=False).cost
    monkeypatch.setenv(integ.CHAIN_COST_ENV, "0,0")
    assert PLDProposer(vllm_config(device_type="cpu"), check_vllm=False).cost == ChainCost()


def test_best_chains_are_the_best_paths_of_each_length():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(0, 12))
        parents = [int(rng.integers(-1, i)) if i else -1 for i in range(n)]
        scores = [float(x) for x in rng.random(n).round(2)]
        got = integ.best_chains(parents, scores, 6)
        assert len(got) == min(6, n)
        for length, chain in enumerate(got, start=1):
            # every root-to-node path of exactly `length` nodes, brute force
            paths = []
            for end in range(n):
                path = [end]
                while parents[path[-1]] >= 0:
                    path.append(parents[path[-1]])
                if len(path) == length:
                    paths.append(path[::-1])
            if not paths:
                assert chain == []
                continue
            best = max(sum(scores[i] for i in p) for p in paths)
            assert chain in paths and sum(scores[i] for i in chain) == pytest.approx(best)


def test_a_measured_cost_per_length_prices_whole_chains(tmp_path):
    cost = ChainCost(0.05, 0.1, (0.15, 0.25, 0.5, 0.55, 0.6))
    assert [cost.of(L) for L in range(7)] == pytest.approx([0, 0.15, 0.25, 0.5, 0.55, 0.6, 0.7])
    assert cost.cheapest_token == pytest.approx(0.05)
    chain = [-1, 0, 1, 2, 3]
    # a strong copy runs to five tokens (the 4th and 5th are cheap) ...
    assert cost.choose(chain, [0.8, 0.7, 0.6, 0.5, 0.4], 5) == [0, 1, 2, 3, 4]
    # ... a middling one stops at two (the third token costs 0.25 here)
    assert cost.choose(chain, [0.6, 0.4, 0.2, 0.02, 0.02], 5) == [0, 1]
    assert cost.choose(chain, [0.1, 0.04, 0.01, 0.01, 0.01], 5) == []
    # the linear cost is the old rule: sum(p) - token * L > step, tokens while p > token
    line = ChainCost(0.1, 0.1)
    assert line.choose(chain, [0.9, 0.5, 0.2, 0.05, 0.01], 5) == [0, 1, 2] == best_chain(chain, [0.9, 0.5, 0.2, 0.05, 0.01], 5, 0.1)
    with pytest.raises(ValueError, match="non-decreasing"):
        ChainCost(by_length=(0.2, 0.1))
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"relative_to_no_draft": {"0": 1.0, "1": 1.15, "2": 1.14, "3": 1.5}, "chain_cost": {"step": 0.05, "token": 0.12}}))
    assert ChainCost.from_probe(probe) == ChainCost(0.05, 0.12, (0.15, 0.15, 0.5))  # a dip is noise
    assert ChainCost.parse(str(probe)) == ChainCost.from_probe(probe)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a step-cost file"):
        ChainCost.parse(str(tmp_path / "bad.json"))
    shipped = ROOT / "benchmarks/experiments/vllm/step-cost-qwen1.5b-zen3.json"
    assert ChainCost.from_probe(shipped).by_length == CPU_DEFAULT.by_length


def test_a_costly_draft_step_drops_weak_matches_and_keeps_strong_copies():
    on_cpu = PLDProposer(vllm_config(device_type="cpu"), check_vllm=False)
    assert on_cpu.cost == CPU_DEFAULT and on_cpu.drafter.config.min_prob == CPU_DEFAULT.cheapest_token
    free = PLDProposer(vllm_config(), check_vllm=False)
    costed = PLDProposer(vllm_config(), check_vllm=False, cost=ChainCost(0.25, 0.065))
    # one earlier "7": a unigram match, estimated at 0.25 acceptance, is worth less than a draft step
    rows = np.zeros((1, 32), np.int32)
    rows[0, :6] = [3, 7, 4, 5, 6, 7]
    assert free.propose([[7]], np.array([6]), rows) == [[4]]
    assert on_cpu.propose([[7]], np.array([6]), rows) == [[4]]  # 0.25 > 0.154 for one token
    assert costed.propose([[7]], np.array([6]), rows) == [[]]
    # a repeated passage is still drafted and accepted
    prompt, truth = copy_task(0)
    batch = Batch(costed)
    batch.add("a", prompt, truth)
    chains = []
    while not batch.finished("a"):
        chains.append(batch.step()[0])
    assert batch.accepted["a"] > 10 and max(map(len, chains)) == K
    assert sum(not c for c in chains) > 0, "steps where nothing pays propose nothing"


def reference_pld(prompt, truth, k):
    """specgraft's PLD drafter driven directly, as the proposer should drive it: the chains it
    would propose for one request against ``truth`` (the target's output)."""
    drafter = PLDDrafter()
    context = list(prompt) + truth[:1]
    state = drafter.begin(context, PrefillOutput(), GenerationConfig())
    chains, pos = [], 1
    while pos < len(truth):
        tree = drafter.propose(state, context, budget=10_000)
        chain = [tree.tokens[i] for i in best_chain(tree.parents, tree.scores, k)]
        chains.append(chain)
        a = 0
        while a < len(chain) and pos + a + 1 < len(truth) and chain[a] == truth[pos + a]:
            a += 1
        new = truth[pos : pos + a + 1]
        tree_acc = DraftTree(tokens=new[:-1], parents=list(range(-1, a - 1)), sources=["pld"] * a)
        context += new
        drafter.observe(state, StepResult(context[-len(new) - 1], tree_acc, VerifyResult(list(range(a)), new[-1]), None, context))
        pos += len(new)
    return chains, state.rates


def test_pld_proposer_drives_the_drafter_and_learns_from_accepted_counts():
    prompt, truth = copy_task(0)
    proposer = PLDProposer(vllm_config(), check_vllm=False)
    batch = Batch(proposer)
    batch.add("a", prompt, truth)
    chains = []
    while not batch.finished("a"):
        chains.append(batch.step()[0])
    expected, rates = reference_pld(prompt, truth, K)
    assert chains[:-1] == expected  # the batch also drafts after the last token (vLLM would stop the request)
    assert batch.accepted["a"] > 10, "the repeated passage is drafted and accepted"
    assert proposer.accepted_tokens == batch.accepted["a"]
    (req,) = proposer._requests
    assert np.array_equal(req.state.rates.hits, rates.hits) and np.array_equal(req.state.rates.tries, rates.tries)
    assert req.state.rates.tries.sum() > 0, "copy rates learned from what vLLM accepted"


def test_requests_keep_their_state_across_condensed_rows_and_are_freed():
    tasks = {r: copy_task(s) for r, s in [("a", 1), ("b", 2), ("c", 3)]}
    # every request alone: the reference chains
    alone = {}
    for r, (prompt, truth) in tasks.items():
        b = Batch(PLDProposer(vllm_config(), check_vllm=False))
        b.add(r, prompt, truth)
        alone[r] = []
        while not b.finished(r):
            alone[r].append(b.step()[0])
    proposer = PLDProposer(vllm_config(), check_vllm=False)
    batch = Batch(proposer)
    seen = {r: [] for r in tasks}
    for r in ("a", "b"):
        batch.add(r, *tasks[r])
    # "c" joins one step later, its first step is a prefill chunk (nothing sampled)
    for r, d in zip(batch.req_ids, batch.step(), strict=True):
        seen[r].append(d)
    batch.add("c", *tasks["c"])
    drafts = batch.step(prefilling={"c"})
    assert drafts[2] == [] and proposer.num_requests == 2
    for r, d in zip(batch.req_ids[:2], drafts[:2], strict=True):
        seen[r].append(d)
    cut = 3  # "a" is aborted: "c" moves into its row, then "b" finishes
    for _ in range(cut):
        for r, d in zip(batch.req_ids, batch.step(), strict=True):
            seen[r].append(d)
    batch.remove("a")
    assert batch.req_ids == ["c", "b"]
    while batch.req_ids:
        for r, d in zip(batch.req_ids, batch.step(), strict=True):
            seen[r].append(d)
        for r in [r for r in batch.req_ids if batch.finished(r)]:
            batch.remove(r)
        assert proposer.num_requests <= 3
    batch.step()  # an empty batch: every state is freed
    assert proposer.num_requests == 0
    assert seen["b"] == alone["b"] and seen["c"] == alone["c"], "a request's drafts do not depend on its row or neighbours"
    assert seen["a"] == alone["a"][: len(seen["a"])]


def test_identical_prompts_and_a_request_that_comes_back():
    prompt, truth = copy_task(4)
    proposer = PLDProposer(vllm_config(), check_vllm=False)
    batch = Batch(proposer)
    batch.add("x", prompt, truth)
    batch.add("y", prompt, truth)
    for _ in range(3):
        dx, dy = batch.step()
        assert dx == dy
    assert proposer.num_requests == 2
    # "x" preempted (leaves the batch), later re-added with its whole context: starts over from it
    n = int(batch.num_tokens_no_spec[0])
    context = batch.token_ids_cpu[0, :n].tolist()
    done = batch.done["x"]
    batch.remove("x")
    batch.step()
    assert proposer.num_requests == 1
    batch.add("x2", context[:-1], truth[done - 1 :])
    batch.step()
    assert proposer.num_requests == 2


def test_drafts_stop_at_the_context_window():
    prompt, truth = copy_task(5)
    proposer = PLDProposer(vllm_config(max_model_len=len(prompt) + 8), check_vllm=False)
    batch = Batch(proposer, max_model_len=len(prompt) + 8)
    batch.add("a", prompt, truth[:8])
    while not batch.finished("a"):
        drafts = batch.step()
        n = int(batch.num_tokens_no_spec[0])
        assert len(drafts[0]) <= max(0, len(prompt) + 8 - n - 1), "draft tokens + the bonus token fit the window"


def test_reader_proposer_trie_and_shared_datastore(tmp_path, monkeypatch):
    from specgraft.retrieval.build import build_datastore

    vocab = 64
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "0.txt").write_text("40 41 42 43 44 45 46 47")
    out = tmp_path / "ds"
    build_datastore(IntTokenizer(vocab), [docs], out, progress=False, suffixes=(".txt",))
    prompt = [5, 6, 7, 8, 9, 10, 11, 5, 6]
    # trie only: what followed "5 6" in this request
    monkeypatch.delenv(integ.DATASTORE_ENV, raising=False)
    trie_only = ReaderProposer(vllm_config(k=4), check_vllm=False)
    assert trie_only.drafter.datastores == []
    b = Batch(trie_only)
    b.add("a", prompt, [7, 8, 9, 10, 11, 40, 41, 42])
    assert b.step() == [[8, 9, 10, 11]]
    # with the datastore from the environment (vocabulary checked against the tokenizer)
    monkeypatch.setenv(integ.DATASTORE_ENV, str(out))
    with_ds = ReaderProposer(vllm_config(k=4), check_vllm=False, tokenizer=IntTokenizer(vocab))
    assert len(with_ds.drafter.datastores) == 1
    b = Batch(with_ds)
    b.add("a", [1, 2, 3, 39], [40, 41, 42, 43, 44, 45])
    assert b.step() == [[41, 42, 43, 44]]
    b.step()
    assert b.accepted["a"] == 4
    # the trie learns the request's own output; the datastore is read-only and shared
    (req,) = with_ds._requests
    assert req.state.trie.stream[-len(b.truth["a"]) :] == b.truth["a"][: b.done["a"]][-len(b.truth["a"]) :]
    with pytest.raises(ValueError, match="tokenizer"):
        ReaderProposer(vllm_config(), check_vllm=False, tokenizer=IntTokenizer(vocab + 1))


def test_adapld_proposer_copies_after_the_most_recent_lexical_anchor():
    proposer = AdaPLDProposer(vllm_config(k=4), check_vllm=False)
    b = Batch(proposer)
    # root 5: its most recent earlier occurrence (after 3 4, as now) is followed by 9 10 11 12;
    # the older one by 6 7 8
    b.add("a", [5, 6, 7, 8, 3, 4, 5, 9, 10, 11, 12, 13, 7, 3, 4], [5, 9, 10, 11, 12, 13])
    assert b.step() == [[9, 10, 11, 12]]
    b.step()
    assert b.accepted["a"] == 4
    (req,) = proposer._requests
    assert req.state.rates.tries.sum() > 0
    # the same drafter, driven directly, proposes the same main copy
    drafter = AdaPLDDrafter(None, layer=1, config=AdaPLDConfig(fallback=False, rerank=False, branches=False, successors=False))
    ctx = [5, 6, 7, 8, 3, 4, 5, 9, 10, 11, 12, 13, 7, 3, 4, 5]
    draft = drafter.propose(drafter.begin(ctx, PrefillOutput(), GenerationConfig()), ctx, budget=30)
    assert draft.tokens[:4] == [9, 10, 11, 12]
    with pytest.raises(ValueError, match="embeddings"):
        AdaPLDDrafter(None, layer=1, config=AdaPLDConfig())


def test_unsupported_methods_are_documented():
    assert {"recycling", "ptd"} <= {k.split(" ")[0].rstrip(",") for k in integ.UNSUPPORTED}
    for why in integ.UNSUPPORTED.values():
        assert why


def test_replay_counts_what_vllm_would_verify():
    """The offline replay of vLLM's greedy loop (its ngram re-implementation is checked against
    vLLM's own in ``tests/integration/test_vllm_e2e.py``)."""
    replay = benchmark_script("replay_vllm_proposers")
    prompt, output = [1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 9]
    # step 1: "5 1" never occurred: no draft, vLLM emits 2; step 2: "1 2" did: 3 4 5 1 2 proposed,
    # 3 4 5 accepted, then 9 (the output is complete)
    results = replay.run_proposers(prompt, output, ["cost=0/0"], k=5)
    assert vars(results["vllm-ngram"]) == {"steps": 2, "drafts": 1, "draft_tokens": 5, "accepted_tokens": 3, "lengths": [0, 5]}
    assert results["vllm-ngram"].cost([1.0, 1.1, 1.2, 1.3, 1.4, 1.5]) == 1 + 1.0 + 1.5  # prefill token + two steps
    # the PLD proposer through the same loop proposes what the Batch stand-in sees it propose
    prompt, truth = copy_task(0)
    batch = Batch(PLDProposer(vllm_config(), check_vllm=False))
    batch.add("a", prompt, truth)
    chains = [batch.step()[0]]  # the prefill's step: the first chain
    while not batch.finished("a"):
        chains.append(batch.step()[0])
    pld = replay.run_proposers(prompt, truth, ["cost=0/0"], k=K)["pld[cost=0/0]"]
    assert pld.lengths == [len(c) for c in chains[: len(pld.lengths)]]
    # the stand-in keeps the last token for a bonus; vLLM (and the replay) may accept it as a draft
    assert pld.accepted_tokens - batch.accepted["a"] in (0, 1) and batch.accepted["a"] > 10
    assert replay.pld_setting("min_prob=0.05,cost=0.25/0.065") == (integ_pld_config(min_prob=0.05), ChainCost(0.25, 0.065))
    assert replay.ngram_chain(np.array([1, 2, 3, 4, 9, 2, 3, 4, 7, 3, 4]), 3) == [9, 2, 3]


def integ_pld_config(**kwargs):
    from specgraft.drafters.pld import PLDConfig

    return PLDConfig(**kwargs)


def test_the_step_cost_probe_drafts_every_length_and_its_result_prices_chains(tmp_path, monkeypatch):
    """The probe vLLM loads (``python -m specgraft.integrations.vllm_probe``), fed as vLLM's runner
    would; its summary is what ``ChainCost.from_probe`` reads."""
    import doctest

    from specgraft.integrations import vllm_probe

    assert doctest.testmod(vllm_probe).failed == 0
    module, name = vllm_probe.PROBE_CLASS.rsplit(".", 1)
    assert module == vllm_probe.__name__ and getattr(vllm_probe, name) is vllm_probe.StepCostProbe
    for gap in (0, 3):
        monkeypatch.setenv(vllm_probe.RECORDS_ENV, str(tmp_path / f"records-{gap}.json"))
        monkeypatch.setenv(vllm_probe.GAP_ENV, str(gap))
        config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=K),
                                 model_config=SimpleNamespace(get_vocab_size=lambda: 100))
        probe = vllm_probe.StepCostProbe(config)
        lengths = [len(probe.propose([[1]], np.array([10]), np.zeros((1, 64), np.int32))[0]) for _ in range(4 * (K + 1) * (gap + 1))]
        assert set(lengths) == set(range(K + 1)) and max(lengths) == K
        if gap:  # every draft is followed by `gap` steps without one
            assert all(lengths[i + 1 : i + 1 + gap] == [0] * gap for i, L in enumerate(lengths[: -gap - 1]) if L)
        assert all(r[0] == L for r, L in zip(probe.records, lengths))  # each step is timed under the length it verified
    # a machine whose steps cost 1 + 0.1 L (L = 1, 2) and 1.5 from L = 3 on: the table follows it
    records = [(L, 0.2 * (1 + (0.1 * L if L < 3 else 0.5)), 1, 0) for L in range(K + 1) for _ in range(5)]
    result = vllm_probe.shuffled_costs(records, plain_step=0.2)
    (tmp_path / "cost.json").write_text(json.dumps(result))
    cost = ChainCost.from_probe(tmp_path / "cost.json")
    assert cost.by_length == pytest.approx((0.1, 0.2, 0.5, 0.5, 0.5))
    assert cost.choose([-1, 0, 1, 2, 3], [0.9, 0.8, 0.2, 0.2, 0.2], K) == [0, 1, 2, 3, 4]  # 2.3 - 0.5 > 1.7 - 0.2
    assert cost.choose([-1, 0, 1, 2, 3], [0.9, 0.8, 0.1, 0.05, 0.05], K) == [0, 1]  # 1.9 - 0.5 < 1.7 - 0.2
    with pytest.raises(ValueError, match="too few steps"):
        vllm_probe.shuffled_costs(records[:3], plain_step=0.2)
