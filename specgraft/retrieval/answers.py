"""A corpus of the target's own answers, for a datastore (READER section 4.2: "many responses,
ideally produced by the base model").

:func:`generate_answers` answers the first turn of each prompt with a decoder (any lossless
method gives the same greedy tokens as plain decoding, so the fastest one is the right choice)
and appends one JSONL record per prompt to a file, flushed as it goes; a run that is stopped
resumes where it left off (prompts whose ``id`` is already in the file are skipped). Records
carry the answer in ``output``, the field :class:`~specgraft.retrieval.corpus.CorpusReader`
indexes, and the prompt in ``turns``, which ``specgraft datastore build`` checks against the
benchmark suites. Prompts that overlap a benchmark prompt are refused here already (``exclude``).

Only the first turn is answered: a datastore document is one answer, and a later turn's answer
would be conditioned on an answer of our own choosing.

Example (any object with ``tokenizer`` and ``generate(ids, config=...)`` serves as the decoder)::

    >>> import json, tempfile, os
    >>> from specgraft.suites import BenchPrompt
    >>> class Tok:
    ...     chat_template = None
    ...     def __call__(self, text): return {"input_ids": [ord(c) for c in text]}
    >>> class Out:
    ...     def __init__(self, text): self.text, self.tokens, self.finish_reason = text, list(text), "length"
    >>> class Dec:
    ...     tokenizer = Tok()
    ...     def generate(self, ids, config=None): return Out("".join(map(chr, ids))[::-1])
    >>> path = os.path.join(tempfile.mkdtemp(), "answers.jsonl")
    >>> run = generate_answers(Dec(), [BenchPrompt("p1", "t", ("abc",), False, "s")], path, config=None, progress=False)
    >>> run.written, json.loads(open(path).read())["output"]
    (1, 'cba')
    >>> generate_answers(Dec(), [BenchPrompt("p1", "t", ("abc",), False, "s")], path, config=None, progress=False).skipped
    1
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from specgraft.files import drop_partial_last_line
from specgraft.progress import progress_bar
from specgraft.suites import conversation_ids

__all__ = ["AnswerRun", "answered_ids", "generate_answers"]


@dataclass
class AnswerRun:
    """What one :func:`generate_answers` call did."""

    written: int = 0
    skipped: int = 0
    """Prompts already answered in the file (a resumed run)."""
    excluded: list[str] | None = None
    """Ids of prompts refused because they overlap a benchmark prompt."""
    new_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def answered_ids(path: str | Path) -> set[str]:
    """Ids already in an answers file (empty when it does not exist). A last line cut off by an
    interrupted write is ignored (it is rewritten); any other bad line is a ``ValueError``."""
    path = Path(path)
    if not path.exists():
        return set()
    lines = path.read_text(encoding="utf-8").splitlines()
    ids = set()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ids.add(json.loads(line)["id"])
        except (json.JSONDecodeError, KeyError, TypeError):
            if i == len(lines):
                continue
            raise ValueError(f"{path}:{i}: not an answers record (a JSON object with an 'id')") from None
    return ids


def generate_answers(
    decoder: Any,
    prompts: Sequence[Any],
    out_path: str | Path,
    config: Any,
    exclude: Callable[[str], bool] | None = None,
    progress: bool = True,
    extra: dict[str, Any] | None = None,
) -> AnswerRun:
    """Answer each prompt's first turn with ``decoder`` and append the records to ``out_path``.

    ``prompts``: :class:`~specgraft.suites.BenchPrompt`; ``config``: the decoder's generation
    config; ``exclude(text) -> True`` refuses a prompt (benchmark prompts must not reach a
    datastore); ``extra``: fields added to every record (model, method).
    """
    from rich.console import Console

    out_path = Path(out_path)
    done = answered_ids(out_path)
    run = AnswerRun(excluded=[])
    todo = []
    for p in prompts:
        if p.id in done:
            run.skipped += 1
        elif exclude is not None and exclude(p.turns[0]):
            run.excluded.append(p.id)
        else:
            todo.append(p)
    if out_path.exists():
        drop_partial_last_line(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    has_template = bool(getattr(decoder.tokenizer, "chat_template", None))
    t0 = time.perf_counter()
    # on stderr, like every progress bar of the CLI: stdout stays for what a command prints
    with out_path.open("a", encoding="utf-8") as f, progress_bar(Console(stderr=True), progress) as bar:
        task = bar.add_task("answers", total=len(todo))
        for p in todo:
            ids = conversation_ids(decoder.tokenizer, p.turns[:1], [], p.chat and has_template)
            result = decoder.generate(ids, config=config)
            record = {
                "id": p.id, "task": p.task, "turns": [p.turns[0]], "chat": p.chat and has_template,
                "output": result.text, "new_tokens": len(result.tokens), "finish_reason": result.finish_reason, **(extra or {}),
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            run.written += 1
            run.new_tokens += len(result.tokens)
            run.seconds = time.perf_counter() - t0
            bar.update(task, advance=1, description=f"answers ({run.tokens_per_s:.1f} tokens/s)")
    return run

