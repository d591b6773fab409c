"""Per-request sampling settings (vLLM/OpenAI names and semantics) and their validation."""

import dataclasses
import math
from dataclasses import dataclass, field

from ridgeline.engine.structured.params import StructuredOutputsParams
from ridgeline.errors import InvalidParameterError

# Below this a temperature is treated as greedy: dividing by it would overflow the logits.
GREEDY_TEMPERATURE_EPS = 1e-5
MAX_TEMPERATURE = 100.0
MAX_N = 128  # OpenAI's own limit on `n`
MAX_LOGPROBS = 20  # OpenAI's limit on `top_logprobs` and vLLM's default max_logprobs
PENALTY_RANGE = (-2.0, 2.0)  # OpenAI's range for presence/frequency penalties
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 1024
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # OpenAI's range: -100 bans a token, +100 all but forces it
MAX_LOGIT_BIAS = 1024
PRIORITY_RANGE = (-(2**31), 2**31 - 1)  # a 32-bit integer, as vLLM's priority is typed


@dataclass
class SamplingParams:
    n: int = 1
    max_tokens: int | None = 16  # None: until EOS or the context is full; 0: score the prompt only
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # <= 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # HF/vLLM: over prompt + output tokens
    presence_penalty: float = 0.0  # OpenAI: over output tokens
    frequency_penalty: float = 0.0  # OpenAI: over output tokens
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-n logprobs of each generated token (0 = the sampled token's only)
    prompt_logprobs: int | None = None  # top-n logprobs of each prompt token
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit before sampling
    # A grammar the output must match (JSON schema, regex, choice, Lark/GBNF): tokens it forbids are masked
    # before sampling, greedy and random alike (engine/structured/).
    structured_outputs: StructuredOutputsParams | None = None
    # Scheduling priority, vLLM's semantics: a lower value is served first; equal values first come, first served
    # (engine/scheduler.py, docs/priority_scheduling.md). Not a sampling setting, but it travels with the request.
    priority: int = 0

    def __post_init__(self) -> None:
        # OpenAI accepts a single stop string; iterating it as a list would stop on every character.
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def changes_logits(self) -> bool:
        """Penalties or biases: the logits must be copied and edited before the token is chosen."""
        return self.has_penalties or bool(self.logit_bias)

    def child(self, index: int) -> "SamplingParams":
        """Params for the index-th of the n sequences of one request: n=1, and a distinct seed so seeded
        siblings do not all draw the same tokens (vLLM offsets the seed by the index the same way)."""
        seed = None if self.seed is None else self.seed + index
        return dataclasses.replace(self, n=1, seed=seed, stop=list(self.stop), stop_token_ids=list(self.stop_token_ids),
                                   logit_bias=dict(self.logit_bias))

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise RidgelineError naming the first field whose value is out of range."""
        _check_int("n", self.n, 1, MAX_N)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 0, None)
        _check_float("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        _check_float("top_p", self.top_p, 0.0, 1.0)
        if self.top_p <= 0.0:
            _fail("top_p", self.top_p, "must be in (0, 1]")
        _check_int("top_k", self.top_k, -1, None)
        _check_float("min_p", self.min_p, 0.0, 1.0)
        _check_float("repetition_penalty", self.repetition_penalty, 0.0, None)
        if self.repetition_penalty <= 0.0:
            _fail("repetition_penalty", self.repetition_penalty, "must be > 0")
        _check_float("presence_penalty", self.presence_penalty, *PENALTY_RANGE)
        _check_float("frequency_penalty", self.frequency_penalty, *PENALTY_RANGE)
        if self.seed is not None:
            _check_int("seed", self.seed, -(2**63), 2**64 - 1)  # what torch and numpy seeds accept
        if self.logprobs is not None:
            _check_int("logprobs", self.logprobs, 0, MAX_LOGPROBS)
        if self.prompt_logprobs is not None:
            _check_int("prompt_logprobs", self.prompt_logprobs, 0, MAX_LOGPROBS)
        _check_int("priority", self.priority, *PRIORITY_RANGE)
        self._validate_stop()
        self._validate_stop_token_ids(vocab_size)
        self._validate_logit_bias(vocab_size)
        if self.structured_outputs is not None:
            if not isinstance(self.structured_outputs, StructuredOutputsParams):
                _fail("structured_outputs", self.structured_outputs, "must be a StructuredOutputsParams")
            self.structured_outputs.validate()
        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                _fail(name, getattr(self, name), "must be a boolean")

    def _validate_stop(self) -> None:
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            _fail("stop", self.stop, "must be a string or a list of strings")
        if len(self.stop) > MAX_STOP_STRINGS:
            _fail("stop", f"{len(self.stop)} strings", f"allows at most {MAX_STOP_STRINGS} strings")
        for s in self.stop:
            if not s:
                _fail("stop", s, "must not contain an empty string")
            if len(s) > MAX_STOP_STRING_CHARS:
                _fail("stop", f"a {len(s)}-character string", f"strings must be at most {MAX_STOP_STRING_CHARS} characters")

    def _validate_stop_token_ids(self, vocab_size: int | None) -> None:
        if not isinstance(self.stop_token_ids, list):
            _fail("stop_token_ids", self.stop_token_ids, "must be a list of token ids")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            _fail("stop_token_ids", f"{len(self.stop_token_ids)} ids", f"allows at most {MAX_STOP_TOKEN_IDS} ids")
        upper = None if vocab_size is None else vocab_size - 1
        for token_id in self.stop_token_ids:
            _check_int("stop_token_ids", token_id, 0, upper)


    def _validate_logit_bias(self, vocab_size: int | None) -> None:
        if not isinstance(self.logit_bias, dict):
            _fail("logit_bias", self.logit_bias, "must map token ids to biases")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            _fail("logit_bias", f"{len(self.logit_bias)} entries", f"allows at most {MAX_LOGIT_BIAS} entries")
        upper = None if vocab_size is None else vocab_size - 1
        for token_id, bias in self.logit_bias.items():
            _check_int("logit_bias", token_id, 0, upper)
            _check_float("logit_bias", bias, *LOGIT_BIAS_RANGE)


def _fail(name: str, value: object, problem: str) -> None:
    raise InvalidParameterError(f"invalid sampling parameter {name}={value!r}: {problem}", param=name)


def _range_text(low: float | None, high: float | None) -> str:
    if high is None:
        return f"must be >= {low}"
    if low is None:
        return f"must be <= {high}"
    return f"must be in [{low}, {high}]"


def _check_int(name: str, value: object, low: int | None, high: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(name, value, "must be an integer")
    if (low is not None and value < low) or (high is not None and value > high):
        _fail(name, value, _range_text(low, high))


def _check_float(name: str, value: object, low: float, high: float | None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(name, value, "must be a finite number")
    if value < low or (high is not None and value > high):
        _fail(name, value, _range_text(low, high))
