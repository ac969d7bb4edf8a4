"""llama.cpp's log, filtered by ggml's own levels (``specgraft/models/llamacpp_lib.py``)."""

import pytest

from specgraft.models.llamacpp_lib import (
    GGML_LOG_LEVEL_CONT,
    GGML_LOG_LEVEL_DEBUG,
    GGML_LOG_LEVEL_ERROR,
    GGML_LOG_LEVEL_INFO,
    GGML_LOG_LEVEL_NONE,
    GGML_LOG_LEVEL_WARN,
    LogFilter,
)


def shown(least: str, lines) -> str:
    log = LogFilter(least)
    return "".join(text for level, text in lines if log.shows(level))


LINES = [
    (GGML_LOG_LEVEL_INFO, "loading "),
    (GGML_LOG_LEVEL_CONT, "....."),
    (GGML_LOG_LEVEL_WARN, "control-looking token "),
    (GGML_LOG_LEVEL_ERROR, "failed "),
    (GGML_LOG_LEVEL_CONT, "to load"),
    (GGML_LOG_LEVEL_DEBUG, " graph"),
    (GGML_LOG_LEVEL_NONE, " perf"),
]


def test_levels_as_ggml_numbers_them():
    assert shown("error", LINES) == "failed to load", "errors with their continuation, no warnings"
    assert shown("warn", LINES) == "control-looking token failed to load"
    assert shown("info", LINES) == "loading .....control-looking token failed to load perf"
    assert shown("debug", LINES) == "loading .....control-looking token failed to load graph perf"
    assert shown("none", LINES) == ""


def test_an_unknown_level_is_refused():
    with pytest.raises(ValueError, match="SPECGRAFT_LLAMACPP_LOG must be one of debug, info, warn, error, none"):
        LogFilter("verbose")


def test_the_filter_prints_on_stderr(capsys):
    log = LogFilter("error")
    log(GGML_LOG_LEVEL_WARN, b"a warning\n")
    log(GGML_LOG_LEVEL_ERROR, b"an error\n")
    assert capsys.readouterr().err == "an error\n"
