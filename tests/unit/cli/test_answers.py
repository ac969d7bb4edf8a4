"""`specgraft datastore generate`: the target's own answers as a datastore corpus (READER 4.2)."""

import json

import pytest

from specgraft.api import SpecDecoder
from specgraft.retrieval import Datastore
from specgraft.retrieval.answers import answered_ids

from tests.helpers.cli import run_cli

PROMPTS = [
    {"id": "a", "task": "t", "turns": ["w5 w6 w7 w5 w6 w7 w5 w6", "a second turn is not answered"]},
    {"id": "b", "task": "t", "turns": ["w9 w10 w11 w9 w10"], "chat": False},
    {"id": "c", "task": "u", "turns": ["w12 w13 w14 w15 w12 w13 w14 w15 w12 w13 w14 w15 w12 w13"]},
]


def write_prompts(path, rows=PROMPTS):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_answers_are_plain_decodings_and_resume(monkeypatch, capsys, tmp_path, tiny_model_dir, tiny_draft_dir):
    prompts = write_prompts(tmp_path / "p.jsonl")
    out = tmp_path / "answers.jsonl"
    args = ["datastore", "generate", "--model", tiny_model_dir, "--prompts", prompts + ":1", "--out", str(out),
            "--method", "draft-tree", "--draft-model", tiny_draft_dir, "--max-new-tokens", "12", "--dtype", "float32", "--threads", "1"]
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in first] == ["a", "c"]  # `:1`: the first prompt of each task
    assert "2 answers written" in err
    # resumed with every prompt: only the missing one is answered
    code, _, err = run_cli(monkeypatch, capsys, *[a if a != prompts + ":1" else prompts for a in args])
    assert code == 0 and "1 answers written" in err and "2 already in" in err
    records = {r["id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert sorted(records) == ["a", "b", "c"]
    assert records["a"]["turns"] == [PROMPTS[0]["turns"][0]] and records["a"]["chat"] and not records["b"]["chat"]
    # greedy answers are plain decoding's, token for token
    plain = SpecDecoder.from_pretrained(tiny_model_dir, method="ar", dtype="float32", progress=False)
    for p in PROMPTS:
        r = records[p["id"]]
        expect = plain.generate(p["turns"][0], chat=p.get("chat", True), max_new_tokens=12)
        assert r["output"] == expect.text and r["new_tokens"] == len(expect.tokens), p["id"]
        assert r["method"] == "draft-tree" and r["model"] == tiny_model_dir
    # the answers build a datastore of three documents (their `output`s); checked against the
    # prompt file itself, the answer to the one long prompt is dropped with its prompt
    for exclude, documents in (("none", 3), (prompts, 2)):
        code, _, err = run_cli(monkeypatch, capsys, "datastore", "build", "--model", tiny_model_dir, "--corpus", str(out),
                               "--out", str(tmp_path / "ds"), "--exclude-suite", exclude, "--force")
        assert code == 0, err
        manifest = Datastore.load(tmp_path / "ds").manifest
        assert (manifest["documents"], manifest["excluded_documents"]) == (documents, 3 - documents)


def test_benchmark_prompts_refused(monkeypatch, capsys, tmp_path, tiny_model_dir):
    prompts = write_prompts(tmp_path / "p.jsonl")
    out = tmp_path / "new" / "folder" / "answers.jsonl"  # made on the way
    code, _, err = run_cli(monkeypatch, capsys, "datastore", "generate", "--model", tiny_model_dir, "--prompts", prompts,
                           "--out", str(out), "--method", "ar", "--max-new-tokens", "4", "--exclude-suite", prompts)
    assert code == 0, err
    # a prompt of the excluded suite is refused when it has 32+ normalised characters ("a" and
    # "b" are too short to judge: `ExcludeFilter`)
    assert "refused 1 prompts" in err and ": c" in err
    assert [json.loads(x)["id"] for x in out.read_text().splitlines()] == ["a", "b"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--method", "graft"], "method 'graft' needs a draft model (--draft-model)"),
        (["--method", "nope"], "unknown method 'nope'"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["--prompts", "missing.jsonl"], "unknown suite 'missing.jsonl'"),
    ],
)
def test_bad_arguments(monkeypatch, capsys, tmp_path, tiny_model_dir, extra, message):
    prompts = write_prompts(tmp_path / "p.jsonl")
    code, _, err = run_cli(monkeypatch, capsys, "datastore", "generate", "--model", tiny_model_dir, "--prompts", prompts,
                           "--out", str(tmp_path / "a.jsonl"), *extra)
    assert code == 2 and message in err, err


def test_answered_ids(tmp_path):
    path = tmp_path / "a.jsonl"
    assert answered_ids(path) == set()
    path.write_text('{"id": "x", "output": "o"}\n{"id": "y", "outp')  # the last write was interrupted
    assert answered_ids(path) == {"x"}
    path.write_text('{"id": "x"}\nnot json\n{"id": "z"}\n')
    with pytest.raises(ValueError, match="a.jsonl:2: not an answers record"):
        answered_ids(path)

