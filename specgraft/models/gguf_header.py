"""One metadata value of a GGUF file, read from its header without parsing the rest.

``gguf.GGUFReader`` parses every field and tensor record into numpy views when it opens a file:
for a Qwen2.5 GGUF, whose tokenizer holds 151,387 merges and 151,936 tokens, that takes about
7 s on two cores, which a ``from_pretrained`` would pay just to learn the file's type. The
header is a list of ``(key, type, value)`` records before the tensor records, and the
``general.*`` keys come first, so :func:`gguf_value` reads records until it meets the key and
skips the values it passes over (an array of scalars in one seek).

    >>> gguf_value("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "general.file_type")  # doctest: +SKIP
    15
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

#: GGUF value types with a fixed size: type id -> struct format (little-endian).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def gguf_value(path: str | os.PathLike[str], key: str) -> object | None:
    """The value of metadata ``key`` in the GGUF file at ``path`` (an int, float, bool, str or
    list), None when the header has no such key. ``ValueError`` when the file is not a
    little-endian GGUF of version 2 or later (what llama.cpp writes)."""
    with open(path, "rb") as f:
        magic, version = struct.unpack("<4sI", _read(f, 8))
        if magic != b"GGUF":
            raise ValueError(f"{os.fspath(path)} is not a GGUF file (it starts with {magic!r})")
        if not 2 <= version < 1 << 16:
            raise ValueError(f"{os.fspath(path)}: GGUF version {version} is not supported (a little-endian file of version 2 or later is)")
        _tensors, n_kv = struct.unpack("<QQ", _read(f, 16))
        for _ in range(n_kv):
            name = _string(f)
            (vtype,) = struct.unpack("<I", _read(f, 4))
            if name == key:
                return _value(f, vtype)
            _skip(f, vtype)
    return None


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise ValueError(f"{f.name}: the GGUF header ends early")
    return data


def _string(f: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", _read(f, 8))
    return _read(f, n).decode("utf-8", errors="replace")


def _value(f: BinaryIO, vtype: int) -> object:
    if vtype in _SCALARS:
        fmt = _SCALARS[vtype]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        etype, n = struct.unpack("<IQ", _read(f, 12))
        return [_value(f, etype) for _ in range(n)]
    raise ValueError(f"{f.name}: unknown GGUF value type {vtype}")


def _skip(f: BinaryIO, vtype: int) -> None:
    if vtype in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[vtype]), os.SEEK_CUR)
    elif vtype == _STRING:
        (n,) = struct.unpack("<Q", _read(f, 8))
        f.seek(n, os.SEEK_CUR)
    elif vtype == _ARRAY:
        etype, n = struct.unpack("<IQ", _read(f, 12))
        if etype in _SCALARS:
            f.seek(n * struct.calcsize(_SCALARS[etype]), os.SEEK_CUR)
        else:
            for _ in range(n):
                _skip(f, etype)
    else:
        raise ValueError(f"{f.name}: unknown GGUF value type {vtype}")
