"""Speculative decoding with an n-gram (prompt-lookup) proposer: guess the next tokens by finding the sequence's
latest n-gram earlier in its own tokens and proposing what followed it, then check the guesses in one forward pass.

A decode step is memory-bound: it reads every weight once whether it computes 1 row or 1 + k, so k guessed tokens
verified in the same step cost little more than one token and, when they are right, turn one stream into a small
batch. A greedy request accepts a guess while it equals the model's own argmax at its position, so the output is
token for token what decoding without speculation gives (the rows of the guesses take the same matmul path as
decode rows, batch invariance does the rest). A sampled request verifies by rejection sampling
(Sampler.verify_guesses), which keeps the target distribution exactly. Requests that ask for logprobs or use
penalties (which depend on the tokens before each position) decode one token a step as before.

Adaptive: each sequence proposes at most as many tokens as its last verification accepted plus one (up to
`num_tokens`), and one whose guesses keep failing stops proposing for a while, so text with nothing to copy runs as
fast as without speculation (the lookup is a dictionary probe per n-gram size).
"""

from dataclasses import dataclass, field

from ridgeline.engine.sequence import Sequence
from ridgeline.errors import RidgelineError

PAUSE_AFTER_MISSES = 3  # verifications in a row that accepted nothing ...
PAUSE_STEPS = 16  # ... stop proposing for this many steps


@dataclass(frozen=True)
class SpeculativeConfig:
    num_tokens: int = 0  # most tokens proposed per sequence and step (0: off)
    ngram_max: int = 4  # longest n-gram looked up
    ngram_min: int = 1  # shortest

    def __post_init__(self) -> None:
        if self.num_tokens < 0 or not 1 <= self.ngram_min <= self.ngram_max:
            raise RidgelineError(f"speculative decoding needs num_tokens >= 0 and 1 <= ngram_min <= ngram_max, got "
                                 f"{self.num_tokens}, {self.ngram_min}, {self.ngram_max}")


@dataclass
class _SequenceState:
    """An index of where each n-gram last ended in the sequence's tokens, grown as tokens arrive."""

    indexed: int = 0  # tokens [0, indexed) are in the index
    last_end: dict[tuple[int, ...], int] = field(default_factory=dict)  # n-gram -> end of its latest occurrence
    draft_len: int = 0
    misses: int = 0
    paused_until: int = 0
    steps: int = 0


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self._states: dict[str, _SequenceState] = {}
        self.num_proposed = 0
        self.num_accepted = 0
        self.num_verifications = 0

    @staticmethod
    def eligible(seq: Sequence) -> bool:
        params = seq.sampling_params
        return not params.has_penalties and params.logprobs is None

    def propose(self, seq: Sequence, room: int) -> list[int]:
        """Up to `room` guessed tokens to follow seq's tokens (none if nothing earlier matches its last n-gram)."""
        if room <= 0 or not self.eligible(seq):
            return []
        state = self._states.setdefault(seq.request_id, _SequenceState(draft_len=self.config.num_tokens))
        state.steps += 1
        if state.steps < state.paused_until:
            return []
        tokens = seq.token_ids
        self._index(state, tokens)
        for n in range(min(self.config.ngram_max, len(tokens) - 1), self.config.ngram_min - 1, -1):
            end = state.last_end.get(tuple(tokens[-n:]))
            if end is not None:
                guess = tokens[end:end + min(room, state.draft_len)]
                return list(guess)
        return []

    def _index(self, state: _SequenceState, tokens: list[int]) -> None:
        """Index every n-gram that ends before the sequence's last token (the last n-gram must match earlier)."""
        for end in range(max(state.indexed, 1), len(tokens)):
            for n in range(self.config.ngram_min, min(self.config.ngram_max, end) + 1):
                state.last_end[tuple(tokens[end - n:end])] = end
        state.indexed = max(state.indexed, len(tokens))

    def verified(self, seq: Sequence, proposed: int, accepted: int) -> None:
        """A verification accepted `accepted` of `proposed` guesses: adapt how many this sequence proposes next."""
        self.num_proposed += proposed
        self.num_accepted += accepted
        self.num_verifications += 1
        state = self._states.get(seq.request_id)
        if state is None:
            return
        state.draft_len = min(self.config.num_tokens, accepted + 1 if accepted < proposed else proposed + 1)
        state.misses = state.misses + 1 if accepted == 0 else 0
        if state.misses >= PAUSE_AFTER_MISSES:
            state.paused_until, state.misses = state.steps + PAUSE_STEPS, 0

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)
