"""From an API request to admitted engine requests: the sampling fields become a `SamplingParams`, the engine's one
admission check resolves it, and its errors become 400s naming the request's own field (errors carry the field,
so nothing here reads their text)."""

import re
import time

from ridgeline.engine.admission import Admission, AdmittedRequest
from ridgeline.engine.messages import AddRequest
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.structured import StructuredOutputsParams
from ridgeline.errors import RidgelineError
from ridgeline.server.errors import APIError, api_error
from ridgeline.server.protocol import SamplingFields


def sampling_params(request: SamplingFields, *, max_tokens: int | None, logprobs: int | None,
                    prompt_logprobs: int | None, structured_outputs: StructuredOutputsParams | None = None) -> SamplingParams:
    """The request's sampling fields as the engine names them, unchecked (admission checks them).
    `structured_outputs`: the request's output constraint (server/structured.py)."""
    given = {
        "temperature": request.temperature,
        "top_p": request.top_p,
        "top_k": request.top_k,
        "min_p": request.min_p,
        "repetition_penalty": request.repetition_penalty,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "seed": request.seed,
        "stop": request.stop,
        "stop_token_ids": request.stop_token_ids,
        "logit_bias": _logit_bias(request.logit_bias),
    }
    return SamplingParams(
        n=request.n,
        max_tokens=max_tokens,
        ignore_eos=request.ignore_eos,
        priority=request.priority,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        structured_outputs=structured_outputs,
        **{name: value for name, value in given.items() if value is not None},
    )


_TOKEN_ID = re.compile(r"[+-]?[0-9]{1,18}")


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI sends token ids as JSON object keys, so as strings: decimal ASCII digits only (int() would also
    take '٣' and '1_0', and fail on '²' or 5,000 digits, which isdigit() accepts)."""
    if bias is None:
        return None
    for key in bias:
        if not _TOKEN_ID.fullmatch(key.strip()):
            raise APIError(400, f"'logit_bias' keys must be token ids, got {key[:40]!r}", "logit_bias")
    return {int(key): value for key, value in bias.items()}


def admit(admission: Admission, ids: list[int], params: SamplingParams,
          field_names: dict[str, str] | None = None) -> AdmittedRequest:
    """`field_names` maps the engine's name of a field to the request's, where they differ."""
    try:
        return admission.admit_ids(ids, params)
    except RidgelineError as error:
        raise api_error(error, field_names) from error


def choice_requests(request_id: str, admitted: AdmittedRequest, n: int) -> list[AddRequest]:
    """The n choices of one prompt as engine requests: every choice after the first forks the first, so the
    prompt is prefilled once and its pages shared, each choice sampling with its own seed (seed + index)."""
    arrival = time.monotonic()
    ids = [f"{request_id}-{choice}" for choice in range(n)]
    return [AddRequest(ids[choice], AdmittedRequest(admitted.prompt_token_ids, admitted.params.child(choice)), arrival,
                       fork_of=ids[0] if choice else None)
            for choice in range(n)]
