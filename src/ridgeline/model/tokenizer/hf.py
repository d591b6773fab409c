"""Tokenizers run by the Hugging Face `tokenizers` library: tokenizer.json directories and GGUF byte-level BPE."""

import json
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer as BackendTokenizer

from ridgeline.errors import ModelLoadError
from ridgeline.model.tokenizer.base import Tokenizer, end_of_generation_ids


def _byte_level_decoding() -> dict[str, int]:
    """GPT-2's byte <-> character table, reversed: printable bytes stand for themselves, the rest are shifted
    past U+0100 in byte order, so every byte has a visible character in the vocabulary."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {byte: chr(byte) for byte in printable}
    for shift, byte in enumerate(b for b in range(256) if b not in chars):
        chars[byte] = chr(256 + shift)
    return {char: byte for byte, char in chars.items()}


BYTE_LEVEL_DECODING = _byte_level_decoding()


class HfTokenizer(Tokenizer):
    def __init__(self, backend: BackendTokenizer, *, byte_level: bool, **common) -> None:
        super().__init__(vocab_size=backend.get_vocab_size(with_added_tokens=True), **common)
        self.backend = backend
        self.byte_level = byte_level  # vocabulary written in GPT-2's byte characters, else SentencePiece-style
        added = backend.get_added_tokens_decoder()
        self._added_ids = frozenset(added)
        self._special_ids = frozenset(token_id for token_id, token in added.items() if token.special)

    @cached_property
    def _plain_text_backend(self) -> BackendTokenizer:
        # A second copy that reads special-token text as plain text, so neither copy changes mode under threads.
        backend = BackendTokenizer.from_str(self.backend.to_str())
        backend.encode_special_tokens = True
        return backend

    def encode_text(self, text: str, special: bool) -> list[int]:
        backend = self.backend if special else self._plain_text_backend
        return backend.encode(text, add_special_tokens=False).ids

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def token_bytes(self, token_id: int) -> bytes:
        piece = self.backend.id_to_token(token_id) if 0 <= token_id < self.vocab_size else None
        if piece is None:  # an id the vocabulary lacks (the model's rows may outnumber it) stands for no text
            return b""
        if token_id in self._added_ids:
            return piece.encode()
        if self.byte_level:
            return b"".join(
                bytes([BYTE_LEVEL_DECODING[c]]) if c in BYTE_LEVEL_DECODING else c.encode() for c in piece
            )
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode()


def tokenizer_from_hf_dir(path: str | Path) -> HfTokenizer:
    """tokenizer.json, with BOS/EOS and the chat template from tokenizer_config.json (and generation_config.json)."""
    path = Path(path)
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ModelLoadError(f"{path} has no tokenizer.json")
    source = file.read_text(encoding="utf-8")
    try:
        backend = BackendTokenizer.from_str(source)
        decoder = json.loads(source).get("decoder") or {}
    except Exception as error:  # the library raises its own exception types for malformed files
        raise ModelLoadError(f"{file} is not a valid tokenizer.json: {error}") from None
    config = _read_json(path / "tokenizer_config.json")
    generation = _read_json(path / "generation_config.json")

    bos_id = _token_id(backend, config.get("bos_token"))
    eos_id = _token_id(backend, config.get("eos_token"))
    declared_eos = generation.get("eos_token_id", [])
    declared_eos = declared_eos if isinstance(declared_eos, list) else [declared_eos]
    decoder_steps = _decoder_steps(decoder)
    return HfTokenizer(
        backend,
        byte_level=any(step.get("type") == "ByteLevel" for step in decoder_steps),
        bos_id=bos_id,
        eos_id=eos_id,
        eos_ids=end_of_generation_ids([eos_id, *declared_eos], backend.token_to_id),
        # The post-processor decides whether BOS is added, whatever tokenizer_config.json says.
        add_bos=bos_id is not None and bos_id in backend.encode("", add_special_tokens=True).ids,
        chat_template=_chat_template(path, config),
        strip_leading_space=any(_prepends_space(step) for step in decoder_steps),
        split_special_tokens=config.get("split_special_tokens") is True,
    )


def _read_json(file: Path) -> dict:
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ModelLoadError(f"{file} is not valid JSON: {error}") from None


def _token_id(backend: BackendTokenizer, token: str | dict | None) -> int | None:
    text = token.get("content") if isinstance(token, dict) else token
    return backend.token_to_id(text) if text else None


def _decoder_steps(decoder: dict) -> list[dict]:
    return [step for inner in decoder.get("decoders", []) for step in _decoder_steps(inner)] or [decoder]


def _prepends_space(step: dict) -> bool:
    """Decoders that undo a space the normaliser put in front of the text (SentencePiece's dummy prefix)."""
    if step.get("type") == "Strip":
        return step.get("content") == " " and step.get("start", 0) > 0
    if step.get("type") == "Metaspace":
        return step.get("prepend_scheme", "always" if step.get("add_prefix_space") else "never") != "never"
    return False


def _chat_template(path: Path, config: dict) -> str | None:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one is the chat template
        named = {entry.get("name"): entry.get("template") for entry in template}
        return named.get("default")
    return template
