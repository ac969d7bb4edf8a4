"""Fixtures for every test: the tiny models (``helpers/models.py``), one torch thread per module,
and draft-tree's cost-aware cut of the presets turned off."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import TINY_MODELS, tiny_llama, tiny_tokenizer


@pytest.fixture(params=sorted(TINY_MODELS))
def tiny_model(request):
    return TINY_MODELS[request.param]()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny Llama with its tokenizer: loadable by path like any Hugging Face model."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    tiny models are dominated by thread hand-offs on a shared 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def no_draft_tree_cut(request, monkeypatch):
    """A tiny random model's distributions are flat (a draft node's path probability is a few
    percent), so ``draft-tree``'s cost-aware cut (the cpu preset's ``long_row_cost``) would
    verify no node at all and every draft-tree test would pass without testing the tree. Tests
    run with the preset's cut off; a test of the cut gives ``row_cost`` itself, and one marked
    ``preset_cut`` sees the shipped preset."""
    if request.node.get_closest_marker("preset_cut"):
        return
    import dataclasses

    from specgraft.drafters.draft_model import config

    presets = {name: dataclasses.replace(p, long_row_cost=None) for name, p in config.PRESETS.items()}
    monkeypatch.setattr(config, "PRESETS", presets)


@pytest.fixture(scope="session", autouse=True)
def requantized_gguf_folder(tmp_path_factory):
    """Draft GGUFs requantized by the tests (``models/gguf_requant.py``) go to a temporary
    folder, not the user's cache."""
    from specgraft.models import gguf_requant

    before = gguf_requant.REQUANTIZED_DIR
    gguf_requant.REQUANTIZED_DIR = tmp_path_factory.mktemp("requantized")
    yield
    gguf_requant.REQUANTIZED_DIR = before
