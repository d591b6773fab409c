"""A chat request's tools read from its JSON (ridgeline/tool_calls does the rest, knowing nothing of HTTP), and the
output constraint they make with the request's own."""

import json

from ridgeline.engine.structured import StructuredOutputsParams
from ridgeline.errors import RidgelineError
from ridgeline.server.errors import APIError, api_error
from ridgeline.server.protocol import ChatCompletionRequest
from ridgeline.server.structured import requested_constraint
from ridgeline.tool_calls import Toolset


def chat_prompt_ids(ctx, request, tools: Toolset | None = None) -> list[int]:
    """A chat request's prompt ids, its tools shown as the template takes them (the default presentation where it
    has no tool section): what a chat completion, /tokenize and /v1/kv/lookup all tokenize. `tools`: the
    request's, when already read."""
    tools = tools if tools is not None else chat_tools(request)
    messages, template_tools = tools.template_input([m.for_template() for m in request.messages],
                                                    ctx.tokenizer.effective_chat_template)
    return ctx.chat_prompt_ids(messages, request.add_generation_prompt, template_tools)


def chat_tools(request: ChatCompletionRequest) -> Toolset:
    tool_choice = request.tool_choice
    try:
        return Toolset.from_openai([t.model_dump() for t in request.tools or []],
                                   tool_choice if tool_choice is None or isinstance(tool_choice, str)
                                   else tool_choice.model_dump(), request.parallel_tool_calls)
    except RidgelineError as error:
        raise api_error(error) from error


def chat_constraint(request: ChatCompletionRequest, tools: Toolset) -> StructuredOutputsParams | None:
    """The request's output constraint with its tools: a forced call's grammar; with tool_choice "auto" and a
    JSON response_format, that JSON or calls; else the constraint the request gave, if any."""
    asked = requested_constraint(request)
    wants_json = asked is not None and (asked.json is not None or asked.json_object)
    answer_schema = ({"type": "object"} if asked.json_object else _schema(asked.json)) if wants_json else None
    grammar = tools.grammar(answer_schema)
    if grammar is None:
        return asked
    return StructuredOutputsParams(grammar=grammar, source="tool_choice" if tools.choice.forces_call else asked.source)


def _schema(value: str | dict) -> dict:
    if isinstance(value, dict):
        return value
    try:
        return json.loads(value)
    except ValueError as error:
        raise APIError(400, f"the JSON schema is not valid JSON: {error}", "response_format") from None
