"""`specgraft bench --preset / --sample-drafts`: they reach the draft-model methods and are recorded."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from specgraft.bench import BenchConfig
from specgraft.cli.bench import bench
from specgraft.bench.records import RESULTS_FILE, read_rows
from specgraft.bench.config import RUN_FILE
from specgraft.bench.session import check_resume as _check_resume
from specgraft.methods import METHODS
from specgraft.methods.settings import MethodSettings


def test_preset_and_sampled_drafts(target_dir, draft_dir, tmp_path):
    app = typer.Typer()
    app.command()(bench)
    out = tmp_path / "run"
    args = ["--model", target_dir, "--draft-model", draft_dir, "--methods", "pld,draft-tree", "--suite", "humaneval", "--per-task", "1",
            "--max-new-tokens", "4", "--dtype", "float32", "--threads", "1", "--no-bracket", "--temperature", "0.7", "--seed", "2",
            "--preset", "gpu", "--sample-drafts", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    info = json.loads((out / RUN_FILE).read_text())
    assert info["config"]["preset"] == "gpu" and info["config"]["sample_drafts"] is True
    assert info["config"]["budgets"] == {"ar": 1, "pld": METHODS["pld"].default_budget, "draft-tree": 60}  # the preset's budget; pld keeps its own
    assert "--preset gpu --sample-drafts" in info["command"]
    rows = {r.method: r for r in read_rows(out / RESULTS_FILE)}
    method_config = rows["draft-tree"].config["method_config"]
    assert method_config["generation"]["budget"] == 60
    graft = method_config["options"]["graft"]
    assert (graft["preset"], graft["sample_drafts"], graft["seed"]) == ("gpu", True, 0)
    assert rows["draft-tree"].proposed_by_source["draft"] > 0


def test_bench_config_checks_and_resume(tmp_path):
    with pytest.raises(ValueError, match="--sample-drafts needs --temperature > 0"):
        BenchConfig(model="m", out="o", settings=MethodSettings(sample_drafts=True))
    with pytest.raises(ValueError, match="unknown draft preset 'tpu'"):
        BenchConfig(model="m", out="o", settings=MethodSettings(preset="tpu"))
    assert BenchConfig(model="m", out="o", methods="pld", budget=5, settings=MethodSettings(preset="gpu")).budgets == {"ar": 5, "pld": 5}

    # a run.json written before --preset existed was made with the cpu preset and no sampled drafts
    cfg = BenchConfig(model="m", out=str(tmp_path), methods="pld")
    old = {k: v for k, v in cfg.comparable().items() if k not in ("preset", "sample_drafts")}
    (tmp_path / RUN_FILE).write_text(json.dumps({"config": old}))
    _check_resume(tmp_path, cfg)
    with pytest.raises(ValueError, match="different config .*preset"):
        _check_resume(tmp_path, BenchConfig(model="m", out=str(tmp_path), methods="pld", settings=MethodSettings(preset="gpu")))
