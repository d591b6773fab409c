"""Tokenizers: llama.cpp's ids on the default model, GGUF byte-level BPE and tokenizer.json against `tokenizers`."""

import copy
import json
import re
from pathlib import Path

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_helpers import load_reference
from tokenizers import Tokenizer as HfBackend
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from ridgeline.errors import ModelLoadError, UnsupportedError
from ridgeline.model.default_model import default_model_path
from ridgeline.model.tokenizer import tokenizer_from_gguf, tokenizer_from_hf_dir
from ridgeline.model.tokenizer.bpe import byte_level_bpe
from ridgeline.model.tokenizer.spm import SpmTokenizer

REFERENCE = load_reference()
REFERENCE_CASES = [(case["text"], case["special"], case["ids"]) for case in REFERENCE["tokenize"]] + [
    (case["prompt"], case["special"], case["prompt_ids"]) for case in REFERENCE["greedy"]
]
SAMPLES = [
    "Hello world",
    "  two leading spaces and trailing   ",
    "numbers 1234567 and 3.14159",
    "naïve café 日本語 🚀 Привет",
    "line one\n\nline two\r\n\ttabbed",
    "don't stop, it's 'quoted'",
]
TRAINING_TEXT = [" ".join(SAMPLES) + " The quick brown fox jumps over the lazy dog."] * 20


@pytest.fixture(scope="module")
def gemma(default_tokenizer):
    return default_tokenizer


@pytest.mark.slow
@pytest.mark.parametrize("text, special, ids", REFERENCE_CASES, ids=[f"case{i}" for i in range(len(REFERENCE_CASES))])
def test_gemma_ids_equal_llama_cpp(gemma, text, special, ids):
    assert gemma.encode(text, special=special) == ids


@pytest.mark.slow
def test_the_cached_vocabulary_gives_the_same_tokenizer(default_tokenizer):
    """read_checkpoint() builds the tokenizer from the cached GGUF index (written on first use), not the reader: it
    must equal the tokenizer built from the file parsed again (the one test here that pays that parse, ~13 s).
    `default_tokenizer` is that cached build, the suite's own (conftest.py)."""
    gemma = tokenizer_from_gguf(gguf.GGUFReader(default_model_path()))
    cached = default_tokenizer
    for text, special, ids in REFERENCE_CASES:
        assert cached.encode(text, special=special) == ids
        assert cached.decode(ids, skip_special=False) == gemma.decode(ids, skip_special=False)
    for text in SAMPLES:
        assert cached.encode(text) == gemma.encode(text) and cached.decode(gemma.encode(text)) == gemma.decode(
            gemma.encode(text))
    assert (cached.vocab_size, cached.eos_ids, cached.chat_template) == (gemma.vocab_size, gemma.eos_ids, None)


def _gemma_texts():
    """Text that stresses where words start: reference and sample text cut at random, pieces that hold a U+2581
    (Gemma's ">▁</" is the one with a mark after another character), runs of spaces and markup."""
    fragments = [text for text, _, _ in REFERENCE_CASES] + SAMPLES
    pieces = st.sampled_from(["> </", ">  </", "> ", " </", "</", ">", "  ", "   ", "\n ", "a b", "<b> x</b>"])
    cut = st.builds(lambda text, a, b: text[min(a, b) : max(a, b)], st.sampled_from(fragments), st.integers(0, 400),
                    st.integers(0, 400))
    return st.lists(st.one_of(pieces, cut, st.text(max_size=8)), max_size=12).map("".join)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(text=_gemma_texts())
def test_gemma_merges_word_by_word_as_over_the_whole_text(gemma, text):
    """encode merges word by word, caching words (spm.py): the ids must be those of one merge over each run of text
    between special pieces, as before words were cut (the same tokenizer, with no cut and no cache)."""
    whole = copy.copy(gemma)
    whole.__dict__["_word_start"] = re.compile(r"(?!)")  # matches nowhere: each run is one word
    whole.__dict__["_merge_word"] = whole._merge
    assert gemma.encode_text(text, special=False) == whole.encode_text(text, special=False)


def test_spm_words_are_not_cut_where_a_piece_spans_a_word_start():
    """A piece with U+2581 after another character ("x▁y") must still be found: no cut is made after "x".
    After "z", which no piece has before a U+2581, a cut is made and changes nothing."""
    pieces = ["<unk>", "x", "y", "z", "▁", "▁y", "x▁", "x▁y"]
    types = [gguf.TokenType.UNKNOWN] + [gguf.TokenType.NORMAL] * 7
    scores = [0.0, -1.0, -1.0, -1.0, -1.0, -2.0, -3.0, -4.0]
    tokenizer = SpmTokenizer(pieces, scores, types, unknown_id=0, add_space_prefix=False, bos_id=None, eos_id=None,
                             eos_ids=frozenset(), add_bos=False, chat_template=None)
    assert tokenizer.encode("x y") == [pieces.index("x\u2581y")]
    assert tokenizer.encode("z y") == [pieces.index("z"), pieces.index("\u2581y")]
    assert tokenizer.encode("x yx y") == [pieces.index("x\u2581y")] * 2  # and the second time, from the cache
    assert tokenizer.encode("z" * 100 + " y") == [pieces.index("z")] * 100 + [pieces.index("\u2581y")]  # not cached


@pytest.mark.slow
def test_gemma_decodes_every_reference_case_back_to_its_text(gemma):
    for text, special, ids in REFERENCE_CASES:
        assert gemma.decode(ids, skip_special=False) == "<bos>" + text
        control_text_dropped = text.replace("<start_of_turn>", "").replace("<end_of_turn>", "")
        assert gemma.decode(ids) == (control_text_dropped if special else text)


@pytest.mark.slow
def test_gemma_special_tokens_follow_the_metadata(gemma):
    end_of_turn = gemma.encode("<end_of_turn>", add_bos=False, special=True)
    assert end_of_turn == [106]
    assert gemma.bos_id == 2 and gemma.add_bos
    assert gemma.eos_ids == {1, 106}  # <eos> and <end_of_turn> both end generation
    assert gemma.is_special(2) and gemma.is_special(106) and not gemma.is_special(9259)
    assert gemma.encode("Hi", add_bos=False) == gemma.encode("Hi")[1:]
    assert gemma.chat_template is None  # the default file has none; the built-in Gemma template applies


def _trained_byte_level_bpe() -> HfBackend:
    backend = HfBackend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex, then bytes
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(TRAINING_TEXT, trainer)
    return backend


def _write_bpe_gguf(path: Path, backend: HfBackend, chat_template: str) -> None:
    model = json.loads(backend.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].get)
    special = {token.content for token in backend.get_added_tokens_decoder().values()}
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    writer.add_token_merges([" ".join(pair) for pair in model["merges"]])
    writer.add_eos_token_id(model["vocab"]["<|endoftext|>"])
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_byte_level_bpe_matches_tokenizers(tmp_path):
    backend = _trained_byte_level_bpe()
    _write_bpe_gguf(tmp_path / "bpe.gguf", backend, chat_template="{{ messages[0]['content'] }}")
    tokenizer = tokenizer_from_gguf(gguf.GGUFReader(tmp_path / "bpe.gguf"))

    for text in SAMPLES + ["unseen words: zebra ☃ ∑ 𝔘"]:
        expected = backend.encode(text).ids
        assert tokenizer.encode(text) == expected, text
        assert tokenizer.decode(expected) == backend.decode(expected) == text
    im_end = backend.token_to_id("<|im_end|>")
    assert tokenizer.encode("a<|im_end|>", special=True) == backend.encode("a<|im_end|>").ids
    as_text = tokenizer.encode("a<|im_end|>")
    assert im_end not in as_text and tokenizer.decode(as_text) == "a<|im_end|>"
    assert tokenizer.bos_id is None and not tokenizer.add_bos
    assert backend.token_to_id("<|endoftext|>") in tokenizer.eos_ids and im_end in tokenizer.eos_ids
    assert tokenizer.chat_template == "{{ messages[0]['content'] }}"


@pytest.mark.parametrize(
    "pre, words",
    [
        ("gpt2", ["a", "Ġ12345", "ĠIT", "'", "S", "ĊĊ"]),  # contractions are lower-case only
        ("llama-bpe", ["a", "Ġ", "123", "45", "ĠIT", "'S", "ĊĊ"]),  # digits in threes
        ("qwen2", ["a", "Ġ", "1", "2", "3", "4", "5", "ĠIT", "'S", "ĊĊ"]),  # digits one by one
    ],
)
def test_bpe_pre_tokenizer_splits_as_its_name_says(pre, words):
    backend = byte_level_bpe(["a"], [], [gguf.TokenType.NORMAL], pre)
    assert [word for word, _ in backend.pre_tokenizer.pre_tokenize_str("a 12345 IT'S\n\n")] == words


def test_unknown_pre_tokenizer_or_tokenizer_model_is_unsupported(tmp_path):
    with pytest.raises(UnsupportedError, match="pre-tokenizer 'made-up'"):
        byte_level_bpe(["a"], [], [gguf.TokenType.NORMAL], "made-up")
    writer = gguf.GGUFWriter(tmp_path / "odd.gguf", "llama")
    writer.add_tokenizer_model("bert")
    writer.add_token_list(["a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    with pytest.raises(UnsupportedError, match="tokenizer model 'bert'"):
        tokenizer_from_gguf(gguf.GGUFReader(tmp_path / "odd.gguf"))


def test_spm_gguf_with_space_prefix_adds_and_removes_the_leading_space(tmp_path):
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    pieces = ["<unk>", "<s>", "</s>", *byte_pieces, "▁", "a", "b", "▁a", "ab", "▁ab"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * 6
    scores = [0.0] * (3 + 256) + [-1.0, -2.0, -2.0, -3.0, -4.0, -5.0]
    writer = gguf.GGUFWriter(tmp_path / "spm.gguf", "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_space_prefix(True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    tokenizer = tokenizer_from_gguf(gguf.GGUFReader(tmp_path / "spm.gguf"))

    space_ab = pieces.index("▁ab")
    assert tokenizer.encode("ab ab") == [1, space_ab, space_ab]  # the prefix space makes the first "▁ab" too
    assert tokenizer.encode("</s>ab", special=True) == [1, 2, space_ab]  # and so does a special token before it
    assert tokenizer.encode("ab", add_bos=False, special=True) == [space_ab]
    assert tokenizer.encode("é", add_bos=False) == [pieces.index(p) for p in ("▁", "<0xC3>", "<0xA9>")]
    assert tokenizer.decode(tokenizer.encode("ab é")) == "ab é"


def _save_hf_dir(path: Path, backend: HfBackend) -> None:
    bos = backend.token_to_id("<|endoftext|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", bos)]
    )
    backend.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "chat_template": "{{ bos_token }}hi"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))


def test_tokenizer_json_directory(tmp_path):
    backend = _trained_byte_level_bpe()
    _save_hf_dir(tmp_path, backend)
    tokenizer = tokenizer_from_hf_dir(tmp_path)

    bos, im_end = backend.token_to_id("<|endoftext|>"), backend.token_to_id("<|im_end|>")
    assert tokenizer.bos_id == bos and tokenizer.add_bos  # the post-processor adds it
    for text in SAMPLES:
        assert tokenizer.encode(text) == backend.encode(text).ids  # BOS included, as the post-processor puts it
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert im_end in tokenizer.eos_ids and tokenizer.is_special(im_end)
    assert tokenizer.encode("<|im_end|>", add_bos=False, special=True) == [im_end]
    assert tokenizer.chat_template == "{{ bos_token }}hi"
    assert tokenizer.apply_chat_template([]) == "hi"  # encode adds the BOS, so the text does not repeat it


def test_directory_without_tokenizer_json_is_a_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        tokenizer_from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not a valid tokenizer.json"):
        tokenizer_from_hf_dir(tmp_path)


def test_sentencepiece_style_tokenizer_json_with_byte_fallback_and_dummy_prefix(tmp_path):
    # Llama-2's layout: spaces become "▁" with one put in front; unknown characters fall back to <0xNN> bytes.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in ["▁", "h", "e", "l", "o", "▁h", "el", "▁hel", "lo", "▁hello"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "h"), ("e", "l"), ("▁h", "el"), ("l", "o"), ("▁hel", "lo")]
    backend = HfBackend(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    backend.add_special_tokens(["<unk>", "<s>", "</s>"])
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    tokenizer = tokenizer_from_hf_dir(tmp_path)

    ids = tokenizer.encode("hello 語")
    assert ids == backend.encode("hello 語").ids
    assert ids[:2] == [1, vocab["▁hello"]] and vocab["<0xE8>"] in ids  # 語 is E8 AA 9E, in bytes
    assert tokenizer.decode(ids) == backend.decode(ids) == "hello 語"
    assert tokenizer.eos_ids == {2} and tokenizer.chat_template is None
