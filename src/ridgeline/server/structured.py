"""A request's output constraint, from whichever field it came in: OpenAI's `response_format`, vLLM's
`structured_outputs` object, or the `guided_*` fields of older vLLM releases; and, for chat, the grammar its tools
impose (server/chat_tools.py). One constraint per request: two different fields at once are a 400 naming both.

Compiling happens here too, ahead of admission, on a worker thread with a deadline: a hostile schema can cost the
grammar engine seconds (within its own limits), which must not hold the event loop or the engine.
"""

import asyncio

from ridgeline.engine.structured import StructuredOutputsParams
from ridgeline.errors import RidgelineError
from ridgeline.server.errors import APIError, api_error
from ridgeline.server.protocol import SamplingFields

COMPILE_TIMEOUT_S = 10.0


def requested_constraint(request: SamplingFields) -> StructuredOutputsParams | None:
    given: list[StructuredOutputsParams] = []
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_object":
        given.append(StructuredOutputsParams(json_object=True, source="response_format"))
    elif fmt is not None and fmt.type == "json_schema":
        schema = fmt.json_schema.schema_
        given.append(StructuredOutputsParams(json=schema, source="response_format") if schema is not None
                     else StructuredOutputsParams(json_object=True, source="response_format"))
    try:
        if request.structured_outputs is not None:
            given.append(StructuredOutputsParams.from_dict(request.structured_outputs))
    except RidgelineError as error:
        raise api_error(error) from error
    for name, kind in (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
                       ("guided_grammar", "grammar")):
        value = getattr(request, name)
        if value is not None:
            given.append(StructuredOutputsParams(**{kind: value}, whitespace_pattern=request.guided_whitespace_pattern,
                                                 source=name))
    if len(given) > 1:
        raise APIError(400, f"give one output constraint, not several: {', '.join(g.source for g in given)}",
                       given[1].source)
    return given[0] if given else None


async def compile_ahead(admission, constraint: StructuredOutputsParams | None) -> None:
    """Compile (or find cached) the constraint off the event loop, so admission finds it ready; a 400 naming its
    field when it is invalid, unsupported, or does not compile within COMPILE_TIMEOUT_S."""
    if constraint is None or admission.grammars is None:
        return  # admission itself says why an engine without a tokenizer cannot take it
    try:
        constraint.validate()
        await asyncio.wait_for(asyncio.to_thread(admission.grammars.compile, constraint), COMPILE_TIMEOUT_S)
    except TimeoutError:
        raise APIError(400, f"{constraint.source}: the {constraint.kind.replace('_', ' ')} did not compile within "
                            f"{COMPILE_TIMEOUT_S:g} s; simplify it", constraint.source) from None
    except RidgelineError as error:
        raise api_error(error) from error
