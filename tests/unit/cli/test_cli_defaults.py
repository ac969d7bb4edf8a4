"""What the command line does when it is told little: the chat template when the tokenizer has one,
pld (or draft-tree with a draft model), dtypes printed resolved, the demo in float32, and why
``--compare`` may be below 100% in bfloat16."""

from __future__ import annotations

import importlib
import json

import pytest

from specgraft.agreement import Agreement
from specgraft.cli.generate import agreement_note
from specgraft.cli.options import method_help, resolve_dtype

from tests.helpers.cli import run_cli
from tests.helpers.models import tiny_llama, tiny_tokenizer

PROMPT = "w5 w6 w7 w5 w6 w7 w5 w6"
generate_module = importlib.import_module("specgraft.cli.generate")  # `specgraft.cli.generate` is also the command


@pytest.fixture(scope="module")
def no_template_dir(tmp_path_factory):
    """The tiny model with a tokenizer that has no chat template (a base model)."""
    path = tmp_path_factory.mktemp("tiny-base")
    tiny_llama().save_pretrained(path)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    tokenizer.save_pretrained(path)
    return str(path)


def generate_json(monkeypatch, capsys, model: str, *args: str) -> dict:
    code, out, err = run_cli(
        monkeypatch, capsys, "generate", "--model", model, "--max-new-tokens", "6", "--threads", "1", "--json", *args, PROMPT
    )
    assert code == 0, err
    return json.loads(out)


def summary_line(err: str) -> str:
    """stderr of a streamed generation as one line (rich may wrap the summary)."""
    return " ".join(err.split())


# -- the chat template -----------------------------------------------------------------------


def test_chat_template_is_the_default_when_the_tokenizer_has_one(monkeypatch, capsys, tiny_model_dir):
    auto = generate_json(monkeypatch, capsys, tiny_model_dir, "--dtype", "float32")
    chat = generate_json(monkeypatch, capsys, tiny_model_dir, "--dtype", "float32", "--chat")
    raw = generate_json(monkeypatch, capsys, tiny_model_dir, "--dtype", "float32", "--no-chat")
    assert (auto["config"]["chat"], chat["config"]["chat"], raw["config"]["chat"]) == (True, True, False)
    # the tiny template appends one token (w3) where the assistant's reply starts
    assert auto["stats"]["prompt_tokens"] == chat["stats"]["prompt_tokens"] == raw["stats"]["prompt_tokens"] + 1
    assert auto["text"] == chat["text"]

    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--max-new-tokens", "4", "--threads", "1", PROMPT)
    assert code == 0 and ", chat template" in summary_line(err), err
    code, _, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--max-new-tokens", "4", "--threads", "1", "--no-chat", PROMPT
    )
    assert code == 0 and ", raw text" in summary_line(err), err


def test_raw_text_without_a_template_and_chat_refused(monkeypatch, capsys, no_template_dir):
    data = generate_json(monkeypatch, capsys, no_template_dir, "--dtype", "float32")
    assert data["config"]["chat"] is False
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", no_template_dir, "--chat", PROMPT)
    err = err[err.find("error: ") :]  # after the model's loading progress bar: the tokenizer is known once it loads
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: --chat: the tokenizer of"), err
    assert "has no chat template; drop --chat" in err


def test_warmup_follows_the_tokenizer(monkeypatch, capsys, tiny_model_dir, no_template_dir, tmp_path):
    """`specgraft warmup` (and calibrate, sharing the option) wraps records in the template when there is one."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"turns": ["w5 w6"], "response": "w7 w8 w9"}\n')
    for model, words in ((tiny_model_dir, "(chat template)"), (no_template_dir, "(raw text)")):
        code, _, err = run_cli(monkeypatch, capsys, "warmup", "--model", model, "--corpus", str(corpus), "--out", str(tmp_path / "m.npz"))
        assert code == 0 and words in err, err
    code, _, err = run_cli(
        monkeypatch, capsys, "warmup", "--model", no_template_dir, "--corpus", str(corpus), "--out", str(tmp_path / "m.npz"), "--chat"
    )
    assert code == 2 and "has no chat template" in err


# -- the default method ----------------------------------------------------------------------


def test_default_method_is_pld_or_draft_tree(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir):
    assert generate_json(monkeypatch, capsys, tiny_model_dir, "--dtype", "float32")["method"] == "pld"
    with_draft = generate_json(monkeypatch, capsys, tiny_model_dir, "--dtype", "float32", "--draft-model", tiny_draft_dir)
    assert with_draft["method"] == "draft-tree" and with_draft["config"]["method"] == "draft-tree"
    assert "Default: pld, or draft-tree with --draft-model." in method_help()


class FakeServer:
    def __init__(self, app, **kw):
        self.app = app

    def run(self):
        pass


@pytest.mark.parametrize("draft", [False, True])
def test_serve_default_method_and_resolved_dtype(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir, draft):
    """`specgraft serve` without --method: pld, or draft-tree with --draft-model; the start-up line
    names the resolved dtype (the server itself is not started)."""
    from specgraft.serve import run

    apps = []
    monkeypatch.setattr(run, "server", lambda app, **kw: apps.append(app) or FakeServer(app))
    args = ["serve", "--model", tiny_model_dir, "--threads", "1", "--device", "cpu", "--cost-table", "none"]
    code, _, err = run_cli(monkeypatch, capsys, *args, *(["--draft-model", tiny_draft_dir] if draft else []))
    assert code == 0, err
    line = " ".join(err.split())
    method = "draft-tree" if draft else "pld"
    assert f"method {method}," in line and f"{resolve_dtype('auto', 'cpu')} on cpu" in line and "auto" not in line.split("; http")[0]
    (app,) = apps
    assert app.state.worker.decoder.method == method
    if draft:
        assert app.state.worker.decoder.options.graft.draft_dtype == resolve_dtype("auto", "cpu")


# -- resolved dtypes -------------------------------------------------------------------------


def test_generate_prints_the_resolved_dtype(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir):
    resolved = resolve_dtype("auto", "cpu")
    assert resolved in ("float32", "bfloat16")
    args = ["generate", "--model", tiny_model_dir, "--max-new-tokens", "4", "--threads", "1", "--device", "cpu", "--draft-model", tiny_draft_dir]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--json", PROMPT)
    assert code == 0, err
    config = json.loads(out)["config"]
    assert config["dtype"] == config["options"]["graft"]["draft_dtype"] == resolved
    code, _, err = run_cli(monkeypatch, capsys, *args, PROMPT)
    assert code == 0 and f", cpu, {resolved}, chat template" in summary_line(err), err


def test_demo_runs_in_float32(monkeypatch, capsys):
    """The demo is SmolLM2 with pld in float32 (so --compare shows 100%); here without loading it."""
    calls = []
    monkeypatch.setattr(generate_module, "run_generate", lambda *args, **kw: calls.append((args, kw)))
    code, _, err = run_cli(monkeypatch, capsys, "demo")
    assert code == 0, err
    ((args, kw),) = calls
    assert args == (generate_module.DEMO_PROMPT, generate_module.DEMO_MODEL, "pld")
    assert kw["dtype"] == "float32" and kw["compare"] is True and kw["chat"] is None
    assert err.startswith("specgraft demo: smollm2-135m-instruct, method pld, float32, greedy")
    code, _, err = run_cli(monkeypatch, capsys, "demo", "--method", "graft")
    assert code == 2 and "the demo runs without a draft model" in err


# -- --compare below 100% ---------------------------------------------------------------------


def test_agreement_note():
    note = agreement_note(0.9, "bfloat16")
    assert note == (
        "agreement below 100% in bfloat16: batched and single-row kernels round differently, so near-tied tokens can flip; "
        "--dtype float32 gives token-for-token equality"
    )
    assert "in float16:" in agreement_note(0.5, "float16")
    assert agreement_note(1.0, "bfloat16") is None
    assert agreement_note(0.9, "float32") is None, "below 100% in float32 is a bug: nothing explains it away"


@pytest.mark.parametrize("dtype, explained", [("bfloat16", True), ("float32", False)])
def test_compare_explains_disagreement_in_bfloat16_only(monkeypatch, capsys, tiny_model_dir, dtype, explained):
    """A --compare run whose agreement is below 100% (faked here: the tiny model agrees) prints the
    reason in bfloat16, and nothing more in float32."""
    monkeypatch.setattr(generate_module, "agreement", lambda tokens, reference: Agreement(False, 2, 0.5))
    code, _, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--dtype", dtype, "--max-new-tokens", "4", "--threads", "1",
        "--compare", PROMPT,
    )
    assert code == 0, err
    text = " ".join(err.split())
    assert "agreement 50.0% (first divergence at token 2)" in text
    assert (agreement_note(0.5, "bfloat16") in err.splitlines()) is explained, "one line of its own"
    assert ("token-for-token equality" in text) is explained
