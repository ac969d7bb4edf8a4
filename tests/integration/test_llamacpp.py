"""The llama.cpp backend (``specgraft/models/llamacpp.py``) on tiny GGUFs the tests write.

Tree rows through sequence-id sets must equal each root-to-node path fed as a chain; commit and
discard must leave the cache as a fresh prefill of the kept text would; in strict mode every
method must equal this backend's own ``ar`` token for token (greedy, and seeded sampling with
deterministic drafts). The real catalog GGUFs, when pulled, pin the row-invariance classes that
strict mode relies on (``test_catalog_gguf_row_classes``) and the strict equality on 50 prompts.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp")

from specgraft import machine  # noqa: E402
from specgraft.config import GenerationConfig, SamplingConfig  # noqa: E402
from specgraft.engine import SpecEngine  # noqa: E402
from specgraft.methods import MethodOptions, get_method  # noqa: E402
from specgraft.models.llamacpp import STRICT_ROWS, LlamaCppTarget, strict_rows  # noqa: E402
from specgraft.types import DraftTree, PrefillRequest  # noqa: E402

from tests.helpers.gguf_models import write_tiny_gguf  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    """``{"f32": path, "q8": path, "q4": path, "draft": path}``: a float32 target, a Q8_0 one, a
    Q4_0 one, and a draft model sharing the vocabulary (another random model)."""
    root = tmp_path_factory.mktemp("gguf")
    return {
        "f32": write_tiny_gguf(root / "tiny-f32.gguf"),
        "q8": write_tiny_gguf(root / "tiny-q8.gguf", qtype="Q8_0"),
        "q4": write_tiny_gguf(root / "tiny-q4.gguf", qtype="Q4_0"),
        "draft": write_tiny_gguf(root / "tiny-draft.gguf", seed=1, layers=1),
    }


def target_of(ggufs, kind: str = "f32", strict: bool = False) -> LlamaCppTarget:
    return LlamaCppTarget(ggufs[kind], threads=1, strict=strict)


def test_loading_prints_only_what_the_log_level_asks(ggufs):
    """llama.cpp's loading chatter stays off stderr unless ``SPECGRAFT_LLAMACPP_LOG`` asks for
    it (llama-cpp-python's own filter reads ggml's levels off by one: ``llamacpp_lib.py``)."""
    code = f"from specgraft.models.llamacpp import LlamaCppTarget; LlamaCppTarget({str(ggufs['f32'])!r}, threads=1)"

    def stderr(level: str | None) -> str:
        env = {k: v for k, v in os.environ.items() if k != "SPECGRAFT_LLAMACPP_LOG"}
        if level is not None:
            env["SPECGRAFT_LLAMACPP_LOG"] = level
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
        assert run.returncode == 0, run.stderr
        return run.stderr

    assert stderr(None) == ""
    assert "llama_model_loader: loaded meta data" in stderr("info")


def test_llamacpp_errors_reach_stderr(tmp_path):
    """What llama.cpp logs as an error is printed (llama-cpp-python's filter dropped it)."""
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"NOT A GGUF" * 100)
    code = (
        "from specgraft.models.llamacpp import LlamaCppTarget\n"
        f"try:\n    LlamaCppTarget({str(bad)!r}, threads=1)\nexcept ValueError as e:\n    print(e)"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPECGRAFT_LLAMACPP_LOG"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "could not load" in run.stdout
    assert "invalid magic characters" in run.stderr, run.stderr


def chain_logits(target: LlamaCppTarget, prefix: list[int], path: list[int]) -> torch.Tensor:
    """Logits of ``path`` fed as a chain after ``prefix`` in a fresh slot."""
    slot = target.allocate()
    try:
        target.prefill(slot, prefix)
        return target.forward_rows(slot, path, list(range(-1, len(path) - 1))).logits.clone()
    finally:
        target.release(slot)


TREE = DraftTree(tokens=[11, 12, 13, 14, 15, 16], parents=[-1, -1, 0, 0, 2, 1], sources=["test"] * 6)


def paths(tree: DraftTree) -> list[list[int]]:
    """Each node's root-to-node node list."""
    out = []
    for i in range(len(tree)):
        path, node = [], i
        while node >= 0:
            path.append(node)
            node = tree.parents[node]
        out.append(path[::-1])
    return out


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("kind", ["f32", "q8"])
def test_tree_rows_equal_their_paths_fed_as_chains(ggufs, kind, strict):
    """Each tree row sees exactly its committed prefix, ancestors and itself: its logits equal
    the last row of its path fed alone as a chain (bit for bit in strict mode, where both
    forwards compute in one row class; to rounding otherwise)."""
    target = target_of(ggufs, kind, strict)
    prefix, root = [5, 6, 7, 8, 9], 10
    slot = target.allocate()
    target.prefill(slot, prefix)
    tree_logits = target.forward_tree(slot, root, TREE).logits
    for i, path in enumerate(paths(TREE)):
        expected = chain_logits(target, prefix, [root, *(TREE.tokens[j] for j in path)])[-1]
        if strict:
            assert torch.equal(tree_logits[i + 1], expected), f"node {i}"
        else:
            torch.testing.assert_close(tree_logits[i + 1], expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize("strict", [False, True])
def test_commit_leaves_the_cache_a_fresh_prefill_would(ggufs, strict):
    """After a tree and a commit of one branch, the next forward sees exactly the kept text: its
    logits equal those after a fresh prefill of it: bit for bit in strict mode; in the default
    mode the freed cells of the rejected rows are reused, so the cells are summed in another
    order (flash attention accumulates V in fp16, ~1e-2 here) and the argmax agrees."""
    target = target_of(ggufs, "q8", strict)
    prefix, root = [5, 6, 7, 8, 9], 10
    slot = target.allocate()
    target.prefill(slot, prefix)
    target.forward_tree(slot, root, TREE)
    target.commit(slot, [0, 1, 3])  # root, node 0 (11), node 2 (13)
    assert target.length(slot) == len(prefix) + 3
    after = target.forward_rows(slot, [20, 21], [-1, 0]).logits
    fresh = chain_logits(target, [*prefix, root, 11, 13], [20, 21])
    if strict:
        assert torch.equal(after, fresh)
    else:
        torch.testing.assert_close(after, fresh, rtol=0, atol=0.05)
        assert after.argmax(-1).tolist() == fresh.argmax(-1).tolist()


def test_discard_and_failed_forwards_leave_the_slot_as_it_was(ggufs):
    target = target_of(ggufs, "q8", strict=True)
    slot = target.allocate()
    target.prefill(slot, [5, 6, 7])
    before = chain_logits(target, [5, 6, 7], [8])
    target.forward_tree(slot, 8, TREE)
    target.discard(slot)
    with pytest.raises(ValueError, match="parent row 5"):
        target.forward_rows(slot, [8, 9], [-1, 5])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        target.forward_rows(slot, [8, 999], [-1, 0])
    with pytest.raises(ValueError, match="not a chain"):
        target.forward_tree(slot, 8, TREE)
        target.commit(slot, [0, 3])  # row 3 (node 2) hangs from row 1 (node 0), not from row 0
    target.discard(slot)
    assert target.length(slot) == 3
    assert torch.equal(target.forward_rows(slot, [8], [-1]).logits, before)


def test_layers_hang_from_earlier_pending_rows(ggufs):
    """A draft model drafts layer by layer: later forwards add children (first and further ones)
    to rows of earlier forwards; every row still equals its path fed as a chain."""
    target = target_of(ggufs, "f32", strict=True)
    prefix = [5, 6, 7]
    slot = target.allocate()
    target.prefill(slot, prefix)
    first = target.forward_rows(slot, [8, 20, 21], [-1, 0, 0]).logits  # root, two children
    second = target.forward_rows(slot, [22, 23, 24], [1, 1, 2]).logits  # 22, 23 under 20; 24 under 21
    third = target.forward_rows(slot, [25, 26], [0, 3]).logits  # a third child of the root; under 22
    rows = [(first, 0, [8]), (first, 1, [8, 20]), (first, 2, [8, 21]), (second, 0, [8, 20, 22]), (second, 1, [8, 20, 23]),
            (second, 2, [8, 21, 24]), (third, 0, [8, 25]), (third, 1, [8, 20, 22, 26])]
    for logits, i, path in rows:
        assert torch.equal(logits[i], chain_logits(target, prefix, path)[-1]), path
    target.commit(slot, [0, 1, 3, 7])  # 8, 20, 22, 26
    assert torch.equal(target.forward_rows(slot, [30], [-1]).logits, chain_logits(target, [*prefix, 8, 20, 22, 26], [30]))


def test_slots_in_one_forward_equal_each_alone(ggufs):
    target = target_of(ggufs, "q8", strict=True)
    a, b = target.allocate(), target.allocate()
    target.prefill(a, [5, 6, 7])
    target.prefill(b, [40, 41])
    outs = target.forward_batch([b, a], [[42, 43, 44], [8, 9]], [[-1, 0, 0], [-1, 0]])
    assert torch.equal(outs[0].logits, torch.cat([chain_logits(target, [40, 41], [42, 43]), chain_logits(target, [40, 41], [42, 44])[-1:]]))
    assert torch.equal(outs[1].logits, chain_logits(target, [5, 6, 7], [8, 9]))
    target.commit(a, [0])
    target.commit(b, [0, 2])
    assert (target.length(a), target.length(b)) == (4, 4)


def test_prefill_top_k_and_no_hidden_states(ggufs):
    target = target_of(ggufs, "f32")
    slot = target.allocate()
    out = target.prefill(slot, list(range(3, 80)), PrefillRequest(topk=4, topk_probs=True))
    assert out.topk.shape == (77, 4) and out.topk_probs.shape == (77, 4)
    last = chain_logits(target, list(range(3, 79)), [79])[-1]
    assert out.topk[-1].tolist() == last.topk(4).indices.tolist()
    with pytest.raises(ValueError, match="no hidden states"):
        target.forward_rows(slot, [5], [-1], output_hidden=True)
    with pytest.raises(ValueError, match="no hidden states"):
        target.prefill(target.allocate(), [5, 6], PrefillRequest(hidden=True))
    with pytest.raises(ValueError, match="no GGUF file"):
        LlamaCppTarget(ggufs["f32"].parent / "missing.gguf")


def test_strict_rows():
    assert STRICT_ROWS == (8, 4, 60)
    assert [strict_rows(n) for n in (1, 7, 8, 9, 59, 60)] == [8, 8, 8, 12, 60, 60]
    with pytest.raises(ValueError, match="at most 60"):
        strict_rows(61)


def test_tiny_model_row_classes(ggufs):
    """Why strict mode pads: with float32 weights llama.cpp computes a 1-row batch apart from
    2-63 rows, and from 64 query rows its flash attention is tiled (another class); strict mode
    keeps every decode in 8-60 rows."""
    target = target_of(ggufs, "f32")
    slot = target.allocate()
    target.prefill(slot, list(range(3, 40)))
    chain = [5 + (7 * i) % 80 for i in range(64)]
    first = {}
    for n in (1, 2, 8, 60, 64):
        first[n] = target.forward_rows(slot, chain[:n], list(range(-1, n - 1))).logits[0]
        target.discard(slot)
    assert torch.equal(first[2], first[8]) and torch.equal(first[8], first[60])
    assert not torch.equal(first[1], first[2])
    assert not torch.equal(first[60], first[64])


def engines(target: LlamaCppTarget, draft: LlamaCppTarget, methods: list[str]) -> dict[str, SpecEngine]:
    out = {}
    for name in ["ar", *methods]:
        spec = get_method(name)
        out[name] = SpecEngine(target, *spec.build(target, MethodOptions(), draft if spec.needs_draft_model else None), method=name)
    return out


def repetitive_prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        unit = [rng.randrange(3, 96) for _ in range(rng.randint(2, 6))]
        out.append((unit * 10)[: rng.randint(6, 40)])
    return out


METHODS = ["pld", "recycling", "ptd", "draft-tree", "graft", "reader-trie"]


def test_every_method_equals_ar_in_strict_mode(ggufs):
    """Greedy: token for token, every method against this backend's own ``ar``, 50 prompts."""
    target = target_of(ggufs, "q8", strict=True)
    draft = LlamaCppTarget(ggufs["draft"], threads=1)
    runs = engines(target, draft, METHODS)
    config = GenerationConfig(max_new_tokens=24, budget=8, stop_on_eos=False)
    accepted = {m: 0 for m in METHODS}
    for prompt in repetitive_prompts(50, seed=3):
        expected = runs["ar"].generate_ids(prompt, config)
        for m in METHODS:
            assert runs[m].generate_ids(prompt, config) == expected, m
            accepted[m] += runs[m].last_stats.new_tokens - runs[m].last_stats.steps
    assert all(accepted[m] > 0 for m in ("pld", "recycling", "draft-tree")), accepted


def test_seeded_sampling_equals_ar_in_strict_mode(ggufs):
    """Sampling with deterministic drafts draws once per emitted token from the request's
    generator, so a seed gives ``ar``'s sampled tokens exactly."""
    target = target_of(ggufs, "q8", strict=True)
    draft = LlamaCppTarget(ggufs["draft"], threads=1)
    runs = engines(target, draft, ["pld", "draft-tree"])
    for i, prompt in enumerate(repetitive_prompts(6, seed=5)):
        config = GenerationConfig(max_new_tokens=20, budget=8, stop_on_eos=False, sampling=SamplingConfig(temperature=0.8, top_p=0.95, seed=i))
        expected = runs["ar"].generate_ids(prompt, config)
        assert runs["pld"].generate_ids(prompt, config) == expected
        assert runs["draft-tree"].generate_ids(prompt, config) == expected


def test_sampled_first_token_follows_the_target(ggufs):
    """Statistical (~0.1 total variation): the first sampled token of ``pld`` on this backend
    follows the target's softmax at temperature 1."""
    target = target_of(ggufs, "f32")
    engine = engines(target, None, ["pld"])["pld"]
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    p = chain_logits(target, prompt[:-1], prompt[-1:])[-1].softmax(-1)
    n = 400
    counts = torch.zeros(len(p))
    for s in range(n):
        config = GenerationConfig(max_new_tokens=2, budget=8, stop_on_eos=False, sampling=SamplingConfig(temperature=1.0, seed=s))
        counts[engine.generate_ids(prompt, config)[0]] += 1
    assert 0.5 * (counts / n - p).abs().sum().item() < 0.15


# -- the catalog's real GGUFs, when pulled -----------------------------------------------------


def catalog_gguf(name: str):
    from specgraft.models.catalog import get_entry, load_catalog, model_dir

    entry = get_entry(name, load_catalog())
    path = model_dir(name) / entry.gguf_name
    if not path.is_file():
        pytest.skip(f"{name}'s GGUF is not pulled (specgraft models pull {name})")
    return path


def first_rows(target: LlamaCppTarget, prompt: list[int], chain: list[int], sizes) -> dict[int, np.ndarray]:
    slot = target.allocate()
    target.prefill(slot, prompt)
    out = {}
    for n in sizes:
        out[n] = target.forward_rows(slot, chain[:n], list(range(-1, n - 1))).logits.numpy()
        target.discard(slot)
    target.release(slot)
    return out


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"])
def test_catalog_gguf_row_classes(name):
    """Strict mode's premise on the real GGUFs: in batches of 8 to 60 rows, every row in a
    whole group of 4 is bit-identical whatever the batch size and wherever it sits in the batch
    (three slots with the same text in one forward). SmolLM2's Q4_1 is invariant from one row
    up. (The Qwen Q4_K_M computes small batches another way for some contexts: after a
    19-token prompt, row 0 of a 1-5 row batch differs from the same row in 8+ rows by 0.25 in a
    logit on an AVX-512 build; the default mode's near-tie flips come from there.) On a build
    with AMX kernels every row is bit-identical in every batch of 1 to 63 rows (after this short
    prompt: a one-row batch over 512+ cached cells takes another attention kernel)."""
    target = LlamaCppTarget(catalog_gguf(name), threads=2, n_ctx=1024)
    chain = [int(t) for t in torch.randint(100, 1000, (63,), generator=torch.Generator().manual_seed(0))]
    prompt = list(range(200, 219))
    rows = first_rows(target, prompt, chain, [1, 2, 3, 4, 5, 8, 12, 20, 36, 60, 63])
    for n in (8, 12, 20, 36):
        assert np.array_equal(rows[n], rows[60][:n]), n
    if machine.llamacpp_amx():  # AMX kernels: every row the same in every batch of 1 to 63 rows
        for n in (1, 2, 3, 4, 5, 8, 12, 20, 36, 60):
            assert np.array_equal(rows[n], rows[63][:n]), n
    if name.startswith("smollm2"):
        assert all(np.array_equal(rows[n][0], rows[60][0]) for n in (1, 2, 4))
    slots = [target.allocate() for _ in range(3)]
    for slot in slots:
        target.prefill(slot, prompt)
    outs = target.forward_batch(slots, [chain[:4]] * 3, [[-1, 0, 1, 2]] * 3)
    assert all(np.array_equal(out.logits.numpy(), rows[60][:4]) for out in outs)


def test_q4_0_rows_are_bit_identical_on_amx(ggufs):
    """Q4_0 (what a draft is requantized to) on a build with AMX: every row bit-identical in
    batches of 1 to 63 rows, 2-8 of them through the small-batch kernels where the build has
    them (``llamacpp_amx_rows.inc``), the rest on the one-row kernel or the tiles."""
    if not machine.llamacpp_amx():
        pytest.skip("llama.cpp's AMX kernels are not in this build")
    target = LlamaCppTarget(ggufs["q4"], threads=2)
    chain = [int(t) for t in torch.randint(3, 96, (63,), generator=torch.Generator().manual_seed(0))]
    rows = first_rows(target, list(range(3, 22)), chain, [1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 63])
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 12, 16):
        assert np.array_equal(rows[n], rows[63][:n]), n


def test_requantized_draft_gguf(ggufs, tmp_path):
    """``--draft-quant`` on the llama.cpp backend: ``q4_0`` / ``q8_0`` write a requantized copy
    once and reuse it while the source is unchanged; ``auto`` is Q4_0 unless the file is Q4_0
    already; ``none`` keeps the file."""
    import os
    import shutil

    from gguf import GGUFReader

    from specgraft.models.gguf_requant import draft_gguf, gguf_file_type

    source = tmp_path / "d.gguf"
    shutil.copy(ggufs["q8"], source)
    q4 = draft_gguf(source, "q4_0", progress=False)
    assert q4 != source and gguf_file_type(q4) == 2
    assert {t.tensor_type.name for t in GGUFReader(q4).tensors} == {"Q4_0", "F32"}, "the norms stay float32"
    written = q4.stat().st_mtime_ns
    assert draft_gguf(source, "auto", progress=False) == q4 and q4.stat().st_mtime_ns == written, "made once"
    assert draft_gguf(q4, "auto", progress=False) == q4, "already Q4_0"
    assert draft_gguf(source, "none", progress=False) == source
    assert gguf_file_type(draft_gguf(source, "q8_0", progress=False)) == 7
    os.utime(source, ns=(written, written + 10**9))
    assert draft_gguf(source, "q4_0", progress=False) != q4, "a changed source is requantized again"


def test_smollm2_methods_equal_ar_in_strict_mode():
    """A real model: 8 chat prompts of the benchmark sets (their last 96 tokens), 16 new tokens:
    ``pld``, ``recycling`` and ``ptd`` on SmolLM2-135M's catalog GGUF in strict mode equal its
    ``ar`` token for token (every method on 50 prompts: the tiny GGUFs above)."""
    import json

    from transformers import AutoTokenizer

    from specgraft.suites import load_suite

    path = catalog_gguf("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path.parent)
    target = LlamaCppTarget(path, threads=2, strict=True, n_ctx=2048)
    runs = engines(target, None, ["pld", "recycling", "ptd"])
    suite = load_suite("spec-bench").prompts
    prompts = [p.turns[0] for p in suite[:: len(suite) // 6][:6] + load_suite("code-edit").prompts[:2]]
    config = GenerationConfig(max_new_tokens=16, stop_on_eos=True)
    for text in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        ids = tokenizer(ids, add_special_tokens=False)["input_ids"][-96:]
        expected = runs["ar"].generate_ids(ids, config)
        for m in ("pld", "recycling", "ptd"):
            assert runs[m].generate_ids(ids, config) == expected, (m, json.dumps(text[:60]))


# -- the API and the command line ---------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_dirs(tmp_path_factory):
    """A target and a draft GGUF, each beside the tiny tokenizer (same vocabulary), as a user's
    downloaded GGUF sits beside its tokenizer."""
    from tests.helpers.models import tiny_tokenizer

    out = {}
    for name, seed, layers in (("target", 0, 2), ("draft", 1, 1)):
        folder = tmp_path_factory.mktemp(name)
        write_tiny_gguf(folder / f"{name}.gguf", seed=seed, layers=layers, qtype="Q8_0")
        tiny_tokenizer().save_pretrained(folder)
        out[name] = folder / f"{name}.gguf"
    return out


def test_spec_decoder_on_llamacpp(gguf_dirs):
    """``from_pretrained`` picks the llama.cpp backend for a .gguf file; its draft model loads
    on it too; methods that need hidden states refuse it in one line; ``with_method`` shares it."""
    from specgraft import SpecDecoder
    from specgraft.methods import GraftOptions

    options = MethodOptions(graft=GraftOptions(draft_model=str(gguf_dirs["draft"])))
    dec = SpecDecoder.from_pretrained(str(gguf_dirs["target"]), options=options, threads=1, strict=True, progress=False)
    assert dec.backend == "llamacpp" and dec.method == "draft-tree"
    prompt = "w5 w6 w7 w5 w6 w7 w5 w6"
    out = dec.generate(prompt, max_new_tokens=16, chat=False)
    plain = dec.with_method("ar").generate(prompt, max_new_tokens=16, chat=False)
    assert out.tokens == plain.tokens and len(out.tokens) > 0
    resolved = dec.resolved_config(dec.make_config())
    assert resolved["backend"] == "llamacpp" and resolved["llamacpp"]["strict"] is True
    # the draft's Q8_0 GGUF requantized to Q4_0 (--draft-quant auto), once
    from specgraft.models.gguf_requant import REQUANTIZED_DIR

    requantized = Path(resolved["draft_model"]["gguf"])
    assert requantized.parent == REQUANTIZED_DIR and requantized.name.startswith("draft.q4_0-")
    assert "Q4_0" in resolved["draft_model"]["quantization"]
    as_is = MethodOptions(graft=GraftOptions(draft_model=str(gguf_dirs["draft"]), draft_quant="none"))
    dec = SpecDecoder.from_pretrained(str(gguf_dirs["target"]), options=as_is, threads=1, strict=True, progress=False)
    assert dec.resolved_config(dec.make_config())["draft_model"]["gguf"] == str(gguf_dirs["draft"])
    assert dec.generate(prompt, max_new_tokens=16, chat=False).tokens == plain.tokens
    with pytest.raises(ValueError, match="'int8' is the torch backend's; the llama.cpp backend takes auto, none, q4_0, q8_0"):
        SpecDecoder.from_pretrained(
            str(gguf_dirs["target"]), options=MethodOptions(graft=GraftOptions(draft_model=str(gguf_dirs["draft"]), draft_quant="int8")),
            threads=1, progress=False,
        )
    with pytest.raises(ValueError, match="hidden states"):
        dec.with_method("adapld")
    with pytest.raises(ValueError, match="hidden states"):
        SpecDecoder.from_pretrained(str(gguf_dirs["target"]), method="adapld", progress=False)
    with pytest.raises(ValueError, match="GGUF's own quantization"):
        SpecDecoder.from_pretrained(str(gguf_dirs["target"]), dtype="float32", progress=False)


def test_cli_generate_on_llamacpp(gguf_dirs, monkeypatch, capsys):
    import json as json_module

    from tests.helpers.cli import run_cli

    code, out, err = run_cli(
        monkeypatch, capsys, "generate", "--model", str(gguf_dirs["target"]), "--method", "pld", "--strict", "--threads", "1",
        "--max-new-tokens", "12", "--no-chat", "--compare", "--json", "w5 w6 w7 w5 w6 w7 w5 w6",
    )
    assert code == 0, err
    summary = json_module.loads(out)
    assert summary["agreement"] == 1.0 and summary["config"]["backend"] == "llamacpp"
    assert summary["config"]["dtype"].startswith("llama ")  # llama.cpp's description of the GGUF: architecture, size, type
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", str(gguf_dirs["target"]), "--dtype", "float32", "w5")
    assert code == 2 and err.count("\n") == 1 and "GGUF's own quantization" in err


def test_batched_requests_equal_each_alone_in_strict_mode(ggufs):
    """Continuous batching on one llama.cpp context: requests joining and leaving at random
    steps, the budget cap changing every step (``tests/helpers/batch.py::RandomCap``), each request's
    greedy output equal to this backend's ``ar`` alone (strict mode: no cell is reused while a
    slot is alive, so every sequence's cells stay in position order)."""
    from specgraft.batch import BatchEngine

    from tests.helpers.batch import RandomCap, run_schedule

    target = target_of(ggufs, "q8", strict=True)
    draft = LlamaCppTarget(ggufs["draft"], threads=1)
    runs = engines(target, draft, ["pld", "draft-tree"])
    rng = random.Random(4)
    requests = [(p, GenerationConfig(max_new_tokens=rng.randint(4, 16), budget=8, stop_on_eos=False)) for p in repetitive_prompts(8, seed=7)]
    expected = {str(i): runs["ar"].generate_ids(p, c) for i, (p, c) in enumerate(requests)}
    for name in ("pld", "draft-tree"):
        got = run_schedule(BatchEngine(runs[name], max_batch=3, policy=RandomCap(rng.randrange(100))), requests, rng)
        assert got == expected, name


def test_server_on_llamacpp(gguf_dirs):
    """``specgraft serve`` on a GGUF: concurrent completions batched in one llama.cpp context, each
    equal to this backend's plain decoding of its prompt alone (strict mode)."""
    from concurrent.futures import ThreadPoolExecutor

    import openai

    from specgraft import SpecDecoder
    from specgraft.serve import ServerConfig

    from tests.helpers.server import running_server

    decoder = SpecDecoder.from_pretrained(str(gguf_dirs["target"]), method="pld", threads=1, strict=True, progress=False)
    plain = decoder.with_method("ar")
    prompts = ["w5 w6 w7 w5 w6 w7 w5", "w9 w10 w9 w10 w9 w10", "w20 w21 w22 w20 w21", "w7 w7 w8 w7 w7 w8"]
    expected = [plain.generate(p, max_new_tokens=12, chat=False).text for p in prompts]
    with running_server(ServerConfig(model_name="tiny", max_batch=4, max_queue=8), decoder=decoder) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=30, max_retries=0)

        def complete(prompt: str) -> str:
            return client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0).choices[0].text

        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(complete, prompts)) == expected


def test_llamacpp_cuts_prompt_lookup_at_its_measured_costs(gguf_dirs, tmp_path, monkeypatch):
    """On llama.cpp extra rows are dear: with a cost table for the model, ``pld`` cuts its trees
    by the table's cost of each row count unless a row cost is given."""
    from specgraft import SpecDecoder
    from specgraft.budget.costs import CostTable
    from specgraft.budget.costs import table_name

    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))
    name = str(gguf_dirs["target"])
    table = CostTable(name, "llamacpp", {1: {1: 0.10, 4: 0.14, 8: 0.26, 16: 0.31}}, threads=1)
    table.save(tmp_path / "costs" / table_name(name, "llamacpp", 1))
    dec = SpecDecoder.from_pretrained(name, method="pld", threads=1, progress=False)
    assert dec.options.row_cost is None and dec.options.step_costs == table.step_costs(1)
    assert dec.engine.drafters[0].config.step_costs == table.step_costs(1)
    given = SpecDecoder.from_pretrained(name, method="pld", threads=1, progress=False, options=MethodOptions(row_cost=0.02))
    assert given.options.row_cost == 0.02 and given.options.step_costs is None
