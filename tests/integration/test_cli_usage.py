"""Usage errors of the real command (a subprocess): one line ``error: ...`` on stderr naming the
bad thing and where to read the usage, exit status 2, no traceback; ``--version``; Ctrl-C.

The command line imports no torch before a command runs, so each subprocess here takes well under
a second."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specgraft
from specgraft import cli

from tests.helpers.cli import run_cli
from tests.helpers.scripts import ROOT


def specgraft_command(*args: str, entry_point: bool = False) -> subprocess.CompletedProcess:
    """``python -m specgraft.cli ARGS`` (or the installed ``specgraft`` script) from the checkout."""
    command = [str(Path(sys.executable).parent / "specgraft")] if entry_point else [sys.executable, "-m", "specgraft.cli"]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    return subprocess.run([*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def assert_usage_error(result: subprocess.CompletedProcess, *parts: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and result.stderr.count("\n") == 1, f"one line: {result.stderr!r}"
    assert lines[0].startswith("error: ") and "Traceback" not in result.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


USAGE_ERRORS = [
    (["generate", "--foo", "w5"], ["No such option: --foo", "(see 'specgraft generate --help')"]),
    (["generate"], ["Missing argument 'prompt'", "(see 'specgraft generate --help')"]),
    (["generate", "w5", "--model"], ["Option '--model' requires an argument", "(see 'specgraft generate --help')"]),
    (["generate", "--max-new-tokens", "abc", "w5"], ["Invalid value for '--max-new-tokens'"]),
    (["generate", "--temperature", "hot", "w5"], ["Invalid value for '--temperature'"]),
    (["generate", "--compare=yes", "w5"], ["Option '--compare' does not take a value"]),
    (["generate", "w5", "w6"], ["unexpected extra argument", "(w6)"]),
    (["generate", "--seed", str(2**64), "w5"], [f"Invalid value for '--seed': {2**64} is not in [0, 2**63)"]),
    (["generate", "--seed", str(2**63), "w5"], [f"{2**63} is not in [0, 2**63)"]),
    (["generate", "--seed", "-1", "w5"], ["-1 is not in [0, 2**63)"]),
    (["bench", "--model", "m", "--out", "o", "--seed", str(2**64)], [f"{2**64} is not in [0, 2**63)", "'specgraft bench --help'"]),
    (["nosuch"], ["No such command 'nosuch'", "(see 'specgraft --help')"]),
    (["serve"], ["Missing option '--model'", "(see 'specgraft serve --help')"]),
    (["models", "pull"], ["Missing argument 'name'", "(see 'specgraft models pull --help')"]),
    (["models", "nope"], ["No such command 'nope'", "(see 'specgraft models --help')"]),
    (["datastore", "info", "--json"], ["Missing argument 'path'", "(see 'specgraft datastore info --help')"]),
    (["demo", "--dtype", "bfloat16"], ["No such option: --dtype", "(see 'specgraft demo --help')"]),
]


@pytest.mark.parametrize("args, parts", USAGE_ERRORS, ids=[" ".join(args) for args, _ in USAGE_ERRORS])
def test_usage_errors_are_one_line(args, parts):
    assert_usage_error(specgraft_command(*args), *parts)


def test_the_installed_entry_point_too():
    if not (Path(sys.executable).parent / "specgraft").exists():
        pytest.skip("no `specgraft` script beside this Python")
    assert_usage_error(specgraft_command("generate", "--foo", "w5", entry_point=True), "No such option: --foo")


def test_version():
    result = specgraft_command("--version")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f"specgraft {cli.version()}\n"
    assert cli.version() in (importlib.metadata.version("specgraft"), specgraft.__version__)


def test_version_without_an_installed_distribution(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert cli.version() == specgraft.__version__


def test_no_arguments_print_the_help():
    result = specgraft_command()
    assert result.returncode == 0 and "Usage: specgraft" in result.stdout and "generate" in result.stdout


def test_help_hint_follows_the_command_words():
    assert cli.command_path(["datastore", "--json", "build", "--model", "m"]) == "specgraft datastore build"
    assert cli.command_path(["generate", "models"]) == "specgraft generate"  # a prompt, not a command


def test_interrupt_exits_130(monkeypatch, capsys):
    """Ctrl-C during a command: "interrupted" and status 130 (typer turns it into a return value,
    which an earlier main ignored: status 0)."""
    generate_module = importlib.import_module("specgraft.cli.generate")  # `specgraft.cli.generate` is also the command

    def interrupted(*args, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate_module, "run_generate", interrupted)
    code, _, err = run_cli(monkeypatch, capsys, "generate", "--dtype", "float32", "--device", "cpu", "w5")
    assert code == 130 and err == "interrupted\n"

