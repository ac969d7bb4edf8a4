"""Incremental detokenisation: the text of each new token without decoding the whole output again.

Decoding all ``n`` tokens after every step costs O(n^2) over a generation. The prefix-offset
technique (vLLM's ``detokenize_incrementally``) decodes only a short window: the tokens from
``prefix_offset`` on, against the same window without the newest tokens; the difference is the
new text. Decoding a window rather than the new tokens alone keeps what a tokenizer does at
word starts (a sentencepiece ``▁`` is a space only after other text) and byte pieces of one
character split across tokens: while the window's text ends in the replacement character
``\\ufffd`` the character is incomplete, nothing is released, and the bytes wait for the next
token.

Example with a word-level tokenizer whose tokens decode to ``"a"``, ``"b"`` and join with
spaces: adding ``[a]`` gives ``"a"``, adding ``[b]`` gives ``" b"``; ``text`` is ``"a b"``, as
``decode([a, b])``.
"""

from __future__ import annotations

from typing import Sequence

#: Tokens kept before the newest ones as decoding context (vLLM uses 5).
CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """``add(ids)`` returns the text the new ids complete; ``text`` is everything released so far.

    ``text`` equals ``tokenizer.decode(ids, skip_special_tokens=...)`` of all ids added, except
    that an incomplete trailing character is held back until :meth:`flush`.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.text = ""
        # ids[prefix_offset:read_offset] decode to text already released
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def add(self, ids: Sequence[int]) -> str:
        """Append ``ids``; return the new text (possibly empty)."""
        self.ids.extend(int(t) for t in ids)
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        window = self._decode(self.ids[self.prefix_offset :])
        if len(window) <= len(prefix) or window.endswith("\ufffd"):
            return ""
        new = window[len(prefix) :]
        self.text += new
        self.prefix_offset = max(self.read_offset, len(self.ids) - CONTEXT_TOKENS)
        self.read_offset = len(self.ids)
        # the window now starts later: the text it already covers is what it decodes to
        return new

    def flush(self) -> str:
        """Release what is held back (an incomplete character at the very end)."""
        prefix = self._decode(self.ids[self.prefix_offset : self.read_offset])
        window = self._decode(self.ids[self.prefix_offset :])
        new = window[len(prefix) :] if len(window) > len(prefix) else ""
        self.text += new
        self.read_offset = len(self.ids)
        return new
