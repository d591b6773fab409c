"""The model's vocabulary as llguidance needs it: each token's bytes, which tokens are control tokens (never
matched as text, so a grammar cannot be satisfied by "<end_of_turn>" spelled as one token), the end tokens, and
the tokenizer itself (llguidance re-tokenises forced text through it)."""

import llguidance

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
