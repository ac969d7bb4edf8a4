"""Text-level API: streaming pieces, stop strings, chat template, warm-up of the successor matrix."""

import pytest

from specgraft.api import SpecDecoder
from specgraft.detokenize import stop_holdback as _stop_holdback
from specgraft.calibration.corpus import read_corpus
from specgraft.calibration.warmup import warm_up_matrix
from specgraft.detokenize import IncrementalDetokenizer, TextStream
from specgraft.drafters.recycling import SuccessorMatrix
from specgraft.methods import METHODS
from specgraft.models.hf import HFTarget

from tests.helpers.models import tiny_llama, tiny_tokenizer


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


def test_generate_batch_equals_generate_alone(decoder):
    """Prompts of different lengths, stop strings and sampled requests in batches of 2: every
    output (text, tokens, finish reason, tokens counted) equals the prompt generated alone."""
    prompts = ["w5 w6 w7 w5 w6 w7 w5 w6", "w9 w10", "w11 w12 w13 w11 w12", "w7", "w20 w21 w22 w20 w21 w22"]
    full = decoder.generate(prompts[0], max_new_tokens=16)
    stop = " ".join(full.text.split()[3:5])
    configs = [
        decoder.make_config(max_new_tokens=16, stop=[stop]),
        decoder.make_config(max_new_tokens=5),
        decoder.make_config(max_new_tokens=12, temperature=0.8, seed=3),
        decoder.make_config(max_new_tokens=0),
        decoder.make_config(max_new_tokens=20, top_p=0.9, temperature=1.0, seed=4),
    ]
    alone = [decoder.generate(p, config=c) for p, c in zip(prompts, configs)]
    batched = decoder.generate_batch(prompts, config=configs, max_batch=2)
    for a, b in zip(alone, batched):
        assert (b.text, b.tokens, b.finish_reason) == (a.text, a.tokens, a.finish_reason)
        assert b.stats.new_tokens == len(b.tokens) == sum(k * v for k, v in b.stats.tokens_per_step.items())
    assert batched[0].finish_reason == "stop" and batched[1].finish_reason == "length"
    with pytest.raises(ValueError, match="2 configs for 5 prompts"):
        decoder.generate_batch(prompts, config=configs[:2])


def test_text_stream_holds_back_a_possible_stop():
    tok = tiny_tokenizer()
    ids = tok("w5 w6 w7 w8")["input_ids"]
    text = TextStream(tok, stops=["w7 w8"])
    pieces = [text.push([t]) for t in ids]
    assert text.stopped and "".join(pieces) == text.text == tok.decode(ids[:2]) + " "
    assert text.dropped == 0 and text.push([5]) == "" and text.dropped == 1


def test_chat_template_and_bad_prompts(decoder):
    assert decoder.encode("w5 w6", chat=True) == decoder.encode("w5 w6 w3")
    with pytest.raises(ValueError, match="the prompt is empty"):
        decoder.generate("")
    with pytest.raises(ValueError, match="the prompt is empty"):
        decoder.generate([])
    with pytest.raises(ValueError, match="unknown method"):
        decoder.with_method("nope")


def test_chat_none_applies_the_template_when_there_is_one(decoder):
    """``chat=None``: the chat template if the tokenizer has one, else the raw text; ``chat=False``
    stays the default of the text API."""
    assert decoder.has_chat_template and decoder.uses_chat(None)
    assert decoder.encode("w5 w6", chat=None) == decoder.encode("w5 w6", chat=True) != decoder.encode("w5 w6")
    assert decoder.generate("w5 w6 w7", chat=None, max_new_tokens=6).tokens == decoder.generate("w5 w6 w7", chat=True, max_new_tokens=6).tokens
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    base = SpecDecoder(tiny_llama(), tokenizer, method="pld")
    assert not base.has_chat_template and not base.uses_chat(None) and base.uses_chat(False) is False
    assert base.encode("w5 w6", chat=None) == base.encode("w5 w6", chat=False)
    with pytest.raises(ValueError, match="no chat template"):
        base.encode("w5 w6", chat=True)


def test_default_method_is_pld_or_draft_tree(tiny_model_dir):
    """No method: ``pld``, or ``draft-tree`` when a draft model is given (``methods.default_method``)."""
    from specgraft.methods import GraftOptions, MethodOptions, default_method

    assert default_method(MethodOptions()) == "pld"
    assert default_method(MethodOptions(graft=GraftOptions(draft_model="some-draft"))) == "draft-tree"
    assert default_method(MethodOptions(), draft_model=object()) == "draft-tree"
    assert SpecDecoder(tiny_llama(), tiny_tokenizer()).method == "pld"
    assert SpecDecoder(tiny_llama(), tiny_tokenizer(), draft_model=tiny_llama(layers=1, seed=5)).method == "draft-tree"
    assert SpecDecoder.from_pretrained(tiny_model_dir, dtype="float32", progress=False).method == "pld"
    options = MethodOptions(graft=GraftOptions(draft_model=tiny_model_dir, draft_dtype="float32"))
    assert SpecDecoder.from_pretrained(tiny_model_dir, dtype="float32", options=options, progress=False).method == "draft-tree"


def byte_level_tokenizer():
    """A byte-level BPE tokenizer trained here on text with multi-byte characters, so single
    tokens hold parts of one character (as in GPT-2 / Qwen tokenizers)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["naïve café — déjà vu, 東京 and 北京 ✓ über straße", "def f(x):\n    return x  # ünïcödé"] * 20
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@pytest.mark.parametrize("make", [tiny_tokenizer, byte_level_tokenizer], ids=["word-level", "byte-level"])
def test_incremental_detokenizer_equals_full_decode(make):
    """Text released token by token (and in uneven chunks, as steps emit them) equals decoding
    everything at once, and a character split across tokens is held back until complete."""
    import random

    tokenizer = make()
    text = "naïve café — déjà vu, 東京 ✓ über straße w5 w6 w7" if make is byte_level_tokenizer else "w5 w6 w7 w5 w9 w3"
    ids = tokenizer(text)["input_ids"]
    rng = random.Random(0)
    for chunked in (False, True):
        detok = IncrementalDetokenizer(tokenizer)
        pieces, i = [], 0
        while i < len(ids):
            n = rng.randint(1, 4) if chunked else 1
            piece = detok.add(ids[i : i + n])
            assert "\ufffd" not in piece, "an incomplete character is never released"
            pieces.append(piece)
            i += n
        pieces.append(detok.flush())
        assert "".join(pieces) == detok.text == tokenizer.decode(ids, skip_special_tokens=True)


def test_interleaved_streams_keep_their_own_stats():
    """Two streams of one decoder advanced in turns give what each gives alone, stats included."""
    dec = SpecDecoder(tiny_llama(), tiny_tokenizer(), method="pld")
    prompts = ["w5 w6 w7 w5 w6 w7 w5 w6", "w9 w10 w11 w9 w10"]
    alone = [dec.generate(p, max_new_tokens=12) for p in prompts]
    streams = [dec.stream(p, max_new_tokens=12) for p in prompts]
    texts, outputs = ["", ""], [None, None]
    live = [0, 1]
    while live:
        for i in list(live):
            try:
                texts[i] += next(streams[i])
            except StopIteration:
                live.remove(i)
                outputs[i] = dec.last_output
    for i in (0, 1):
        assert texts[i] == alone[i].text
    # the one stream that ended last left its output; each stream's stats counted its own tokens
    assert dec.last_output.stats.new_tokens == len(dec.last_output.tokens) == 12


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


# -- stop_on_eos ---------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["ar", "pld"])
def test_stop_on_eos(method):
    """EOS stops generation (kept as the last token) unless ``stop_on_eos=False``, where it is an
    ordinary token. EOS here is a token greedy decoding emits mid-way, so a speculative step can
    carry tokens after it."""
    from specgraft.config import GenerationConfig
    from specgraft.engine import SpecEngine
    from specgraft.methods import MethodOptions, get_method
    from specgraft.models.hf import HFTarget

    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    target = HFTarget(tiny_llama())

    def run(eos: list[int], stop_on_eos: bool) -> list[int]:
        drafters, composer = get_method(method).build(target, MethodOptions())
        engine = SpecEngine(target, drafters, composer, method=method, eos_token_ids=eos)
        return engine.generate_ids(prompt, GenerationConfig(max_new_tokens=24, stop_on_eos=stop_on_eos))

    full = run([], True)
    eos = full[5]
    first = full.index(eos)
    assert run([eos], True) == full[: first + 1]
    assert run([eos], False) == full


def test_make_config_stop_on_eos(decoder):
    assert SpecDecoder.make_config().stop_on_eos is True
    config = decoder.resolve(SpecDecoder.make_config(stop_on_eos=False))
    assert config.stop_on_eos is False
    out = decoder.generate("w5 w6", config=config)
    assert out.config["generation"]["stop_on_eos"] is False


# -- draft-model options through the API -----------------------------------------------------


def test_sampled_drafts_and_preset_budget_through_the_api():
    from specgraft.methods import MethodOptions
    from specgraft.methods.graft import GraftOptions, with_sampled_drafts

    graft = with_sampled_drafts(GraftOptions(preset="gpu"), temperature=0.8)
    dec = SpecDecoder(
        tiny_llama(), tiny_tokenizer(), method="draft-tree", options=MethodOptions(graft=graft), draft_model=tiny_llama(layers=1, seed=5)
    )
    (drafter,) = dec.engine.drafters
    assert (drafter.config.sample, drafter.config.seed) == (True, 0)
    assert (drafter.config.depth, drafter.config.top_k) == (8, 10)  # the gpu preset
    assert dec.default_budget == 60 and dec.resolve(dec.make_config()).budget == 60
    out = dec.generate("w5 w6 w7 w5 w6", max_new_tokens=6, temperature=0.8, seed=0)
    assert out.config["generation"]["budget"] == 60 and len(out.tokens) <= 6
    assert dec.with_method("pld").default_budget == METHODS["pld"].default_budget  # other methods keep their own default
    with pytest.raises(ValueError, match="needs --temperature > 0"):
        with_sampled_drafts(GraftOptions(), temperature=0.0)


def test_build_graft_method_checks_the_tokenizer(tmp_path):
    """Given the target's tokenizer, loading a draft model whose tokenizer numbers the same
    words differently is refused; equal vocabulary sizes alone would pass."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from specgraft.methods.graft import GraftOptions, build_graft_method

    words = {"<pad>": 0, "<s>": 1, "</s>": 2}
    words.update({f"w{i}": (7 if i == 3 else 3 if i == 7 else i) for i in range(3, 96)})  # w3 and w7 swapped
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    draft_dir = tmp_path / "draft"
    tiny_llama(layers=1, seed=5).save_pretrained(draft_dir)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(draft_dir)
    options = GraftOptions(draft_model=str(draft_dir), draft_dtype="float32")
    target = HFTarget(tiny_llama())

    drafters, _ = build_graft_method("draft-tree", target, options)  # sizes agree: accepted without the tokenizer
    assert drafters[0].name == "draft"
    with pytest.raises(ValueError, match="has a different vocabulary"):
        build_graft_method("draft-tree", target, options, target_tokenizer=tiny_tokenizer())
