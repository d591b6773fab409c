"""What the completions and chat endpoints share: the model check, prompt ids, answering a job whole or as a
stream (SSE framing, waiting for results while watching for a vanished client), and the one-line request log."""

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from ridgeline.engine.admission import Admission
from ridgeline.engine.messages import ReceiveKV
from ridgeline.errors import RidgelineError
from ridgeline.model.tokenizer.base import Tokenizer
from ridgeline.server.async_engine import EngineFront, Submission
from ridgeline.server.client_watch import ClientLeft, DeadlinePassed, while_client_waits
from ridgeline.server.deadline import Deadline, deadline_error, request_deadline
from ridgeline.server.disaggregation import WorkerRole
from ridgeline.server.errors import APIError, api_error, error_body
from ridgeline.server.protocol import Usage
from ridgeline.server.tenants import TenantAccount, reserve
from ridgeline.tenancy.gate import TenantGate

request_logger = logging.getLogger("ridgeline.server.requests")


@dataclass
class ServingContext:
    engine: EngineFront  # AsyncEngine (an engine thread here), or an engine core in its own process
    tokenizer: Tokenizer
    admission: Admission  # the engine's one admission check (pure: safe to call on the event loop)
    model_name: str
    log_prompts: bool = False
    role: WorkerRole = field(default_factory=WorkerRole)  # disaggregated prefill/decode, or both
    tenants: TenantGate | None = None  # per-tenant limits and usage (--tenants); None: none

    @property
    def max_model_len(self) -> int:
        """The model's context, capped by --max-model-len and by what the KV cache can hold for one sequence."""
        return self.admission.max_seq_len

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"model {model!r} does not exist; this server serves {self.model_name!r}", "model", "model_not_found")

    def prompt_ids(self, prompt: str | list[int], param: str, *, special: bool | None = None) -> list[int]:
        """Token ids of a text or token-list prompt (with BOS as the model asks, special-token text parsed unless
        `special` is False: Admission.prompt_ids); a 400 naming `param` if it is empty or holds ids outside the
        vocabulary."""
        try:
            return self.admission.prompt_ids(prompt, special=special)
        except RidgelineError as error:
            raise api_error(error, {"prompt": param}) from error

    def chat_prompt_ids(self, messages: list[dict], add_generation_prompt: bool, tools: list | None = None) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        return self.prompt_ids(text, "messages", special=True)

    def text_special(self, split_special_tokens: bool) -> bool:
        """Whether special-token text in a request's text prompt is parsed: unless the request (its
        `split_special_tokens`) or the tokenizer's files ask to keep it plain text."""
        return not (split_special_tokens or self.tokenizer.split_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


# Characters pydantic's JSON leaves raw in strings that line readers built on str.splitlines() (httpx's
# aiter_lines, among others) take for line ends, cutting an event's JSON in two: SSE ends lines only at CR and LF,
# but a model's text can hold any of these. Escaped, they are the same JSON string.
_LINE_BREAKS_JSON_KEEPS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def sse(payload: BaseModel | dict) -> str:
    body = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {body.translate(_LINE_BREAKS_JSON_KEEPS)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def new_logprobs(output) -> list:
    """The logprob entries of the tokens this output adds (the engine's list covers all tokens so far)."""
    return (output.logprobs or [])[len(output.output_token_ids) - len(output.new_token_ids) :]


def sse_error(error: Exception) -> str:
    """An error after the 200 was sent can only travel inside the stream."""
    if isinstance(error, APIError):
        return sse(error_body(error.status, error.message, error.param, error.code))
    if isinstance(error, RidgelineError):
        return sse(error_body(400, str(error), error.param, error.code))
    return sse(error_body(500, f"internal server error: {error!r}"))


async def collect(raw: Request, submission: Submission, deadline: Deadline | None = None) -> dict[int, object]:
    """The final output of every choice. ClientLeft if the client went away first, DeadlinePassed if its deadline
    did (the caller then aborts)."""
    finals: dict[int, object] = {}

    async def gather() -> None:
        async for index, output in submission.outputs():
            if output.finished:
                finals[index] = output

    await while_client_waits(raw, gather(), deadline)
    return finals


class Job(Protocol):
    """One validated request of an endpoint: the engine requests of its choices, and the last output of each."""

    request: BaseModel  # has `stream` and `stream_options`
    engine_requests: list
    last: list

    def log(self) -> None: ...

    def usage(self) -> Usage:
        """The tokens the choices used so far (what the response's `usage` says)."""

    def response(self) -> BaseModel:
        """The whole answer, from `last` (every choice finished)."""

    def events(self, submission: Submission) -> AsyncIterator[str]:
        """The stream's SSE events as outputs arrive, up to the last choice's last token."""

    def usage_event(self) -> str:
        """The SSE event with the usage, sent last when the request's stream_options ask for it."""


FRONT_REQUEST_ID_CHARS = 128


def front_request_id(kv_params: dict | None) -> str | None:
    """`kv_transfer_params.front_request_id`: the name a front gave a request it sends a prefill worker, to release
    its pages by (POST /v1/kv/release) whether or not the answer reached it."""
    name = (kv_params or {}).get("front_request_id")
    if name is None:
        return None
    if not isinstance(name, str) or not 0 < len(name) <= FRONT_REQUEST_ID_CHARS:
        raise APIError(400, f"'kv_transfer_params.front_request_id' must be a string of 1 to {FRONT_REQUEST_ID_CHARS} "
                            "characters", "kv_transfer_params")
    return name


def check_kv_hold(engine_requests: list, stream: bool) -> bool:
    """Whether a prefill worker holds these requests' KV for a decode worker to collect; such an answer is whole."""
    holds_kv = any(getattr(r, "hold_kv", False) for r in engine_requests)
    if holds_kv and stream:
        raise APIError(400, "a prefill worker answers 'kv_transfer_params' requests whole: set stream to false",
                       "stream")
    return holds_kv


async def answer(ctx: ServingContext, job: Job, raw: Request) -> StreamingResponse | BaseModel | None:
    """Check the tenant's limits (a 429 before anything runs), submit the job, then stream its events, or wait
    for every choice and answer whole. None: the client left before the whole answer was ready (the submission is
    then closed, which aborts what is still running). A request past its deadline (x-ridgeline-deadline-ms) is
    aborted wherever it is and answered 504. The tenant is charged what the job used, once, however it ends."""
    deadline = request_deadline(raw.headers)
    source = ctx.role.kv_source if getattr(job, "holds_kv", False) else None
    # The front's own name for it: its release by that name frees the pages even if the front never reads this
    # answer (cancelled while the answer is on the wire), or released it before it got here.
    named = front_request_id(job.request.kv_transfer_params) if source is not None else None
    account = await reserve(ctx.tenants, raw, job.engine_requests)
    if named is not None:
        source.expect(named, job.engine_requests[0].request_id)
    try:
        submission = ctx.engine.submit(job.engine_requests)
    except BaseException:
        _settle(account, None)  # refused by the engine (full queue, no replica): nothing ran
        if named is not None:
            source.settle(job.engine_requests[0].request_id)
        raise
    if source is not None:
        # A prefill worker whose client (the front) left: pages that still finish are freed, not held a lease.
        submission.on_finished_after_leaving = lambda request_id: asyncio.ensure_future(
            asyncio.to_thread(source.drop, request_id))
    finals = None
    try:
        if job.request.stream:
            if any(isinstance(r, ReceiveKV) for r in job.engine_requests):
                # a pull that fails is a status (503 kv_pages_gone: a front prefills again), not an error event
                try:
                    await while_client_waits(raw, submission.ready(), deadline)
                except BaseException:
                    account, unsettled = None, account  # the stream never started: nothing is charged
                    _settle(unsettled, None)
                    raise
            stream = _stream(job, submission, deadline, account)
            account = None  # the stream settles it, however it ends
            return StreamingResponse(stream, media_type="text/event-stream")
        finals = await collect(raw, submission, deadline)
    except ClientLeft:
        submission.close("client_left")
        job.log()
        return None
    except DeadlinePassed:
        submission.close("deadline")
        job.log()
        raise deadline_error() from None
    except BaseException:
        submission.close()
        raise
    finally:
        if finals is not None:
            job.last = [finals[i] for i in range(len(job.engine_requests))]
        _settle(account, job)  # None once a stream has taken it over
        if named is not None:
            source.settle(job.engine_requests[0].request_id)
    submission.close()
    job.log()
    return job.response()


def _settle(account: TenantAccount | None, job: Job | None) -> None:
    if account is not None:
        account.settle(job.usage() if job is not None else None)


async def _stream(job: Job, submission: Submission, deadline: Deadline | None,
                  account: TenantAccount | None = None) -> AsyncIterator[str]:
    complete = False  # False in `finally`: the stream was cancelled because its client left
    try:
        events = aiter(job.events(submission))
        while True:
            try:
                timeout = deadline.remaining() if deadline is not None else None
                event = await asyncio.wait_for(anext(events), timeout)
            except StopAsyncIteration:
                break
            except TimeoutError:  # the deadline passed mid-stream: dropped, told in the stream's last event
                submission.close("deadline")
                complete = True
                yield sse_error(deadline_error())
                break
            yield event
        if not submission.left and job.request.stream_options is not None and job.request.stream_options.include_usage:
            yield job.usage_event()
        complete = True
    except Exception as error:  # noqa: BLE001 - the 200 is already sent; the error must travel in the stream
        complete = True
        yield sse_error(error)
    finally:
        submission.close(None if complete else "client_left")
        _settle(account, job)
        job.log()
    yield SSE_DONE


def log_request(
    ctx: ServingContext,
    request_id: str,
    endpoint: str,
    usage: Usage,
    outputs: list,
    started: float,
    prompt: object = None,
) -> None:
    """One JSON line per request: id, token counts, timings, finish reasons; the prompt only if asked for.
    `outputs` holds the last output seen of each choice (None where none arrived)."""
    seen = [o for o in outputs if o is not None]
    queue_times = [o.timings.queue_time for o in seen if o.timings.queue_time is not None]
    ttfts = [o.timings.ttft for o in seen if o.timings.ttft is not None]
    line = {
        "request_id": request_id,
        "endpoint": endpoint,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.prompt_tokens_details.cached_tokens,
        "finish_reasons": [(o.finish_reason if o is not None and o.finished else None) or "abort" for o in outputs],
        "queue_ms": _ms(max(queue_times, default=None)),
        "ttft_ms": _ms(min(ttfts, default=None)),
        "e2e_ms": _ms(time.monotonic() - started),
    }
    if ctx.log_prompts and prompt is not None:
        line["prompt"] = prompt
    request_logger.info(json.dumps(line))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
