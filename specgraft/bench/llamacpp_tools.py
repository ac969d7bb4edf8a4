"""llama.cpp's own programs as benchmark peers: ``llama-speculative`` and ``llama-lookup``.

Each generation is one run of the program, in a process of its own, on the same GGUF (and, for
``llama-speculative``, the draft model's GGUF: ``-md``), threads (``-t -tb``, and ``-td -tbd``
for the draft), context (``-c``, :data:`~specgraft.bench.llamacpp_peers.PEER_N_CTX`) and
temperature (``--temp 0``: llama.cpp's greedy sampler) as the other methods. The programs are
found in ``--llamacpp-tools DIR`` (default ``$SPECGRAFT_LLAMACPP_TOOLS``), built from llama.cpp's
source (:data:`BUILD_HINT`).

**The prompt.** The programs take text, not token ids. The bench's ids are detokenized by our
tokenizer exactly (special tokens kept, no clean-up: the chat template is already applied) and
written to a file read with ``-f`` (plus one newline, which ``-f`` drops; ``--no-escape`` keeps
backslashes as they are). The programs tokenize it with llama.cpp's tokenizer, adding BOS only
where the GGUF asks for it (neither SmolLM2's nor Qwen2.5's does); before every run the same
tokenization is computed here through llama-cpp-python (:class:`LlamaVocab`), and a row records
whether the program got exactly the bench's ids (``method_config["prompt"]["same_ids"]``; on
Qwen2.5 it does for every prompt of the suites; on SmolLM2 some raw-code prompts split
whitespace differently).

**The output.** Both programs print ``"\\n\\n"``, the prompt's pieces, then each generated
token's piece as it is accepted, then ``"\\n\\n"`` twice around their statistics, on stdout;
:func:`parse_tool_output` takes the generated text between them. It is turned into ids by our
tokenizer (``add_special_tokens=False``), cut at the first EOS and at ``max_new_tokens``, and
compared with ``ar`` and with the ``llamacpp`` peer like any row. A re-tokenized text can split
a few spots differently from the ids the model emitted, so a rare divergence there is a
tokenization difference, not a different answer: the row's ``text`` shows it.

**What is timed.** ``time_s`` = the program's own ``encoded ... in X seconds`` (prompt
processing: the target's, and the draft model's for ``llama-speculative``) + ``decoded N tokens
in Y seconds`` (the generation loop: drafting, decoding, sampling, printing each token), both
from ``ggml_time_us``, as printed on stderr. Not timed: process start, model loading and
llama.cpp's warm-up decode, tokenization, the lookup cache's initial fill and final save, and
the statistics printing. Our methods' ``time_s`` likewise counts prefill and generation.
The wall time of the whole process is recorded beside (``tool_timing``).
The programs run with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (:func:`specgraft.models.hugepages.program_env`):
their weights in 2 MiB pages, as our target's are; and with ``--load-mode none``: read into
memory, not mapped, as our backend loads its models.

**Stopping.** ``-n`` stops a program only after a whole draft-and-verify step, and only once it
has emitted *more* than ``-n`` tokens, so it gets ``max_new_tokens - 1``: the program stops after
the step that reaches ``max_new_tokens``, as our engine does, and the same number of target
decodes is timed; tokens that step accepted past the limit are cut from the row but their step
was needed anyway. (``max_new_tokens = 1`` gets ``-n 1``: ``llama-lookup`` reads 0 as no limit.)
The programs stop at llama.cpp's end-of-generation tokens.

**Counts.** ``steps`` = ``n_predict - n_accept`` (each step emits its accepted drafts + 1, the
prompt's last decode included, as llama.cpp counts), so MAT = new tokens / steps; drafted and
accepted tokens are the program's ``n_drafted`` and ``n_accept`` over its whole run.

Example::

    peer = LlamaToolPeer("llama-lookup", find_tool("llama-lookup", "/opt/llama.cpp/build/bin"), "m.gguf", None,
                         tokenizer, eos_token_ids=[2], max_new_tokens=32, threads=2)
    run = peer.run([1, 5, 6, 7])     # MethodRun(tokens=[...], time_s=encode + decode seconds, ...)
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from specgraft.bench.contract import MethodRun, until_eos
from specgraft.bench.llamacpp_peers import LLAMACPP_TOOL_PEERS, PEER_N_CTX, peer_threads
from specgraft.models.hugepages import program_env
from specgraft.models.llamacpp_lib import import_llama_cpp

#: Environment variable naming the folder of llama.cpp's programs (``--llamacpp-tools`` wins).
TOOLS_ENV = "SPECGRAFT_LLAMACPP_TOOLS"

BUILD_HINT = (
    "build them from llama.cpp's source: cmake -B build && cmake --build build -j --target llama-speculative llama-lookup "
    f"(benchmarks/README.md), then pass --llamacpp-tools build/bin or set ${TOOLS_ENV}"
)

#: What the programs print on stdout around the prompt's echo and the generated text.
OUTPUT_HEAD = b"\n\n"
OUTPUT_TAIL = b"\n\n\n\n"


def default_tools_dir() -> str | None:
    return os.environ.get(TOOLS_ENV) or None


def find_tool(name: str, tools_dir: str | os.PathLike[str] | None) -> Path:
    """The executable of llama.cpp program ``name`` in ``tools_dir``; ``ValueError`` in one line
    saying how to build it when it is missing."""
    if name not in LLAMACPP_TOOL_PEERS:
        raise ValueError(f"unknown llama.cpp program {name!r}; choose one of {', '.join(LLAMACPP_TOOL_PEERS)}")
    if not tools_dir:
        raise ValueError(f"{name} is llama.cpp's own program: say where it is with --llamacpp-tools DIR or ${TOOLS_ENV}; {BUILD_HINT}")
    path = Path(tools_dir).expanduser() / name
    if not path.is_file() or not os.access(path, os.X_OK):
        raise ValueError(f"no executable {name} in {str(tools_dir)!r}: {BUILD_HINT}")
    return path


class LlamaVocab:
    """A GGUF's vocabulary alone (no weights), for llama.cpp's own tokenization of a prompt and
    the pieces a program prints for it.

    >>> # LlamaVocab("m.gguf").tokenize("<|im_start|>user\\nHi") -> [151644, 872, 198, 13048]
    """

    def __init__(self, gguf: str | os.PathLike[str]):
        llama = import_llama_cpp()
        self._llama = llama
        llama.llama_backend_init()
        params = llama.llama_model_default_params()
        params.vocab_only = True
        self._model = llama.llama_model_load_from_file(str(gguf).encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not read the vocabulary of {str(gguf)!r}")
        self._vocab = llama.llama_model_get_vocab(self._model)

    def tokenize(self, text: str) -> list[int]:
        """``common_tokenize(ctx, text, add_special=true, parse_special=true)``, as the programs call it."""
        data = text.encode()
        size = len(data) + 8
        while True:
            buf = (self._llama.llama_token * size)()
            n = self._llama.llama_tokenize(self._vocab, data, len(data), buf, size, True, True)
            if n >= 0:
                return list(buf[:n])
            size = -n

    def piece(self, token: int) -> bytes:
        """``common_token_to_piece(ctx, token)`` (special tokens rendered), as the programs print it."""
        size = 32
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self._llama.llama_token_to_piece(self._vocab, token, buf, size, 0, True)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def close(self) -> None:
        if getattr(self, "_model", None):
            self._llama.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the module may be gone
            pass


@dataclass
class ToolOutput:
    """What one run of a llama.cpp program printed."""

    text: str
    """The generated text (every token the program emitted, past ``-n`` too)."""
    prompt_tokens: int
    encode_s: float
    """``encoded N tokens in X seconds``: prompt processing."""
    decode_s: float
    """``decoded N tokens in Y seconds``: the generation loop."""
    n_predict: int
    n_drafted: int
    n_accept: int


_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([0-9.]+) seconds")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds")


def _count(name: str, stderr: str) -> int:
    # lines may carry the log's prefix, e.g. "0.00.612.935 I n_predict    = 33"
    found = re.search(rf"\b{name}\s*=\s*(\d+)", stderr)
    if not found:
        raise ValueError(f"no '{name} = ' line in the program's output")
    return int(found.group(1))


def parse_tool_output(stdout: bytes, stderr: str, echoes: Sequence[bytes]) -> ToolOutput:
    """The generated text, timings and counts of one run of ``llama-speculative`` or
    ``llama-lookup``. ``echoes``: how the prompt may have been printed (llama.cpp's pieces of its
    tokens; the prompt's text), the first that starts the output is cut off.

    >>> out = parse_tool_output(b"\\n\\nHi there!\\n\\n\\n\\n", "encoded    2 tokens in    0.010 seconds, speed: 1 t/s\\n"
    ...     "decoded    3 tokens in    0.200 seconds, speed: 15 t/s\\nn_predict = 3\\nn_drafted = 4\\nn_accept  = 1\\n", [b"Hi"])
    >>> out.text, out.encode_s, out.decode_s, out.n_accept
    (' there!', 0.01, 0.2, 1)
    """
    if not stdout.startswith(OUTPUT_HEAD) or not stdout.endswith(OUTPUT_TAIL):
        raise ValueError(f"unexpected output (not the prompt and text between blank lines): {stdout[:80]!r}...{stdout[-40:]!r}")
    body = stdout[len(OUTPUT_HEAD) : len(stdout) - len(OUTPUT_TAIL)]
    echo = next((e for e in echoes if body.startswith(e)), None)
    if echo is None:
        raise ValueError(f"the output does not start with the prompt: {body[:80]!r}")
    encoded, decoded = _ENCODED.search(stderr), _DECODED.search(stderr)
    if not encoded or not decoded:
        raise ValueError("no 'encoded ... seconds' and 'decoded ... seconds' lines in the program's output")
    return ToolOutput(
        text=body[len(echo) :].decode("utf-8", errors="replace"),
        prompt_tokens=int(encoded.group(1)),
        encode_s=float(encoded.group(2)),
        decode_s=float(decoded.group(2)),
        n_predict=_count("n_predict", stderr),
        n_drafted=_count("n_drafted", stderr),
        n_accept=_count("n_accept", stderr),
    )


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """
    >>> first_difference([1, 2, 3], [1, 2, 3]), first_difference([1, 2], [1, 5, 3]), first_difference([1], [1, 2])
    (None, 1, 1)
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class LlamaToolPeer:
    """One of llama.cpp's programs as a benchmark method (module docstring)."""

    is_peer = True

    def __init__(
        self,
        name: str,
        tool: str | os.PathLike[str],
        gguf: str | os.PathLike[str],
        draft_gguf: str | os.PathLike[str] | None,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        max_new_tokens: int,
        threads: int | None = None,
        temperature: float = 0.0,
        seed: int = 0,
        draft_max: int | None = None,
        n_ctx: int = PEER_N_CTX,
    ):
        if name not in LLAMACPP_TOOL_PEERS:
            raise ValueError(f"unknown llama.cpp program {name!r}; choose one of {', '.join(LLAMACPP_TOOL_PEERS)}")
        if name == "llama-speculative" and draft_gguf is None:
            raise ValueError("llama-speculative needs a draft model (--draft-model)")
        if not eos_token_ids:
            raise ValueError("peers need at least one EOS token id")
        self.name = name
        self.tool = Path(tool)
        self.gguf = Path(gguf)
        self.draft_gguf = Path(draft_gguf) if draft_gguf is not None and name == "llama-speculative" else None
        self.tokenizer = tokenizer
        self.eos_token_ids = sorted(int(t) for t in eos_token_ids)
        self.max_new_tokens = max_new_tokens
        self.threads = peer_threads(threads)
        self.temperature = temperature
        self.seed = seed
        self.draft_max = draft_max
        self.n_ctx = n_ctx
        self.vocab = LlamaVocab(self.gguf)
        self.version = tool_version(self.tool)

    def command(self, prompt_file: str | os.PathLike[str], max_new_tokens: int) -> list[str]:
        """The program's command line for one generation."""
        t = str(self.threads)
        cmd = [
            str(self.tool), "-m", str(self.gguf), "-f", str(prompt_file), "-n", str(max(max_new_tokens - 1, 1)),
            "-c", str(self.n_ctx), "-t", t, "-tb", t, "--temp", str(self.temperature), "--seed", str(self.seed),
            "--no-escape", "--color", "off",
            "--load-mode", "none",  # read, not mapped, as our backend loads the models (models/llamacpp.py)
        ]
        if self.temperature > 0:
            cmd += ["--top-k", "0", "--top-p", "1.0", "--min-p", "0.0"]
        if self.draft_gguf is not None:
            cmd += ["-md", str(self.draft_gguf), "-td", t, "-tbd", t]
        if self.draft_max is not None:
            cmd += ["--spec-draft-n-max", str(self.draft_max)]
        return cmd

    def prompt_text(self, ids: Sequence[int]) -> str:
        """The bench's ids as the text the program gets (chat template already applied)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def run(self, ids: Sequence[int], max_new_tokens: int | None = None) -> MethodRun:
        n = max_new_tokens or self.max_new_tokens
        ids = [int(t) for t in ids]
        text = self.prompt_text(ids)
        theirs = self.vocab.tokenize(text)
        with tempfile.TemporaryDirectory(prefix="specgraft-llamacpp-") as folder:
            prompt_file = Path(folder) / "prompt.txt"
            prompt_file.write_bytes(text.encode() + b"\n")  # -f drops one trailing newline
            cmd = self.command(prompt_file, n)
            t0 = time.perf_counter()
            done = subprocess.run(cmd, capture_output=True, env=program_env())  # huge pages, as our target
            wall_s = time.perf_counter() - t0
        stderr = done.stderr.decode("utf-8", errors="replace")
        if done.returncode != 0:
            tail = " | ".join(line for line in stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"{self.name} exited with code {done.returncode}: {tail}")
        echo = b"".join(self.vocab.piece(t) for t in theirs)
        try:
            out = parse_tool_output(done.stdout, stderr, [echo, text.encode()])
        except ValueError as e:
            raise RuntimeError(f"{self.name}: {e} (command: {' '.join(cmd)})") from None
        generated = [int(t) for t in self.tokenizer(out.text, add_special_tokens=False)["input_ids"]]
        tokens = until_eos(generated, self.eos_token_ids)[:n]
        difference = first_difference(ids, theirs)
        config = {
            **self.resolved_config(),
            "command": cmd,
            "prompt": {"same_ids": difference is None, "tool_prompt_tokens": len(theirs), "first_difference": difference},
            "tool_timing": {"encode_s": out.encode_s, "decode_s": out.decode_s, "wall_s": round(wall_s, 6),
                            "tool_new_tokens": out.n_predict},
            "step_counts": {"steps": out.n_predict - out.n_accept, "proposed": out.n_drafted, "accepted": out.n_accept},
            "tool_output": {k: v for k, v in asdict(out).items() if k != "text"},
        }
        return MethodRun(tokens=tokens, time_s=out.encode_s + out.decode_s, stats=None, config=config)

    def resolved_config(self) -> dict[str, Any]:
        return {
            "method": self.name,
            "peer": LLAMACPP_TOOL_PEERS[self.name],
            "tool": str(self.tool),
            "tool_version": self.version,
            "gguf": str(self.gguf),
            "draft_gguf": str(self.draft_gguf) if self.draft_gguf is not None else None,
            "threads": self.threads,
            "n_ctx": self.n_ctx,
            "temperature": self.temperature,
            "seed": self.seed,
            "draft_max": self.draft_max,
            "eos_token_ids": self.eos_token_ids,
        }


def tool_version(tool: Path) -> str | None:
    """The first line ``TOOL --version`` prints (llama.cpp's build number and commit), or None
    when it prints nothing useful."""
    try:
        done = subprocess.run([str(tool), "--version"], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = (done.stdout + done.stderr).decode("utf-8", errors="replace").strip().splitlines()
    version = next((line.strip() for line in lines if line.strip().startswith("version")), None)
    return version
