"""Warm-up: run the target over a corpus to fill the successor matrix before serving.

Token Recycling and Graft start from a matrix that already knows common transitions. We
teacher-force the target over corpus texts (prompt + reference response, chat-formatted when
asked): every position's top-k successors fill the row of its token, exactly as the prefill
does for a prompt. One prefill per record is much cheaper than generating, and the responses
are what a chat model's outputs look like. Rows seen several times keep the last context.
"""

from __future__ import annotations

from typing import Sequence

from specgraft.drafters.recycling import SuccessorMatrix
from specgraft.models.base import TargetModel
from specgraft.types import PrefillRequest


def warm_up_matrix(
    target: TargetModel, tokenizer, records: Sequence[tuple[str, str]], matrix: SuccessorMatrix, chat: bool = True, progress: bool = True, max_tokens: int = 1024
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
        slot = target.allocate()
        try:
            top = target.prefill(slot, ids, PrefillRequest(topk=matrix.k)).topk
        finally:
            target.release(slot)
        matrix.update_rows(ids, top.numpy())
    return int((matrix.table[:, 0] >= 0).sum())
