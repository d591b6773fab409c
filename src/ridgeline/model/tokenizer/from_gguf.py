"""Build the tokenizer a GGUF file describes in its `tokenizer.*` metadata."""

import re
from collections.abc import Mapping
from typing import Any

from gguf import GGUFReader, TokenType

from ridgeline.errors import ModelLoadError, RidgelineError, UnsupportedError
from ridgeline.model.gguf_index import read_fields
from ridgeline.model.tokenizer.base import END_OF_GENERATION_TEXTS, Tokenizer, end_of_generation_ids
from ridgeline.model.tokenizer.bpe import byte_level_bpe
from ridgeline.model.tokenizer.hf import HfTokenizer
from ridgeline.model.tokenizer.spm import SpmTokenizer

_MISSING = object()
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _is_a(value: object, kind: type | tuple[type, ...]) -> bool:
    # bool is an int to Python, but not to a file's metadata
    return isinstance(value, kind) and not (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)))


def _names(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))


def tokenizer_from_gguf(source: GGUFReader | Mapping[str, Any]) -> Tokenizer:
    """From an open reader, or from the metadata values a reader gave (see gguf_index: a warm start has no reader)."""
    fields = read_fields(source) if isinstance(source, GGUFReader) else source

    # A file may hold anything under these keys: each value is checked for type (and ids for range) here, so a
    # broken vocabulary is one ModelLoadError naming the key, not an IndexError on the first request.
    def field(key: str, default=_MISSING, kind: type | tuple[type, ...] = object):
        if key not in fields:
            if default is _MISSING:
                raise ModelLoadError(f"GGUF metadata lacks {key}")
            return default
        if not _is_a(fields[key], kind):
            raise ModelLoadError(f"GGUF metadata {key} has the wrong type ({type(fields[key]).__name__})")
        return fields[key]

    def token_id(key: str) -> int | None:
        value = field(key, None, int)
        if value is not None and not 0 <= value < len(tokens):
            raise ModelLoadError(f"GGUF metadata {key} = {value} is outside the vocabulary of {len(tokens)} tokens")
        return value

    def per_token(key: str, default: list, kind: type | tuple[type, ...]) -> list:
        values = field(key, None, list) or default
        kinds = set(kind if isinstance(kind, tuple) else (kind,))  # exact types: a bool array is no int array
        if len(values) != len(tokens) or not all(type(v) in kinds for v in values):
            raise ModelLoadError(f"GGUF metadata {key} should hold one {_names(kind)} per token ({len(tokens)})")
        return values

    kind = field("tokenizer.ggml.model", kind=str)
    tokens = field("tokenizer.ggml.tokens", kind=list)
    if not tokens or not all(isinstance(token, str) for token in tokens):
        raise ModelLoadError("GGUF metadata tokenizer.ggml.tokens should be a non-empty list of strings")
    # Files without token types mark nothing special; every token is then normal text (type 1).
    types = per_token("tokenizer.ggml.token_type", [1] * len(tokens), int)
    bos_id = token_id("tokenizer.ggml.bos_token_id")
    eos_id = token_id("tokenizer.ggml.eos_token_id")
    declared_eos = [eos_id, token_id("tokenizer.ggml.eot_token_id"), token_id("tokenizer.ggml.eom_token_id")]
    wanted = set(END_OF_GENERATION_TEXTS)
    named = {token: token_id for token_id, token in enumerate(tokens) if token in wanted}
    common = dict(
        bos_id=bos_id,
        eos_id=eos_id,
        eos_ids=end_of_generation_ids(declared_eos, named.get),
        add_bos=field("tokenizer.ggml.add_bos_token", kind == "llama", bool),  # llama.cpp's default per vocab kind
        chat_template=field("tokenizer.chat_template", None, str),
    )

    if kind == "llama":
        for token_id_, (piece, token_type) in enumerate(zip(tokens, types)):
            if token_type == TokenType.BYTE and not _BYTE_PIECE.fullmatch(piece):
                raise ModelLoadError(f"GGUF byte token {token_id_} is {piece[:20]!r}, not <0xNN>")
        return SpmTokenizer(
            tokens,
            per_token("tokenizer.ggml.scores", [0.0] * len(tokens), (int, float)),
            types,
            unknown_id=token_id("tokenizer.ggml.unknown_token_id"),
            add_space_prefix=field("tokenizer.ggml.add_space_prefix", True, bool),
            **common,
        )
    if kind == "gpt2":
        merges = field("tokenizer.ggml.merges", kind=list)
        if not all(isinstance(merge, str) and " " in merge for merge in merges):
            raise ModelLoadError("GGUF metadata tokenizer.ggml.merges should be a list of 'left right' strings")
        pre = field("tokenizer.ggml.pre", "default", str)
        try:
            backend = byte_level_bpe(tokens, merges, types, pre)
        except RidgelineError:
            raise
        except Exception as error:  # noqa: BLE001 - `tokenizers` raises its own types for a malformed vocabulary
            raise ModelLoadError(f"GGUF byte-level vocabulary is malformed: {' '.join(str(error).split())[:300]}") from None
        return HfTokenizer(backend, byte_level=True, **common)
    raise UnsupportedError(f"unsupported tokenizer model {kind!r} in GGUF metadata (supported: llama, gpt2)")
