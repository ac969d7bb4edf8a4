"""llama-cpp-python, imported once for every part of specgraft that uses it, with llama.cpp's log
filtered by ggml's own levels.

llama-cpp-python 0.3.36 reads llama.cpp's log levels by an older numbering of ``ggml_log_level``
(its map takes 1 for INFO, 2 for WARN, 3 for ERROR, 4 for DEBUG), while the llama.cpp it ships
numbers them DEBUG 1, INFO 2, WARN 3, ERROR 4. So with ``verbose=False`` its filter prints
warnings as errors (every load of a Qwen GGUF printed ``load: control-looking token: 128247
'</s>' was not control-type ...``) and drops the errors. :func:`import_llama_cpp` installs a
callback that reads the levels as the library defines them and prints those at or above
``SPECGRAFT_LLAMACPP_LOG`` (``error`` by default; ``warn``, ``info`` or ``debug`` to see more of
what llama.cpp says, ``none`` for nothing).

>>> LogFilter("warn").shows(GGML_LOG_LEVEL_WARN), LogFilter("error").shows(GGML_LOG_LEVEL_WARN)
(True, False)
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from specgraft.models.llamacpp_build import LLAMA_CPP_PYTHON

#: ``enum ggml_log_level`` of the llama.cpp that llama-cpp-python 0.3.36 ships (``ggml.h``).
GGML_LOG_LEVEL_NONE, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO, GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT = range(6)

#: The environment variable that sets the least level printed, and its values.
LOG_ENV = "SPECGRAFT_LLAMACPP_LOG"
LOG_LEVELS = {"debug": GGML_LOG_LEVEL_DEBUG, "info": GGML_LOG_LEVEL_INFO, "warn": GGML_LOG_LEVEL_WARN, "error": GGML_LOG_LEVEL_ERROR, "none": GGML_LOG_LEVEL_CONT + 1}


class LogFilter:
    """Prints llama.cpp's log lines of level ``least`` or above on stderr; a continuation line
    (``GGML_LOG_LEVEL_CONT``) goes with the line it continues, a line without a level
    (``GGML_LOG_LEVEL_NONE``) counts as information."""

    def __init__(self, least: str = "error"):
        if least not in LOG_LEVELS:
            raise ValueError(f"{LOG_ENV} must be one of {', '.join(LOG_LEVELS)}, got {least!r}")
        self.least = LOG_LEVELS[least]
        self._last = GGML_LOG_LEVEL_NONE

    def shows(self, level: int) -> bool:
        """Whether a line of ``level`` is printed (and remembers it for continuations)."""
        if level != GGML_LOG_LEVEL_CONT:
            self._last = GGML_LOG_LEVEL_INFO if level == GGML_LOG_LEVEL_NONE else level  # llama.cpp's plain prints
        return self._last >= self.least

    def __call__(self, level: int, text: bytes, user_data: Any = None) -> None:
        if self.shows(level):
            print(text.decode("utf-8", "replace"), end="", file=sys.stderr, flush=True)


#: The ctypes callback llama.cpp holds (kept here so that it is never collected), made once.
_callback: Any = None
_callback_lock = threading.Lock()


def import_llama_cpp() -> Any:
    """The ``llama_cpp`` module with llama.cpp's log filtered (module docstring), or an
    ``ImportError`` saying how to install it in one line."""
    global _callback
    try:
        import llama_cpp
    except ImportError as e:
        raise ImportError(
            f"the llama.cpp backend needs {LLAMA_CPP_PYTHON}: python -m specgraft.models.llamacpp_build --install "
            "(builds it for this CPU) and pip install -e \".[llamacpp]\""
        ) from e
    with _callback_lock:
        if _callback is None:
            _callback = llama_cpp.llama_log_callback(LogFilter(os.environ.get(LOG_ENV, "error").lower()))
        llama_cpp.llama_log_set(_callback, None)
    return llama_cpp
