"""`specgraft calibrate`: per-task thresholds, variant selection, benchmark prompts kept out, help text."""

from __future__ import annotations

import json
import re

import pytest
import typer
from typer.testing import CliRunner

from specgraft.suites import DATA_DIR, read_prompt_file
from specgraft.calibration import load_calibration
from specgraft.calibration.corpus import CorpusRecord, read_task_corpus, split_corpus
from specgraft.cli.calibrate import PRESET_HELP, calibrate
from specgraft.drafters.draft_model import PRESETS

from tests.helpers.calibration import corpus_records


def app() -> typer.Typer:
    app = typer.Typer()
    app.command()(calibrate)
    app.command("noop")(lambda: None)  # a second command keeps `calibrate` a named subcommand
    return app


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_preset_help_agrees_with_the_presets():
    for name, p in PRESETS.items():
        assert re.search(rf"{name} \((the paper's )?depth {p.depth}, top-k {p.top_k}, {p.budget} nodes\)", PRESET_HELP), (name, PRESET_HELP)


def test_by_task_calibrates_each_task_and_keeps_benchmark_prompts_out(tmp_path, tiny_model_dir):
    mt_bench_question = read_prompt_file(DATA_DIR / "mt_bench.jsonl", "mt")[0].turns[0]
    # one file with a task field (and a benchmark prompt among its records), one without (task = file name)
    code = [{"task": "code", "turns": [p], "response": r} for p, r in corpus_records(4, seed=1)]
    code.insert(1, {"task": "code", "turns": [mt_bench_question], "response": "w5 w6 w7"})
    chat = [{"turns": [p], "response": r} for p, r in corpus_records(4, seed=2)]
    extra = write_jsonl(tmp_path / "mine.jsonl", [{"id": "x", "task": "t", "turns": [chat[0]["turns"][0]]}])
    corpora = [write_jsonl(tmp_path / "code.jsonl", code), write_jsonl(tmp_path / "chatty.jsonl", chat)]
    out = tmp_path / "calib.json"
    args = ["calibrate", "--model", tiny_model_dir, "--draft-model", tiny_model_dir, "--corpus", corpora[0], "--corpus", corpora[1],
            "--out", str(out), "--prompts", "2", "--limit", "1", "--max-new-tokens", "8", "--budget", "6", "--dtype", "float32",
            "--threads", "1", "--by-task", "--exclude", extra]
    result = CliRunner().invoke(app(), args)
    assert result.exit_code == 0, result.output
    cal = load_calibration(out, vocab_size=96)
    assert cal.meta["tasks"] == ["code", "chatty"] and cal.meta["dropped_benchmark_prompts"] == 2
    assert cal.meta["prompts"] == 4 and cal.meta["warm_records"] == 2, "per task: 1 warm-up record, then 2 prompts"
    assert set(cal.thresholds) == {"graft", "graft-prune"}
    for variant in cal.thresholds:
        assert set(cal.thresholds_by_task[variant]) == {"code", "chatty"}
        for taus in [cal.thresholds[variant], *cal.thresholds_by_task[variant].values()]:
            assert all(a >= b for a, b in zip(taus, taus[1:])), f"{variant}: thresholds must not rise with depth: {taus}"
    assert {"code", "chatty"} <= set(cal.report["by_task"]) and cal.report["by_task"]["code"]["prompts"] == 2
    text = " ".join(result.output.split())
    assert "graft thresholds by task" in text and "| gate | code | chatty | range | pooled |" in text
    assert "2 corpus records dropped as benchmark prompts" in text

    # --method selects the variant; without --by-task there are no per-task thresholds
    only = tmp_path / "only.json"
    args = [*args[: args.index("--out") + 1], str(only), *args[args.index("--out") + 2 : args.index("--by-task")], "--method", "graft-prune"]
    result = CliRunner().invoke(app(), args)
    assert result.exit_code == 0, result.output
    cal = load_calibration(only, vocab_size=96)
    assert set(cal.thresholds) == {"graft-prune"} and cal.thresholds_by_task == {} and cal.meta["methods"] == ["graft-prune"]
    with pytest.raises(ValueError, match="not 'graft'"):
        cal.thresholds_for("graft")


def test_corpus_grouping(tmp_path):
    path = write_jsonl(tmp_path / "alpaca.jsonl", [
        {"turns": ["a"], "response": "x", "category": "oasst"},
        {"turns": ["b"], "response": "y"},
        {"turns": ["c"], "response": "z", "category": "koala"},
    ])
    assert [r.task for r in read_task_corpus(path, "category")] == ["oasst", "alpaca", "koala"]
    assert [(r.prompt, r.task) for r in read_task_corpus(path)] == [("a", "alpaca"), ("b", "alpaca"), ("c", "alpaca")]
    text = tmp_path / "notes.txt"
    text.write_text("some text")
    assert read_task_corpus(text) == [CorpusRecord("", "some text", "notes")]
    groups = {"big": [CorpusRecord(str(i), "", "big") for i in range(6)], "small": [CorpusRecord("s", "", "small")]}
    with pytest.raises(ValueError, match="'small' has 1 records; need at least 3"):
        split_corpus(groups, limit=1, prompts=2)
    warm, held = split_corpus({"big": groups["big"]}, limit=10, prompts=2)
    assert [r.prompt for r in warm] == ["0", "1", "2", "3"] and [r.prompt for r in held] == ["4", "5"]
    warm, held = split_corpus({"small": groups["small"]}, limit=0, prompts=1)
    assert warm == [] and held == groups["small"]


def test_recalibrate_from_a_matrix_with_skip_and_a_deeper_draft(tmp_path, tiny_model_dir):
    """``--matrix`` of an earlier run + ``--skip <its limit> --limit 0`` decodes exactly the
    records that run held out and teaches the matrix nothing; ``--draft-depth`` is recorded, and
    a run must use the same depth to read the file."""
    from specgraft.methods import GraftOptions
    from specgraft.methods.graft import check_calibration_draft

    corpus = write_jsonl(tmp_path / "c.jsonl", [{"turns": [p], "response": r} for p, r in corpus_records(5, seed=3)])
    common = ["--model", tiny_model_dir, "--draft-model", tiny_model_dir, "--corpus", corpus, "--max-new-tokens", "6",
              "--dtype", "float32", "--threads", "1", "--method", "graft-prune"]
    first = tmp_path / "first.json"
    result = CliRunner().invoke(app(), ["calibrate", *common, "--limit", "2", "--prompts", "2", "--out", str(first)])
    assert result.exit_code == 0, result.output
    again = tmp_path / "again.json"
    args = ["calibrate", *common, "--matrix", str(first.with_suffix(".npz")), "--skip", "2", "--limit", "0", "--prompts", "2",
            "--draft-depth", "5", "--out", str(again)]
    result = CliRunner().invoke(app(), args)
    assert result.exit_code == 0, result.output
    cal, before = load_calibration(again, vocab_size=96), load_calibration(first, vocab_size=96)
    assert cal.meta["warm_records"] == 0 and cal.meta["skip"] == 2 and cal.meta["prompts"] == 2
    assert cal.draft["depth"] == 5 and before.draft["depth"] == PRESETS["cpu"].depth
    check_calibration_draft(GraftOptions(calibration=str(again), depth=5), cal)
    with pytest.raises(ValueError, match="depth 5"):
        check_calibration_draft(GraftOptions(calibration=str(again)), cal)
    result = CliRunner().invoke(app(), ["calibrate", *common, "--skip", "-1", "--out", str(again)])
    assert result.exit_code != 0 and "skip" in str(result.exception)
