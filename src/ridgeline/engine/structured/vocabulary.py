"""The model's vocabulary as llguidance needs it: each token's bytes, which tokens are control tokens (never
matched as text, so a grammar cannot be satisfied by "<end_of_turn>" spelled as one token), the end tokens, and
the tokenizer itself (llguidance re-tokenises forced text through it)."""

from dataclasses import dataclass

import llguidance
import numpy as np

from ridgeline.model.tokenizer.base import Tokenizer


class _Vocabulary:
    """The shape llguidance.TokenizerWrapper reads: tokens, eos/bos ids, special ids, and a text -> ids call."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        self._tokenizer = tokenizer
        known = min(tokenizer.vocab_size, vocab_size)
        self.tokens = [tokenizer.token_bytes(i) for i in range(known)] + [b""] * (vocab_size - known)
        # Rows past the tokenizer's vocabulary (embedding padding) are control tokens too: never text.
        self.special_token_ids = [i for i in range(known) if tokenizer.is_special(i)] + list(range(known, vocab_size))
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.eos_ids)
        self.bos_token_id = tokenizer.bos_id

    def __call__(self, text: str) -> list[int]:
        if isinstance(text, bytes):  # llguidance asks first whether bytes are taken: they are not
            raise TypeError("text only")
        return self._tokenizer.encode(text, add_bos=False)


def grammar_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer, vocab_size))
    return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=sorted(tokenizer.eos_ids))


# What a JSON answer that must end soon is steered to (matcher.py, "closing"): inside a string, a token that closes
# it (a quote, maybe followed by brackets and braces); outside, first tokens made only of closing brackets and braces,
# then short structural or value tokens; so the answer closes in a few tokens instead of being cut at max_tokens.
# Each tier applies only where the grammar allows some of it; end tokens are in every tier (ending is closing).
IN_STRING_TIERS = (lambda text: text[:1] == b'"' and set(text) <= set(b'"]}'),)
OUT_OF_STRING_TIERS = (lambda text: set(text) <= set(b"]}"),
                       lambda text: set(text) <= set(b'"]}[{,:0 ') or text.strip() in (b"null", b"true", b"false"))


@dataclass
class ClosingVocabulary:
    token_bytes: list[bytes]  # what each token spells ("" for control tokens), to follow whether a string is open
    in_string: list[np.ndarray]  # per tier, a bitmask in llguidance's layout (int32 words, bit i of word i // 32)
    out_of_string: list[np.ndarray]


def closing_vocabulary(tokenizer: Tokenizer, vocab_size: int) -> ClosingVocabulary:
    known = min(tokenizer.vocab_size, vocab_size)
    texts = [b"" if tokenizer.is_special(i) else tokenizer.token_bytes(i) for i in range(known)]
    texts += [b""] * (vocab_size - known)
    ends = sorted(i for i in tokenizer.eos_ids if i < vocab_size)

    def bitmask(test) -> np.ndarray:
        bits = np.zeros(((vocab_size + 31) // 32) * 32, dtype=np.uint8)
        bits[[i for i, text in enumerate(texts) if text and test(text)]] = 1
        bits[ends] = 1
        return np.packbits(bits, bitorder="little").view(np.int32)

    return ClosingVocabulary(texts, [bitmask(t) for t in IN_STRING_TIERS], [bitmask(t) for t in OUT_OF_STRING_TIERS])
