"""Tree attention, the slot cache and the adapter's checks, on tiny Llama and Qwen2 models in fp32."""

import random

import numpy as np
import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

from specgraft.cache.slots import SlotCache
from specgraft.config import GenerationConfig
from specgraft.engine import SpecEngine
from specgraft.methods import GraftOptions, MethodOptions, build_method
from specgraft.models.hf import HFTarget
from specgraft.types import DraftTree

from tests.helpers.lossless import hf_greedy
from tests.helpers.models import TINY_MODELS, tiny_llama


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


def plain_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0, -1]


def assert_slot_equals_fresh_prefill(target: HFTarget, slot: int, tokens: list[int]) -> None:
    """The committed rows of ``slot`` equal a fresh prefill of ``tokens`` in a new cache."""
    fresh = HFTarget(target.model)
    other = fresh.allocate()
    fresh.prefill(other, tokens)
    n = len(tokens)
    assert target.length(slot) == n
    for a, b in zip(target.cache.layers, fresh.cache.layers, strict=True):
        torch.testing.assert_close(a.keys[slot, :, :n], b.keys[other, :, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.values[slot, :, :n], b.values[other, :, :n], rtol=1e-5, atol=1e-5)


def test_tree_logits_equal_plain_branch_logits(tiny_model):
    rng = random.Random(0)
    target = HFTarget(tiny_model)
    for trial in range(3):
        prompt = [rng.randrange(3, 96) for _ in range(7 + trial)]
        tree = random_tree(rng, 12, 96)
        slot = target.allocate()
        target.prefill(slot, prompt[:-1])
        out = target.forward_tree(slot, prompt[-1], tree, output_hidden=True)
        assert out.logits.shape == (13, 96) and out.hidden.shape[0] == 13
        torch.testing.assert_close(out.logits[0], plain_logits(tiny_model, prompt), rtol=1e-4, atol=1e-4)
        for i in range(len(tree)):
            ref = plain_logits(tiny_model, prompt + branch(tree, i))
            torch.testing.assert_close(out.logits[i + 1], ref, rtol=1e-4, atol=1e-4)
        target.commit(slot, [0])
        target.release(slot)


def test_commit_equals_fresh_prefill(tiny_model):
    rng = random.Random(1)
    prompt = [rng.randrange(3, 96) for _ in range(9)]
    tree = DraftTree(tokens=[11, 12, 13, 14, 15, 16], parents=[-1, 0, 0, -1, 3, 4], sources=["t"] * 6)
    target = HFTarget(tiny_model)
    for accepted in ([], [0], [0, 2], [3, 4, 5]):
        slot = target.allocate()
        target.prefill(slot, prompt[:-1])
        target.forward_tree(slot, prompt[-1], tree)
        target.commit(slot, [0, *(i + 1 for i in accepted)])
        assert_slot_equals_fresh_prefill(target, slot, prompt + [tree.tokens[i] for i in accepted])
        target.release(slot)


def test_batched_forward_and_commit_equal_single_sequences(tiny_model):
    """B = 3 slots of different lengths and trees in one forward: every row's logits equal a
    plain forward of its path, and each slot's commit equals a fresh prefill of its sequence."""
    rng = random.Random(2)
    target = HFTarget(tiny_model)
    slots = [target.allocate() for _ in range(3)]
    assert slots == [0, 1, 2], "slots are allocated in order, so they form one range"
    prompts = [[rng.randrange(3, 96) for _ in range(n)] for n in (5, 11, 8)]
    trees = [random_tree(rng, n, 96) for n in (6, 2, 9)]
    for slot, prompt in zip(slots, prompts):
        target.prefill(slot, prompt[:-1])
    outs = target.forward_batch(
        range(3), [[p[-1], *t.tokens] for p, t in zip(prompts, trees)], [[-1, *(q + 1 for q in t.parents)] for t in trees]
    )
    for prompt, tree, out in zip(prompts, trees, outs):
        assert out.logits.shape == (len(tree) + 1, 96)
        torch.testing.assert_close(out.logits[0], plain_logits(tiny_model, prompt), rtol=1e-4, atol=1e-4)
        for i in range(len(tree)):
            torch.testing.assert_close(out.logits[i + 1], plain_logits(tiny_model, prompt + branch(tree, i)), rtol=1e-4, atol=1e-4)
    for slot, prompt, tree in zip(slots, prompts, trees):
        leaf = max(range(len(tree)), key=lambda i: len(branch(tree, i)))
        path = []
        node = leaf
        while node >= 0:
            path.append(node)
            node = tree.parents[node]
        path = path[::-1]
        target.commit(slot, [0, *(i + 1 for i in path)])
        assert_slot_equals_fresh_prefill(target, slot, prompt + [tree.tokens[i] for i in path])


def test_batched_forward_over_scattered_slots(tiny_model):
    """Slots that are not one range (a batch whose members joined at different times), in any
    order: the same logits and commits as one slot at a time; a repeated slot is refused."""
    rng = random.Random(5)
    target = HFTarget(tiny_model)
    slots = [target.allocate() for _ in range(5)]
    prompts = {s: [rng.randrange(3, 96) for _ in range(rng.randrange(3, 12))] for s in slots}
    for s, p in prompts.items():
        target.prefill(s, p[:-1])
    batch = [slots[3], slots[0], slots[4]]
    trees = [random_tree(rng, n, 96) for n in (4, 7, 1)]
    with pytest.raises(ValueError, match="distinct slots"):
        target.forward_batch([slots[0], slots[0]], [[1], [1]], [[-1], [-1]])
    outs = target.forward_batch(
        batch, [[prompts[s][-1], *t.tokens] for s, t in zip(batch, trees)], [[-1, *(q + 1 for q in t.parents)] for t in trees]
    )
    for s, tree, out in zip(batch, trees, outs):
        for i in range(len(tree)):
            torch.testing.assert_close(out.logits[i + 1], plain_logits(tiny_model, prompts[s] + branch(tree, i)), rtol=1e-4, atol=1e-4)
        target.commit(s, [0, 1])
        assert_slot_equals_fresh_prefill(target, s, prompts[s] + [tree.tokens[0]])
    for s in (slots[1], slots[2]):
        assert_slot_equals_fresh_prefill(target, s, prompts[s][:-1])


def test_plain_rows_fast_path_equals_the_general_path(tiny_model):
    """One row per slot and nothing pending (plain batched decoding) takes ``_plain_inputs``:
    bit-for-bit the logits, cache rows and next steps of the general path, its twin, over
    scattered slots of different lengths and several steps, hidden states included."""
    rng = random.Random(9)
    prompts = [[rng.randrange(3, 96) for _ in range(rng.randrange(2, 14))] for _ in range(5)]
    runs = {}
    for fast in (True, False):
        target = HFTarget(tiny_model, plain_fast_path=fast)
        slots = [target.allocate() for _ in prompts]
        for slot, prompt in zip(slots, prompts):
            target.prefill(slot, prompt[:-1])
        batch = [slots[3], slots[0], slots[4], slots[1]]
        last = {s: prompts[slots.index(s)][-1] for s in batch}
        logits, hidden = [], []
        for _ in range(4):
            outs = target.forward_batch(batch, [[last[s]] for s in batch], [[-1]] * len(batch), output_hidden=True, hidden_layer=1)
            for s, out in zip(batch, outs):
                logits.append(out.logits)
                hidden.append(out.hidden)
                target.commit(s, [0])
                last[s] = int(out.logits[0].argmax())
        keys = [layer.keys[s, :, : target.length(s)].clone() for layer in target.cache.layers for s in batch]
        runs[fast] = (logits, hidden, keys, [target.length(s) for s in batch])
    for a, b in zip(runs[True], runs[False]):
        if isinstance(a, list) and a and isinstance(a[0], torch.Tensor):
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        else:
            assert a == b


def test_batch_tree_inputs_equal_the_slot_by_slot_inputs(tiny_model):
    """Tree forwards of slots with equal pending rows build their inputs for the whole batch
    (``HFTarget._batch_tree_inputs``): the same ids, positions and masks, bit for bit, as the
    slot-by-slot build, the same ancestor sets afterwards, hence the same logits and hidden
    states; over slots in any order at different lengths, rows of different counts (padding),
    a second forward on top of pending rows (P > 0), then commits of different chains."""
    import random

    rng = random.Random(3)
    prompts = [[5 + (7 * i + j) % 90 for i in range(6 + 3 * j)] for j in range(4)]
    runs = {}
    for batched in (True, False):
        target = HFTarget(tiny_model, batched_tree_inputs=batched)
        built = []
        for name in ("_batch_tree_inputs", "_tree_inputs"):
            original = getattr(target, name)
            setattr(target, name, lambda *a, _f=original, _n=name: built.append((_n, *(t.clone() for t in _f(*a)))) or built[-1][1:])
        slots = [target.allocate() for _ in prompts]
        for slot, prompt in zip(slots, prompts):
            target.prefill(slot, prompt)
        batch = [slots[2], slots[0], slots[3], slots[1]]
        rng.seed(3)
        outs, expected = [], []
        for r in range(3):
            counts = [rng.randint(1, 6) for _ in batch] if r != 1 else [4] * len(batch)
            # the second forward finds equal pending rows (P > 0) only where the counts are equal
            expected += ["_batch_tree_inputs", "_batch_tree_inputs" if len(set(counts)) == 1 else "_tree_inputs"]
            parents = [[-1] + [rng.randrange(i + 1) for i in range(c - 1)] for c in counts]
            tokens = [[rng.randrange(3, 90) for _ in range(c)] for c in counts]
            outs += target.forward_batch(batch, tokens, parents, output_hidden=True, hidden_layer=1)
            # P > 0: one more row under each slot's pending row 0, then keep a chain per slot
            outs += target.forward_batch(batch, [[rng.randrange(3, 90)] for _ in batch], [[0]] * 4)
            for s, c in zip(batch, counts):
                target.commit(s, [0, c])  # the root, then the row hung from it
        if batched:
            assert [b[0] for b in built] == expected and expected.count("_batch_tree_inputs") >= 4
        runs[batched] = (built, outs, {s: target._ancestors[s].clone() for s in batch}, [target.length(s) for s in batch])
    (built_a, outs_a, anc_a, len_a), (built_b, outs_b, anc_b, len_b) = runs[True], runs[False]
    assert len_a == len_b
    for (_, *x), (_, *y) in zip(built_a, built_b, strict=True):
        assert all(torch.equal(u, v) for u, v in zip(x, y, strict=True))
    for x, y in zip(outs_a, outs_b, strict=True):
        assert torch.equal(x.logits, y.logits) and (x.hidden is None or torch.equal(x.hidden, y.hidden))
    assert all(torch.equal(anc_a[s], anc_b[s]) for s in anc_a)


def test_slots_grow_and_are_reused(tiny_model):
    """Room grows by doubling, slots by doubling; a released slot is reused and starts empty."""
    target = HFTarget(tiny_model, capacity=4)
    a = target.allocate()
    target.prefill(a, list(range(3, 40)))
    assert target.cache.capacity >= 37 and target.length(a) == 37
    b, c = target.allocate(), target.allocate()
    assert target.cache.num_slots >= 3
    target.prefill(b, [5, 6, 7])
    assert_slot_equals_fresh_prefill(target, a, list(range(3, 40)))
    target.release(b)
    assert target.allocate() == b and target.length(b) == 0
    with pytest.raises(ValueError, match="not an allocated slot"):
        target.release(17)
    del c


def test_cache_bookkeeping_errors():
    cache = SlotCache(num_layers=1, capacity=8)
    slot = cache.allocate()
    with pytest.raises(ValueError, match="not ascending rows"):
        cache.commit(slot, [0])  # nothing pending


def test_long_prompt_prefilled_in_chunks_then_tree_passes(tiny_model):
    """A prompt longer than ``prefill_chunk`` followed by tree passes equals plain greedy decoding."""
    rng = random.Random(3)
    prompt = [rng.randrange(3, 96) for _ in range(70)]
    target = HFTarget(tiny_model, prefill_chunk=16)
    drafters, composer = build_method("pld", target)
    engine = SpecEngine(target, drafters, composer)
    got = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=20, budget=8, stop_on_eos=False))
    assert got == hf_greedy(tiny_model, prompt, 20)


@pytest.mark.parametrize("method", ["pld", "recycling", "ptd", "draft-tree", "graft"])
def test_context_window_edge(method):
    """Generation runs to the last position of the context window and stops there, equal to plain
    greedy decoding (trees near the edge are cut to the room left; a draft model feeds more rows
    than positions there: positions, not rows, must stay inside the window)."""
    model = tiny_llama()
    model.config.max_position_embeddings = 64
    draft = tiny_llama(seed=3)
    draft.config.max_position_embeddings = 64
    rng = random.Random(4)
    unit = [rng.randrange(3, 96) for _ in range(5)]
    prompt = (unit * 10)[:50]
    target = HFTarget(model)
    drafters, composer = build_method(method, target, MethodOptions(graft=GraftOptions(depth=4, top_k=3)), draft)
    engine = SpecEngine(target, drafters, composer)
    got = engine.generate_ids(prompt, GenerationConfig(max_new_tokens=40, budget=8, stop_on_eos=False))
    assert len(prompt) + len(got) == 64 + 1, "the last committed position is the window's last one, plus the bonus token"
    assert got == hf_greedy(model, prompt, len(got))


def test_eager_attention_equals_sdpa():
    model = tiny_llama()
    eager = tiny_llama()
    eager.config._attn_implementation = "eager"
    tree = DraftTree(tokens=[11, 12, 13, 14], parents=[-1, 0, -1, 2], sources=["t"] * 4)
    outs = []
    for m in (model, eager):
        target = HFTarget(m)
        slot = target.allocate()
        target.prefill(slot, [5, 6, 7, 8])
        outs.append(target.forward_tree(slot, 9, tree).logits)
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-4, atol=1e-4)


def test_models_the_tree_mask_cannot_serve_are_refused_at_construction():
    model = tiny_llama()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="attention implementation 'flash_attention_2'.*sdpa"):
        HFTarget(model)
    cfg = MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=512, sliding_window=16)
    cfg._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="sliding_attention layers"):
        HFTarget(MistralForCausalLM(cfg))


def test_bad_rows_and_commits_are_errors_that_change_nothing(tiny_model):
    target = HFTarget(tiny_model)
    slot = target.allocate()
    target.prefill(slot, [5, 6, 7])
    target.forward_rows(slot, [8, 9], [-1, 0])
    with pytest.raises(ValueError, match="parent row 5 of new row 2"):
        target.forward_rows(slot, [10], [5])
    with pytest.raises(ValueError, match="not a chain"):
        target.commit(slot, [1])
    assert target.cache.pending[slot] == 2 and target.cache.write is None, "the failed calls changed nothing"
    target.commit(slot, [0, 1])
    assert_slot_equals_fresh_prefill(target, slot, [5, 6, 7, 8, 9])
    with pytest.raises(ValueError, match="past the context window"):
        target.forward_rows(slot, [3 + i % 90 for i in range(600)], list(range(-1, 599)))


def test_token_ids_outside_the_vocabulary_are_errors():
    target = HFTarget(tiny_llama())
    slot = target.allocate()
    with pytest.raises(ValueError, match="token id 96 is outside the vocabulary"):
        target.prefill(slot, [5, 96])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        target.forward_tree(slot, 5, DraftTree(tokens=[200], parents=[-1], sources=["x"]))


@pytest.mark.parametrize("arch", sorted(TINY_MODELS))
def test_pending_rows_of_one_slot_never_reach_another(arch):
    """Two sequences interleaved step by step on one adapter give what each gives alone."""
    model = TINY_MODELS[arch]()
    target = HFTarget(model)
    drafters, composer = build_method("pld", target)
    engine = SpecEngine(target, drafters, composer)
    config = GenerationConfig(max_new_tokens=16, budget=8, stop_on_eos=False)
    prompts = [[7, 8, 9, 7, 8, 9, 7, 8], [20, 21, 22, 23, 20, 21]]
    alone = [engine.generate_ids(p, config) for p in prompts]
    seqs = [engine.start(p, config) for p in prompts]
    while not all(s.done for s in seqs):
        for s in seqs:
            if not s.done:
                engine.step(s)
    for s in seqs:
        engine.finish(s)
    assert [s.new_tokens for s in seqs] == alone


def test_committing_the_first_pending_row_alone_needs_no_check(tiny_model, monkeypatch):
    """A plain step commits its root row alone (``[0]``): always a chain (the first pending row
    has no pending parent), so the chain check and its two host transfers (device syncs on a
    GPU) are skipped; the slot then holds what a fresh prefill gives."""
    target = HFTarget(tiny_model)
    slot = target.allocate()
    target.prefill(slot, [5, 6, 7])
    target.forward_rows(slot, [8, 9, 4], [-1, 0, -1])  # a root row and a tree under it
    class WriteOnly(dict):  # the check would read the slot's ancestor sets; the reset writes them
        def __getitem__(self, key):
            raise AssertionError("the chain check ran")

    monkeypatch.setattr(target, "_ancestors", WriteOnly())
    target.commit(slot, [0])
    assert_slot_equals_fresh_prefill(target, slot, [5, 6, 7, 8])


def test_host_tree_inputs_equal_the_device_inputs(tiny_model):
    """One slot's tree given as host lists with nothing pending (the engine's verify pass, a fused
    start's prompt chain) gets its inputs built on the host (``HFTarget._host_tree_inputs``): the
    same ids, positions and masks, bit for bit, as the device path, padded or not; the same
    logits and ancestor sets; a forward on top of those pending rows (P > 0, device path) and the
    commit's chain check (on the host arrays) behave the same, a non-chain refused both ways."""
    import random

    rng = random.Random(5)
    for trial in range(12):
        length = rng.randint(1, 30)
        n = rng.randint(2, 12)
        parents = [-1] + [rng.randrange(-1, i + 1) if trial % 3 == 0 else rng.randrange(i + 1) for i in range(n - 1)]
        tokens = [rng.randrange(3, 90) for _ in range(n)]
        n_rows = n + (trial % 4)  # padding rows, as the CUDA graphs' row counts add
        target = HFTarget(tiny_model)
        slot = target.allocate()
        target.prefill(slot, [3 + (7 * i) % 80 for i in range(length)])
        host = target._host_tree_inputs(slot, tokens, parents, n_rows)
        host_seen = target._ancestors[slot]
        target._ancestors[slot] = target._empty_ancestors()
        device = target._tree_inputs([slot], [torch.tensor(tokens)], [torch.tensor(parents)], [n], n_rows)
        assert all(torch.equal(a, b) for a, b in zip(host, device, strict=True)), trial
        assert isinstance(host_seen, np.ndarray) and np.array_equal(host_seen, target._ancestors[slot].numpy())
    runs = {}
    for on in (True, False):
        target = HFTarget(tiny_model, host_tree_inputs=on)
        slot = target.allocate()
        target.prefill(slot, [5, 6, 7, 8])
        outs = [target.forward_rows(slot, [9, 4, 11, 12], [-1, 0, 0, 1], output_hidden=True, hidden_layer=1)]
        assert isinstance(target._ancestors[slot], np.ndarray) == on
        outs.append(target.forward_rows(slot, [13], [3]))  # P > 0: under pending row 3
        with pytest.raises(ValueError, match="not a chain"):
            target.commit(slot, [0, 2, 3])
        target.commit(slot, [0, 1, 3, 4])
        outs.append(target.forward_rows(slot, [6, 7], [-1, 0]))
        runs[on] = (outs, target.length(slot))
    assert runs[True][1] == runs[False][1]
    for x, y in zip(runs[True][0], runs[False][0], strict=True):
        assert torch.equal(x.logits, y.logits) and (x.hidden is None or torch.equal(x.hidden, y.hidden))
