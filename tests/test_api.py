"""Text-level API: streaming pieces, stop strings, chat template, warm-up of the successor matrix."""

import numpy as np
import pytest

from specgraft.api import SpecDecoder, _stop_holdback
from specgraft.drafters.recycling import SuccessorMatrix
from specgraft.warmup import read_corpus, warm_up_matrix

from tests.conftest import tiny_llama, tiny_tokenizer


@pytest.fixture(scope="module")
def decoder():
    return SpecDecoder(tiny_llama(), tiny_tokenizer(), method="pld")


def test_stream_pieces_concatenate_to_text(decoder):
    pieces = list(decoder.stream("w5 w6 w7 w5 w6 w7 w5 w6", max_new_tokens=16))
    out = decoder.last_output
    assert "".join(pieces) == out.text == decoder.decode(out.tokens)
    assert out.stats.new_tokens == len(out.tokens) == 16
    assert out.config["method"] == "pld" and out.config["generation"]["max_new_tokens"] == 16


def test_stop_string_cuts_text_and_tokens(decoder):
    full = decoder.generate("w5 w6 w7 w5 w6 w7 w5 w6", max_new_tokens=16)
    words = full.text.split()
    stop = " ".join(words[3:5])
    out = decoder.generate("w5 w6 w7 w5 w6 w7 w5 w6", max_new_tokens=16, stop=[stop])
    assert stop not in out.text and full.text.startswith(out.text)
    assert out.text == full.text[: full.text.find(stop)]
    s = out.stats
    assert s.new_tokens == len(out.tokens) == sum(k * v for k, v in s.tokens_per_step.items())


def test_chat_template_and_bad_prompts(decoder):
    assert decoder.encode("w5 w6", chat=True) == decoder.encode("w5 w6 w3")
    with pytest.raises(ValueError, match="the prompt is empty"):
        decoder.generate("")
    with pytest.raises(ValueError, match="the prompt is empty"):
        decoder.generate([])
    with pytest.raises(ValueError, match="unknown method"):
        decoder.with_method("nope")


def test_stop_holdback():
    assert _stop_holdback("abc ST", ["STOP"]) == 2
    assert _stop_holdback("abc", ["STOP"]) == 0
    assert _stop_holdback("abc S", ["STOP", "SX"]) == 1


def test_warm_up_fills_rows(tmp_path, decoder):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"turns": ["w5 w6"], "response": "w7 w8 w9"}\n{"turns": ["w10"], "response": "w11"}\n')
    records = read_corpus(corpus)
    assert records == [("w5 w6", "w7 w8 w9"), ("w10", "w11")]
    matrix = SuccessorMatrix(96, k=4)
    rows = warm_up_matrix(decoder.target, decoder.tokenizer, records, matrix, chat=True, progress=False)
    assert rows > 0 and (matrix.table[5] >= 0).all() and (matrix.table[1] == -1).all()
    with pytest.raises(ValueError, match="does not exist"):
        read_corpus(tmp_path / "missing.jsonl")
