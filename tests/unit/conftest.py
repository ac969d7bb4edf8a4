"""Fixtures shared by unit tests of several packages."""

from __future__ import annotations

import random

import pytest


@pytest.fixture(scope="module")
def datastore_dir(tmp_path_factory):
    """A datastore of plain greedy continuations of the test prompts (like a datastore of the
    model's own responses), so retrieved nodes are really accepted."""
    from specgraft.retrieval.build import build_datastore

    from tests.helpers.lossless import hf_greedy, make_prompts
    from tests.helpers.models import TINY_MODELS
    from tests.helpers.stubs import IntTokenizer

    model = TINY_MODELS["llama"]()
    vocab = model.config.vocab_size
    rng = random.Random(99)
    lines = []
    for prompt, _ in make_prompts(vocab=vocab)[1::4]:
        lines.append(" ".join(str(t) for t in prompt + hf_greedy(model, prompt, 24)))
    for _ in range(10):
        lines.append(" ".join(str(rng.randrange(3, vocab)) for _ in range(40)))
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    out = tmp_path_factory.mktemp("ds") / "ds"
    # one document per file line is not a format: write one file per document
    docs = corpus.parent / "docs"
    docs.mkdir()
    for i, line in enumerate(lines):
        (docs / f"{i:03d}.txt").write_text(line)
    build_datastore(IntTokenizer(vocab), [docs], out, progress=False, suffixes=(".txt",))
    return str(out)
