"""SentencePiece-style vocabulary (GGUF `tokenizer.ggml.model = llama`, as in Gemma), tokenized as llama.cpp does.

Each piece of raw text becomes one symbol per character (spaces written as U+2581). Adjacent symbols whose
concatenation is in the vocabulary are candidate merges; the candidate with the highest vocabulary score
(leftmost on ties) is merged first, until none is left. Characters no token covers fall back to <0xNN>
byte tokens.

The merge is run word by word, and a word seen before is not merged again. That gives the same ids as one merge
over the whole text: the text is cut only before a U+2581 whose preceding character no vocabulary piece has
before a U+2581, so no piece can span a cut, no candidate merge ever crosses one, and each side's merges go on
as if the other were not there. (Gemma's 262k pieces have one such character, ">" in ">▁</".) Merging short
runs is cheaper (smaller queues), and prompts repeat their words: a prompt of 256 English words took 5.9–6.2 ms
as one merge, 2.7–3.6 ms word by word with no word cached and 0.3–0.5 ms with all cached. This runs on the
server's event loop, once per request.
"""

import heapq
import re
from functools import cached_property, lru_cache

from gguf import TokenType

from ridgeline.errors import ModelLoadError
from ridgeline.model.tokenizer.base import Tokenizer
from ridgeline.model.tokenizer.special_split import split_on_special

SPACE_MARK = "\u2581"
# Longer words are merged each time: the cache holds 2**16 words, and unbounded words would make it unbounded.
CACHED_WORD_CHARS = 64


class SpmTokenizer(Tokenizer):
    def __init__(
        self,
        pieces: list[str],
        scores: list[float],
        types: list[int],
        *,
        unknown_id: int | None,
        add_space_prefix: bool,
        **common,
    ) -> None:
        super().__init__(vocab_size=len(pieces), strip_leading_space=add_space_prefix, **common)
        self.pieces = pieces
        self.scores = scores
        self.types = types
        self.unknown_id = unknown_id
        self.add_space_prefix = add_space_prefix

    @cached_property
    def piece_to_id(self) -> dict[str, int]:
        # Built on first use: 262k entries take a moment. Duplicate pieces resolve to the last id, as in llama.cpp.
        return {piece: token_id for token_id, piece in enumerate(self.pieces)}

    @cached_property
    def _specials(self) -> dict[bool, list[tuple[str, int]]]:
        """Specials cut out before merging, longest first: user-defined always, control/unknown only when asked."""
        always, on_request = (TokenType.USER_DEFINED,), (TokenType.CONTROL, TokenType.UNKNOWN)
        by_length = sorted(range(self.vocab_size), key=lambda i: -len(self.pieces[i]))

        def select(kinds: tuple[int, ...]) -> list[tuple[str, int]]:
            return [(self.pieces[i], i) for i in by_length if self.types[i] in kinds and self.pieces[i]]

        return {False: select(always), True: select(always + on_request)}

    def is_special(self, token_id: int) -> bool:
        if not 0 <= token_id < self.vocab_size:
            return False
        return self.types[token_id] in (TokenType.CONTROL, TokenType.UNKNOWN, TokenType.UNUSED)

    def token_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < self.vocab_size:
            return b""  # an id the vocabulary lacks (the model's rows may outnumber it) stands for no text
        piece, kind = self.pieces[token_id], self.types[token_id]
        if kind == TokenType.BYTE:
            return bytes([int(piece[3:5], 16)])  # "<0xNN>"
        if kind == TokenType.NORMAL:
            return piece.replace(SPACE_MARK, " ").encode()
        return piece.encode()  # control and user-defined tokens stand for their own text

    def encode_text(self, text: str, special: bool) -> list[int]:
        ids: list[int] = []
        after_special = True
        for part in split_on_special(text, self._specials[special]):
            if isinstance(part, int):
                ids.append(part)
                after_special = True
                continue
            if self.add_space_prefix and after_special:
                part = " " + part
            for word in self._word_start.split(part.replace(" ", SPACE_MARK)):
                ids.extend(self._merge_word(word) if len(word) <= CACHED_WORD_CHARS else self._merge(word))
            after_special = False
        return ids

    @cached_property
    def _word_start(self) -> re.Pattern:
        """Matches the empty string where a word may start: before a U+2581 that follows a character no piece
        has directly before a U+2581 (see the module's note)."""
        joined = {piece[i - 1] for piece in self.pieces for i in range(1, len(piece)) if piece[i] == SPACE_MARK}
        kept = "".join(re.escape(char) for char in sorted(joined | {SPACE_MARK}))
        return re.compile(f"(?<=[^{kept}])(?={SPACE_MARK})")

    @cached_property
    def _merge_word(self):
        # Per tokenizer, not per class: a class-level cache would keep every tokenizer (and its vocabulary) alive.
        # Bounded in count and (by CACHED_WORD_CHARS) in size, since a server sees any text: a few tens of MB at worst.
        cached = lru_cache(maxsize=2**16)(lambda word: tuple(self._merge(word)))
        return cached

    def _merge(self, text: str) -> list[int]:
        vocab, scores = self.piece_to_id, self.scores
        # Symbol i covers text[i : i + length[i]]; a symbol merged into its left neighbour gets length 0.
        length = [1] * len(text)
        previous = list(range(-1, len(text) - 1))
        queue: list[tuple[float, int, int, int]] = []

        def offer(left: int, right: int) -> None:
            if left < 0 or right >= len(text):
                return
            size = length[left] + length[right]
            token_id = vocab.get(text[left : left + size])
            if token_id is not None:
                heapq.heappush(queue, (-scores[token_id], left, right, size))

        for i in range(1, len(text)):
            offer(i - 1, i)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # stale: one side has merged with something else since
            length[left] = size
            length[right] = 0
            following = left + size
            if following < len(text):
                previous[following] = left
            offer(previous[left], left)
            offer(left, following)

        ids: list[int] = []
        i = 0
        while i < len(text):
            piece = text[i : i + length[i]]
            token_id = vocab.get(piece)
            ids.extend([token_id] if token_id is not None else self._byte_ids(piece))
            i += length[i]
        return ids

    def _byte_ids(self, piece: str) -> list[int]:
        ids = []
        for byte in piece.encode():
            token_id = self.piece_to_id.get(f"<0x{byte:02X}>", self.unknown_id)
            if token_id is None:
                raise ModelLoadError(f"the vocabulary has neither a byte token for 0x{byte:02X} nor an unknown token")
            ids.append(token_id)
        return ids
