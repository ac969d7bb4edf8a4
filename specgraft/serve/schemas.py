"""OpenAI request bodies (validated by pydantic), response and chunk bodies, and OpenAI-style errors.

Only the fields specgraft serves are declared; other OpenAI fields are accepted and ignored
(``logit_bias``, ``user``, ...), except those that would change what is generated and that are
not supported, which are refused with a 400 naming them (:func:`refuse_unsupported`).

``max_tokens`` defaults to :attr:`ServerConfig.default_max_tokens`, capped by what is left of
the context window after the prompt. Numbers are strict: ``max_tokens: true`` or ``"5"`` is a
400, not 1 or 5 (pydantic would coerce them); ranges are OpenAI's (``temperature`` in [0, 2],
``top_p`` in (0, 1]) and the seed's ([0, 2**63), ``config.SEED_LIMIT``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from specgraft.config import SEED_LIMIT


class APIError(Exception):
    """An error answered as OpenAI does: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if 400 <= status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False
    """Send one more chunk, with ``usage`` and no choices, before ``data: [DONE]``."""


class SamplingFields(BaseModel):
    """Fields shared by both endpoints."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1, strict=True)
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False, strict=True)
    """OpenAI's default is 1 (sampling); pass 0 for greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0, strict=True)
    top_k: int = Field(0, ge=0, strict=True)
    """Not OpenAI's; vLLM's extension (0 = off)."""
    seed: int | None = Field(None, ge=0, lt=SEED_LIMIT, strict=True)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1, strict=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    """Not OpenAI's; vLLM's extension: generate ``max_tokens`` tokens, EOS or not (load tests)."""

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(not s for s in stops):
            raise APIError(400, "stop strings must not be empty", param="stop")
        return tuple(stops)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    """One prompt: text, or token ids; a list of several prompts is refused (batch them as
    separate requests)."""


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


def _json_kind(value: Any) -> str:
    """What a JSON value is, in words.

    >>> _json_kind({}), _json_kind(3), _json_kind(None)
    ('an object', 'a number', 'null')
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number"}
    return next((word for kind, word in kinds.items() if isinstance(value, kind)), type(value).__name__)


def _part_kind(part: Any) -> str:
    """A content part in words, for the error that refuses it.

    >>> _part_kind({"type": "image_url"}), _part_kind({"type": "file"}), _part_kind("hi")
    ("an 'image_url' part", "a 'file' part", 'a string')
    """
    if not isinstance(part, dict):
        return _json_kind(part)
    kind = part.get("type")
    if not isinstance(kind, str):
        return "a part without a type"
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return f"{article} {kind!r} part"


#: Error types whose message describes the input itself: no ``(got ...)`` after it (an image
#: part's input would be its whole base64 payload).
DESCRIBES_INPUT = frozenset({"content_type", "unsupported_content_part", "text_part"})


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    """Text, or a list of text parts (joined); images, audio and files are refused."""

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content: Any) -> Any:
        """Refuse what is not text before the union tries each of its types, so that the error
        names what was sent (``messages[0].content: only text parts are supported, got an
        'image_url' part``), not what each type of the union expected (``messages.0.content.str``)."""
        if content is None or isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise PydanticCustomError(
                "content_type", "content must be a string or a list of text parts, got {kind}", {"kind": _json_kind(content)}
            )
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise PydanticCustomError(
                    "unsupported_content_part", "only text parts are supported, got {kind}", {"kind": _part_kind(part)}
                )
            if not isinstance(part.get("text"), str):
                raise PydanticCustomError("text_part", "a text part's text must be a string, got {kind}", {"kind": _json_kind(part.get("text"))})
        return content

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def missing_text(self) -> str | None:
        """How a message without text lacks it (``"null"``, ``"an empty string"`` ...), or None
        when it has text."""
        if self.text():
            return None
        if "content" not in self.model_fields_set:
            return "no content"
        if self.content is None:
            return "null"
        if isinstance(self.content, str):
            return "an empty string"
        return "an empty list of parts" if not self.content else "only empty text parts"


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = Field(None, ge=1, strict=True)
    """OpenAI's newer name for ``max_tokens``; either may be given."""

    def conversation(self) -> list[dict[str, str]]:
        """The messages as the chat template takes them (text parts joined); 400 for no messages
        and for a user message without text (assistant and system messages may be empty).

        >>> ChatCompletionRequest(model="m", messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]).conversation()
        [{'role': 'user', 'content': 'hi'}]
        """
        if not self.messages:
            raise APIError(400, "messages must not be empty", param="messages")
        for i, message in enumerate(self.messages):
            missing = message.missing_text() if message.role == "user" else None
            if missing is not None:
                param = f"messages[{i}].content"
                raise APIError(400, f"{param}: a user message needs text, got {missing}", param=param, code="empty_content")
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    def max_new_tokens(self) -> int | None:
        if self.max_tokens is not None and self.max_completion_tokens is not None and self.max_tokens != self.max_completion_tokens:
            raise APIError(400, "max_tokens and max_completion_tokens differ; give one", param="max_completion_tokens")
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# fields that would change the output and are not supported: refused rather than ignored
_UNSUPPORTED = {
    "logprobs": lambda v: v not in (None, False, 0),
    "top_logprobs": lambda v: v not in (None, 0),
    "echo": lambda v: bool(v),
    "best_of": lambda v: v not in (None, 1),
    "suffix": lambda v: v not in (None, ""),
    "tools": lambda v: bool(v),
    "functions": lambda v: bool(v),
    "response_format": lambda v: v not in (None, {"type": "text"}),
    "presence_penalty": lambda v: v not in (None, 0, 0.0),
    "frequency_penalty": lambda v: v not in (None, 0, 0.0),
}


def refuse_unsupported(request: SamplingFields) -> None:
    """400 for ``n > 1`` and for set fields this server does not implement (``_UNSUPPORTED``)."""
    if request.n != 1:
        raise APIError(400, f"n must be 1 (got {request.n}): send separate requests for several completions", param="n")
    for name, is_set in _UNSUPPORTED.items():
        value = (request.model_extra or {}).get(name)
        if value is not None and is_set(value):
            raise APIError(400, f"{name} is not supported by this server (got {value!r})", param=name)


def completion_prompt(request: CompletionRequest) -> str | list[int]:
    """The one prompt of a completion request: text or token ids.

    >>> completion_prompt(CompletionRequest(model="m", prompt=["hi"])), completion_prompt(CompletionRequest(model="m", prompt=[[5, 6]]))
    ('hi', [5, 6])
    """
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"one prompt per request (got {len(prompt)}): send separate requests", param="prompt")
        prompt = prompt[0]
    if len(prompt) == 0:
        raise APIError(400, "the prompt is empty", param="prompt")
    return prompt


# -- responses --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }


@dataclass(frozen=True)
class ResponseHead:
    """What every chunk and response of one request repeats."""

    id: str
    model: str
    chat: bool
    created: int

    @classmethod
    def new(cls, request_id: str, model: str, chat: bool) -> "ResponseHead":
        return cls(("chatcmpl-" if chat else "cmpl-") + request_id, model, chat, int(time.time()))

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def response(self, text: str, finish_reason: str | None, usage: Usage) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish_reason}
            return self._base("chat.completion") | {"choices": [choice], "usage": usage.to_dict()}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return self._base("text_completion") | {"choices": [choice], "usage": usage.to_dict()}

    def chunk(self, text: str | None, finish_reason: str | None = None, role: bool = False) -> dict[str, Any]:
        """One streamed choice: a text piece, or (``text=None``) the last chunk with its finish reason;
        chat's first chunk carries the role."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._base("chat.completion.chunk") | {"choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._base("text_completion") | {"choices": [choice]}

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return self._base(obj) | {"choices": [], "usage": usage.to_dict()}
