"""One request's grammar state: the tokens it allows next, and the tokens it has taken.

The mask is llguidance's bitmask unpacked to one byte a token (~0.01 ms). A plain greedy request needs no more: its
token is the row's argmax where the grammar allows it, else the best of the allowed ones (masked_argmax), with no
copy of the logits. Any other request gets an additive row (0 / -inf) the sampler adds to its logits."""

import numpy as np
import torch

import llguidance

from ridgeline.engine.structured.vocabulary import ClosingVocabulary

# Bit -> additive bias. A gather through this table costs the same whatever the mask (~0.3 ms for 262k tokens);
# masked_fill with a boolean row costs 1-2 ms on a mixed mask (a branch per entry), and the add that applies the
# row to the logits ~0.04 ms. The row is built ahead, off the step's critical path (engine/structured/masks.py).
_BIAS = np.array([-np.inf, 0.0], dtype=np.float32)
_WORD_BITS = np.arange(32)
SPARSE_FRACTION = 16  # at most vocab / 16 allowed: masked_argmax gathers them instead of masking the whole row


def closing_window(max_tokens: int | None) -> int | None:
    """How many tokens before max_tokens a JSON answer starts closing (None: never, no max_tokens). A quarter of the
    budget, 4 to 32 tokens: what closing a few open strings, arrays and objects takes."""
    return None if max_tokens is None else max(4, min(32, max_tokens // 4))


class GrammarMatcher:
    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, close_at: int | None = None,
                 closing: ClosingVocabulary | None = None):
        """close_at: from this many output tokens on, the next token is taken from the first closing tier
        (vocabulary.py) the grammar allows any of, so the answer ends before max_tokens (JSON answers only)."""
        self._matcher = matcher
        self.vocab_size = vocab_size
        self.num_consumed = 0  # output tokens the grammar has taken
        self.close_at = close_at if closing is not None else None
        self._closing = closing
        self._in_string = False  # the JSON written so far ends inside a string (followed only when closing may come)
        self._escaped = False
        self.closed_early = False  # a token was steered by closing
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
        self._bits = np.zeros(vocab_size, dtype=np.uint8)  # 1 where allowed
        self._few: np.ndarray | None = None  # the allowed ids, where they are few
        self._bias: torch.Tensor | None = None
        self._at = -1  # num_consumed the mask was computed for
        self.needs_bias = True  # the engine says False for a plain greedy request (masked_argmax suffices)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and takes nothing more (an end token included): the request is done."""
        return self._matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None

    def compute(self) -> None:
        """This position's mask: its bits (a bool row, and the allowed ids where they are few) and, for a request
        that needs it (needs_bias), the additive row. Once per position, by whichever thread asks first (the
        engine asks ahead, on its mask worker, while the forward pass runs)."""
        if self._at != self.num_consumed:
            self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)  # drops the GIL
            if self.close_at is not None and self.num_consumed >= self.close_at:
                self._close()
            self._bits = np.unpackbits(self._words.view(np.uint8), count=self.vocab_size, bitorder="little")
            self._few = None
            words = np.flatnonzero(self._words)  # 8k words scanned, not 262k bytes
            if len(words) * 32 <= self.vocab_size // SPARSE_FRACTION or \
                    np.count_nonzero(self._bits) <= self.vocab_size // SPARSE_FRACTION:
                in_words = np.unpackbits(self._words[words].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
                self._few = (words[:, None] * 32 + _WORD_BITS)[in_words.view(np.bool_)]
            self._bias = None
            self._at = self.num_consumed
        if self.needs_bias and self._bias is None:
            self._bias = torch.from_numpy(np.take(_BIAS, self._bits))

    def bias(self) -> torch.Tensor:
        """[vocab] float32: 0 where the next token may be, -inf where the grammar forbids it."""
        self.compute()
        if self._bias is None:
            self._bias = torch.from_numpy(np.take(_BIAS, self._bits))
        return self._bias

    def masked_argmax(self, logits: torch.Tensor, best: int) -> int:
        """The first largest of `logits` ([vocab], on the CPU) among the tokens allowed; `best` is its unmasked
        argmax, the answer wherever the grammar allows it. Else, among few allowed tokens, a gather; among many, the
        whole row masked. Exactly the argmax of the masked row, ties included (first of equals)."""
        self.compute()
        if self._bits[best]:
            return best
        values = logits.numpy()
        if self._few is not None:
            return int(self._few[values[self._few].argmax()])
        return int(np.where(self._bits.view(np.bool_), values, -np.inf).argmax())

    def _close(self) -> None:
        for tier in self._closing.in_string if self._in_string else self._closing.out_of_string:
            narrowed = self._words & tier
            if narrowed.any():
                self.closed_early |= not np.array_equal(narrowed, self._words)
                self._words = narrowed
                return

    def allows(self, token_id: int) -> bool:
        self.compute()
        return bool(self._bits[token_id])

    def consume(self, token_ids: list[int]) -> bool:
        """Take the tokens sampled for this request; False if the grammar refuses one (then it stays in error)."""
        for token_id in token_ids:
            if not self._matcher.consume_token(token_id):
                return False
            self.num_consumed += 1
            if self.close_at is not None:
                self._follow(self._closing.token_bytes[token_id])
        return True

    def _follow(self, text: bytes) -> None:
        for byte in text:
            if self._escaped:
                self._escaped = False
            elif self._in_string and byte == 0x5C:  # backslash
                self._escaped = True
            elif byte == 0x22:  # quote
                self._in_string = not self._in_string
