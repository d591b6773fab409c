"""POST /v1/completions: one or more prompts, n choices each, streamed or whole; echo + logprobs scores the prompt."""

import time
from collections.abc import AsyncIterator

from fastapi import Request

from ridgeline.model.tokenizer.detokenizer import IncrementalDetokenizer
from ridgeline.engine.messages import AddRequest
from ridgeline.server.errors import APIError
from ridgeline.server.protocol import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    Usage,
)
from ridgeline.server.disaggregation import engine_requests, offered_params
from ridgeline.server.sampling import admit, sampling_params
from ridgeline.server.tenants import apply_priority
from ridgeline.server.structured import compile_ahead, requested_constraint
from ridgeline.server.serving import (
    ServingContext,
    answer,
    check_kv_hold,
    log_request,
    new_logprobs,
    new_request_id,
    sse,
)


class LogprobsBuilder:
    """The legacy parallel-list logprobs of one choice, grown token by token, with text offsets into the
    choice's text (which starts with the prompt when echoing)."""

    def __init__(self, ctx: ServingContext):
        self.ctx = ctx
        self.offset = 0
        self._detokenizer = IncrementalDetokenizer(ctx.tokenizer)

    def add(self, logprobs: CompletionLogprobs, token_id: int, entry) -> None:
        """entry: the engine's TokenLogprobs for token_id, or None (the first prompt token has no prediction)."""
        logprobs.tokens.append(self.ctx.token_text(token_id))
        logprobs.text_offset.append(self.offset)
        logprobs.token_logprobs.append(None if entry is None else entry.logprob)
        logprobs.top_logprobs.append(
            None
            if entry is None
            else {self.ctx.token_text(t): lp for t, lp in zip(entry.top_token_ids, entry.top_logprobs)}
        )
        self.offset += len(self._detokenizer.push(token_id))

    def prompt(self, prompt_ids: list[int], entries: list) -> CompletionLogprobs:
        # The engine scores every prompt token but the first; align so entry i belongs to prompt_ids[i].
        entries = [None] * (len(prompt_ids) - len(entries)) + list(entries)
        logprobs = CompletionLogprobs()
        for token_id, entry in zip(prompt_ids, entries):
            self.add(logprobs, token_id, entry)
        return logprobs

    def generated(self, token_ids: list[int], entries: list, into: CompletionLogprobs | None = None) -> CompletionLogprobs:
        logprobs = into or CompletionLogprobs()
        for token_id, entry in zip(token_ids, entries):
            self.add(logprobs, token_id, entry)
        return logprobs


class CompletionJob:
    """One validated completions request: the engine requests for every (prompt, choice), and their answers."""

    def __init__(self, ctx: ServingContext, request: CompletionRequest):
        ctx.check_model(request.model)
        self.ctx = ctx
        self.request = request
        self.id = new_request_id("cmpl")
        self.started = time.monotonic()
        self.prompts = request.prompts()
        special = ctx.text_special(request.split_special_tokens)
        self.prompt_ids = [ctx.prompt_ids(p, "prompt", special=special) for p in self.prompts]
        want_prompt_logprobs = request.echo and request.logprobs is not None
        params = sampling_params(request, max_tokens=request.max_tokens, logprobs=request.logprobs,
                                 prompt_logprobs=request.logprobs if want_prompt_logprobs else None,
                                 structured_outputs=requested_constraint(request))
        if request.kv_transfer_params and len(self.prompt_ids) > 1:
            raise APIError(400, "'kv_transfer_params' (disaggregated prefill/decode) needs a single prompt", "prompt")
        self.engine_requests: list[AddRequest] = []
        for prompt_index, ids in enumerate(self.prompt_ids):
            admitted = admit(ctx.admission, ids, params, {"prompt_logprobs": "logprobs"})
            self.engine_requests += engine_requests(ctx.role, f"{self.id}-{prompt_index}", admitted, request.n,
                                                    request.kv_transfer_params)
        self.last: list = [None] * len(self.engine_requests)  # latest output of each choice
        self.holds_kv = check_kv_hold(self.engine_requests, request.stream)

    def prompt_of(self, index: int) -> tuple[str | list[int], list[int]]:
        prompt_index = index // self.request.n
        return self.prompts[prompt_index], self.prompt_ids[prompt_index]

    def echo_text(self, index: int) -> str:
        prompt, ids = self.prompt_of(index)
        return prompt if isinstance(prompt, str) else self.ctx.tokenizer.decode(ids)

    def usage(self) -> Usage:
        usage = Usage()
        for index, output in enumerate(self.last):
            first_choice = index % self.request.n == 0  # a prompt is billed once, whatever n is
            usage.add(
                len(self.prompt_of(index)[1]) if first_choice else 0,
                len(output.output_token_ids) if output is not None else 0,
                output.num_cached_tokens if first_choice and output is not None else 0,
            )
        return usage

    def log(self) -> None:
        log_request(self.ctx, self.id, "completions", self.usage(), self.last, self.started, self.prompts)

    def response(self) -> CompletionResponse:
        return CompletionResponse(
            id=self.id,
            model=self.ctx.model_name,
            choices=[self.choice(i, output) for i, output in enumerate(self.last)],
            usage=self.usage(),
            kv_transfer_params=offered_params(self.ctx.role, self.last[0]) if self.holds_kv else None,
        )

    async def events(self, submission) -> AsyncIterator[str]:
        request = self.request
        builders: dict[int, LogprobsBuilder] = {}
        async for index, output in submission.outputs():
            previous, self.last[index] = self.last[index], output
            text, logprobs = output.new_text, None
            if previous is None and request.echo:
                text = self.echo_text(index) + text
            if request.logprobs is not None:
                builder = builders.setdefault(index, LogprobsBuilder(self.ctx))
                if previous is None and request.echo:
                    logprobs = builder.prompt(output.prompt_token_ids, output.prompt_logprobs or [])
                logprobs = builder.generated(output.new_token_ids, new_logprobs(output), into=logprobs)
            if text or output.finished or logprobs is not None:
                choice = CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=output.finish_reason)
                yield sse(CompletionResponse(id=self.id, model=self.ctx.model_name, choices=[choice]))

    def usage_event(self) -> str:
        return sse(CompletionResponse(id=self.id, model=self.ctx.model_name, choices=[], usage=self.usage()))

    def choice(self, index: int, output) -> CompletionChoice:
        """The whole answer of one finished choice."""
        text = output.text
        logprobs = None
        if self.request.logprobs is not None:
            builder = LogprobsBuilder(self.ctx)
            if self.request.echo:
                logprobs = builder.prompt(output.prompt_token_ids, output.prompt_logprobs or [])
            logprobs = builder.generated(output.output_token_ids, output.logprobs or [], into=logprobs)
        if self.request.echo:
            text = self.echo_text(index) + text
        return CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=output.finish_reason)


async def create_completion(ctx: ServingContext, request: CompletionRequest, raw: Request):
    apply_priority(raw, request)
    await compile_ahead(ctx.admission, requested_constraint(request))
    return await answer(ctx, CompletionJob(ctx, request), raw)
