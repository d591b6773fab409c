"""POST /v1/chat/completions: the messages rendered by the model's chat template, n choices, streamed or whole;
with tools, each answer read for calls (server/chat_tools.py), and with a response format, constrained."""

import time
from collections.abc import AsyncIterator

from fastapi import Request

from ridgeline.engine.structured import StructuredOutputsParams
from ridgeline.server.chat_tools import chat_constraint, chat_prompt_ids, chat_tools
from ridgeline.server.disaggregation import engine_requests, offered_params
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
    FunctionCallDelta,
    FunctionCallOut,
    ToolCallChunk,
    ToolCallOut,
    TopLogprob,
    Usage,
)
from ridgeline.server.sampling import admit, sampling_params
from ridgeline.server.serving import (
    ServingContext,
    answer,
    check_kv_hold,
    log_request,
    new_logprobs,
    new_request_id,
    sse,
)
from ridgeline.server.tenants import apply_priority
from ridgeline.server.structured import compile_ahead
from ridgeline.tool_calls import ToolCallDelta, Toolset


class ChatJob:
    def __init__(self, ctx: ServingContext, request: ChatCompletionRequest, tools: Toolset,
                 constraint: StructuredOutputsParams | None):
        """`tools` and `constraint`: the request's, read once by create_chat_completion (which compiles the
        constraint off the event loop first)."""
        ctx.check_model(request.model)
        self.ctx = ctx
        self.request = request
        self.id = new_request_id("chatcmpl")
        self.started = time.monotonic()
        self.tools = tools
        self.prompt_ids = chat_prompt_ids(ctx, request, tools)
        self.messages = [m.for_template() for m in request.messages]  # as logged
        max_tokens_param = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
        top_logprobs = (request.top_logprobs or 0) if request.logprobs else None
        params = sampling_params(request, max_tokens=request.max_new_tokens(), logprobs=top_logprobs, prompt_logprobs=None,
                                 structured_outputs=constraint)
        admitted = admit(ctx.admission, self.prompt_ids, params,
                         {"prompt": "messages", "logprobs": "top_logprobs", "max_tokens": max_tokens_param})
        self.engine_requests = engine_requests(ctx.role, self.id, admitted, request.n, request.kv_transfer_params)
        self.last: list = [None] * request.n
        self.holds_kv = check_kv_hold(self.engine_requests, request.stream)

    def usage(self) -> Usage:
        usage = Usage()
        seen = [o for o in self.last if o is not None]
        usage.add(len(self.prompt_ids), sum(len(o.output_token_ids) for o in seen), seen[0].num_cached_tokens if seen else 0)
        return usage

    def log(self) -> None:
        log_request(self.ctx, self.id, "chat", self.usage(), self.last, self.started, self.messages)

    def response(self) -> ChatCompletionResponse:
        messages = [self._message(output.text) for output in self.last]
        choices = [
            ChatChoice(
                index=i,
                message=message,
                logprobs=self.logprobs(output.output_token_ids, output.logprobs or []),
                finish_reason=self._finish_reason(output.finish_reason, message.tool_calls),
            )
            for i, (output, message) in enumerate(zip(self.last, messages))
        ]
        offer = offered_params(self.ctx.role, self.last[0]) if self.holds_kv else None
        return ChatCompletionResponse(id=self.id, model=self.ctx.model_name, choices=choices, usage=self.usage(),
                                      kv_transfer_params=offer)

    def _message(self, text: str) -> ChatResponseMessage:
        if not self.tools.active:
            return ChatResponseMessage(content=text)
        content, calls = self.tools.read(text)
        return ChatResponseMessage(content=content, tool_calls=[
            ToolCallOut(id=call.id, function=FunctionCallOut(name=call.name, arguments=call.arguments)) for call in calls])

    @staticmethod
    def _finish_reason(reason: str | None, calls: list) -> str | None:
        """OpenAI's: an answer that ended in calls finished for "tool_calls" (cut off by a limit, it stays "length")."""
        return "tool_calls" if calls and reason == "stop" else reason

    async def events(self, submission) -> AsyncIterator[str]:
        for index in range(self.request.n):  # the role first, as OpenAI does, before any token exists
            yield self._chunk(ChatChunkChoice(index=index, delta=ChatDelta(role="assistant", content="")))
        readers = [self.tools.stream() for _ in range(self.request.n)] if self.tools.active else None
        async for index, output in submission.outputs():
            self.last[index] = output
            logprobs = self.logprobs(output.new_token_ids, new_logprobs(output))
            text, deltas, finish_reason = output.new_text, [], output.finish_reason
            if readers is not None:
                text, deltas = readers[index].feed(output.new_text)
                if output.finished:
                    rest, last_deltas = readers[index].finish()
                    text, deltas = text + rest, deltas + last_deltas
                    finish_reason = self._finish_reason(finish_reason, readers[index].calls)
                if self.tools.choice.forces_call:
                    text = ""  # the grammar allows only calls: between them, white space that OpenAI never sends
            if text or deltas or output.finished or logprobs is not None:
                delta = ChatDelta(content=text or None, tool_calls=[_tool_call_chunk(d) for d in deltas] or None)
                choice = ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason)
                yield self._chunk(choice)

    def usage_event(self) -> str:
        return sse(ChatCompletionChunk(id=self.id, model=self.ctx.model_name, choices=[], usage=self.usage()))

    def _chunk(self, choice: ChatChunkChoice) -> str:
        return sse(ChatCompletionChunk(id=self.id, model=self.ctx.model_name, choices=[choice]))

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


def _tool_call_chunk(delta: ToolCallDelta) -> ToolCallChunk:
    first = delta.id is not None
    return ToolCallChunk(index=delta.index, id=delta.id, type="function" if first else None,
                         function=FunctionCallDelta(name=delta.name, arguments=delta.arguments))


async def create_chat_completion(ctx: ServingContext, request: ChatCompletionRequest, raw: Request):
    apply_priority(raw, request)
    tools = chat_tools(request)
    constraint = chat_constraint(request, tools)
    await compile_ahead(ctx.admission, constraint)
    return await answer(ctx, ChatJob(ctx, request, tools, constraint), raw)
