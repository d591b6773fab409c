"""A chat request's tools: what the template is given, the grammar a forced call imposes, and how the answer is
read back (ridgeline/tool_calls holds the parts that know nothing of HTTP)."""

import json
from dataclasses import dataclass, field

from ridgeline.engine.structured import StructuredOutputsParams
from ridgeline.errors import RidgelineError
from ridgeline.server.errors import APIError, api_error
from ridgeline.server.protocol import ChatCompletionRequest
from ridgeline.server.structured import requested_constraint
from ridgeline.tool_calls import FunctionTool, ToolCallStream, ToolChoice, present_tools, tool_call_grammar
from ridgeline.tool_calls.presentation import template_takes_tools
from ridgeline.tool_calls.spec import check_tools


@dataclass(frozen=True)
class ChatTools:
    tools: list[FunctionTool] = field(default_factory=list)
    choice: ToolChoice = field(default_factory=ToolChoice)

    @property
    def active(self) -> bool:
        """Tools are shown to the model and its answer is read for calls (tool_choice "none" hides them)."""
        return bool(self.tools) and self.choice.mode != "none"

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools)

    def stream(self) -> ToolCallStream:
        """A reader of one choice's answer; a forced call's arguments stream as they are written."""
        return ToolCallStream(self.names, incremental=self.choice.forces_call)


def chat_tools(request: ChatCompletionRequest) -> ChatTools:
    tools = [FunctionTool(t.function.name, t.function.description,
                          t.function.parameters if t.function.parameters is not None
                          else {"type": "object", "properties": {}})
             for t in request.tools or []]
    raw = request.tool_choice
    if raw is None:
        choice = ToolChoice("auto" if tools else "none")
    elif isinstance(raw, str):
        choice = ToolChoice(raw)
    else:
        choice = ToolChoice("function", raw.function.name)
    choice = ToolChoice(choice.mode, choice.name, request.parallel_tool_calls is not False)
    try:
        check_tools(tools, choice)
    except RidgelineError as error:
        raise api_error(error) from error
    return ChatTools(tools, choice)


def chat_constraint(request: ChatCompletionRequest, tools: ChatTools) -> StructuredOutputsParams | None:
    """The request's output constraint with its tools: a forced call's grammar; with tool_choice "auto" and a
    JSON response_format, that JSON or calls (an agent with a typed output and tools asks exactly this); else the
    constraint the request gave, if any."""
    asked = requested_constraint(request)
    if tools.active and tools.choice.forces_call:
        return StructuredOutputsParams(grammar=tool_call_grammar(tools.tools, tools.choice), source="tool_choice")
    if tools.active and asked is not None and (asked.json is not None or asked.json_object):
        schema = {"type": "object"} if asked.json_object else _schema(asked.json)
        return StructuredOutputsParams(grammar=tool_call_grammar(tools.tools, tools.choice, schema), source=asked.source)
    return asked


def template_input(request: ChatCompletionRequest, tools: ChatTools, template_source: str) -> tuple[list[dict], list | None]:
    """The messages and `tools` the chat template renders (the default tool presentation where it has no tool
    section; the history's calls and results are rendered even when no tools are shown now)."""
    messages = [m.for_template() for m in request.messages]
    return present_tools(messages, tools.tools if tools.active else [], template_takes_tools(template_source))


def _schema(value: str | dict) -> dict:
    if isinstance(value, dict):
        return value
    try:
        return json.loads(value)
    except ValueError as error:
        raise APIError(400, f"the JSON schema is not valid JSON: {error}", "response_format") from None
