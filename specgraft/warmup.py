"""Warm-up: run the target over a corpus to fill the successor matrix before serving.

Token Recycling and Graft start from a matrix that already knows common transitions. We
teacher-force the target over corpus texts (prompt + reference response, chat-formatted when
asked): every position's top-k successors fill the row of its token, exactly as the prefill
does for a prompt. One prefill per record is much cheaper than generating, and the responses
are what a chat model's outputs look like. Rows seen several times keep the last context.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from specgraft.drafters.recycling import SuccessorMatrix
from specgraft.models.hf import HFTarget


def read_corpus(path: str | Path, limit: int | None = None) -> list[tuple[str, str]]:
    """``(prompt, response)`` pairs from a JSONL file (``turns`` + ``response``) or a text file."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"corpus file {str(path)!r} does not exist")
    records: list[tuple[str, str]] = []
    if path.suffix == ".jsonl":
        with path.open() as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                turns = rec.get("turns") or [""]
                records.append((str(turns[0]), str(rec.get("response", ""))))
                if limit is not None and len(records) >= limit:
                    break
    else:
        records.append(("", path.read_text()))
    if not records:
        raise ValueError(f"corpus file {str(path)!r} has no records")
    return records


def warm_up_matrix(
    target: HFTarget, tokenizer, records: Sequence[tuple[str, str]], matrix: SuccessorMatrix, chat: bool = True, progress: bool = True, max_tokens: int = 1024
) -> int:
    """Fill ``matrix`` from ``records``; returns how many distinct rows are now known."""
    from rich.progress import track

    it = track(records, description="warm-up") if progress else records
    for prompt, response in it:
        if chat and getattr(tokenizer, "chat_template", None) and prompt:
            msgs = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
            text = tokenizer.apply_chat_template(msgs, tokenize=False)
        else:
            text = prompt + ("\n\n" if prompt and response else "") + response
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
        if len(ids) < 2:
            continue
        target.reset()
        top = target.prefill(ids, topk=matrix.k)
        matrix.update_rows(ids, top.numpy())
    target.reset()
    return int((matrix.table[:, 0] >= 0).sum())
