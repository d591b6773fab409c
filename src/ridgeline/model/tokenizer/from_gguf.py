"""Build the tokenizer a GGUF file describes in its `tokenizer.*` metadata."""

from collections.abc import Mapping
from typing import Any

from gguf import GGUFReader

from ridgeline.errors import ModelLoadError, UnsupportedError
from ridgeline.model.gguf_index import read_fields
from ridgeline.model.tokenizer.base import END_OF_GENERATION_TEXTS, Tokenizer, end_of_generation_ids
from ridgeline.model.tokenizer.bpe import byte_level_bpe
from ridgeline.model.tokenizer.hf import HfTokenizer
from ridgeline.model.tokenizer.spm import SpmTokenizer

_MISSING = object()


def tokenizer_from_gguf(source: GGUFReader | Mapping[str, Any]) -> Tokenizer:
    """From an open reader, or from the metadata values a reader gave (see gguf_index: a warm start has no reader)."""
    fields = read_fields(source) if isinstance(source, GGUFReader) else source

    def field(key: str, default=_MISSING):
        if key in fields:
            return fields[key]
        if default is _MISSING:
            raise ModelLoadError(f"GGUF metadata lacks {key}")
        return default

    kind = field("tokenizer.ggml.model")
    tokens = field("tokenizer.ggml.tokens")
    # Files without token types mark nothing special; every token is then normal text (type 1).
    types = field("tokenizer.ggml.token_type", None) or [1] * len(tokens)
    bos_id = field("tokenizer.ggml.bos_token_id", None)
    eos_id = field("tokenizer.ggml.eos_token_id", None)
    declared_eos = [eos_id, field("tokenizer.ggml.eot_token_id", None), field("tokenizer.ggml.eom_token_id", None)]
    wanted = set(END_OF_GENERATION_TEXTS)
    named = {token: token_id for token_id, token in enumerate(tokens) if token in wanted}
    common = dict(
        bos_id=bos_id,
        eos_id=eos_id,
        eos_ids=end_of_generation_ids(declared_eos, named.get),
        add_bos=field("tokenizer.ggml.add_bos_token", kind == "llama"),  # llama.cpp's default per vocab kind
        chat_template=field("tokenizer.chat_template", None),
    )

    if kind == "llama":
        return SpmTokenizer(
            tokens,
            field("tokenizer.ggml.scores", None) or [0.0] * len(tokens),
            types,
            unknown_id=field("tokenizer.ggml.unknown_token_id", None),
            add_space_prefix=field("tokenizer.ggml.add_space_prefix", True),
            **common,
        )
    if kind == "gpt2":
        backend = byte_level_bpe(tokens, field("tokenizer.ggml.merges"), types, field("tokenizer.ggml.pre", "default"))
        return HfTokenizer(backend, byte_level=True, **common)
    raise UnsupportedError(f"unsupported tokenizer model {kind!r} in GGUF metadata (supported: llama, gpt2)")
