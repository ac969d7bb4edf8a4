"""`specgraft tune` end to end on the tiny model: reader-search's tree size per batch size, and
the tuned budgets applied by `bench-serve`."""

import json

import pytest

from tests.helpers.cli import run_cli

pytestmark = pytest.mark.usefixtures("one_thread")


class FakeServer:
    def run(self):
        pass


def write_prompts(path, texts):
    path.write_text("".join(json.dumps({"id": f"p{i}", "task": "t", "turns": [t]}) + "\n" for i, t in enumerate(texts)))
    return str(path)


def test_tune_reader_search_per_batch_size_then_bench_serve(tmp_path, monkeypatch, capsys, tiny_model_dir):
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))
    prompts = write_prompts(tmp_path / "tune.jsonl", ["w5 w6 w7 w5 w6 w7 w5 w6", "w9 w10 w11 w9 w10"])
    out = tmp_path / "shape.json"
    code, _, err = run_cli(
        monkeypatch, capsys, "tune", "--model", tiny_model_dir, "--method", "reader-search", "--prompts", prompts,
        "--batch-size", "1,2", "--max-new-tokens", "8", "--seed-search-nodes", "6", "--seed-search", "4", "--out", str(out),
    )
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["method"] == "reader-search" and data["prompts"] == ["p0", "p1"] and data["identity"]["draft_model"] is None
    shape = data["shape"]
    assert shape["draft_nodes"] == 0 and shape["d_deep"] == 0 and shape["d_search"] == 4 and 1 <= shape["search_nodes"] <= 6
    assert shape["min_match"] == 2
    assert set(data["by_batch"]) == {"1", "2"} and all(len(t["verify_s"]) == 7 for t in data["by_batch"].values())
    assert all(len(row) == 6 for row in data["record"]["search"]) and data["steps"] == len(data["record"]["search"]) > 0
    assert "budget per batch size: B=1" in err

    suite = write_prompts(tmp_path / "suite.jsonl", ["w5 w6 w7 w5 w6", "w4 w5 w4 w5", "w8"])
    code, _, err = run_cli(
        monkeypatch, capsys, "bench-serve", "--model", tiny_model_dir, "--methods", "reader-search", "--reader-shape", str(out),
        "--batch-sizes", "1,2", "--suite", suite, "--max-new-tokens", "6", "--out", str(tmp_path / "bs"), "--threads", "1", "--no-hf",
    )
    assert code == 0, err
    assert "reader-search: budgets tuned per batch size, TunedBudget(" in err
    rows = [json.loads(line) for line in (tmp_path / "bs" / "results.jsonl").read_text().splitlines()]
    assert all(r["exact"] for r in rows)
    budgets = {b: t["budget"] for b, t in data["by_batch"].items()}
    for r in rows:
        if r["method"] == "reader-search":
            assert r["budget"] == min(budgets[str(r["batch"])], shape["search_nodes"]), "the tuned budget of the batch size capped every step"

    # the server takes the same budgets (the server itself is not started)
    from specgraft.budget.policy import TunedBudget
    from specgraft.serve import run

    apps = []
    monkeypatch.setattr(run, "server", lambda app, **kw: apps.append(app) or FakeServer())
    code, _, err = run_cli(
        monkeypatch, capsys, "serve", "--model", tiny_model_dir, "--method", "reader-search", "--reader-shape", str(out), "--threads", "1",
    )
    assert code == 0, err
    assert f"budgets tuned per batch size in {out}" in " ".join(err.split())
    policy = apps[0].state.worker.batch.policy
    assert isinstance(policy, TunedBudget) and policy.budgets == {int(b): n for b, n in budgets.items()}


def test_tune_refuses_what_it_cannot_tune(tmp_path, monkeypatch, capsys, tiny_model_dir):
    common = ["tune", "--model", tiny_model_dir, "--out", str(tmp_path / "s.json")]
    code, _, err = run_cli(monkeypatch, capsys, *common)
    assert code != 0 and "--method reader needs --draft-model" in err
    code, _, err = run_cli(monkeypatch, capsys, *common, "--method", "reader-search", "--draft-model", tiny_model_dir)
    assert code != 0 and "drop --draft-model" in err
    code, _, err = run_cli(monkeypatch, capsys, *common, "--method", "pld")
    assert code != 0 and "--method must be one of reader, reader-search" in err


def test_tune_reader_with_a_draft_model(tmp_path, monkeypatch, capsys, tiny_model_dir):
    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path))
    prompts = write_prompts(tmp_path / "tune.jsonl", ["w5 w6 w7 w5 w6 w7 w5 w6"])
    out = tmp_path / "shape.json"
    code, _, err = run_cli(
        monkeypatch, capsys, "tune", "--model", tiny_model_dir, "--draft-model", tiny_model_dir, "--prompts", prompts,
        "--max-new-tokens", "6", "--seed-draft-nodes", "3", "--seed-search", "2", "--seed-deep", "2", "--out", str(out),
        "--deepen-depth", "16", "--min-match", "2",
    )
    assert code == 0, err
    data = json.loads(out.read_text())
    assert set(data["shape"]) == {"draft_nodes", "d_search", "d_deep", "deepen_depth", "min_match"} and 1 <= data["shape"]["draft_nodes"] <= 3
    assert (data["shape"]["deepen_depth"], data["shape"]["min_match"]) == (16, 2), "the keys the seed ran with stay in the shape"
    assert "by_batch" not in data and data["identity"]["draft_model"] == tiny_model_dir
    assert all(len(r) == 3 for r in data["record"]["draft"]) and len(data["verify_s"]) == 8
