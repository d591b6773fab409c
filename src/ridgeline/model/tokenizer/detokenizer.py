"""Streaming detokenisation: text out as soon as it is whole, one token id in at a time."""

import codecs

from ridgeline.model.tokenizer.base import Tokenizer


class IncrementalDetokenizer:
    """push() returns the text a new token completes. A character whose UTF-8 bytes are split across byte
    tokens is held back until its last byte arrives, so no chunk carries a broken character. All pushes
    plus flush() concatenate to tokenizer.decode(ids, skip_special)."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._strip_next_space = tokenizer.strip_leading_space

    def push(self, token_id: int) -> str:
        if self._skip_special and self._tokenizer.is_special(token_id):
            return ""
        return self._emit(self._utf8.decode(self._tokenizer.token_bytes(token_id)))

    def flush(self) -> str:
        """At the end of the stream: bytes of a character that never completed, as U+FFFD."""
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if self._strip_next_space and text:
            self._strip_next_space = False
            return text.removeprefix(" ")  # as decode() drops the space the encoder put in front
        return text
