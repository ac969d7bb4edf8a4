"""The benchmark on the llama.cpp backend and its llama.cpp peers, on tiny GGUFs the tests write.

``bench --backend llamacpp`` end to end (our methods on LlamaCppTarget; ``llamacpp`` and
``llamacpp-pld`` through llama-cpp-python, in the peers' process and in ours; rounds; strict
mode; the report's llama.cpp columns), llama.cpp's programs through a fake ``llama-lookup`` /
``llama-speculative`` that prints what the real ones print (their command line, prompt file,
output parsing and timing), and the options' one-line errors. No real model is needed.

The tiny GGUF has a vocabulary of 259 tokens (3 specials and the 256 bytes as byte tokens) and
sits beside a byte-level tokenizer whose id for byte ``b`` is ``3 + b``, so llama.cpp can tokenize
any prompt text (a vocabulary without some byte would abort llama.cpp's tokenizer).
"""

from __future__ import annotations

import dataclasses

import json
import os
import re
import stat
import sys
from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from specgraft.methods.settings import MethodSettings  # noqa: E402
from specgraft.bench import BenchConfig, run_benchmark  # noqa: E402
from specgraft.bench.llamacpp_tools import ToolOutput, find_tool, parse_tool_output  # noqa: E402
from specgraft.bench.records import RESULTS_FILE, read_rows  # noqa: E402
from specgraft.bench.runner import round_order, to_measure  # noqa: E402
from specgraft.models.gguf_requant import draft_gguf  # noqa: E402

from tests.helpers.gguf_models import write_tiny_gguf  # noqa: E402
from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: E402

MAX_NEW = 8
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def byte_tokenizer():
    """Byte-level BPE with no merges: byte ``b`` is id ``3 + b`` (the GGUF's byte token), <unk>=0, <s>=1, </s>=2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {ch: 3 + b for b, ch in bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory):
    """A target and a draft GGUF (Q8_0), each beside the byte tokenizer."""
    out = {}
    for name, seed, layers in (("target", 0, 2), ("draft", 1, 1)):
        folder = tmp_path_factory.mktemp(name)
        write_tiny_gguf(folder / f"{name}.gguf", vocab=259, seed=seed, layers=layers, qtype="Q8_0")
        byte_tokenizer().save_pretrained(folder)
        out[name] = str(folder / f"{name}.gguf")
    return out


# What the real programs print (llama.cpp b0c1e570, llama-lookup on SmolLM2): the prompt's
# pieces and the generated ones between blank lines on stdout, prefixed log lines on stderr.
FAKE_TOOL = r'''#!{python}
"""A stand-in for llama.cpp's llama-lookup / llama-speculative: logs its argv, echoes the
prompt file (less its last newline, as -f reads it), generates "abcabc..." (-n + 3 bytes, past
-n as the real ones overshoot) and prints the real programs' statistics lines."""
import json, os, sys

args = sys.argv[1:]
if args == ["--version"]:
    sys.stderr.write("version: 9999 (fake)\nbuilt with a test\n")
    sys.exit(0)
def options(args):
    out, i = {{}}, 0
    while i < len(args):
        if args[i] == "--no-escape":
            out[args[i]], i = True, i + 1
        else:
            out[args[i]], i = args[i + 1], i + 2
    return out


opts = options(args)
with open(os.environ["FAKE_LLAMA_LOG"], "a") as log:
    log.write(json.dumps({{"tool": os.path.basename(sys.argv[0]), "args": args, "prompt": open(opts["-f"], "rb").read().decode()}}) + "\n")
if os.environ.get("FAKE_LLAMA_FAIL"):
    sys.stderr.write("main: error: failed to load model\n")
    sys.exit(1)
prompt = open(opts["-f"], "rb").read()[:-1]
n = int(opts["-n"]) + 3
out = sys.stdout.buffer
out.write(b"\n\n" + prompt)
out.write((b"abc" * n)[:n])
out.write(b"\n\n\n\n")
sys.stderr.write(
    "0.00.612.921 I encoded   %4d tokens in    0.250 seconds, speed:  20.000 t/s\n"
    "0.00.612.934 I decoded   %4d tokens in    0.500 seconds, speed:  22.000 t/s\n"
    "0.00.612.935 I n_draft      = 3\n0.00.612.935 I n_predict    = %d\n0.00.612.935 I n_drafted    = 9\n"
    "0.00.612.936 I n_accept     = 4\n0.00.612.938 I accept       = 44.444%%\n" % (len(prompt), n, n)
)
'''


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """A folder with fake ``llama-lookup`` and ``llama-speculative``; returns (folder, log file)."""
    folder = tmp_path / "tools"
    folder.mkdir()
    for name in ("llama-lookup", "llama-speculative"):
        path = folder / name
        path.write_text(FAKE_TOOL.format(python=sys.executable))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "tool-calls.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(log))
    monkeypatch.delenv("SPECGRAFT_LLAMACPP_TOOLS", raising=False)
    return folder, log


def bench(ggufs, out: Path, **kw) -> tuple[list, dict, str]:
    base = dict(
        model=ggufs["target"], out=str(out), suite="humaneval:2", max_new_tokens=MAX_NEW, threads=1, warmup_tokens=2, progress=False,
    )
    report = run_benchmark(BenchConfig.from_dict(base | kw))
    return read_rows(out / RESULTS_FILE), json.loads((out / "run.json").read_text()), report.read_text()


def by_key(rows) -> dict:
    return {(r.prompt_id, r.method): r for r in rows}


# -- end to end ------------------------------------------------------------------------------------


def test_bench_on_llamacpp_with_its_python_peers(ggufs, tmp_path):
    """``ar``, ``pld`` on LlamaCppTarget, ``llamacpp`` and ``llamacpp-pld`` in the peers'
    process, two rounds: every row is there, llama-cpp-python's plain greedy decoding equals our
    one-row ``ar`` token for token, and the report compares every row with it."""
    rows, info, report = bench(ggufs, tmp_path / "run", methods="ar,pld,llamacpp,llamacpp-pld", rounds=2)
    assert {r.method for r in rows} == {"ar", "pld", "llamacpp", "llamacpp-pld", "ar-end"}
    assert len(rows) == 2 * 5
    rows_by = by_key(rows)
    for r in rows:
        assert r.new_tokens == len(r.tokens) <= MAX_NEW and r.time_s > 0
        assert len(r.round_times_s) == 2, "every method, the llama.cpp peers too, ran both rounds"
        assert r.environment["dtype"] == "gguf" and r.environment["packages"]["llama_cpp_python"]
        mc = r.config["method_config"]
        if r.peer:
            assert mc["peer_process"] == "separate" and mc["threads"] == 1 and mc["gguf"] == ggufs["target"]
            assert mc["eos_token_ids"] == [2] and mc["flash_attn"] is True
            assert r.agreement_hf is not None and r.steps is not None and r.mat is not None
        else:
            assert mc["backend"] == "llamacpp" and mc["llamacpp"]["strict"] is False and mc["threads"] == 1
    for prompt in {r.prompt_id for r in rows}:
        ar, plain = rows_by[(prompt, "ar")], rows_by[(prompt, "llamacpp")]
        # both decode one row per step on the same ids, greedy, stopping at the same EOS: what
        # tells them apart is only where the prompt's last token is computed (there in the
        # prompt's batch, here alone), which on this model flips no argmax
        assert plain.tokens == ar.tokens, "llama.cpp's one-row plain decoding, through llama-cpp-python and through our engine"
        assert plain.steps == plain.new_tokens and plain.mat == 1.0
        pld = rows_by[(prompt, "llamacpp-pld")]
        assert pld.config["method_config"]["prompt_lookup"] == {"max_ngram_size": 2, "num_pred_tokens": 10}
        assert pld.agreement_hf["exact"] == (pld.tokens == plain.tokens)
    assert info["config"]["resolved_backend"] == "llamacpp" and info["config"]["resolved_dtype"] == "gguf"
    assert info["llamacpp"]["gguf"] == ggufs["target"] and info["llamacpp"]["threads"] == 1 and info["llamacpp"]["strict"] is False
    assert info["config"]["resolved_peer_process"] == "separate"
    assert "--backend" not in info["command"], "auto resolves a .gguf file to llamacpp"
    assert "| speedup vs llama.cpp plain | exact vs llama.cpp plain |" in report
    assert "| llamacpp (llama.cpp) |" in report and "- llama.cpp: our methods run on `target.gguf`" in report
    assert "one-row plain decoding through specgraft's engine" in report


def test_strict_bench_with_llamacpp_programs(ggufs, tools, tmp_path):
    """Strict mode, the peers in the bench's process, a draft model for ``draft-tree`` and
    ``llama-speculative``: our methods equal ``ar`` token for token; the programs get the
    bench's threads, context, greedy sampling, draft GGUF and the prompt text; their rows carry
    their own timing, counts and tokens."""
    folder, log = tools
    rows, info, report = bench(
        ggufs, tmp_path / "run", methods="ar,pld,draft-tree,llamacpp,llama-lookup,llama-speculative", strict=True,
        draft_model=ggufs["draft"], peer_process="shared", llamacpp_tools=str(folder), llamacpp_draft_max=5,
    )
    assert {r.method for r in rows} == {"ar", "pld", "draft-tree", "llamacpp", "llama-lookup", "llama-speculative", "ar-end"}
    for r in rows:
        if not r.peer:
            assert r.agreement["exact"], f"strict mode: {r.method} equals ar"
            assert r.config["method_config"]["llamacpp"]["strict"] is True
    tool_rows = [r for r in rows if r.method.startswith("llama-")]
    assert len(tool_rows) == 4
    for r in tool_rows:
        mc = r.config["method_config"]
        assert r.time_s == pytest.approx(0.75), "encoded 0.25 s + decoded 0.5 s, the program's own clocks"
        assert mc["tool_timing"]["encode_s"] == 0.25 and mc["tool_timing"]["wall_s"] > 0
        assert mc["tool_version"] == "version: 9999 (fake)"
        assert r.text == ("abc" * MAX_NEW)[:MAX_NEW], "the generated text, cut at max_new_tokens by our tokenizer"
        assert r.tokens == [3 + b for b in r.text.encode()]
        assert r.steps == (MAX_NEW + 2) - 4 and r.mat == pytest.approx(MAX_NEW / r.steps, abs=1e-4)
        assert r.proposed_by_source == {r.method: 9} and r.accepted_by_source == {r.method: 4}
        assert r.agreement_hf is not None, "compared with llamacpp, their own plain decoding"
        # the tiny GGUF's SentencePiece vocabulary puts a space before the text: other ids, recorded
        assert mc["prompt"]["same_ids"] is False and mc["prompt"]["first_difference"] == 0
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert {c["tool"] for c in calls} == {"llama-lookup", "llama-speculative"}
    assert len(calls) == 2 * (1 + 2), "a warm-up and one run per prompt each"
    gen_rows = {r.prompt_id: r for r in rows if r.method == "ar"}
    for c in calls:
        opts = opts_of(c)
        assert opts["-m"] == ggufs["target"] and opts["-t"] == opts["-tb"] == "1" and opts["--temp"] == "0.0"
        assert opts["-c"] == "8192" and opts["--spec-draft-n-max"] == "5" and "--no-escape" in c["args"]
        assert c["prompt"].endswith("\n"), "one newline more: -f drops one"
        if c["tool"] == "llama-speculative":
            # the draft file our methods load (requantized to Q4_0: --draft-quant auto)
            assert opts["-md"] == str(draft_gguf(ggufs["draft"], "auto")) != ggufs["draft"] and opts["-td"] == opts["-tbd"] == "1"
        else:
            assert "-md" not in opts
    runs = [c for c in calls if opts_of(c)["-n"] == str(MAX_NEW - 1)]
    assert len(runs) == 4, "-n is max_new_tokens - 1: the programs stop once they emitted more than -n"
    texts = {c["prompt"][:-1] for c in runs}
    assert len(texts) == 2 and all(any(t == text_of(r) for t in texts) for r in gen_rows.values())
    assert "llama-lookup (llama.cpp)" in report and "strict mode: `ar` is padded to 8 rows" in report
    assert "llama.cpp tokenized the text of 2 input(s) to other ids than ours" in report
    assert info["config"]["resolved_peer_process"] == "shared" and info["llamacpp"]["strict"] is True
    assert "--strict" in info["command"] and f"--llamacpp-tools {folder}" in info["command"]
    assert "--llamacpp-draft-max 5" in info["command"]
    # resuming with another mode is refused
    with pytest.raises(ValueError, match="strict: True before, False now"):
        bench(ggufs, tmp_path / "run", methods="ar,pld", resume=True)


def opts_of(call: dict) -> dict:
    """A logged command line's options (``--no-escape`` takes no value)."""
    args, out, i = call["args"], {}, 0
    while i < len(args):
        if args[i] == "--no-escape":
            out[args[i]], i = True, i + 1
        else:
            out[args[i]], i = args[i + 1], i + 2
    return out


def text_of(row) -> str:
    """The prompt text of an ``ar`` row's input, as the bench gave it (its ids detokenized)."""
    from specgraft.suites import conversation_ids
    from specgraft.suites import load_suite

    prompt = next(p for p in load_suite("humaneval:2").prompts if p.id == row.prompt_id)
    tok = byte_tokenizer()
    ids = conversation_ids(tok, prompt.turns[:1], [], False)
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_a_failing_program_stops_the_run(ggufs, tools, tmp_path, monkeypatch):
    folder, _ = tools
    monkeypatch.setenv("FAKE_LLAMA_FAIL", "1")
    with pytest.raises(RuntimeError, match="llama-lookup exited with code 1: main: error: failed to load model"):
        bench(ggufs, tmp_path / "run", methods="ar,llama-lookup", llamacpp_tools=str(folder), bracket=False)


# -- parsing the programs' output -------------------------------------------------------------------

REAL_STDERR = """\
0.00.230.195 I cmn          init: llama threadpool init, n_threads = 2
0.00.612.921 I encoded   42 tokens in    0.129 seconds, speed:  579.786 t/s
0.00.612.934 I decoded   33 tokens in    0.218 seconds, speed:  151.332 t/s
0.00.612.934 I 
0.00.612.934 I n_draft      = 3
0.00.612.935 I n_predict    = 33
0.00.612.935 I n_drafted    = 9
0.00.612.936 I t_draft_flat = 0.05 ms
0.00.612.937 I t_draft      = 0.20 ms, 22.44 us per token, 44554.46 tokens per second
0.00.612.937 I n_accept     = 9
0.00.612.938 I accept       = 100.000%
"""


def test_parse_tool_output():
    prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n".encode()
    stdout = b"\n\n" + prompt + "Hello!\n\nHow can I help?\n\n".encode() + b"\n\n\n\n"
    out = parse_tool_output(stdout, REAL_STDERR, [b"<|im_start|>system", prompt])
    assert out == ToolOutput(
        text="Hello!\n\nHow can I help?\n\n", prompt_tokens=42, encode_s=0.129, decode_s=0.218, n_predict=33, n_drafted=9, n_accept=9
    ), "the first echo that starts the output is cut (here the second); the generated text keeps its own blank lines"
    with pytest.raises(ValueError, match="does not start with the prompt"):
        parse_tool_output(stdout, REAL_STDERR, [b"something else"])
    with pytest.raises(ValueError, match="unexpected output"):
        parse_tool_output(b"error\n", REAL_STDERR, [prompt])
    with pytest.raises(ValueError, match="no 'encoded ... seconds'"):
        parse_tool_output(stdout, "n_predict = 3\n", [prompt])
    with pytest.raises(ValueError, match="no 'n_accept = ' line"):
        parse_tool_output(stdout, REAL_STDERR.replace("n_accept", "n_acc"), [prompt])


# -- rounds and resume ------------------------------------------------------------------------------


def test_llamacpp_peers_alternate_in_rounds():
    cfg = BenchConfig(model="m.gguf", out="o", methods="pld,llamacpp-pld")
    assert cfg.run_methods == ("ar", "pld", "llamacpp", "llamacpp-pld", "ar-end")
    assert round_order(cfg.run_methods, 0, 2) == ["ar", "llamacpp-pld", "llamacpp", "pld", "ar-end"]
    assert round_order(cfg.run_methods, 1, 2) == ["ar", "pld", "llamacpp", "llamacpp-pld", "ar-end"]
    stored = {("p", 0, m): object() for m in ("ar", "pld", "llamacpp", "ar-end")}
    assert to_measure(("ar", "pld", "llamacpp", "llama-lookup", "ar-end"), stored, "p", 0) == ["ar", "llamacpp", "llama-lookup", "ar-end"]


# -- configuration and the command line --------------------------------------------------------------


def test_config_on_llamacpp(tools, monkeypatch):
    folder, _ = tools
    cfg = BenchConfig(model="m.gguf", out="o", methods="all")
    assert cfg.resolved_backend == "llamacpp" and cfg.resolved_device == "cpu" and cfg.resolved_dtype == "gguf"
    assert "adapld" not in cfg.methods and {"llamacpp", "llamacpp-pld"} <= set(cfg.methods)
    assert "llama-lookup" not in cfg.methods, "the programs join 'all' only when their folder is known"
    monkeypatch.setenv("SPECGRAFT_LLAMACPP_TOOLS", str(folder))
    everything = BenchConfig(model="m.gguf", out="o", methods="all", settings=MethodSettings(draft_model="d.gguf"))
    assert {"llama-lookup", "llama-speculative", "draft-tree"} <= set(everything.methods)
    assert everything.resolved_llamacpp_tools == str(folder) and "--llamacpp-tools" not in everything.to_command()
    # the draft's GGUF as it is, or requantized (auto reads the file's type: Q4_0 unless it is already)
    assert [dataclasses.replace(everything, settings=MethodSettings(draft_model="d.gguf", draft_quant=q)).resolved_draft_quant
            for q in ("none", "q4_0", "q8_0")] == ["gguf", "gguf-q4_0", "gguf-q8_0"]
    hf = BenchConfig(model="m", out="o", methods="all")
    assert not any(m.startswith("llama") for m in hf.methods), "the hf backend's 'all' is what it was"
    command = BenchConfig(model="m", out="o", backend="llamacpp", strict=True, methods="pld,llamacpp").to_command()
    assert "--backend llamacpp --strict" in command and "--dtype auto" in command


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(dtype="float32"), "--dtype float32: the llama.cpp backend computes in the GGUF's own quantization; drop --dtype"),
        (dict(methods="adapld"), "method 'adapld' reads the target's hidden states and input embeddings, which the llama.cpp backend does not return"),
        (dict(device="cuda"), "--device cuda: the llama.cpp backend runs on the CPU here"),
        (dict(draft_model="d.gguf", draft_quant="int8", methods="draft-tree"),
         "--draft-quant int8: on the llama.cpp backend the draft model is a GGUF, which takes auto, none, q4_0, q8_0"),
        (dict(methods="llama-speculative"), "method llama-speculative needs --draft-model"),
        (dict(methods="llama-lookup"), "llama-lookup is llama.cpp's own program: say where it is with --llamacpp-tools DIR"),
        (dict(methods="llama-lookup", llamacpp_tools="/nowhere"), "no executable llama-lookup in '/nowhere': build them from llama.cpp's source"),
        (dict(methods="hf"), "the Hugging Face peers load a Hugging Face model; 'm.gguf' is a GGUF file"),
        (dict(llamacpp_draft_max=0), "llamacpp_draft_max must be an integer >= 1, got 0"),
        (dict(backend="tpu"), "unknown backend 'tpu'; choose one of auto, hf, llamacpp"),
    ],
)
def test_bad_llamacpp_config(kw, message, monkeypatch):
    monkeypatch.delenv("SPECGRAFT_LLAMACPP_TOOLS", raising=False)
    with pytest.raises(ValueError, match=re.escape(message)):
        BenchConfig.from_dict({"model": "m.gguf", "out": "o"} | kw)


def test_strict_needs_llamacpp():
    with pytest.raises(ValueError, match="strict mode is the llama.cpp backend's"):
        BenchConfig(model="m", out="o", strict=True)
    with pytest.raises(ValueError, match="drop --peer-process shared"):
        BenchConfig(model="m", out="o", backend="llamacpp", methods="hf", peer_process="shared")


def test_find_tool(tools):
    folder, _ = tools
    assert find_tool("llama-lookup", folder) == folder / "llama-lookup"
    (folder / "llama-speculative").chmod(0o644)
    with pytest.raises(ValueError, match="no executable llama-speculative"):
        find_tool("llama-speculative", folder)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dtype", "float32"], "--dtype float32: the llama.cpp backend computes in the GGUF's own quantization"),
        (["--methods", "adapld"], "method 'adapld' reads the target's hidden states"),
        (["--methods", "llama-lookup"], "llama-lookup is llama.cpp's own program"),
    ],
)
def test_cli_errors_in_one_line(ggufs, monkeypatch, capsys, tmp_path, args, message):
    from tests.helpers.cli import run_cli

    monkeypatch.delenv("SPECGRAFT_LLAMACPP_TOOLS", raising=False)
    code, _, err = run_cli(monkeypatch, capsys, "bench", "--model", ggufs["target"], "--out", str(tmp_path / "o"), *args)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not os.path.exists(tmp_path / "o"), "nothing is written before the options are checked"



def test_bench_serve_on_llamacpp(ggufs, monkeypatch, capsys, tmp_path):
    """``bench-serve --backend llamacpp``: batches of requests in one llama.cpp context, every
    output equal to single-sequence ``ar``'s in strict mode, no Hugging Face row, the backend and
    llama.cpp's threads recorded; ``--hf`` is refused there in one line."""
    from tests.helpers.cli import run_cli

    monkeypatch.setenv("SPECGRAFT_CACHE", str(tmp_path / "cache"))
    suite = tmp_path / "suite.jsonl"
    texts = ["abc abc abc", "hello hello", "xyz"]
    suite.write_text("".join(json.dumps({"id": f"p{i}", "task": "t", "turns": [t]}) + "\n" for i, t in enumerate(texts)))
    out = tmp_path / "bs"
    code, _, err = run_cli(
        monkeypatch, capsys, "bench-serve", "--model", ggufs["target"], "--draft-model", ggufs["draft"], "--strict",
        "--methods", "pld,draft-tree", "--batch-sizes", "1,2", "--suite", str(suite), "--max-new-tokens", "6",
        "--threads", "1", "--out", str(out),
    )
    assert code == 0, err
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["method"], r["batch"]) for r in rows] == [(m, b) for b in (1, 2) for m in ("ar", "pld", "draft-tree", "ar-end")]
    assert all(r["exact"] and r["equal"] == len(texts) and r["tokens"] == 6 * len(texts) for r in rows), "strict: every batch equals ar"
    assert all(r["kv_mb"] > 0 for r in rows), "llama.cpp's KV cache (the draft's too) is counted"
    assert "| equal to ar |" in (out / "report.md").read_text() and f"| {len(texts)}/{len(texts)} |" in (out / "report.md").read_text()
    run = json.loads((out / "run.json").read_text())
    assert (run["backend"], run["strict"], run["threads"], run["dtype"]) == ("llamacpp", True, 1, "gguf")
    code, _, err = run_cli(
        monkeypatch, capsys, "bench-serve", "--model", ggufs["target"], "--hf", "--suite", str(suite), "--out", str(tmp_path / "x"),
    )
    assert code == 2 and err.count("\n") == 1 and "Hugging Face generate does not run a GGUF on llama.cpp" in err, err
