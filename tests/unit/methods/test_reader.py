"""READER (``methods/reader.py``): tree composition, greedy losslessness of every variant with a
real on-disk datastore, exact seeded sampling, and the datastore checks."""


import pytest
import torch

from specgraft.composers.reader import ReaderComposer, deepening_node
from specgraft.config import GenerationConfig, SamplingConfig
from specgraft.drafters.draft_model import ModelDraft
from specgraft.drafters.reader_retrieval import ReaderConfig, ReaderRetrieval, RetrievalDraft, path_drafts
from specgraft.engine import SpecEngine
from specgraft.methods import GraftOptions, MethodOptions, get_method, method_budget
from specgraft.methods.reader import READER_METHODS
from specgraft.models.hf import HFTarget
from specgraft.retrieval import SearchPath
from specgraft.types import PrefillOutput

from tests.helpers.lossless import hf_greedy, make_prompts
from tests.helpers.models import TINY_MODELS, perturbed


def path(tokens, source="trie"):
    return SearchPath(tuple(tokens), (source,) * len(tokens), (1.0,) * len(tokens), (1,) * len(tokens))


def test_compose_widens_at_the_root_and_deepens_the_best_branch():
    draft = ModelDraft(source="draft", tokens=[5, 2, 9, 4], parents=[-1, -1, 0, 2], scores=[0.6, 0.3, 0.5, 0.4])
    assert deepening_node(draft, 2) == 2 and deepening_node(draft, 1) == 0 and deepening_node(draft, 9) == 3
    seen = []

    def search(prefix, depth):
        seen.append((tuple(prefix), depth))
        return path([4, 8][:depth], "datastore")

    retrieved = RetrievalDraft(source="retrieval", tokens=[7, 3], parents=[-1, 0], path=path([7, 3]), search=search)
    tree = ReaderComposer(ReaderConfig(draft_nodes=4, d_search=2, d_deep=2)).build([draft, retrieved], budget=8)
    assert seen == [((5, 9), 2)]
    # draft nodes best-first by score, the widening path, then 8 under the draft's 4 (on 5, 9, 4)
    assert tree.tokens == [5, 9, 4, 2, 7, 3, 8]
    assert tree.parents == [-1, 0, 1, -1, -1, 4, 2]
    assert tree.sources == ["draft"] * 4 + ["trie", "trie", "datastore"]
    # the draft is cut to draft_nodes first; the budget caps the whole tree
    small = ReaderComposer(ReaderConfig(draft_nodes=2, d_search=2, d_deep=2)).build([draft, retrieved], budget=3)
    assert len(small) == 3 and small.tokens == [5, 9, 7]
    # no draft-model draft: the widening path alone; an empty search: the draft alone
    assert ReaderComposer().build([retrieved], 8).tokens == [7, 3]
    with pytest.raises(ValueError, match="READER composes"):
        ReaderComposer().build([draft], 8)


def test_path_drafts_split_by_source():
    p = SearchPath((4, 5, 6), ("trie", "datastore", "datastore"), (1.0, 0.5, 0.5), (2, 1, 1))
    assert [(d.source, d.tokens, d.anchor) for d in path_drafts(p, (1,))] == [("trie", [4], (1,)), ("datastore", [5, 6], (1, 4))]


def test_retrieval_drafter_learns_the_context_per_sequence():
    drafter = ReaderRetrieval(ReaderConfig(d_search=4, key_len=2))
    a = drafter.begin([5, 6, 7, 8, 5, 6], PrefillOutput(), GenerationConfig())
    b = drafter.begin([1, 2, 3], PrefillOutput(), GenerationConfig())
    assert drafter.propose(a, [5, 6, 7, 8, 5, 6], 8).tokens == [7, 8, 5, 6]
    assert drafter.propose(b, [1, 2, 3], 8).tokens == []  # nothing of a's context reaches b
    assert drafter.propose(a, [5, 6, 7, 8, 5, 6], 8).search([7], 2).tokens == (8, 5)


@pytest.mark.parametrize("name", sorted(READER_METHODS))
def test_greedy_equals_plain_decoding(name, datastore_dir):
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    options = MethodOptions(datastores=(datastore_dir,))
    drafters, composer = get_method(name).build(target, options, perturbed(model))
    engine = SpecEngine(target, drafters, composer, method=name, default_budget=method_budget(name, options))
    config = GenerationConfig(max_new_tokens=16)
    accepted = {"trie": 0, "datastore": 0}
    for prompt, _ in make_prompts(vocab=model.config.vocab_size):
        assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, 16), f"{name} diverged on {prompt}"
        for source in accepted:
            accepted[source] += engine.last_stats.accepted_by_source[source]
    assert accepted["trie"] > 0
    assert (accepted["datastore"] > 0) == (name != "reader-trie")


# retrieval alone rarely finds what a random tiny model samples: a near-greedy temperature gives
# reader-search repeats to accept, through the same sampling path
@pytest.mark.parametrize("name, temperature", [("reader", 0.6), ("reader-search", 0.02)])
def test_seeded_sampling_equals_plain_sampling(name, temperature, datastore_dir):
    """Top-k drafts and retrieved paths and trees are deterministic: sample-and-match everywhere,
    one target draw per emitted token, so a seeded run reproduces ``ar``."""
    model = TINY_MODELS["llama"]()
    target = HFTarget(model)
    options = MethodOptions(datastores=(datastore_dir,))
    spec = SpecEngine(target, *get_method(name).build(target, options, perturbed(model)), method=name)
    ar = SpecEngine(target, *get_method("ar").build(target, options), method="ar")
    accepted = 0
    for seed, (prompt, _) in enumerate(make_prompts(n=8, vocab=model.config.vocab_size)):
        config = GenerationConfig(max_new_tokens=16, budget=16, sampling=SamplingConfig(temperature=temperature, seed=seed))
        assert spec.generate_ids(prompt, config) == ar.generate_ids(prompt, config)
        accepted += spec.last_stats.new_tokens - spec.last_stats.steps
    assert accepted > 0


def test_retrieval_only_reader_needs_no_draft_model_and_drafts_a_tree(datastore_dir):
    spec = get_method("reader-search")
    assert not spec.needs_draft_model and spec.reads_datastores and get_method("reader").needs_draft_model
    spec.check(MethodOptions())  # no --draft-model: fine
    model = TINY_MODELS["llama"]()
    drafters, composer = spec.build(HFTarget(model), MethodOptions(datastores=(datastore_dir,)))
    assert [type(d).__name__ for d in drafters] == ["ReaderRetrieval"]
    drafter = ReaderRetrieval(ReaderConfig(draft_nodes=0, d_deep=0, search_nodes=5, d_search=4, key_len=2))
    state = drafter.begin([5, 6, 7, 5, 6, 8, 5, 6], PrefillOutput(), GenerationConfig())
    draft = drafter.propose(state, [5, 6, 7, 5, 6, 8, 5, 6], budget=8)
    tree = ReaderComposer(drafter.config).build([draft], budget=8)
    # "5 6" was followed by 7 and by 8: two branches at the root, each continued by "5 6"
    assert sorted(tree.tokens[:2]) == [7, 8] and tree.parents[:2] == [-1, -1] and len(tree) == 5
    assert drafter.propose(state, [5, 6, 7, 5, 6, 8, 5, 6], budget=3).tree is not None
    assert len(ReaderComposer(drafter.config).build([drafter.propose(state, [5, 6, 7, 5, 6, 8, 5, 6], budget=3)], 3)) == 3


def test_sampled_drafts_keep_the_target_law():
    """With ``--sample-drafts`` the draft children are verified by rejection sampling beside the
    deterministic retrieved paths; the first emitted token's law over many seeds matches the
    target's (a statistical check: ~0.1 TV; ``test_sampling_exact.py`` proves the merge rule)."""
    model = TINY_MODELS["llama"](vocab=8)
    target = HFTarget(model)
    options = MethodOptions(graft=GraftOptions(sample_drafts=True))
    spec = SpecEngine(target, *get_method("reader").build(target, options, perturbed(model, scale=0.5)), method="reader")
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    with torch.no_grad():
        p = model(torch.tensor([prompt])).logits[0, -1].softmax(-1)
    n = 300
    counts = torch.zeros(8)
    for seed in range(n):
        out = spec.generate_ids(prompt, GenerationConfig(max_new_tokens=2, budget=16, sampling=SamplingConfig(temperature=1.0, seed=seed)))
        counts[out[0]] += 1
    tv = 0.5 * (counts / n - p).abs().sum().item()
    assert tv < 0.12, f"first-token law off by TV {tv:.3f}"


def test_datastore_errors(tmp_path, datastore_dir):
    spec = get_method("reader")
    with pytest.raises(ValueError, match="not a directory"):
        spec.check(MethodOptions(graft=GraftOptions(draft_model="x"), datastores=(str(tmp_path / "missing"),)))
    with pytest.raises(ValueError, match="needs a draft model"):
        spec.check(MethodOptions(datastores=(datastore_dir,)))
    small = HFTarget(TINY_MODELS["llama"](vocab=8))
    with pytest.raises(ValueError, match="more than the target's 8"):
        spec.build(small, MethodOptions(datastores=(datastore_dir,)), perturbed(small.model))


def test_reader_drafts_draft_trees_tree_and_adds_retrieval(datastore_dir):
    """READER's draft tree is ``draft-tree``'s, step for step: the same drafter configuration
    (long chains, their cut, copy-ahead), capped at ``draft-tree``'s budget. With no retrieved
    paths (``d_search = d_deep = 0``) READER verifies exactly ``draft-tree``'s trees (same steps,
    same nodes); with them its trees hold those nodes and more, never fewer."""
    from dataclasses import replace

    from specgraft.methods.graft import draft_tree_config

    model = TINY_MODELS["llama"]()
    draft = perturbed(model)
    target = HFTarget(model)
    base = MethodOptions(datastores=(datastore_dir,))
    drafters, _ = get_method("reader").build(target, base, draft)
    assert drafters[0].config == draft_tree_config("draft-tree", base.graft) and drafters[0].max_nodes == 16
    assert method_budget("reader", base) == 16 + 6 + 2
    engines = {}
    for name, options in (("draft-tree", base), ("reader", replace(base, reader=ReaderConfig(d_search=0, d_deep=0))), ("reader+", base)):
        method = "reader" if name.startswith("reader") else name
        engines[name] = SpecEngine(target, *get_method(method).build(target, options, draft), method=method,
                                   default_budget=method_budget(method, options))
    config = GenerationConfig(max_new_tokens=24)
    more = 0
    for prompt, _ in make_prompts(n=12, vocab=model.config.vocab_size):
        stats = {}
        for name, engine in engines.items():
            assert engine.generate_ids(prompt, config) == hf_greedy(model, prompt, 24), name
            stats[name] = engine.last_stats
        tree, reader, wider = stats["draft-tree"], stats["reader"], stats["reader+"]
        assert (reader.steps, reader.tree_nodes) == (tree.steps, tree.tree_nodes)
        more += wider.tree_nodes / wider.steps > tree.tree_nodes / tree.steps
    assert more > 0  # the retrieved paths added rows
