"""The command line run in-process, as ``specgraft ARGS...`` would run it."""

from __future__ import annotations

import sys

from specgraft import cli


def run_cli(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``specgraft *args`` in this process: (exit status, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["specgraft", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err
