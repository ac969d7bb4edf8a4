"""Prompt suites: the packaged prompt sets, EAGLE's alpaca set read from a path, or any JSONL file.

The benchmark runs them (``bench/``); calibration refuses to fit on their prompts.

Every file has one JSON object per line with ``id`` (str, unique), ``task`` (str) and ``turns``
(a non-empty list of user turns, str); an optional ``chat`` (bool) says whether the prompt is
wrapped in the model's chat template (default: yes, except HumanEval's raw code completion).

A suite spec names one suite, optionally with its own prompts-per-task count after a colon::

    >>> parse_suite_spec("spec-bench:3")
    ('spec-bench', 3)
    >>> parse_suite_spec("humaneval")
    ('humaneval', None)

``--per-task N`` takes the first N prompts of each task in file order, so runs are comparable.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

DATA_DIR = Path(__file__).resolve().parent / "data"

# suite name -> packaged file
SUITES: dict[str, str] = {
    "spec-bench": "spec_bench.jsonl",
    "humaneval": "humaneval.jsonl",
    "mt-bench": "mt_bench.jsonl",
    "eagle": "eagle_eval.jsonl",
    # bug-fix prompts built from HumanEval by benchmarks/make_code_edit.py; chat-templated
    "code-edit": "code_edit.jsonl",
    # Spec-Bench's RAG items as quote-and-cite prompts (READER's RAG regime), built by benchmarks/make_rag_cite.py
    "rag-cite": "rag_cite.jsonl",
}

# tasks whose prompts are completed as raw text, never through the chat template
RAW_TASKS = frozenset({"code_completion"})

ALPACA_FILE = "alpaca_eagle80.jsonl"


def default_alpaca_paths() -> list[Path]:
    """Where EAGLE's alpaca set (CC BY-NC 4.0, never packaged) is looked for when no path is given:
    ``../shared/data/bench/`` relative to the working directory, then to the repository checkout."""
    return [
        Path("..") / "shared" / "data" / "bench" / ALPACA_FILE,
        Path(__file__).resolve().parents[3] / "shared" / "data" / "bench" / ALPACA_FILE,
    ]


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark item: ``turns`` are user turns; turn k > 0 is conditioned on the model's own
    earlier answers."""

    id: str
    task: str
    turns: tuple[str, ...]
    chat: bool
    """Wrap in the chat template (when the tokenizer has one)."""
    suite: str


@dataclass(frozen=True)
class Suite:
    """The prompts of one run, in run order, with notes for the report (e.g. a skipped set)."""

    prompts: tuple[BenchPrompt, ...]
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()

    @property
    def tasks(self) -> list[str]:
        """Task names in order of first appearance."""
        return list(dict.fromkeys(p.task for p in self.prompts))

    @property
    def generations_per_method(self) -> int:
        return sum(len(p.turns) for p in self.prompts)


def parse_suite_spec(spec: str) -> tuple[str, int | None]:
    """``"name"`` or ``"name:N"`` -> (name, N or None). A path may contain colons; only a
    trailing ``:<digits>`` is read as a count."""
    spec = spec.strip()
    if not spec:
        raise ValueError("empty suite name")
    head, sep, tail = spec.rpartition(":")
    if sep and head and tail.isdigit():
        n = int(tail)
        if n < 1:
            raise ValueError(f"prompts per task must be >= 1 in suite spec {spec!r}")
        return head, n
    return spec, None


def read_prompt_file(path: str | Path, suite: str) -> list[BenchPrompt]:
    """Read and validate a prompt JSONL file.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "x.jsonl")
    >>> _ = open(p, "w").write('{"id": "a", "task": "t", "turns": ["hi", "more"]}\\n')
    >>> read_prompt_file(p, "x")[0].turns
    ('hi', 'more')
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompt file {str(path)!r} does not exist")
    prompts: list[BenchPrompt] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{where}: expected a JSON object")
            pid, task, turns = rec.get("id"), rec.get("task"), rec.get("turns")
            if not isinstance(pid, str) or not pid:
                raise ValueError(f"{where}: 'id' must be a non-empty string")
            if not isinstance(task, str) or not task:
                raise ValueError(f"{where}: 'task' must be a non-empty string")
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise ValueError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
            chat = rec.get("chat", task not in RAW_TASKS)
            if not isinstance(chat, bool):
                raise ValueError(f"{where}: 'chat' must be true or false")
            if pid in seen:
                raise ValueError(f"{where}: duplicate id {pid!r}")
            seen.add(pid)
            prompts.append(BenchPrompt(id=pid, task=task, turns=tuple(turns), chat=chat, suite=suite))
    if not prompts:
        raise ValueError(f"prompt file {str(path)!r} has no prompts")
    return prompts


def first_per_task(prompts: Sequence[BenchPrompt], n: int | None) -> list[BenchPrompt]:
    """The first ``n`` prompts of each task in file order (all when ``n`` is None).

    >>> ps = [BenchPrompt(str(i), t, ("x",), True, "s") for i, t in enumerate("aabab")]
    >>> [p.id for p in first_per_task(ps, 2)]
    ['0', '1', '2', '4']
    """
    if n is None:
        return list(prompts)
    counts: dict[str, int] = {}
    out = []
    for p in prompts:
        if counts.get(p.task, 0) < n:
            counts[p.task] = counts.get(p.task, 0) + 1
            out.append(p)
    return out


def task_tuning_prompts(per_task: int, tasks: Sequence[str] | None = None) -> list[BenchPrompt]:
    """Spec-Bench items 41 .. 40 + ``per_task`` of each of ``tasks`` (default: every task, in file
    order): held out of every benchmark suite (``spec-bench:N`` takes the first ``N``), so what is
    tuned on them is not fitted to the benchmarks. ``ValueError`` for an unknown task."""
    by_task: dict[str, list[BenchPrompt]] = {}
    for p in read_prompt_file(DATA_DIR / "spec_bench.jsonl", "spec-bench"):
        by_task.setdefault(p.task, []).append(p)
    unknown = [t for t in tasks or () if t not in by_task]
    if unknown:
        raise ValueError(f"unknown Spec-Bench task {unknown[0]!r}; choose from {', '.join(by_task)}")
    return [p for t in tasks or list(by_task) for p in by_task[t][40 : 40 + per_task]]


def code_tuning_prompts(code_prompts: int) -> list[BenchPrompt]:
    """HumanEval items 100 .. 99 + ``code_prompts`` (no benchmark suite uses them)."""
    return read_prompt_file(DATA_DIR / "humaneval.jsonl", "humaneval")[100 : 100 + code_prompts]


def tuning_prompts(per_task: int, code_prompts: int) -> list[BenchPrompt]:
    """:func:`task_tuning_prompts` of every task, then :func:`code_tuning_prompts`."""
    return task_tuning_prompts(per_task) + code_tuning_prompts(code_prompts)


def _load_one(name: str, per_task: int | None, alpaca_path: str | None) -> tuple[list[BenchPrompt], list[str], list[str]]:
    notes: list[str] = []
    if name in SUITES:
        path = DATA_DIR / SUITES[name]
        prompts = read_prompt_file(path, name)
        sources = [str(path)]
        if name == "eagle":
            alpaca = resolve_alpaca_path(alpaca_path)
            if alpaca is None:
                notes.append(
                    "eagle: the alpaca set (CC BY-NC 4.0, not packaged) was skipped: no --alpaca-path given and "
                    f"{default_alpaca_paths()[0]} not found"
                )
            else:
                # EAGLE's file order puts alpaca first
                prompts = read_prompt_file(alpaca, name) + prompts
                sources.append(str(alpaca))
    else:
        path = Path(name)
        if not path.is_file():
            raise ValueError(
                f"unknown suite {name!r}; choose one of {', '.join(SUITES)} or give the path of a JSONL file"
            )
        prompts = read_prompt_file(path, path.stem)
        sources = [str(path)]
    return first_per_task(prompts, per_task), sources, notes


def resolve_alpaca_path(alpaca_path: str | None) -> Path | None:
    """The given path (which must exist), else the first default that exists, else None."""
    if alpaca_path is not None:
        p = Path(alpaca_path)
        if not p.is_file():
            raise ValueError(f"alpaca file {alpaca_path!r} does not exist")
        return p
    return next((p for p in default_alpaca_paths() if p.is_file()), None)


def load_suite(specs: str | Sequence[str], per_task: int | None = None, alpaca_path: str | None = None) -> Suite:
    """Prompts of one or more suites (``"spec-bench:3,humaneval:6"`` or a list of specs).

    Tasks that share a name across suites are told apart as ``suite/task``. Prompt ids must be
    unique over the whole run.
    """
    if per_task is not None and per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    if isinstance(specs, str):
        specs = [s for s in specs.split(",") if s.strip()]
    if not specs:
        raise ValueError("no suite given")
    parts: list[tuple[str, list[BenchPrompt]]] = []
    sources: list[str] = []
    notes: list[str] = []
    for spec in specs:
        name, n = parse_suite_spec(spec)
        prompts, src, nt = _load_one(name, n if n is not None else per_task, alpaca_path)
        parts.append((name, prompts))
        sources += src
        notes += nt
    owners: dict[str, set[str]] = {}
    for name, prompts in parts:
        for p in prompts:
            owners.setdefault(p.task, set()).add(name)
    out: list[BenchPrompt] = []
    ids: set[str] = set()
    for name, prompts in parts:
        for p in prompts:
            if p.id in ids:
                raise ValueError(f"prompt id {p.id!r} appears twice in suites {', '.join(specs)}")
            ids.add(p.id)
            if len(owners[p.task]) > 1:
                p = BenchPrompt(p.id, f"{name}/{p.task}", p.turns, p.chat, p.suite)
            out.append(p)
    return Suite(prompts=tuple(out), sources=tuple(sources), notes=tuple(notes))


def conversation_ids(tokenizer, turns: Sequence[str], answers: Sequence[str], chat: bool) -> list[int]:
    """Token ids of the last of ``turns``, after the earlier turns and their ``answers``.

    With ``chat`` the message list ``[user t0, assistant a0, user t1, ...]`` goes through
    ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``; for one turn this is
    exactly :meth:`SpecDecoder.encode(prompt, chat=True)`. Without a chat template the parts are
    joined by blank lines, e.g. ``turns=["Hi", "More"], answers=["Hello"]`` -> ``"Hi\\n\\nHello\\n\\nMore"``.
    """
    assert len(answers) == len(turns) - 1, f"{len(turns)} turns need {len(turns) - 1} answers, got {len(answers)}"
    if chat:
        messages: list[dict[str, str]] = []
        for i, turn in enumerate(turns):
            messages.append({"role": "user", "content": turn})
            if i < len(answers):
                messages.append({"role": "assistant", "content": answers[i]})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        parts = [p for pair in zip(turns, [*answers, ""]) for p in pair][:-1]
        ids = tokenizer("\n\n".join(parts))["input_ids"]
    if not ids:
        raise ValueError("a benchmark prompt encoded to no tokens")
    return list(ids)
