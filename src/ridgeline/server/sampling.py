"""From an API request's sampling fields to a validated `SamplingParams`; range errors become 400s naming the field."""

import re

from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.errors import RidgelineError
from ridgeline.server.errors import APIError
from ridgeline.server.protocol import SamplingFields

_BAD_FIELD = re.compile(r"invalid sampling parameter (\w+)=")


def sampling_params(
    request: SamplingFields,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None,
    vocab_size: int,
    field_names: dict[str, str] | None = None,
) -> SamplingParams:
    """`field_names` maps a SamplingParams field to the request field it came from, where they differ."""
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
    }
    params = SamplingParams(
        n=request.n,
        max_tokens=max_tokens,
        ignore_eos=request.ignore_eos,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        **{name: value for name, value in given.items() if value is not None},
    )
    try:
        params.validate(vocab_size)
    except RidgelineError as error:
        match = _BAD_FIELD.match(str(error))
        field = match.group(1) if match else None
        raise APIError(400, str(error), param=(field_names or {}).get(field, field)) from error
    return params
