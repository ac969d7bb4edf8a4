"""The benchmark harness on a tiny random model: files, resume, consistent numbers, report and plots.

No speed assertions: timings of a random 2-layer model say nothing. The tiny model reads a
byte-level tokenizer (259 ids: 3 specials + 256 bytes), so the real prompt sets encode without
unknown tokens and texts round-trip exactly.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace

import pytest
import torch

from specgraft.bench import BenchConfig, load_suite, run_benchmark, self_repetition
from specgraft.agreement import agreement
from specgraft.suites import DATA_DIR, SUITES, parse_suite_spec
from specgraft.bench.records import RESULTS_FILE, read_rows
from specgraft.bench.repetition import longest_match
from specgraft.bench.summary import OVERALL, common_rows, summarize
from specgraft.bench.peers import PEERS
from specgraft.bench.runner import build_methods, load_models
from specgraft.bench.session import plain_answers
from specgraft.suites import conversation_ids
from specgraft.calibration import save_calibration
from specgraft.methods import METHODS
from specgraft.methods.settings import MethodSettings
from specgraft.models.device import parse_dtype
from specgraft.models.kernels import OneDNNLinear
from specgraft.models.quant import draft_numerics

from tests.helpers.bench import MAX_NEW, byte_tokenizer, check_rows_consistent, config
from tests.helpers.calibration import make_calibration


@pytest.fixture(scope="module")
def alpaca_file(tmp_path_factory):
    """A stand-in for EAGLE's alpaca set (the real one is never read by the tests)."""
    path = tmp_path_factory.mktemp("alpaca") / "alpaca.jsonl"
    rows = [{"id": f"alpaca_eagle-{i}", "task": "alpaca", "turns": [f"Name {i + 2} colours."]} for i in range(3)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# -- READER self-repetition and agreement -------------------------------------------------------


def slow_self_repetition(prompt: list[int], response: list[int], documents: list[list[int]] = ()) -> tuple[int, int]:
    """The paper's three steps with brute-force substring search (the obviously correct twin);
    a match in one of ``documents`` must be followed by a token of it (``store_match``)."""

    def occurs(sub: list[int], text: list[int]) -> bool:
        return any(text[j : j + len(sub)] == sub for j in range(len(text) - len(sub) + 1))

    def in_documents(sub: list[int]) -> bool:
        return any(occurs(sub, doc[:-1]) for doc in documents)

    pointer = advances = 0
    while pointer < len(response):
        best = 0
        for end in range(pointer + 1, len(response) + 1):
            sub = response[pointer:end]
            if occurs(sub, prompt) or occurs(sub, response[:pointer]) or in_documents(sub):
                best = end - pointer
        pointer += max(best, 1)
        advances += 1
    return len(response), advances


def test_self_repetition_worked_example():
    sr = self_repetition([1, 2, 3, 4], [1, 2, 3, 5, 1, 2, 3, 5])
    assert (sr.response_tokens, sr.advances) == (8, 3)
    assert self_repetition([1, 2], []).value == 0.0
    # no repetition at all: one advance per token
    assert self_repetition([9], [1, 2, 3]).value == 1.0
    # the response repeats itself; a match never overlaps the pointer: advances 1 | 2 | 1,2 | 1,2
    assert self_repetition([], [1, 2, 1, 2, 1, 2]).advances == 4


def test_self_repetition_matches_slow_twin():
    rng = random.Random(0)
    for _ in range(300):
        prompt = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        response = [rng.randrange(4) for _ in range(rng.randrange(0, 16))]
        sr = self_repetition(prompt, response)
        assert (sr.response_tokens, sr.advances) == slow_self_repetition(prompt, response), (prompt, response)


def test_self_repetition_with_datastores_matches_slow_twin():
    from specgraft.retrieval import Datastore

    rng = random.Random(1)
    for _ in range(200):
        documents = [[rng.randrange(4) for _ in range(rng.randrange(1, 10))] for _ in range(rng.randrange(1, 4))]
        prompt = [rng.randrange(4) for _ in range(rng.randrange(0, 8))]
        response = [rng.randrange(4) for _ in range(rng.randrange(0, 16))]
        stores = [Datastore.from_documents(documents[:1]), Datastore.from_documents(documents[1:])] if len(documents) > 1 else [
            Datastore.from_documents(documents)]
        sr = self_repetition(prompt, response, stores=stores)
        assert (sr.response_tokens, sr.advances) == slow_self_repetition(prompt, response, documents), (prompt, response, documents)
    # a datastore can only add matches
    assert self_repetition([1], [2, 3, 2, 3], stores=[Datastore.from_documents([[2, 3, 2, 3, 0]])]).advances == 1


def test_longest_match():
    assert longest_match([1, 2, 3], [1, 2, 3]) == 3
    assert longest_match([1, 2, 3], [3, 1, 2]) == 2
    assert longest_match([], [1]) == 0


def test_agreement():
    assert agreement([1, 2, 3], [1, 2, 3]).to_dict() == {"exact": True, "first_divergence": None, "fraction_equal": 1.0}
    a = agreement([1, 9, 3, 4], [1, 2, 3])
    assert (a.exact, a.first_divergence, a.fraction_equal) == (False, 1, 0.5)
    assert agreement([], []).exact


# -- suites ---------------------------------------------------------------------------------------


def test_packaged_suites_load():
    spec = load_suite("spec-bench", per_task=2)
    assert spec.tasks == ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert len(spec.prompts) == 12 and all(p.chat for p in spec.prompts)
    # first N in file order
    all_ids = [json.loads(l)["id"] for l in (DATA_DIR / SUITES["spec-bench"]).read_text().splitlines()]
    assert [p.id for p in spec.prompts[:2]] == all_ids[:2]
    he = load_suite("humaneval", per_task=2)
    assert [p.id for p in he.prompts] == ["HumanEval/0", "HumanEval/1"] and not any(p.chat for p in he.prompts)
    mt = load_suite("mt-bench", per_task=2)
    assert all(len(p.turns) == 2 for p in mt.prompts)
    both = load_suite("spec-bench:1,humaneval:3")
    assert len(both.prompts) == 6 + 3
    # the two suites share the task mt_bench: told apart by suite
    mixed = load_suite("spec-bench:1,mt-bench:1")
    assert {"spec-bench/mt_bench", "mt-bench/mt_bench"} <= set(mixed.tasks)


def test_eagle_alpaca_is_read_from_a_path_never_packaged(alpaca_file, monkeypatch, tmp_path):
    packaged = (DATA_DIR / "eagle_eval.jsonl").read_text()
    assert '"task": "alpaca"' not in packaged and not (DATA_DIR / "alpaca_eagle80.jsonl").exists()
    with_alpaca = load_suite("eagle", per_task=2, alpaca_path=alpaca_file)
    assert with_alpaca.tasks == ["alpaca", "gsm8k", "humaneval", "mt_bench", "qa", "sum"]
    assert not with_alpaca.notes
    monkeypatch.setattr("specgraft.suites.default_alpaca_paths", lambda: [tmp_path / "missing.jsonl"])
    without = load_suite("eagle", per_task=2)
    assert "alpaca" not in without.tasks and "skipped" in without.notes[0]
    with pytest.raises(ValueError, match="alpaca file 'nope.jsonl' does not exist"):
        load_suite("eagle", alpaca_path="nope.jsonl")


def test_custom_jsonl_and_bad_input(tmp_path):
    good = tmp_path / "mine.jsonl"
    good.write_text('{"id": "a", "task": "t1", "turns": ["x"]}\n{"id": "b", "task": "t2", "turns": ["y"], "chat": false}\n')
    suite = load_suite(str(good))
    assert suite.tasks == ["t1", "t2"] and [p.chat for p in suite.prompts] == [True, False]
    with pytest.raises(ValueError, match="unknown suite 'nope'; choose one of spec-bench, humaneval, mt-bench, eagle"):
        load_suite("nope")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "task": "t", "turns": []}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: 'turns' must be a non-empty list"):
        load_suite(str(bad))
    bad.write_text('{"id": "a", "task": "t", "turns": ["x"]}\n{"id": "a", "task": "t", "turns": ["y"]}\n')
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        load_suite(str(bad))
    assert parse_suite_spec("spec-bench:3") == ("spec-bench", 3)
    with pytest.raises(ValueError, match="per_task must be >= 1"):
        load_suite("humaneval", per_task=0)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(methods="ar,nope"), "unknown method 'nope'; choose from adapld, adapld-full, "),
        (dict(methods="hf-assisted"), "hf-assisted needs --draft-model"),
        (dict(suite="humaneval:0"), "prompts per task must be >= 1"),
        (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
        (dict(dtype="int3"), "unknown dtype 'int3'"),
        (dict(temperature=-1.0), "temperature must be a finite number >= 0"),
        (dict(recycling_state="missing.npz"), "recycling state 'missing.npz' does not exist"),
        (dict(methods="ar,draft-tree"), "method 'draft-tree' needs a draft model (--draft-model)"),
        (dict(methods="graft", draft_model="d", calibration="missing.json"), "calibration file 'missing.json' does not exist"),
        (dict(budget=0), "budget must be an integer >= 1, got 0"),
    ],
)
def test_bad_config(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BenchConfig.from_dict({"model": "m", "out": "o", **kw})


def test_run_order():
    assert BenchConfig(model="m", out="o", methods="hf-pld,recycling").run_methods == ("ar", "recycling", "hf", "hf-pld", "ar-end")
    assert BenchConfig(model="m", out="o", methods="pld", bracket=False).run_methods == ("ar", "pld")
    everything = BenchConfig(model="m", out="o", methods="all", settings=MethodSettings(draft_model="d")).run_methods
    assert set(everything) == set(METHODS) | set(PEERS) | {"ar-end"}
    without_draft = BenchConfig(model="m", out="o", methods="all", bracket=False).run_methods
    assert set(without_draft) == {m for m in METHODS if not METHODS[m].needs_draft_model} | {"hf", "hf-pld"}


def test_budgets_and_dtype_are_resolved():
    cfg = BenchConfig(model="m", out="o", methods="pld,draft-tree", settings=MethodSettings(draft_model="d"))
    assert cfg.budget is None and cfg.budgets == {m: METHODS[m].default_budget for m in ("ar", "pld", "draft-tree")}
    assert BenchConfig(model="m", out="o", budget=5).budgets == {"ar": 5, "pld": 5, "recycling": 5}
    assert "--budget" not in cfg.to_command() and "--budget 5" in BenchConfig(model="m", out="o", budget=5).to_command()
    copy = BenchConfig(model="m", out="o", methods="draft-tree", settings=MethodSettings(draft_model="d", draft_copy_ahead=0))
    assert "--draft-copy-ahead" not in cfg.to_command() and "--draft-copy-ahead 0" in copy.to_command()
    assert copy.method_options().graft.copy_ahead == 0 and copy.comparable()["draft_copy_ahead"] == 0
    assert cfg.dtype == "auto" and cfg.resolved_dtype == str(parse_dtype("auto")).removeprefix("torch.")
    assert cfg.comparable()["budgets"] == cfg.budgets and cfg.comparable()["resolved_dtype"] == cfg.resolved_dtype


def test_second_turn_holds_the_first_answer():
    tok = byte_tokenizer()
    ids = conversation_ids(tok, ["Hi", "More"], ["Hello"], chat=True)
    assert tok.decode(ids) == "<user>Hi</s><assistant>Hello</s><user>More</s><assistant>"
    first = conversation_ids(tok, ["Hi"], [], chat=True)
    assert tok.decode(first) == "<user>Hi</s><assistant>"
    assert tok.decode(conversation_ids(tok, ["Hi", "More"], ["Hello"], chat=False)) == "Hi\n\nHello\n\nMore"


# -- full runs on the tiny model ------------------------------------------------------------------------


def test_full_run_every_suite(target_dir, alpaca_file, tmp_path):
    out = tmp_path / "run"
    cfg = config(
        target_dir, out, suite="spec-bench:2,humaneval:2,mt-bench:2,eagle:2",
        methods="ar,pld,recycling,hf,hf-pld", alpaca_path=alpaca_file,
    )
    report = run_benchmark(cfg)
    rows = read_rows(out / RESULTS_FILE)
    suite = load_suite(cfg.suite, alpaca_path=alpaca_file)
    generations = suite.generations_per_method
    assert len(rows) == generations * 5
    check_rows_consistent(rows)
    assert {r.method for r in rows if r.peer} == {"hf", "hf-pld"}
    he = [r for r in rows if r.suite == "humaneval"]
    assert he and not any(r.chat for r in he)

    text = report.read_text()
    assert text.startswith("# specgraft benchmark")
    assert "specgraft bench --model" in text and "total `ar` time / total method time" in text
    assert "retrieval ceiling" in text and "MAT (bonus incl.)" in text
    for task in suite.tasks:
        assert f"## {task} (" in text
    for name in ("speedup_vs_mat", "speedup_by_task", "tokens_per_step", "time_breakdown"):
        png = out / "plots" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert f"plots/{name}.png" in text
    summary = summarize(rows)
    overall = summary.cell("pld", OVERALL)
    assert overall.generations == generations and overall.speedup is not None and overall.speedup_hf is not None
    assert summary.ceiling[OVERALL].value >= 1.0
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["config"]["run_methods"] == ["ar", "pld", "recycling", "hf", "hf-pld"]
    # the run's plain answers with the ids they were generated from, second turns included
    from transformers import AutoTokenizer

    answers = plain_answers(out, AutoTokenizer.from_pretrained(target_dir))
    assert [(a["prompt_id"], a["turn"]) for a, _ in answers] == [(r.prompt_id, r.turn) for r in rows if r.method == "ar"]
    assert any(a["turn"] == 1 for a, _ in answers) and all(len(ids) == a["prompt_tokens"] for a, ids in answers)
    with pytest.raises(FileNotFoundError, match="is not a finished bench run: no run.json"):
        plain_answers(tmp_path, None)


def test_ceiling_with_the_runs_datastores(target_dir, tmp_path):
    """A run with ``--datastore`` reports the ceiling with them beside the plain one: here a
    datastore of the answers themselves, so it can only be higher."""
    from transformers import AutoTokenizer

    from specgraft.retrieval.build import build_datastore

    plain = tmp_path / "plain"
    run_benchmark(config(target_dir, plain, suite="humaneval:2", methods="ar"))
    rows = read_rows(plain / RESULTS_FILE)
    assert all(r.self_repetition_ds is None for r in rows)
    corpus = tmp_path / "answers.jsonl"
    corpus.write_text("".join(json.dumps({"output": r.text}) + "\n" for r in rows))
    build_datastore(AutoTokenizer.from_pretrained(target_dir), [corpus], tmp_path / "ds", progress=False)
    out = tmp_path / "with-ds"
    report = run_benchmark(config(target_dir, out, suite="humaneval:2", methods="ar,pld", datastores=(str(tmp_path / "ds"),)))
    rows = read_rows(out / RESULTS_FILE)
    ar = [r for r in rows if r.method == "ar"]
    assert all(r.self_repetition_ds for r in ar) and all(r.self_repetition_ds is None for r in rows if r.method != "ar")
    summary = summarize(rows)
    assert summary.ceiling_ds[OVERALL].value > summary.ceiling[OVERALL].value
    assert summary.ceiling_ds[OVERALL].response_tokens == summary.ceiling[OVERALL].response_tokens
    column = "| retrieval ceiling (self-repetition) | ceiling with the datastores |"
    assert column in report.read_text() and column not in (plain / "report.md").read_text()


def test_bracketed_run_uses_the_mean_of_both_ar_runs(target_dir, tmp_path):
    out = tmp_path / "bracketed"
    report = run_benchmark(config(target_dir, out, suite="humaneval:2", methods="ar,pld", bracket=True))
    rows = read_rows(out / RESULTS_FILE)
    assert [r.method for r in rows] == ["ar", "pld", "ar-end"] * 2, "ar first and last on every input"
    check_rows_consistent(rows)
    by = {(r.prompt_id, r.method): r for r in rows}
    ends = [r for r in rows if r.method == "ar-end"]
    assert all(r.tokens == by[(r.prompt_id, "ar")].tokens and r.agreement["exact"] for r in ends)
    summary = summarize(rows)
    assert "ar-end" not in summary.methods
    cell = summary.cell("pld", OVERALL)
    expected = sum((by[(p, "ar")].time_s + by[(p, "ar-end")].time_s) / 2 for p in {r.prompt_id for r in rows})
    assert cell.ar_time_s == pytest.approx(expected)
    assert len(summary.drift[OVERALL]) == 2
    text = report.read_text()
    assert "## Baseline drift" in text and "median ar-end / ar time" in text
    assert "--no-bracket" not in text and "--no-bracket" in config(target_dir, out).to_command()

    # `specgraft report DIR` renders the same report again from the rows (a stopped run)
    from typer.testing import CliRunner

    from specgraft.cli import app

    report.unlink()
    shutil.rmtree(out / "plots")
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert report.read_text() == text and (out / "plots" / "speedup_vs_mat.png").exists()
    assert "## Baseline drift" in result.output
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "nowhere")], standalone_mode=False)
    assert isinstance(missing.exception, ValueError) and "no results.jsonl" in str(missing.exception)


def test_rounds_alternate_the_order_and_keep_the_mean_time(target_dir, tmp_path, monkeypatch):
    """``rounds=2``: ar first and ar-end last in both rounds, the methods between them reversed in
    the first; one row per method with the rounds' mean time and phase times; same report."""
    from specgraft.bench.contract import SpecgraftMethod

    calls: list[str] = []
    plain_run = SpecgraftMethod.run

    def run(self, ids):
        calls.append(self.name)
        return plain_run(self, ids)

    monkeypatch.setattr(SpecgraftMethod, "run", run)
    out = tmp_path / "rounds"
    cfg = config(target_dir, out, suite="humaneval:1", methods="ar,pld,ptd", bracket=True, rounds=2)
    assert "--rounds 2" in cfg.to_command()
    report = run_benchmark(cfg)
    order = ["ar", "ptd", "pld", "ar", "ar", "pld", "ptd", "ar"]  # ar-end is an ar engine of its own
    assert calls[-len(order):] == order, calls
    rows = read_rows(out / RESULTS_FILE)
    assert [r.method for r in rows] == ["ar", "pld", "ptd", "ar-end"], "rows in run order: the last round's"
    check_rows_consistent(rows)
    for r in rows:
        assert len(r.round_times_s) == 2 and r.time_s == pytest.approx(sum(r.round_times_s) / 2, abs=1e-6)
        assert r.time_breakdown_s["total"] <= max(r.round_times_s) + 1e-6
    assert "## Baseline drift" in report.read_text() and "every input ran 2 rounds" in report.read_text()
    single = run_benchmark(config(target_dir, tmp_path / "one", suite="humaneval:1", methods="ar,pld"))
    assert all(r.round_times_s is None for r in read_rows(single.parent / RESULTS_FILE))
    with pytest.raises(ValueError, match="different config .*rounds: 2 before, 1 now"):
        run_benchmark(config(target_dir, out, suite="humaneval:1", methods="ar,pld,ptd", bracket=True, resume=True))
    with pytest.raises(ValueError, match="rounds must be an integer >= 1"):
        config(target_dir, out, rounds=0)


def test_session_ids_are_unique_within_a_second():
    from specgraft.bench.session import session_id as _session_id

    assert _session_id() != _session_id()


def test_resume_skips_finished_rows(target_dir, tmp_path):
    out = tmp_path / "run"
    run_benchmark(config(target_dir, out, suite="humaneval:1,mt-bench:1", methods="ar,pld"))
    first = read_rows(out / RESULTS_FILE)
    assert len(first) == (1 + 2) * 2

    with pytest.raises(ValueError, match="exists; pass --resume"):
        run_benchmark(config(target_dir, out, suite="humaneval:1", methods="ar,pld"))
    with pytest.raises(ValueError, match="different config .*max_new_tokens: 8 before, 6 now"):
        run_benchmark(config(target_dir, out, suite="humaneval:1", max_new_tokens=6, resume=True))

    # an interrupted write leaves a partial last line: resume cuts it and re-measures
    with (out / RESULTS_FILE).open("a") as f:
        f.write('{"prompt_id": "HumanEval/1", "tur')
    run_benchmark(config(target_dir, out, suite="humaneval:2,mt-bench:1", methods="ar,pld,hf", resume=True))
    rows = read_rows(out / RESULTS_FILE)
    assert rows[: len(first)] == first, "finished rows are kept as they were"
    # ar, pld and hf on 4 inputs, plus ar again on the 3 inputs that gain hf in this session
    assert len(rows) == (2 + 2) * 3 + 3
    check_rows_consistent(rows)
    new = rows[len(first) :]
    assert len({r.session for r in new}) == 1 and new[0].session != first[0].session
    assert [(r.prompt_id, r.method) for r in new if r.prompt_id == "HumanEval/0"] == [("HumanEval/0", "ar"), ("HumanEval/0", "hf")]
    # each row pairs with the ar of its own session; the ar cell counts each input once
    summary = summarize(rows)
    assert summary.cell("ar", OVERALL).generations == 4
    same_session_ar = {(r.prompt_id, r.turn, r.session): r.time_s for r in rows if r.method == "ar"}
    for method, session in (("hf", new[0].session), ("pld", first[0].session)):
        cell = summary.cell(method, OVERALL)
        paired = [same_session_ar[(r.prompt_id, r.turn, session)] for r in rows if r.method == method and r.session == session]
        if method == "pld":  # HumanEval/1's pld ran in the second session, beside that session's ar
            paired += [same_session_ar[(r.prompt_id, r.turn, r.session)] for r in rows if r.method == "pld" and r.session != session]
        assert cell.ar_time_s == pytest.approx(sum(paired))
    assert "2 sessions" in (out / "report.md").read_text()
    assert "inputs every method ran" not in (out / "report.md").read_text(), "every method ran every input"
    assert "## Every method by task: speedup over `ar` (MAT)\n" in (out / "report.md").read_text()

    # a third session adds a prompt for ar only: the report compares methods on their common inputs too
    run_benchmark(config(target_dir, out, suite="humaneval:3", methods="ar", resume=True))
    rows = read_rows(out / RESULTS_FILE)
    shared = common_rows(rows)
    assert {r.prompt_id for r in rows} - {r.prompt_id for r in shared} == {"HumanEval/2"}
    text = (out / "report.md").read_text()
    generations = len({(r.prompt_id, r.turn) for r in shared})
    prompts = len({r.prompt_id for r in shared})
    assert f"## Overall on the inputs every method ran ({prompts} prompts, {generations} generations)" in text
    # the by-task matrix compares methods on those common inputs: speedup (MAT) for ours, speedup for peers
    common = summarize(shared)
    pld, hf = common.cell("pld", OVERALL), common.cell("hf", OVERALL)
    assert "## Every method by task: speedup over `ar` (MAT) on the inputs every method ran" in text
    assert f"| overall | {pld.speedup:.2f}x ({pld.mat:.2f}) | {hf.speedup:.2f}x |" in text


def test_cli_with_draft_model(target_dir, draft_dir, tmp_path):
    import typer
    from typer.testing import CliRunner

    from specgraft.cli.bench import bench

    app = typer.Typer()
    app.command()(bench)
    out = tmp_path / "cli"
    args = ["--model", target_dir, "--draft-model", draft_dir, "--methods", "ar,hf-assisted", "--suite", "humaneval",
            "--per-task", "1", "--max-new-tokens", str(MAX_NEW), "--dtype", "float32", "--threads", "1", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = read_rows(out / RESULTS_FILE)
    assert [r.method for r in rows] == ["ar", "hf", "hf-assisted", "ar-end"], "the CLI brackets by default"
    assert "hf-assisted (HF)" in result.output
    # one log line per measured row, with the ETA (a progress bar does not show in a log)
    lines = [line for line in result.output.splitlines() if line.startswith("[")]
    assert [line.split(" ", 1)[0] for line in lines] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"], result.output
    assert " hf-assisted: " in lines[2] and "x ar; eta " in lines[2] and lines[3].endswith("eta 0:00")
    bad = CliRunner().invoke(app, [*args[:-1], str(tmp_path / "cli2"), "--suite", "nope"])
    assert isinstance(bad.exception, ValueError) and "unknown suite 'nope'" in str(bad.exception)


def test_draft_model_methods(target_dir, draft_dir, tmp_path):
    """draft-tree and graft (with a calibration) run beside ar on 2 prompts, losslessly, each at its default budget."""
    calibration = str(save_calibration(make_calibration(vocab=len(byte_tokenizer())), tmp_path / "calib.json"))
    out = tmp_path / "run"
    # no cost-aware cut for draft-tree: every node of a random draft is unlikely (the flag is recorded)
    report = run_benchmark(config(target_dir, out, suite="humaneval:2", methods="draft-tree,graft", draft_model=draft_dir, calibration=calibration, draft_row_cost=0.0))
    rows = read_rows(out / RESULTS_FILE)
    assert [r.method for r in rows] == ["ar", "draft-tree", "graft"] * 2
    check_rows_consistent(rows)
    for r in rows:
        method_config = r.config["method_config"]
        assert method_config["generation"]["budget"] == METHODS[r.method].default_budget
        assert r.config["calibration"] == calibration
        if r.method != "ar":
            assert method_config["options"]["graft"]["calibration"] == calibration
            assert method_config["draft_model"].pop("fused_projections") > 0, "q/k/v and gate/up fused on CPU"
            assert method_config["draft_model"] == {
                "name_or_path": draft_dir, "dtype": "float32", "numerics": "int8", "attention": "specgraft_sdpa"
            }, "auto on CPU"
            assert r.proposed_by_source["draft"] > 0
    assert any("retrieval" in r.proposed_by_source for r in rows if r.method == "graft")
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["config"]["budgets"] == {"ar": 1, "draft-tree": 16, "graft": 8} == {m: METHODS[m].default_budget for m in ("ar", "draft-tree", "graft")}
    assert run_info["config"]["resolved_dtype"] == "float32" and f"--calibration {calibration}" in run_info["command"]
    assert run_info["config"]["resolved_draft_quant"] == "int8" and "--draft-row-cost 0.0" in run_info["command"]
    assert "budget (nodes per step) ar 1, draft-tree 16, graft 8" in report.read_text()

    # resuming with another budget for a method already measured is refused
    with pytest.raises(ValueError, match="different config .*budgets"):
        run_benchmark(config(target_dir, out, suite="humaneval:2", methods="draft-tree", draft_model=draft_dir, budget=4, resume=True))


def test_one_draft_model_for_every_method(target_dir, draft_dir, tmp_path):
    cfg = config(target_dir, tmp_path / "o", methods="draft-tree,graft-tail,hf-assisted", draft_model=draft_dir, draft_quant="none")
    options = cfg.method_options()
    models = load_models(cfg, options)
    methods = build_methods(cfg, models, options)
    assert methods["hf-assisted"].assistant_model is models.draft
    assert methods["draft-tree"].decoder.draft_model is models.draft and methods["graft-tail"].decoder.draft_model is models.draft
    # --draft-quant none: loaded like the target, same CPU kernels
    kernels = {type(m) for m in models.draft.modules()} & {OneDNNLinear, torch.nn.Linear}
    assert kernels == {type(m) for m in models.decoder.model.modules()} & {OneDNNLinear, torch.nn.Linear}
    # --draft-quant int8 (auto on CPU): the one loaded draft (hf-assisted's too) has int8 linears
    cfg = replace(cfg, settings=replace(cfg.settings, draft_quant="int8"))
    options = cfg.method_options()
    models = load_models(cfg, options)
    methods = build_methods(cfg, models, options)
    assert draft_numerics(models.draft) == "int8" and methods["hf-assisted"].assistant_model is models.draft


def test_vllm_peers_run_after_ours_on_the_same_ids(target_dir, tmp_path, monkeypatch):
    """The vLLM peers' subprocess is replaced by a stand-in that answers with ``ar``'s tokens (the
    real one runs in tests/integration/test_vllm_e2e.py): what the runner sends it and how it
    records and reports what comes back."""
    import specgraft.bench.runner as runner
    from specgraft.bench.contract import MethodRun

    calls = []

    def fake_run(name, settings, inputs, eos, max_new_tokens, warmup_ids, workdir, warmup_tokens=16):
        calls.append((name, settings, [k for k, _ in inputs]))
        rows = {(r.prompt_id, r.turn): r for r in read_rows(tmp_path / "vllm-out" / RESULTS_FILE) if r.method == "ar"}
        out = {}
        for key, ids in inputs:
            pid, turn = key.rsplit(":", 1)
            ar = rows[(pid, int(turn))]
            assert len(ids) == ar.prompt_tokens and max_new_tokens == MAX_NEW
            spec = {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0} if name == "vllm" else {"drafts": 2, "draft_tokens": 6, "accepted_tokens": 3}
            out[key] = MethodRun(tokens=ar.tokens, time_s=1.0 if name == "vllm" else 0.5, config={"method": name, "spec_decode": spec})
        return out

    monkeypatch.setattr(runner, "run_vllm_peer", fake_run)
    monkeypatch.setattr(runner, "check_vllm_python", lambda python: "0.32.0")
    out = tmp_path / "vllm-out"
    cfg = config(target_dir, out, suite="humaneval:1,mt-bench:1", methods="ar,pld,vllm-ngram,vllm-specgraft-pld", vllm_python="/x/python")
    assert cfg.vllm_methods == ("vllm", "vllm-ngram", "vllm-specgraft-pld") and "vllm" not in cfg.run_methods
    assert "--vllm-python /x/python" in cfg.to_command()
    report = run_benchmark(cfg)
    assert [c[0] for c in calls] == ["vllm", "vllm-ngram", "vllm-specgraft-pld"]
    assert calls[0][1].python == "/x/python" and calls[0][1].model == target_dir and calls[0][1].num_speculative_tokens == 5
    rows = read_rows(out / RESULTS_FILE)
    inputs = sorted(f"{r.prompt_id}:{r.turn}" for r in rows if r.method == "ar")
    assert len(inputs) == 3 and all(sorted(c[2]) == inputs for c in calls), "every prompt and turn, MT-bench's second turn included"
    ours = [r for r in rows if not r.method.startswith("vllm")]
    assert rows[: len(ours)] == ours, "the vLLM peers run after every input has run here"
    spec = [r for r in rows if r.method == "vllm-specgraft-pld"]
    assert all(r.peer and r.agreement_hf["exact"] and r.steps == r.new_tokens - 3 for r in spec)
    summary = summarize(rows)
    assert summary.cell("vllm-specgraft-pld", OVERALL).speedup_hf == pytest.approx(2.0), "vs plain vLLM"
    text = report.read_text()
    assert "vllm-specgraft-pld (vLLM)" in text and "speedup vs own plain" in text
    with pytest.raises(ValueError, match="unknown method"):
        config(target_dir, out, methods="vllm-recycling")


def test_hf_peers_run_under_our_attention_backends(monkeypatch):
    """Hugging Face's ``generate`` (a peer row, ``bench-serve``'s padded batches) runs with the
    SDPA backends our forwards use (on a GPU: no cuDNN attention, whose plan per new key length
    made HF's padded batches 8x slower on an H100), and gives the same tokens under them."""
    import contextlib

    import specgraft.bench.batched as batched
    import specgraft.bench.peers as peers
    from specgraft.bench.peers import HFPeer
    from tests.helpers.models import TINY_MODELS

    entered = []

    @contextlib.contextmanager
    def spy(device):
        entered.append(device.type)
        yield

    model = TINY_MODELS["qwen2"]()
    ids = [5, 9, 17, 33, 5, 9]
    plain = HFPeer("hf", model, eos_token_ids=[0], max_new_tokens=8).run(ids).tokens
    padded = batched.hf_padded(model, [ids, ids[:4]], 8, 2, pad_id=0).outputs
    monkeypatch.setattr(peers, "attention_backends", spy)
    monkeypatch.setattr(batched, "attention_backends", spy)
    assert HFPeer("hf", model, eos_token_ids=[0], max_new_tokens=8).run(ids).tokens == plain
    assert batched.hf_padded(model, [ids, ids[:4]], 8, 2, pad_id=0).outputs == padded
    assert entered == ["cpu", "cpu"]


def test_source_revision_names_the_commit_and_uncommitted_changes(tmp_path):
    """Every run records the git revision of the code that ran (``+dirty`` with uncommitted
    changes to tracked files; None outside a checkout), beside the CPU's family and model."""
    import shutil
    import subprocess

    from specgraft.bench.environment import environment, source_revision

    assert source_revision(tmp_path) is None  # not a checkout
    if shutil.which("git") is None:
        pytest.skip("no git")

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert source_revision(tmp_path) == head
    (tmp_path / "b.py").write_text("untracked\n")
    assert source_revision(tmp_path) == head  # untracked files do not count
    (tmp_path / "a.py").write_text("x = 2\n")
    assert source_revision(tmp_path) == head + "+dirty"
    env = environment("float32")
    assert {"specgraft_revision", "cpu"} <= set(env)


def small_summary():
    """``ar``, ``pld`` and a peer whose baseline is missing (no speedup anywhere: an empty series),
    on one task; ``ar`` emits one token a step, ``pld`` one to three."""
    from specgraft.bench.summary import PHASES, Cell, Summary

    cells = {}
    for task in ("qa", OVERALL):
        for m, time_s, steps, hist in (("ar", 10.0, 60, {1: 60}), ("pld", 5.0, 30, {1: 10, 2: 10, 3: 10})):
            c = Cell(m, task, False, generations=2, new_tokens=60, steps=steps, time_s=time_s, ar_time_s=10.0,
                     hf_time_s=None, prefill_s=1.0, ar_prefill_s=1.0, exact=2, fraction_equal_sum=2.0)
            c.tokens_per_step.update(hist)
            c.phase_s.update({p: time_s / len(PHASES) for p in PHASES})
            cells[(m, task)] = c
        cells[("hf-pld", task)] = Cell("hf-pld", task, True, generations=2, new_tokens=60, steps=None, time_s=4.0,
                                       ar_time_s=0.0, hf_time_s=None, prefill_s=None)
    return Summary(["ar", "pld", "hf-pld"], ["qa"], cells, {}, {"qa": 2, OVERALL: 2}, ["s1"])


def test_the_ar_row_shows_no_speedup_over_itself():
    from specgraft.bench.report import render_markdown, task_table

    rows = {line.split(" | ")[0].lstrip("| "): line.strip("|").split(" | ") for line in task_table(small_summary(), OVERALL)[2:]}
    header = task_table(small_summary(), OVERALL)[0].strip("| ").split(" | ")
    ar, pld = (dict(zip(header, (x.strip() for x in rows[m]))) for m in ("ar", "pld"))
    assert ar["speedup vs ar"] == "-" and ar["decode speedup vs ar"] == "-" and ar["MAT (bonus incl.)"] == "1.00"
    assert pld["speedup vs ar"] == "2.00x" and pld["decode speedup vs ar"] == "2.25x"
    assert "| ar | 1.00 | 6.00 | - |" in render_markdown(small_summary())


def test_plots_start_the_histogram_at_zero_and_keep_legends_off_the_bars(tmp_path, monkeypatch):
    """Rendered with the Agg backend and inspected before the figures close: every
    tokens-per-step axis (``ar``'s single bar at 1 included) starts at 0; a legend sits right of
    its axes, lists only series that drew something, and rendering warns about nothing."""
    import warnings

    import specgraft.bench.plots as plots

    figures = {}
    monkeypatch.setattr(plots.plt, "close", lambda fig: figures.setdefault(len(figures), fig))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = plots.write_plots(small_summary(), tmp_path)
    assert [p.name for p in paths] == ["speedup_vs_mat.png", "speedup_by_task.png", "tokens_per_step.png", "time_breakdown.png"]
    by_name = dict(zip((p.stem for p in paths), figures.values()))
    hist_axes = by_name["tokens_per_step"].axes
    assert [ax.get_title().split(" ")[0] for ax in hist_axes] == ["ar", "pld"]
    assert all(ax.get_xlim()[0] == 0 for ax in hist_axes)
    for name, labels in (("speedup_by_task", ["pld"]), ("speedup_vs_mat", ["ar: overall", "pld: overall", "qa"])):
        fig = by_name[name]
        ax = fig.axes[0]
        legend = ax.get_legend()
        assert [t.get_text() for t in legend.get_texts()] == labels, name
        fig.canvas.draw()
        assert legend.get_window_extent().x0 >= ax.get_window_extent().x1, f"{name}: the legend overlaps the axes"
    # a run of ar alone: nothing to compare, so no bars and no legend (and no "No artists with labels" warning)
    alone = small_summary()
    alone.methods = ["ar"]
    figures.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots.plot_speedup_by_task(alone, tmp_path / "alone.png")
    assert figures[0].axes[0].get_legend() is None


def test_the_shared_alternating_order():
    """``benchmarks/tools/alternate.py``: the one alternating-order loop the measurement scripts
    share (its doctest), and that a script importing it through ``tools`` loads."""
    import doctest

    from tests.helpers.scripts import benchmark_script

    alternate = benchmark_script("alternate")
    assert doctest.testmod(alternate).failed == 0
    assert [alternate.alternate("abc", i) for i in range(3)] == [list("abc"), list("cba"), list("abc")]
    assert benchmark_script("project_gpu").alternate(["ar", "pld"], 1) == ["pld", "ar"]
