"""The model's vocabulary as llguidance needs it: each token's bytes, which tokens are control tokens (never
matched as text, so a grammar cannot be satisfied by "<end_of_turn>" spelled as one token), the end tokens, and
the tokenizer itself (llguidance re-tokenises forced text through it)."""

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


# Tokens a JSON answer that must end soon is steered to (matcher.py, "closing"): first those made only of closing
# characters (a quote, a bracket, a brace), else short structural or value tokens, so the answer closes in a few
# tokens instead of being cut at max_tokens, unfinished.
CLOSING_TIERS = (frozenset(b'"]}'), frozenset(b'"]}[{,:0 ') )
CLOSING_WORDS = {b"null", b"true", b"false", b" null", b" true", b" false"}


def closing_tiers(tokenizer: Tokenizer, vocab_size: int) -> list[np.ndarray]:
    """Per tier, a bitmask over the vocabulary (llguidance's layout: int32 words, bit i of word i // 32)."""
    tiers = []
    known = min(tokenizer.vocab_size, vocab_size)
    texts = [b"" if tokenizer.is_special(i) else tokenizer.token_bytes(i) for i in range(known)]
    for allowed in CLOSING_TIERS:
        bits = np.zeros(((vocab_size + 31) // 32) * 32, dtype=np.uint8)
        for i, text in enumerate(texts):
            if text and (set(text) <= allowed or (allowed is CLOSING_TIERS[-1] and text in CLOSING_WORDS)):
                bits[i] = 1
        bits[sorted(i for i in tokenizer.eos_ids if i < vocab_size)] = 1  # ending is closing too
        tiers.append(np.packbits(bits, bitorder="little").view(np.int32))
    return tiers
