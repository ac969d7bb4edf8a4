"""Model arguments to directories: catalog names (pulled on first use), local paths, hub ids;
failed pulls and loads as one :class:`ModelLoadError` naming the model.

Example:
    >>> resolve_model("Qwen/Qwen2.5-0.5B")  # a hub id passes through unchanged
    'Qwen/Qwen2.5-0.5B'
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specgraft.models.catalog import Catalog, cache_root, is_pulled, load_catalog, model_dir
from specgraft.models.pull import pull_model

__all__ = ["ModelLoadError", "load_errors", "pull", "resolve_model"]


def resolve_model(
    name_or_path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    pull_if_missing: bool = True,
    progress: bool = True,
    *,
    catalog: Catalog | None = None,
) -> str:
    """Turn a model argument into something ``from_pretrained`` accepts.

    * a catalog name -> its local directory, pulling it on first use
      (``FileNotFoundError`` if not pulled and ``pull_if_missing=False``);
    * an existing local path -> itself;
    * anything containing ``/`` -> unchanged (a Hugging Face hub id);
    * anything else -> ``ValueError`` listing the catalog names.

    Example:
        >>> resolve_model("HuggingFaceTB/SmolLM2-135M")
        'HuggingFaceTB/SmolLM2-135M'
        >>> resolve_model("/tmp")
        '/tmp'
    """
    text = os.fspath(name_or_path)
    cat = load_catalog() if catalog is None else catalog
    if text in cat:
        target = model_dir(text, cache_dir)
        if is_pulled(text, cache_dir):
            return str(target)
        if not pull_if_missing:
            raise FileNotFoundError(
                f"model {text!r} is not pulled into {str(cache_root(cache_dir))!r}; "
                f"run `specgraft models pull {text}`"
            )
        return str(pull(text, cache_dir=cache_dir, progress=progress, catalog=cat))
    if os.path.exists(os.path.expanduser(text)):
        return os.path.expanduser(text)
    if "/" not in text:
        raise ValueError(f"unknown model {text!r}; catalog models: {', '.join(cat) or '(none)'}")
    return text


class ModelLoadError(OSError):
    """A model could not be pulled or loaded (download failed, not a model directory, unknown
    hub id, no network). The message names the model; the original error is the ``__cause__``."""


def _one_line(error: BaseException) -> str:
    """``error``'s message on one line (transformers' loading errors span several)."""
    return " ".join(str(error).split()) or type(error).__name__


def pull(
    name: str, cache_dir: str | os.PathLike[str] | None = None, progress: bool = True, *, catalog: Catalog | None = None
) -> Path:
    """:func:`specgraft.models.pull.pull_model` with a failed download or conversion (the
    ``RuntimeError`` it raises) as a :class:`ModelLoadError` naming the model."""
    try:
        return pull_model(name, cache_dir=cache_dir, progress=progress, catalog=catalog)
    except RuntimeError as e:
        raise ModelLoadError(f"could not pull model {name!r}: {_one_line(e)}") from e


@contextmanager
def load_errors(name: str, role: str = "model") -> Iterator[None]:
    """Re-raise the ``OSError`` of a failed ``from_pretrained`` as a one-line
    :class:`ModelLoadError` that says which ``role`` (``"model"``, ``"draft model"``) failed
    and how ``name`` was looked up; a ``ValueError`` (e.g. a tokenizer that cannot be built)
    stays a ``ValueError``, with the model named. Anything else passes through untouched.

    Example::

        with load_errors("org/missing"):
            AutoModelForCausalLM.from_pretrained("org/missing")
        # ModelLoadError: cannot load model 'org/missing' (not a catalog name or local
        # directory, so a Hugging Face hub id): We couldn't connect to 'https://huggingface.co' ...
    """
    try:
        yield
    except ModelLoadError:
        raise
    except (OSError, ValueError) as e:
        text = os.fspath(name)
        path = Path(os.path.expanduser(text))
        if path.is_dir():
            how = "a local directory" if (path / "config.json").is_file() else "a local directory with no config.json"
        elif path.exists():
            how = "a local file, not a model directory"
        else:
            how = "not a catalog name or local directory, so a Hugging Face hub id"
        message = f"cannot load {role} {text!r} ({how}): {_one_line(e)}"
        if isinstance(e, OSError):
            raise ModelLoadError(message) from e
        raise ValueError(message) from e
