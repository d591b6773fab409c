"""Streaming detokenisation: whole characters only, and the stream adds up to decode()."""

import pytest
from gguf import TokenType
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.model.tokenizer import IncrementalDetokenizer
from ridgeline.model.tokenizer.bpe import byte_level_bpe
from ridgeline.model.tokenizer.hf import BYTE_LEVEL_DECODING, HfTokenizer
from ridgeline.model.tokenizer.spm import SpmTokenizer

# A small SentencePiece-style vocabulary: most characters outside ASCII fall back to <0xNN> byte tokens,
# which is exactly where a naive detokenizer would emit half a character.
CONTROL = ["<pad>", "<eos>", "<bos>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]
NORMAL = ["▁", "a", "b", "c", "▁a", "ab", "é", "日本", "▁▁", "🚀"]


def _spm(add_space_prefix: bool = False) -> SpmTokenizer:
    pieces = CONTROL + BYTES + NORMAL
    types = [TokenType.CONTROL] * 3 + [TokenType.BYTE] * 256 + [TokenType.NORMAL] * len(NORMAL)
    scores = [0.0] * (3 + 256) + [-float(i) for i in range(len(NORMAL))]
    return SpmTokenizer(
        pieces,
        scores,
        types,
        unknown_id=None,
        add_space_prefix=add_space_prefix,
        bos_id=2,
        eos_id=1,
        eos_ids=frozenset({1}),
        add_bos=True,
        chat_template=None,
    )


def _byte_level() -> HfTokenizer:
    tokens = ["<|end|>", *BYTE_LEVEL_DECODING, "Ġt", "he", "Ġthe"]
    types = [TokenType.CONTROL] + [TokenType.NORMAL] * (len(tokens) - 1)
    backend = byte_level_bpe(tokens, ["Ġ t", "h e", "Ġt he"], types, "gpt2")
    return HfTokenizer(
        backend, byte_level=True, bos_id=None, eos_id=0, eos_ids=frozenset({0}), add_bos=False, chat_template=None
    )


TOKENIZERS = {"spm": _spm(), "spm_space_prefix": _spm(add_space_prefix=True), "byte_level": _byte_level()}


def _stream(tokenizer, ids: list[int], skip_special: bool = True) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special=skip_special)
    return [detokenizer.push(token_id) for token_id in ids] + [detokenizer.flush()]


@pytest.mark.parametrize("name", TOKENIZERS)
@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=40))
def test_stream_adds_up_to_decode_and_never_breaks_a_character(name, text):
    tokenizer = TOKENIZERS[name]
    ids = tokenizer.encode(text)
    chunks = _stream(tokenizer, ids)
    assert "".join(chunks) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in chunk for chunk in chunks) or "\ufffd" in text


def test_a_character_split_over_byte_tokens_comes_out_whole_with_its_last_byte():
    tokenizer = TOKENIZERS["spm"]
    ids = tokenizer.encode("a語", add_bos=False)
    assert len(ids) == 4  # "a" and the three bytes of 語
    assert _stream(tokenizer, ids) == ["a", "", "", "語", ""]


def test_special_tokens_are_skipped_unless_asked_for():
    tokenizer = TOKENIZERS["spm"]
    ids = tokenizer.encode("ab")
    assert _stream(tokenizer, ids) == ["", "ab", ""]
    assert _stream(tokenizer, ids, skip_special=False) == ["<bos>", "ab", ""]


def test_a_stream_cut_mid_character_flushes_a_replacement_character_like_decode():
    tokenizer = TOKENIZERS["byte_level"]
    ids = tokenizer.encode("the 語")[:-1]
    chunks = _stream(tokenizer, ids)
    assert chunks[-1] == "\ufffd"
    assert "".join(chunks) == tokenizer.decode(ids)
