"""One request's grammar state: the tokens it allows next, and the tokens it has taken.

The mask is llguidance's bitmask as it comes (one bit a token, 32 to an int32 word), filled for the whole step's
batch in one call (fill_masks) on the engine's mask worker. Nothing else is built ahead: a plain greedy request's
token is its row's argmax wherever the grammar allows it (one bit read), else the best of the allowed ones
(masked_argmax, which unpacks the bits only then); a sampled request's row is masked with the others of its batch
in one vectorised op in the sampler (apply_grammar_masks), not through a float row built per request.

torch is imported where a tensor is touched, not with the module: admission compiles grammars through this module,
and the CLI commands that only admit or simulate (their errors included) would otherwise pay ~2 s importing it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

import llguidance

if TYPE_CHECKING:
    import torch

from ridgeline.engine.structured.vocabulary import ClosingVocabulary

# Bit -> additive bias, for bias() (tests and tools; the sampler masks whole batches with apply_grammar_masks).
_BIAS = np.array([-np.inf, 0.0], dtype=np.float32)
_WORD_BITS = np.arange(32)
SPARSE_FRACTION = 16  # at most vocab / 16 allowed: masked_argmax gathers them instead of masking the whole row
# Set bits per int32 word (numpy >= 2 counts them directly; older ones unpack).
_popcount = getattr(np, "bitwise_count", None) or \
    (lambda words: np.unpackbits(words.view(np.uint8).reshape(-1, 4), axis=1).sum(axis=1))


def closing_window(max_tokens: int | None) -> int | None:
    """How many tokens before max_tokens a JSON answer starts closing (None: never, no max_tokens). A quarter of the
    budget, 4 to 32 tokens: what closing a few open strings, arrays and objects takes."""
    return None if max_tokens is None else max(4, min(32, max_tokens // 4))


@dataclass
class SamplingMasks:
    """Masks computed when a row is sampled rather than ahead on the mask worker (a row that checked the token it
    chose unmasked and was refused, or one nothing asked ahead for): their time is on the step's critical path."""

    count: int = 0
    seconds: float = 0.0


class GrammarMatcher:
    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int, close_at: int | None = None,
                 closing: ClosingVocabulary | None = None, sampling_masks: SamplingMasks | None = None):
        """close_at: from this many output tokens on, the next token is taken from the first closing tier
        (vocabulary.py) the grammar allows any of, so the answer ends before max_tokens (JSON answers only).
        sampling_masks: where the masks this matcher computes itself (compute(), not fill_masks) are counted."""
        self._matcher = matcher
        self._sampling_masks = sampling_masks
        self.vocab_size = vocab_size
        self.num_consumed = 0  # output tokens the grammar has taken
        self.close_at = close_at if closing is not None else None
        self._closing = closing
        self._in_string = False  # the JSON written so far ends inside a string (followed only when closing may come)
        self._escaped = False
        self.closed_early = False  # a token was steered by closing
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)  # bit t of word t // 32: token t allowed
        self._bits: np.ndarray | None = None  # 1 where allowed, one byte a token: unpacked only when asked for
        self._few: np.ndarray | None = None  # the allowed ids, where they are few (_allowed_few)
        self._few_at = -1  # num_consumed _few was found for
        self._at = -1  # num_consumed the mask was computed for

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and takes nothing more (an end token included): the request is done."""
        return self._matcher.is_stopped()

    @property
    def error(self) -> str | None:
        return self._matcher.get_error() if self._matcher.is_error() else None

    @property
    def needs_mask(self) -> bool:
        """This position's mask is not computed yet."""
        return self._at != self.num_consumed

    def compute(self) -> None:
        """This position's mask, once per position, by whichever asks first (the engine asks ahead, for the whole
        batch at once, on its mask worker while the forward pass runs: fill_masks)."""
        if self.needs_mask:
            started = time.perf_counter()
            self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)  # drops the GIL
            self._computed()
            if self._sampling_masks is not None:
                self._sampling_masks.count += 1
                self._sampling_masks.seconds += time.perf_counter() - started

    @property
    def closing(self) -> bool:
        """The answer is near max_tokens: this position's mask is narrowed to the closing tokens."""
        return self.close_at is not None and self.num_consumed >= self.close_at

    def _computed(self) -> None:
        if self.closing:
            self._close()
        self._bits = None  # _few is keyed by position (_few_at)
        self._at = self.num_consumed

    def words(self) -> np.ndarray:
        """[ceil(vocab / 32)] int32: bit t % 32 of word t // 32 is set where token t may come next."""
        self.compute()
        return self._words

    def _unpack(self) -> np.ndarray:
        """The mask one byte a token."""
        self.compute()
        if self._bits is None:
            self._bits = np.unpackbits(self._words.view(np.uint8), count=self.vocab_size, bitorder="little")
        return self._bits

    def _allowed_few(self) -> np.ndarray | None:
        """The allowed ids where they are few (at most vocab / SPARSE_FRACTION: masked_argmax's gather), else None.
        Found from the mask's nonzero words alone (8k words scanned, not 262k bytes unpacked): a closing answer's
        mask, the closing tokens the grammar allows, is a few dozen ids."""
        self.compute()
        if self._few_at != self._at:
            self._few, self._few_at = None, self._at
            words = np.flatnonzero(self._words)
            few = self.vocab_size // SPARSE_FRACTION
            if len(words) * 32 <= few or (len(words) <= few and int(_popcount(self._words[words]).sum()) <= few):
                in_words = np.unpackbits(self._words[words].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
                self._few = (words[:, None] * 32 + _WORD_BITS)[in_words.view(np.bool_)]
        return self._few

    def bias(self) -> torch.Tensor:
        """[vocab] float32: 0 where the next token may be, -inf where the grammar forbids it."""
        import torch

        return torch.from_numpy(np.take(_BIAS, self._unpack()))

    def masked_argmax(self, logits: torch.Tensor, best: int) -> int:
        """The first largest of `logits` ([vocab], on the CPU) among the tokens allowed; `best` is its unmasked
        argmax, the answer wherever the grammar allows it (one bit read). Else, among few allowed tokens, a gather;
        among many, the whole row masked. Exactly the argmax of the masked row, ties included (first of equals)."""
        if self.allows(best):
            return best
        values = logits.numpy()
        few = self._allowed_few()
        if few is not None:
            return int(few[values[few].argmax()])
        return int(np.where(self._unpack().view(np.bool_), values, -np.inf).argmax())

    def _close(self) -> None:
        for tier in self._closing.in_string if self._in_string else self._closing.out_of_string:
            narrowed = self._words & tier
            if narrowed.any():
                self.closed_early |= not np.array_equal(narrowed, self._words)
                self._words = narrowed
                return

    def allows(self, token_id: int) -> bool:
        """One bit of the mask where it is computed; else llguidance's check of that one token, ~2 us against
        ~30 us for a whole mask over 262k tokens (a plain greedy row and a row sampled with temperature alone ask
        this first, and need their mask only if the answer is no: engine/sampler.py). While closing, the mask is
        the grammar's narrowed to the first closing tier it meets (_close): a token in the first tier that the
        grammar allows is in it, whatever the rest of the mask; any other answer needs the mask."""
        if self.needs_mask:
            if not self.closing:
                return self._matcher.validate_tokens([token_id]) == 1
            first_tier = (self._closing.in_string if self._in_string else self._closing.out_of_string)[0]
            if _bit(first_tier, token_id) and self._matcher.validate_tokens([token_id]) == 1:
                return True
            self.compute()
        return _bit(self._words, token_id)

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


def _bit(words: np.ndarray, token_id: int) -> bool:
    return bool((int(words[token_id >> 5]) >> (token_id & 31)) & 1)


def fill_masks(executor: llguidance.LLExecutor, matchers: list[GrammarMatcher]) -> None:
    """The masks of every matcher not yet computed at its position, in one llguidance call into one fresh [rows,
    words] buffer (each matcher keeps a view of its row: fresh, so no later step overwrites a mask still read)."""
    stale = [matcher for matcher in matchers if matcher.needs_mask]
    if not stale:
        return
    words = stale[0]._words.shape[0]
    buffer = np.empty((len(stale), words), dtype=np.int32)
    executor.unsafe_compute_mask_ptr([(matcher._matcher, i) for i, matcher in enumerate(stale)],
                                     buffer.ctypes.data, words * 4, len(stale))  # drops the GIL
    for matcher, row in zip(stale, buffer):
        matcher._words = row
        matcher._computed()


def apply_grammar_masks(logits: torch.Tensor, rows: list[int], words: list[np.ndarray]) -> None:
    """In place on float32 logits [R, vocab]: -inf at row rows[i]'s tokens that words[i] (a packed mask) forbids.
    The values are those of adding a 0 / -inf row, without a float row per request and with less memory traffic,
    which is what a 262k row costs: where a mask's forbidden tokens lie in few words, only they are written; where
    its allowed ones do (between JSON values), those are kept and the row refilled; the other rows are unpacked
    whole and selected, all in one op (not masked_fill, which branches per entry)."""
    import torch

    vocab = logits.shape[-1]
    forbidden = torch.tensor(float("-inf"), device=logits.device)
    mixed_rows, mixed_words = [], []
    for row, packed in zip(rows, words):
        # By words, not tokens: finding the ids costs by the words they lie in, and ~10k tokens spread over 8k
        # words (what a JSON string allows of Gemma's vocabulary) are cheaper selected whole.
        partial = np.flatnonzero(packed != -1)  # the words with a forbidden token
        if len(partial) * 32 <= vocab // SPARSE_FRACTION:
            ids = _set_bits(partial, ~packed[partial], vocab)
            logits[row].index_fill_(0, torch.from_numpy(ids).to(logits.device), float("-inf"))
            continue
        nonzero = np.flatnonzero(packed)
        if len(nonzero) * 32 <= vocab // SPARSE_FRACTION:
            ids = torch.from_numpy(_set_bits(nonzero, packed[nonzero], vocab)).to(logits.device)
            target = logits[row]  # a row's view: 1-d index ops (2-d advanced indexing is ~50x slower here)
            kept = target.index_select(0, ids)
            target.fill_(float("-inf"))
            target.index_copy_(0, ids, kept)
            continue
        mixed_rows.append(row)
        mixed_words.append(packed)
    if not mixed_rows:
        return
    allowed = np.unpackbits(np.stack(mixed_words).view(np.uint8), axis=1, count=vocab, bitorder="little")
    allowed = torch.from_numpy(allowed.view(np.bool_)).to(logits.device)
    if mixed_rows == list(range(mixed_rows[0], mixed_rows[0] + len(mixed_rows))):  # one slice: one op
        target = logits[mixed_rows[0]:mixed_rows[0] + len(mixed_rows)]
        torch.where(allowed, target, forbidden, out=target)
    else:
        for i, row in enumerate(mixed_rows):
            torch.where(allowed[i], logits[row], forbidden, out=logits[row])


def _set_bits(word_ids: np.ndarray, words: np.ndarray, vocab: int) -> np.ndarray:
    """The token ids of the set bits of `words` (int32, at word positions word_ids), below vocab."""
    bits = np.unpackbits(words.view(np.uint8).reshape(-1, 4), axis=1, bitorder="little").view(np.bool_)
    ids = (word_ids[:, None] * 32 + _WORD_BITS)[bits]
    return ids[ids < vocab]
