"""``gguf_value`` reads one header value as ``gguf.GGUFReader`` parses it, for every value type."""

from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf")

from specgraft.models.gguf_header import gguf_value  # noqa: E402
from tests.helpers.gguf_models import write_tiny_gguf  # noqa: E402


def test_every_key_of_a_model_reads_as_the_gguf_package_reads_it(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    reader = gguf.GGUFReader(str(path))
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    assert "general.file_type" in keys and "tokenizer.ggml.tokens" in keys
    for key in keys:
        expected = reader.get_field(key).contents()
        got = gguf_value(path, key)
        if isinstance(expected, float):
            assert got == pytest.approx(expected), key
        elif isinstance(expected, list) and expected and isinstance(expected[0], float):
            assert got == pytest.approx(expected), key
        else:
            assert got == expected, key
    assert gguf_value(path, "general.no_such_key") is None


def test_every_value_type(tmp_path):
    path = tmp_path / "values.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    values = {
        "t.u8": (writer.add_uint8, 200), "t.i8": (writer.add_int8, -5), "t.u16": (writer.add_uint16, 60000),
        "t.i16": (writer.add_int16, -300), "t.u32": (writer.add_uint32, 4_000_000_000), "t.i32": (writer.add_int32, -7),
        "t.f32": (writer.add_float32, 0.5), "t.bool": (writer.add_bool, True), "t.u64": (writer.add_uint64, 2**40),
        "t.i64": (writer.add_int64, -(2**40)), "t.f64": (writer.add_float64, 0.25), "t.str": (writer.add_string, "héllo"),
        "t.ints": (writer.add_array, [1, 2, 3]), "t.strs": (writer.add_array, ["a", "bc", ""]),
    }
    for key, (add, value) in values.items():
        add(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # each key read past every value before it (skipped)
    for key, (_, value) in values.items():
        assert gguf_value(path, key) == value, key


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"PK\x03\x04" + bytes(60))
    with pytest.raises(ValueError, match="is not a GGUF file"):
        gguf_value(path, "general.file_type")
    short = tmp_path / "short.gguf"
    short.write_bytes(b"GGUF\x03\x00\x00\x00" + (1).to_bytes(8, "little") + (5).to_bytes(8, "little"))
    with pytest.raises(ValueError, match="ends early"):
        gguf_value(short, "general.file_type")
