"""Hostile text for the tokenizers: invalid Unicode is refused by name, any id sequence decodes, streamed or whole.

Properties over generated inputs, on small vocabularies of both kinds, on the tiny model's real GGUF byte-level
BPE (the `tokenizers` backend), and (slow) on the default model's 262k SentencePiece vocabulary.
"""

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import tiny_model_path
from test_detokenizer import TOKENIZERS

from ridgeline.engine.stop_checker import StopChecker
from ridgeline.model.checkpoint import read_checkpoint
from ridgeline.model.tokenizer import IncrementalDetokenizer
from ridgeline.model.tokenizer.valid_text import InvalidTextError, first_invalid, unpaired_surrogate

SURROGATES = st.integers(0xD800, 0xDFFF).map(chr)
# Any code point, lone surrogates included (hypothesis leaves them out of st.text by default).
ANY_TEXT = st.lists(st.one_of(st.characters(), SURROGATES, st.sampled_from(["<s>", "<|end|>", "<bos>", " "])), max_size=30).map("".join)


@functools.cache
def tiny_gguf_tokenizer():
    return read_checkpoint(tiny_model_path()).load_tokenizer()


def _tokenizers():
    return {**TOKENIZERS, "tiny_gguf_bpe": tiny_gguf_tokenizer()}


NAMES = ["spm", "spm_space_prefix", "byte_level", "tiny_gguf_bpe"]


def _check_encode(tokenizer, text: str, special: bool) -> None:
    bad = unpaired_surrogate(text)
    if bad is not None:
        with pytest.raises(InvalidTextError, match=f"U\\+{ord(text[bad]):04X}\\) at character {bad}"):
            tokenizer.encode(text, special=special)
        return
    ids = tokenizer.encode(text, special=special)
    assert all(0 <= i < tokenizer.vocab_size for i in ids)
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special=False)
    streamed = "".join(detokenizer.push(i) for i in ids) + detokenizer.flush()
    assert streamed == tokenizer.decode(ids, skip_special=False)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=ANY_TEXT, special=st.booleans())
def test_any_text_encodes_or_is_refused_naming_the_bad_character(name, text, special):
    _check_encode(_tokenizers()[name], text, special)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=80, deadline=None)
@given(data=st.binary(max_size=40))
def test_arbitrary_bytes_read_as_text_encode_or_are_refused(name, data):
    # surrogateescape turns every invalid byte into a lone surrogate: what a careless client would send.
    _check_encode(_tokenizers()[name], data.decode("utf-8", errors="surrogateescape"), special=False)
    _check_encode(_tokenizers()[name], data.decode("utf-8", errors="replace"), special=False)


def _ids(vocab_size: int):
    edges = st.sampled_from([0, 1, vocab_size - 1, vocab_size, vocab_size + 1, -1, -(2**40), 2**40, 2**70])
    return st.lists(st.one_of(st.integers(0, vocab_size - 1), edges), max_size=40)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None)
@given(data=st.data(), skip_special=st.booleans())
def test_any_id_sequence_decodes_and_streams_to_the_same_text(name, data, skip_special):
    """Ids at and past the vocabulary's edges (the model's rows may outnumber the vocabulary) stand for no text."""
    tokenizer = _tokenizers()[name]
    ids = data.draw(_ids(tokenizer.vocab_size))
    whole = tokenizer.decode(ids, skip_special=skip_special)
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special=skip_special)
    chunks = [detokenizer.push(i) for i in ids] + [detokenizer.flush()]
    assert "".join(chunks) == whole
    assert unpaired_surrogate(whole) is None  # whatever came out can be sent as JSON/UTF-8
    in_vocab = [i for i in ids if 0 <= i < tokenizer.vocab_size]
    assert whole == tokenizer.decode(in_vocab, skip_special=skip_special)


@settings(max_examples=150, deadline=None)
@given(stop=st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=16), chunks=st.lists(st.text(max_size=6), max_size=20))
def test_stop_strings_of_any_text_never_raise_and_never_leak_into_the_output(stop, chunks):
    checker = StopChecker(stop)
    for chunk in chunks:
        if checker.append(chunk).stopped:
            break
    checker.flush()
    text = "".join(chunks)
    assert text.startswith(checker.output_text)
    assert not any(s in checker.output_text for s in stop)


def test_first_invalid_names_the_position_without_quoting_the_text():
    assert first_invalid({"prompt": ["fine", "x\ud800"]}) == (
        "['prompt'][1] holds an unpaired UTF-16 surrogate (U+D800) at character 1; text must be valid Unicode"
    )
    assert first_invalid({"\udc80": 1}).startswith("key #0 holds an unpaired UTF-16 surrogate (U+DC80)")
    assert first_invalid({"ok": ["a", {"b": "\U0001f680"}]}) is None


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=ANY_TEXT, data=st.data())
def test_the_default_vocabulary_encodes_any_text_and_decodes_any_ids(gemma_tokenizer, text, data):
    _check_encode(gemma_tokenizer, text, special=True)
    ids = data.draw(_ids(gemma_tokenizer.vocab_size))
    detokenizer = IncrementalDetokenizer(gemma_tokenizer)
    assert "".join(detokenizer.push(i) for i in ids) + detokenizer.flush() == gemma_tokenizer.decode(ids)


@pytest.fixture(scope="module")
def gemma_tokenizer(default_tokenizer):
    return default_tokenizer
