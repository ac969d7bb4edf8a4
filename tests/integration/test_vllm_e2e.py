"""End to end in vLLM (CPU): specgraft's proposers inside vLLM give vLLM's plain greedy output,
token for token, and vLLM accepts their drafts.

Runs only where vLLM 0.32 is importable (its own virtual environment, ``.ci/run``'s vLLM step)
and SmolLM2-135M Instruct is in the model cache (``specgraft models pull smollm2-135m-instruct``);
skipped otherwise. Each engine starts in ~30 s on the 2-core CPU; the module takes ~3-5 min.

    VLLM_CPU_KVCACHE_SPACE=1 /work/.venv-vllm/bin/python -m pytest -q tests/integration/test_vllm_e2e.py
"""

import gc
import json
import os
from pathlib import Path

import pytest

#: ``.ci/run`` sets SPECGRAFT_VLLM_E2E=required: there a missing vLLM or model fails instead of skipping
REQUIRED = os.environ.get("SPECGRAFT_VLLM_E2E") == "required"
if not REQUIRED:
    pytest.importorskip("vllm", reason="vLLM is not installed here (it runs in its own venv: see README, vLLM)")

from specgraft.integrations.vllm import DATASTORE_ENV, speculative_config  # noqa: E402
from specgraft.integrations.vllm_worker import generate, make_llm, sampling_params, spec_counters  # noqa: E402

MODEL = Path(os.environ.get("SPECGRAFT_CACHE", Path.home() / ".cache" / "specgraft")) / "models" / "smollm2-135m-instruct"
pytestmark = pytest.mark.skipif(not REQUIRED and not (MODEL / "config.json").exists(), reason=f"{MODEL} is not pulled")

PASSAGE = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
    "All that glitters is not gold. Actions speak louder than words. Where there is a will, there is a way."
)
PROMPTS = [
    f"Repeat the following text exactly, then say done.\n\n{PASSAGE}",
    "Rename the function `add` to `plus` in this code and show the whole code:\n\n"
    "def add(a, b):\n    return a + b\n\n\ndef twice(x):\n    return add(x, x)\n\n\nprint(add(1, 2), twice(3))\n",
]
NEW_TOKENS = 64


@pytest.fixture(scope="module")
def inputs():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False) for p in PROMPTS]
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    eos = sorted({int(tok.eos_token_id)})
    return ids, eos, tok


def run_engine(spec, ids, eos):
    """Outputs of each input alone, then of all inputs in one batch (rows share the proposer), and
    the spec-decode counters; the engine is shut down after."""
    llm = make_llm(str(MODEL), spec, max_model_len=1024)
    try:
        params = sampling_params(NEW_TOKENS, eos)
        alone = [generate(llm, x, params)["tokens"] for x in ids]
        from vllm.inputs import TokensPrompt

        batch = [list(o.outputs[0].token_ids) for o in llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], params, use_tqdm=False)]
        return alone, batch, spec_counters(llm)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


@pytest.fixture(scope="module")
def plain(inputs):
    ids, eos, _ = inputs
    alone, batch, counters = run_engine(None, ids, eos)
    assert alone == batch, "vLLM plain: batched outputs differ from single ones"
    assert counters["drafts"] == 0
    return alone


@pytest.fixture(scope="module")
def datastore(inputs, tmp_path_factory):
    """A small datastore over the passage and the code, in the served model's vocabulary."""
    from specgraft.retrieval.build import build_datastore

    pytest.importorskip("pydivsufsort")
    _, _, tok = inputs
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in [PASSAGE, "def plus(a, b):\n    return a + b\n"]) + "\n")
    out = tmp_path_factory.mktemp("ds") / "ds"
    build_datastore(tok, [corpus], out, progress=False, exclude_texts=())
    return str(out)


@pytest.mark.parametrize("method", ["pld", "reader", "adapld"])
def test_outputs_equal_vllm_plain_and_drafts_are_accepted(method, inputs, plain, datastore, monkeypatch):
    ids, eos, _ = inputs
    if method == "reader":
        monkeypatch.setenv(DATASTORE_ENV, datastore)  # the engine process inherits it
    alone, batch, counters = run_engine(speculative_config(method, 5), ids, eos)
    assert alone == plain, f"{method}: outputs differ from vLLM plain greedy"
    assert batch == plain, f"{method}: batched outputs differ from vLLM plain greedy"
    assert counters["drafts"] > 0 and counters["accepted_tokens"] > 0, f"{method}: no draft accepted ({counters})"
    print(f"{method}: {counters}")


def test_replay_ngram_is_vllms_ngram():
    """``benchmarks/tools/replay_vllm_proposers.py`` re-implements vLLM's ngram proposal to replay it
    offline; it must propose what vLLM's own (numba) function proposes."""
    import importlib.util
    import sys

    import numpy as np
    from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "tools" / "replay_vllm_proposers.py"
    spec = importlib.util.spec_from_file_location("replay_vllm_proposers", path)
    replay = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = replay  # its dataclasses look their module up
    spec.loader.exec_module(replay)
    rng = np.random.default_rng(0)
    for trial in range(300):
        tokens = rng.integers(0, 2 + trial % 6, int(rng.integers(1, 40))).astype(np.int32)
        ours = replay.ngram_chain(tokens, 5, 2, 4)
        theirs = _find_longest_matched_ngram_and_propose_tokens(tokens, 2, 4, 4096, 5).tolist()
        assert ours == theirs, (tokens.tolist(), ours, theirs)
