"""The one check every request passes on its way into the engine, wherever it comes from (server, offline API,
workers): the prompt's ids, the sampling fields, and the context. It returns the request as the engine will run
it, with `max_tokens` resolved to what fits, so callers never re-derive limits of their own.

Pure: it reads fixed limits and never touches the engine's mutable state, so the server calls it on its event
loop (a bad request is refused before any response starts) while the engine thread steps.
Errors name the engine's field (`prompt`, `max_tokens`, `top_p`, ...); callers that name fields differently
(chat's `messages`, `max_completion_tokens`) translate `error.param`.
"""

from dataclasses import dataclass, replace

from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.structured.compiler import GrammarCompiler
from ridgeline.errors import ContextLengthError, InvalidParameterError
from ridgeline.model.tokenizer.base import Tokenizer


@dataclass(frozen=True)
class AdmittedRequest:
    """A request that passed admission: valid ids, valid params, max_tokens resolved to fit the context."""

    prompt_token_ids: tuple[int, ...]
    params: SamplingParams


@dataclass(frozen=True)
class AdmissionLimits:
    vocab_size: int  # the model's (embedding rows): the one vocabulary size ids are checked against
    max_seq_len: int  # prompt + output tokens one sequence may reach (context, --max-model-len, KV pool)
    max_num_batched_tokens: int
    chunked_prefill: bool


class Admission:
    def __init__(self, limits: AdmissionLimits, tokenizer: Tokenizer | None = None,
                 grammars: GrammarCompiler | None = None):
        self.limits = limits
        self.tokenizer = tokenizer  # None: only token-id prompts (simulator, workers handed ids)
        # Compiles (and caches) structured-output constraints; None: an engine without a tokenizer takes none.
        self.grammars = grammars

    @property
    def max_seq_len(self) -> int:
        return self.limits.max_seq_len

    def prompt_ids(self, prompt: str | list[int], *, special: bool | None = None) -> list[int]:
        """Token ids of a text or of a token-id prompt (taken as it is); refuses an empty prompt and ids outside
        the vocabulary. `special`: whether special-token text ("<bos>", "<start_of_turn>") in a text prompt becomes
        the special token, as Hugging Face tokenizers and llama.cpp's parse_special do; None: yes, unless the
        tokenizer's files say to split such text (split_special_tokens)."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidParameterError("the prompt must not be empty", param="prompt")
            if self.tokenizer is None:
                raise InvalidParameterError("this engine takes token ids only (it has no tokenizer)", param="prompt")
            if special is None:
                special = not self.tokenizer.split_special_tokens
            ids = self.tokenizer.encode(prompt, special=special)
        else:
            ids = list(prompt)
        if not ids:
            raise InvalidParameterError("the prompt must not be empty", param="prompt")
        vocab = self.limits.vocab_size
        bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidParameterError(f"token id {bad!r} in the prompt is outside the vocabulary [0, {vocab})",
                                        param="prompt")
        return ids

    def admit(self, prompt: str | list[int], params: SamplingParams) -> AdmittedRequest:
        ids = self.prompt_ids(prompt)
        return self.admit_ids(ids, params)

    def admit_ids(self, ids: list[int], params: SamplingParams) -> AdmittedRequest:
        """Admission for ids that already passed prompt_ids (the server tokenises once, then admits)."""
        params.validate(self.limits.vocab_size)
        if params.structured_outputs is not None:
            if self.grammars is None:
                raise InvalidParameterError("this engine has no tokenizer to constrain output with",
                                            param=params.structured_outputs.source)
            # A cache hit when the server compiled it ahead on a worker thread (a cold compile of a hostile
            # schema must not hold the event loop); the engine takes its matcher from the same cache.
            self.grammars.compile(params.structured_outputs)
        limit = self.limits.max_seq_len
        room = limit - len(ids)
        if room <= 0:
            raise ContextLengthError(f"the prompt ({len(ids)} tokens) exceeds the context of {limit} tokens, one of which "
                                     f"must be left to generate (the context is the model's, --max-model-len or what "
                                     f"the KV cache holds for one sequence, whichever is least)", param="prompt")
        if params.max_tokens is not None and params.max_tokens > room:
            raise ContextLengthError(f"the prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                                     f"context of {limit} tokens", param="max_tokens")
        if not self.limits.chunked_prefill and len(ids) > self.limits.max_num_batched_tokens:
            raise InvalidParameterError(
                f"the prompt has {len(ids)} tokens, more than max_num_batched_tokens "
                f"({self.limits.max_num_batched_tokens}); enable chunked prefill or raise the budget", param="prompt")
        resolved = params if params.max_tokens is not None else replace(params, max_tokens=room)
        return AdmittedRequest(tuple(ids), resolved)
