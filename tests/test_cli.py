"""The command line: bad input gives one line and exit status 2; --json has the documented fields."""

import json
import sys

import pytest

from specgraft import cli


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["specgraft", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "nope"], "unknown method 'nope'; choose one of ar, pld, recycling"),
        (["--budget", "0"], "budget must be an integer >= 1, got 0"),
        (["--max-new-tokens", "-1"], "max_new_tokens must be an integer >= 0, got -1"),
        (["--temperature", "-0.5"], "temperature must be a finite number >= 0, got -0.5"),
        (["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--top-p", "1.5"], "top_p must be in (0, 1], got 1.5"),
        (["--dtype", "int3"], "unknown dtype 'int3'"),
    ],
)
def test_bad_values(monkeypatch, capsys, tiny_model_dir, extra, message):
    code, out, err = run_cli(monkeypatch, capsys, "generate", "--model", tiny_model_dir, *extra, "w5 w6")
    assert code == 2
    assert message in err and "Traceback" not in err


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


def test_streaming_output(monkeypatch, capsys, tiny_model_dir):
    code, out, err = run_cli(
        monkeypatch, capsys, "generate", "--model", tiny_model_dir, "--dtype", "float32", "--max-new-tokens", "6", "w5 w6 w7"
    )
    assert code == 0, err
    assert out.strip() and "MAT" in err


def test_models_list(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))
    code, out, _ = run_cli(monkeypatch, capsys, "models", "list")
    assert code == 0 and "qwen2.5-coder-1.5b-instruct" in out
