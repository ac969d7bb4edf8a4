"""Retrieval: the trie and the suffix-array datastore against brute-force n-gram counts, the
datastore's files (build, load, refusals), SearchPath, corpus reading and the `datastore` CLI."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from specgraft.retrieval import Continuations, Datastore, SearchPath, TokenTrie, load_datastores, search_path, vocab_hash
from specgraft.retrieval.build import build_datastore
from specgraft.retrieval.corpus import CorpusReader, ExcludeFilter, corpus_files, record_text
from specgraft.retrieval.datastore import build_suffix_array, join_documents
from specgraft.retrieval.trie import ngram_continuations
from tests.helpers.models import tiny_tokenizer

MAX_KEY = 8


def same(a: Continuations, b: Continuations) -> bool:
    return a.matched == b.matched and a.tokens.tolist() == b.tokens.tolist() and a.counts.tolist() == b.counts.tolist()


def keys_of(stream: list[int], rng: random.Random, n: int, alphabet: int) -> list[list[int]]:
    """Keys that occur in ``stream`` (lengths 1..MAX_KEY), some behind a token that never occurs
    (so they back off), and random keys that may not occur at all."""
    keys = []
    for _ in range(n):
        length = rng.randint(1, MAX_KEY)
        i = rng.randrange(0, max(1, len(stream) - length))
        key = [t for t in stream[i : i + length] if t >= 0] or [0]
        keys += [key, [alphabet + 7] + key, [rng.randrange(alphabet) for _ in range(rng.randint(1, MAX_KEY + 2))]]
    return keys


# -- trie ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed,alphabet", [(0, 2), (1, 3), (2, 5)])
def test_trie_equals_brute_force_ngram_counts(seed, alphabet):
    rng = random.Random(seed)
    stream = [rng.randrange(alphabet) for _ in range(400)]
    trie = TokenTrie(max_depth=MAX_KEY + 1)
    trie.extend(stream)
    for key in keys_of(stream, rng, 150, alphabet):
        assert same(trie.next_tokens(key), ngram_continuations(stream, key, MAX_KEY)), key


def test_trie_every_occurring_key_up_to_max_depth():
    rng = random.Random(3)
    stream = [rng.randrange(3) for _ in range(120)]
    trie = TokenTrie(max_depth=MAX_KEY + 1)
    trie.extend(stream)
    keys = {tuple(stream[i : i + n]) for n in range(1, MAX_KEY + 1) for i in range(len(stream) - n + 1)}
    for key in sorted(keys):
        assert same(trie.next_tokens(key), ngram_continuations(stream, key, MAX_KEY)), key


def test_trie_extend_in_pieces_equals_extend_at_once():
    rng = random.Random(4)
    stream = [rng.randrange(4) for _ in range(300)]
    whole, pieces = TokenTrie(6), TokenTrie(6)
    whole.extend(stream)
    i = 0
    while i < len(stream):
        step = rng.randint(0, 9)
        pieces.extend(np.array(stream[i : i + step]))  # numpy input too
        # a query between pieces must not disturb later inserts (the ranked cache is refreshed)
        pieces.next_tokens(stream[max(0, i - 3) : i + step])
        i += step
    assert pieces.stream == whole.stream == stream
    for key in keys_of(stream, rng, 100, 4):
        assert same(pieces.next_tokens(key), whole.next_tokens(key)), key


def test_trie_backoff_and_cap():
    trie = TokenTrie(max_depth=3)
    trie.extend([1, 2, 3, 1, 2, 4, 1, 2])
    c = trie.next_tokens([1, 2])
    assert (c.tokens.tolist(), c.counts.tolist(), c.matched) == ([3, 4], [1, 1], 2)
    # capped to the last max_depth - 1 = 2 tokens: the leading 9 is never looked at
    assert trie.next_tokens([9, 1, 2]).matched == 2
    # [4, 2] never occurred: back off to [2], followed by 3 and 4
    assert trie.next_tokens([4, 2]).tokens.tolist() == [3, 4]
    # [3, 1, 2] -> [1, 2]; the stream's last [1, 2] has no continuation yet
    assert trie.next_tokens([2]).counts.tolist() == [1, 1]
    # no suffix followed by anything: empty, never the unigram distribution
    assert trie.next_tokens([7]).matched == 0 and len(trie.next_tokens([7])) == 0
    assert trie.next_tokens([]).matched == 0
    trie.extend([3])
    assert trie.next_tokens([1, 2]).tokens.tolist() == [3, 4] and trie.next_tokens([1, 2]).counts.tolist() == [2, 1]


def test_trie_rejects_depth_below_two():
    with pytest.raises(ValueError, match="max_depth"):
        TokenTrie(1)


# -- suffix array and datastore ------------------------------------------------------------


def test_suffix_array_equals_sorted_suffixes():
    rng = np.random.default_rng(0)
    for alphabet in (2, 5, 200_000):
        tokens = join_documents([rng.integers(0, alphabet, size=rng.integers(1, 40)) for _ in range(8)])
        ref = sorted(range(len(tokens)), key=lambda i: tokens[i:].tolist())
        assert build_suffix_array(tokens).tolist() == ref


@pytest.mark.parametrize("seed,alphabet", [(0, 2), (1, 3), (2, 6)])
def test_datastore_equals_brute_force_ngram_counts(seed, alphabet):
    rng = random.Random(seed)
    docs = [[rng.randrange(alphabet) for _ in range(rng.randint(0, 60))] for _ in range(12)]
    corpus = join_documents(docs).tolist()
    assert corpus.count(-1) == len(docs)
    ds = Datastore.from_documents(docs, max_key_len=MAX_KEY, sample_cap=10**9)
    for key in keys_of(corpus, rng, 150, alphabet):
        assert same(ds.next_tokens(key), ngram_continuations(corpus, key, MAX_KEY)), key
        lo, hi = ds.key_range(key)
        positions = sorted(int(p) for p in ds.suffix_array[lo:hi])
        followed = [i for i in range(len(corpus) - len(key)) if corpus[i : i + len(key)] == key and corpus[i + len(key)] >= 0]
        assert positions == followed, key


def test_datastore_never_matches_across_documents():
    ds = Datastore.from_documents([[1, 2], [3, 4]])
    assert ds.next_tokens([2]).matched == 0  # 2 ends a document: followed by the separator only
    assert ds.next_tokens([2, 3]).tokens.tolist() == [4]  # [2, 3] never occurs: back off to [3]
    assert ds.next_tokens([2, 3]).matched == 1


def test_datastore_key_length_cap():
    ds = Datastore.from_documents([[1, 2, 3, 4, 5], [9, 2, 3, 4, 6]], max_key_len=2)
    c = ds.next_tokens([1, 2, 3, 4])  # only [3, 4] is used
    assert (c.tokens.tolist(), c.counts.tolist(), c.matched) == ([5, 6], [1, 1], 2)


def test_datastore_samples_huge_ranges_evenly_and_deterministically():
    doc = [0, 1] * 5000 + [0, 2] * 1000 + [0, 3] * 7
    ds = Datastore.from_documents([doc], sample_cap=100)
    c = ds.next_tokens([0])
    size = 6007
    assert c.matched == 1 and c.tokens.tolist()[:2] == [1, 2]
    for token, exact in ((1, 5000), (2, 1000)):
        estimate = int(c.counts[c.tokens == token][0])
        assert abs(estimate - exact) <= size / 100
    assert same(c, ds.next_tokens([0]))
    exact = Datastore.from_documents([doc], sample_cap=10**6).next_tokens([0])
    assert exact.counts.tolist() == [5000, 1000, 7]


def test_datastore_count_cache_is_bounded(monkeypatch):
    import specgraft.retrieval.datastore as datastore

    monkeypatch.setattr(datastore, "_CACHED_RANGE", 2)
    monkeypatch.setattr(datastore, "_CACHE_TOKENS", 3)
    monkeypatch.setattr(datastore, "_CACHE_ENTRIES", 2)
    doc = [0, 1, 0, 2, 0, 1, 3, 1, 3, 2, 3, 1]
    ds = Datastore.from_documents([doc])
    for key in ([0], [3], [1], [0], [3], [0, 1]):
        assert same(ds.next_tokens(key), ngram_continuations(doc, key, MAX_KEY))
        assert ds._counted_tokens <= 3 and len(ds._heads) <= 2
    with pytest.raises(ValueError):  # cached arrays are shared: read-only
        ds.next_tokens([0]).counts[0] = 9


def test_datastore_argument_checks():
    with pytest.raises(ValueError, match="max_key_len"):
        Datastore.from_documents([[1]], max_key_len=0)
    with pytest.raises(ValueError, match="token ids"):
        join_documents([[1, -3]])


# -- datastore files -----------------------------------------------------------------------

WORDS = [f"w{i}" for i in range(3, 12)]


def word_corpus(tmp_path: Path, n: int = 40, seed: int = 0) -> tuple[Path, list[str]]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS[:5]) for _ in range(rng.randint(1, 30))) for _ in range(n)]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"turns": ["q"], "response": t}) + "\n" for t in texts))
    return path, texts


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture
def built(tmp_path, tok):
    corpus, texts = word_corpus(tmp_path)
    out = tmp_path / "ds"
    manifest = build_datastore(tok, [corpus], out, progress=False, tokenizer_name="tiny")
    return out, texts, manifest


def test_build_load_round_trip(built, tok):
    out, texts, manifest = built
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "suffix_array.npy", "tokens.npy"]
    assert not list(out.parent.glob(".ds.*"))  # no temporary folders left
    ds = Datastore.load(out, tokenizer=tok)
    assert isinstance(ds.tokens, np.memmap) and ds.tokens.dtype == np.int32
    assert manifest["documents"] == len(texts) and manifest["tokenizer"] == "tiny"
    assert manifest["vocab_hash"] == vocab_hash(tok) and manifest["token_count"] == len(ds)
    assert manifest["corpus"][0]["documents"] == len(texts) and len(manifest["corpus"][0]["sha256"]) == 64
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    memory = Datastore.from_documents(ids)
    assert ds.tokens.tolist() == memory.tokens.tolist()
    rng = random.Random(5)
    for key in keys_of(memory.tokens.tolist(), rng, 50, 12):
        assert same(ds.next_tokens(key), memory.next_tokens(key))
    [again] = load_datastores([out], tok)
    assert same(again.next_tokens([3, 4]), ds.next_tokens([3, 4]))


def test_build_refuses_existing_dir_unless_overwrite(built, tok, tmp_path):
    out, _, _ = built
    corpus, _ = word_corpus(tmp_path, n=3, seed=1)
    with pytest.raises(ValueError, match="already exists"):
        build_datastore(tok, [corpus], out, progress=False)
    manifest = build_datastore(tok, [corpus], out, progress=False, overwrite=True)
    assert manifest["documents"] == 3 and Datastore.load(out).manifest["documents"] == 3


def test_load_refuses_another_tokenizer(built):
    out, _, _ = built
    with pytest.raises(ValueError, match="built with tokenizer 'tiny'"):
        Datastore.load(out, tokenizer=tiny_tokenizer(vocab=50))
    with pytest.raises(ValueError, match="built with tokenizer"):
        load_datastores([out], "sha256:0000")


def one_line_error(out: Path, match: str) -> None:
    with pytest.raises(ValueError, match=match) as info:
        Datastore.load(out)
    assert "\n" not in str(info.value)


def test_load_refuses_truncated_array(built):
    out, _, _ = built
    data = (out / "tokens.npy").read_bytes()
    (out / "tokens.npy").write_bytes(data[: len(data) - 12])
    one_line_error(out, "tokens.npy")
    (out / "tokens.npy").write_bytes(data[:50])  # a cut header
    one_line_error(out, "tokens.npy")


def test_load_refuses_missing_or_bad_manifest(built):
    out, _, _ = built
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text("{not json")
    one_line_error(out, "manifest.json")
    (out / "manifest.json").unlink()
    one_line_error(out, "no manifest.json")
    (out / "manifest.json").write_text(json.dumps({**manifest, "token_count": manifest["token_count"] + 1}))
    one_line_error(out, "suffix_array.npy|tokens.npy")
    (out / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    one_line_error(out, "version 99")
    (out / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items() if k != "vocab_hash"}))
    one_line_error(out, "vocab_hash")


def test_load_refuses_wrong_dtype_and_missing_file(built):
    out, _, _ = built
    tokens = np.load(out / "tokens.npy")
    np.save(out / "tokens.npy", tokens.astype(np.int64))
    one_line_error(out, "tokens.npy.*int64")
    np.save(out / "tokens.npy", tokens)
    (out / "suffix_array.npy").unlink()
    one_line_error(out, "suffix_array.npy")
    one_line_error(out / "nowhere", "not a directory")


# -- SearchPath -----------------------------------------------------------------------------


def test_search_path_hand_made():
    trie = TokenTrie(max_depth=4)
    trie.extend([1, 2, 3, 4, 9, 1, 2, 3, 5, 9, 1, 2])
    ds = Datastore.from_documents([[3, 5, 7], [5, 7, 8]])
    p = search_path([9, 1, 2], depth=6, trie=trie, datastores=[ds], key_len=3)
    assert isinstance(p, SearchPath)
    # [9 1 2] -> 3 (trie); [1 2 3] -> 4 | 5 tie in the trie, the datastore's [3] is shorter: 4;
    # [2 3 4] -> 9; [3 4 9] -> 1; [4 9 1] -> 2; [9 1 2] -> 3
    assert p.tokens == (3, 4, 9, 1, 2, 3) and set(p.sources) == {"trie"}
    assert p.shares == (1.0, 0.5, 1.0, 1.0, 1.0, 1.0) and p.matched == (3, 3, 3, 3, 3, 3)
    summed = search_path([9, 1, 2], depth=4, trie=trie, datastores=[ds], key_len=3, merge="sum")
    # level 2: trie [1 2 3] -> {4: 1, 5: 1} plus datastore [3] -> {5: 1}: 5 wins with 2 of 3 counts;
    # trie and datastore counted 1 each, so the first source (the trie) is named.
    # level 3: trie [2 3 5] -> {9: 1}, datastore [3 5] -> {7: 1}: a tie, the smaller id wins
    assert summed.tokens[:3] == (3, 5, 7) and summed.shares[1] == pytest.approx(2 / 3)
    assert summed.sources[:3] == ("trie", "trie", "datastore")


def test_search_path_single_sources_and_stops():
    ds = Datastore.from_documents([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 3, 9]])
    only_ds = search_path([0, 1], depth=10, datastores=[ds], key_len=4)
    assert only_ds.tokens == (2, 3, 9) and only_ds.sources == ("datastore",) * 3
    assert only_ds.shares == (1.0, 1.0, pytest.approx(2 / 3))  # then [.., 9] ends every document: stop
    trie = TokenTrie(3)
    trie.extend([5, 6, 7, 5, 6])
    only_trie = search_path([5, 6], depth=2, trie=trie)
    assert only_trie.tokens == (7, 5) and only_trie.sources == ("trie", "trie")
    assert search_path([5, 6], depth=0, trie=trie).tokens == ()
    assert len(search_path([42], depth=3, trie=trie, datastores=[ds])) == 0
    two = search_path([1, 2, 3], depth=1, datastores=[ds, ds])  # two datastores: counts add up
    assert two.tokens == (9,) and two.shares == (pytest.approx(2 / 3),)
    with pytest.raises(ValueError, match="merge"):
        search_path([1], depth=1, trie=trie, merge="max")


# -- corpus ---------------------------------------------------------------------------------


def test_jsonl_field_precedence():
    assert record_text({"response": "r", "output": "o", "text": "t", "turns": ["a"]}) == "r"
    assert record_text({"output": "o", "text": "t"}) == "o"
    assert record_text({"response": "", "text": "t"}) == "t"
    assert record_text({"turns": ["a", "b"]}) == "a\n\nb"
    assert record_text({"id": 1}) is None


def test_corpus_reader_formats(tmp_path):
    (tmp_path / "d" / "sub" / "__pycache__").mkdir(parents=True)
    (tmp_path / "d" / "b.py").write_text("b = 1\n")
    (tmp_path / "d" / "sub" / "a.py").write_text("a = 1\n")
    (tmp_path / "d" / "sub" / "c.txt").write_text("not read: wrong suffix")
    (tmp_path / "d" / "sub" / "bin.py").write_bytes(b"x\0y")
    (tmp_path / "d" / "sub" / "latin.py").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "d" / "sub" / "__pycache__" / "x.py").write_text("skipped")
    (tmp_path / "notes.txt").write_text("plain text")
    (tmp_path / "r.jsonl").write_text('{"turns": ["q1"], "response": "r1"}\n\n{"nothing": 1}\n{"text": "t2"}\n')
    files = [p.relative_to(tmp_path / "d").as_posix() for p in corpus_files(tmp_path / "d")]
    assert files == ["b.py", "sub/a.py", "sub/bin.py", "sub/latin.py"]
    reader = CorpusReader([tmp_path / "r.jsonl", tmp_path / "notes.txt", tmp_path / "d"])
    docs = list(reader)
    assert [d.text for d in docs] == ["r1", "t2", "plain text", "b = 1\n", "a = 1\n"]
    assert docs[0].prompt == "q1" and docs[0].source.endswith("r.jsonl:1") and docs[2].prompt == ""
    d = reader.sources[2]
    assert (d["kind"], d["files"], d["skipped_files"], d["documents"]) == ("directory", 2, 2, 2)
    again = CorpusReader([tmp_path / "d"])
    list(again)
    assert again.sources[0]["sha256"] == d["sha256"]
    capped = CorpusReader([tmp_path / "d"], max_bytes=8)
    assert [x.text for x in capped] == ["b = 1\n"] and capped.truncated
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl' line 2"):
        list(CorpusReader([tmp_path / "bad.jsonl"]))
    with pytest.raises(ValueError, match="does not exist"):
        CorpusReader([tmp_path / "missing"])


def test_exclude_filter():
    prompt = "Write a Python function that checks whether a number is prime.  " + "x " * 200
    f = ExcludeFilter([prompt, "too short"])
    assert len(f) == 1
    assert f("Here: write a python function that checks whether a number is prime. x x x x x x " + "x " * 300)
    assert f("checks whether a number is prime. x x x x")  # the prompt contains the document
    assert not f("Write a Python function that checks whether a number is even.")
    assert not f("too short")  # short documents and texts take no part
    assert ExcludeFilter(["averyveryverylongidentifierwithoutanyspaces_0123"])("x = averyveryverylongidentifierwithoutanyspaces_0123()")


def test_build_drops_benchmark_overlaps(tmp_path, tok):
    prompt = "w3 w4 w5 w6 w7 w8 w9 w10 w11 w3 w4 w5 w6 w7 w8 w9"
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        json.dumps({"response": "w3 w3 w3"}) + "\n"
        + json.dumps({"response": "w9 " + prompt + " w9"}) + "\n"  # the answer quotes the prompt
        + json.dumps({"turns": [prompt], "response": "w4 w4"}) + "\n"  # the answer to the prompt
    )
    manifest = build_datastore(tok, [corpus], tmp_path / "ds", exclude_texts=[prompt], progress=False)
    assert manifest["documents"] == 1 and manifest["excluded_documents"] == 2


# -- CLI ------------------------------------------------------------------------------------


def test_cli_build_and_info(tmp_path, tok):
    from typer.testing import CliRunner

    from specgraft.cli import app

    tok_dir = tmp_path / "tok"
    tok.save_pretrained(tok_dir)
    corpus, texts = word_corpus(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p", "task": "t", "turns": [texts[0] + " " + texts[1] + " padding to 32 chars"]}) + "\n")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("w3 w4 w5\n")
    out = tmp_path / "ds"
    runner = CliRunner()
    args = ["datastore", "build", "--model", str(tok_dir), "--corpus", str(corpus), "--corpus", str(tmp_path / "src"),
            "--out", str(out), "--exclude-suite", str(prompts)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tokenizer"] == str(tok_dir) and manifest["exclude_texts"] == 1
    assert [s["kind"] for s in manifest["corpus"]] == ["file", "directory"]
    assert Datastore.load(out, tokenizer=tok).manifest["documents"] == manifest["documents"]
    result = runner.invoke(app, ["datastore", "info", str(out)])
    assert result.exit_code == 0 and "tokens.npy" in result.output and str(manifest["token_count"]) in result.output
    result = runner.invoke(app, ["datastore", "info", str(out), "--json"])
    assert json.loads(result.output)["token_count"] == manifest["token_count"]
    result = runner.invoke(app, args)
    assert isinstance(result.exception, ValueError) and "already exists" in str(result.exception)
    assert runner.invoke(app, args + ["--force", "--exclude-suite", "none"]).exit_code == 0
    result = runner.invoke(app, ["datastore", "info", str(tmp_path)])
    assert isinstance(result.exception, ValueError) and "no manifest.json" in str(result.exception)
