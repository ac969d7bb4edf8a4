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


def stop_holdback(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string.

    >>> stop_holdback("hello wor", ["world"]), stop_holdback("hello", ["world"])
    (3, 0)
    """
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class TextStream:
    """One request's text: token chunks in, text pieces out, stop strings applied.

    :meth:`push` takes the tokens a step emitted and returns the text that is now final; text
    that might be the start of a stop string is held back until it is decided. When a stop
    string completes, :attr:`stopped` is set, the text ends before it and the tokens after the
    one that completed it are dropped (:attr:`tokens` keeps the tokens up to that one).
    :meth:`close` releases the rest. Without a tokenizer, only token ids are kept.

    Example with stop ``"\\n\\n"``: pushing tokens that decode to ``"a\\n"`` yields ``"a"`` (the
    ``"\\n"`` may start the stop string); pushing ``"\\nb"`` completes it: nothing more is
    yielded, ``stopped`` is True and the text is ``"a"``.
    """

    def __init__(self, tokenizer, stops: Sequence[str] = ()):
        self.detok = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self.stops = tuple(stops)
        self.longest_stop = max((len(s) for s in self.stops), default=0)
        self.tokens: list[int] = []
        self.received = 0
        """Tokens pushed, including those dropped after a stop string."""
        self.shown = 0
        """Characters of the detokenizer's text released."""
        self.stop_at: int | None = None

    @property
    def stopped(self) -> bool:
        return self.stop_at is not None

    @property
    def text(self) -> str:
        """The text released so far."""
        return self.detok.text[: self.shown] if self.detok is not None else ""

    @property
    def dropped(self) -> int:
        """Tokens pushed after the one that completed a stop string."""
        return self.received - len(self.tokens)

    def push(self, chunk: Sequence[int]) -> str:
        """Add one step's tokens; return the text that became final (maybe empty)."""
        self.received += len(chunk)
        if self.stopped:
            return ""
        # with stop strings token by token (to end exactly at the one completing a stop)
        for piece_ids in ([[t] for t in chunk] if self.stops else [list(chunk)]):
            self.tokens.extend(piece_ids)
            if self.detok is None:
                continue
            before = len(self.detok.text)
            if not self.detok.add(piece_ids) or not self.stops:
                continue
            # a stop string can only be found where it overlaps the new text
            start = max(0, before - self.longest_stop + 1)
            hits = [i for i in (self.detok.text.find(s, start) for s in self.stops) if i >= 0]
            if hits:
                self.stop_at = min(hits)
                return self._release(self.stop_at)
        if self.detok is None:
            return ""
        return self._release(len(self.detok.text) - stop_holdback(self.detok.text, self.stops))

    def close(self) -> str:
        """The generation is over: release what was held back."""
        if self.detok is None:
            return ""
        if self.stop_at is None:
            self.detok.flush()
            return self._release(len(self.detok.text))
        return self._release(self.stop_at)

    def _release(self, end: int) -> str:
        if end <= self.shown:
            return ""
        piece = self.detok.text[self.shown : end]
        self.shown = end
        return piece
