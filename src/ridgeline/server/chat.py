"""POST /v1/chat/completions: the messages rendered by the model's chat template, n choices, streamed or whole."""

import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse

from ridgeline.server.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatLogprobs,
    ChatResponseMessage,
    ChatTokenLogprob,
    TopLogprob,
    Usage,
)
from ridgeline.server.disaggregation import engine_requests, offer_prefilled
from ridgeline.server.errors import APIError
from ridgeline.server.sampling import admit, sampling_params
from ridgeline.server.serving import (
    SSE_DONE,
    ServingContext,
    collect,
    log_request,
    new_logprobs,
    new_request_id,
    sse,
    sse_error,
)


class ChatJob:
    def __init__(self, ctx: ServingContext, request: ChatCompletionRequest):
        ctx.check_model(request.model)
        self.ctx = ctx
        self.request = request
        self.id = new_request_id("chatcmpl")
        self.started = time.monotonic()
        self.messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        self.prompt_ids = ctx.chat_prompt_ids(self.messages, request.add_generation_prompt)
        max_tokens_param = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        top_logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = sampling_params(request, max_tokens=request.max_new_tokens(), logprobs=top_logprobs, prompt_logprobs=None)
        admitted = admit(ctx.admission, self.prompt_ids, params,
                         {"prompt": "messages", "logprobs": "top_logprobs", "max_tokens": max_tokens_param})
        self.engine_requests = engine_requests(ctx.role, self.id, admitted, request.n, request.kv_transfer_params)
        self.last: list = [None] * request.n
        self.holds_kv = any(getattr(r, "hold_kv", False) for r in self.engine_requests)
        if self.holds_kv and request.stream:
            raise APIError(400, "a prefill worker answers 'kv_transfer_params' requests whole: set stream to false",
                           "stream")

    def usage(self) -> Usage:
        usage = Usage()
        seen = [o for o in self.last if o is not None]
        usage.add(len(self.prompt_ids), sum(len(o.output_token_ids) for o in seen), seen[0].num_cached_tokens if seen else 0)
        return usage

    def log(self) -> None:
        log_request(self.ctx, self.id, "chat", self.usage(), self.last, self.started, self.messages)

    def logprobs(self, token_ids: list[int], entries: list) -> ChatLogprobs | None:
        if not self.request.logprobs:
            return None
        return ChatLogprobs(content=[self._token_logprob(t, e) for t, e in zip(token_ids, entries)])

    def _token_logprob(self, token_id: int, entry) -> ChatTokenLogprob:
        def top(t: int, logprob: float) -> TopLogprob:
            return TopLogprob(token=self.ctx.token_text(t), logprob=logprob, bytes=list(self.ctx.tokenizer.token_bytes(t)))

        chosen = top(token_id, entry.logprob)
        alternatives = [top(t, lp) for t, lp in zip(entry.top_token_ids, entry.top_logprobs)]
        return ChatTokenLogprob(**chosen.model_dump(), top_logprobs=alternatives)


async def create_chat_completion(ctx: ServingContext, request: ChatCompletionRequest, raw: Request):
    job = ChatJob(ctx, request)
    submission = ctx.engine.submit(job.engine_requests)
    if request.stream:
        return StreamingResponse(_stream(job, submission), media_type="text/event-stream")
    try:
        finals = await collect(raw, submission)
    finally:
        submission.close()
    if finals is None:  # the client is gone; nobody will read a response
        job.log()
        return None
    job.last = [finals[i] for i in range(request.n)]
    job.log()
    choices = [
        ChatChoice(
            index=i,
            message=ChatResponseMessage(content=output.text),
            logprobs=job.logprobs(output.output_token_ids, output.logprobs or []),
            finish_reason=output.finish_reason,
        )
        for i, output in enumerate(job.last)
    ]
    return ChatCompletionResponse(id=job.id, model=ctx.model_name, choices=choices, usage=job.usage(),
                                  kv_transfer_params=offer_prefilled(ctx.role, job.last[0]) if job.holds_kv else None)


async def _stream(job: ChatJob, submission) -> AsyncIterator[str]:
    def chunk(choice: ChatChunkChoice) -> str:
        return sse(ChatCompletionChunk(id=job.id, model=job.ctx.model_name, choices=[choice]))

    try:
        for index in range(job.request.n):  # the role first, as OpenAI does, before any token exists
            yield chunk(ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content="")))
        async for index, output in submission.outputs():
            job.last[index] = output
            logprobs = job.logprobs(output.new_token_ids, new_logprobs(output))
            if output.new_text or output.finished or logprobs is not None:
                delta = ChatDelta(content=output.new_text or None)
                yield chunk(ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=output.finish_reason))
        if job.request.stream_options is not None and job.request.stream_options.include_usage:
            yield sse(ChatCompletionChunk(id=job.id, model=job.ctx.model_name, choices=[], usage=job.usage()))
    except Exception as error:  # noqa: BLE001 - the 200 is already sent; the error must travel in the stream
        yield sse_error(error)
    finally:
        submission.close()
        job.log()
    yield SSE_DONE
