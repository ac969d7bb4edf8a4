"""Every test under ``tests/integration/`` is marked ``integration`` (deselect them with
``-m "not integration"``), and the benchmark's saved tiny models are fixtures here."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    # a conftest's hook sees every collected item, not only this folder's
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    """The benchmark's tiny target (2 layers, byte-level tokenizer), saved."""
    from tests.helpers.bench import save_tiny

    return save_tiny(tmp_path_factory.mktemp("bench-target"), layers=2, seed=0)


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory):
    """The benchmark's tiny draft model (1 layer, the target's tokenizer), saved."""
    from tests.helpers.bench import save_tiny

    return save_tiny(tmp_path_factory.mktemp("bench-draft"), layers=1, seed=1)
