"""Fixtures of the command-line tests."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.models import save_draft


@pytest.fixture(autouse=True)
def keep_threads():
    """``--threads`` sets torch's global thread count; the tests after this one keep theirs."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_draft_dir(tmp_path_factory):
    """A saved one-layer tiny Llama: a draft model for ``tiny_model_dir``."""
    return save_draft(tmp_path_factory.mktemp("tiny-draft"))
