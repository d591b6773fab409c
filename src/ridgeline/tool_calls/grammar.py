"""The grammar of an answer that must call tools (tool_choice "required" or a named function): one call, or
with parallel calls several, each `<tool_call>{"name": N, "arguments": A}</tool_call>` with A valid against that
function's parameters schema. Lark in llguidance's dialect, each call's JSON an embedded `%json` schema, so the
grammar engine guarantees the arguments as it guarantees any JSON schema."""

import json

from ridgeline.json_schemas import DEFAULT_BOUNDS, bound_schema
from ridgeline.tool_calls.spec import FunctionTool, ToolChoice

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# Calls one answer may make with parallel_tool_calls. A bound, because a small model that may always add one more
# call does: Gemma 3 270M asked for the weather in Paris wrote the same call until max_tokens ran out. Calls follow
# each other with nothing between: offered a "\n" after a call, that model always took it and went on to another
# call (5 of 5), offered only the next call's tag or the end of its turn, it ended (1 call).
MAX_PARALLEL_CALLS = 5
# The JSON as the structured-outputs compiler writes it (engine/structured/compiler.py): no free whitespace.
JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def strict(schema: dict) -> dict:
    """A schema as the structured-outputs compiler reads one: objects closed, default bounds where it sets none
    (json_schemas/), so a forced call's arguments end as a constrained answer does."""
    return bound_schema(schema, DEFAULT_BOUNDS)


def call_schema(tool: FunctionTool) -> dict:
    """The schema of one call. The arguments' definitions move up to the call's root: a `$ref` such as
    "#/$defs/Role" means the parameters' root, which here is the call's."""
    arguments = strict(tool.parameters)
    definitions = {key: arguments.pop(key) for key in ("$defs", "definitions") if key in arguments}
    return {"type": "object", "properties": {"name": {"const": tool.name}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False, "x-guidance": JSON_STYLE, **definitions}


def tool_call_grammar(tools: list[FunctionTool], choice: ToolChoice, answer_schema: dict | None = None) -> str:
    """Lark text. `answer_schema`: with tool_choice "auto", a response_format's schema: the answer is then either
    that JSON or calls (what an agent with a typed output and tools needs)."""
    callable_tools = [t for t in tools if choice.mode != "function" or t.name == choice.name]
    rules = [f"fn{i}: %json {json.dumps(call_schema(tool))}" for i, tool in enumerate(callable_tools)]
    call = f'call: "{CALL_OPEN}" ({" | ".join(f"fn{i}" for i in range(len(callable_tools)))}) "{CALL_CLOSE}"'
    parallel = choice.parallel and choice.mode != "function"
    calls = "calls: call" + " (call" * (MAX_PARALLEL_CALLS - 1) + ")?" * (MAX_PARALLEL_CALLS - 1) if parallel \
        else "calls: call"
    if answer_schema is not None:
        start = "start: calls | answer"
        rules.append(f"answer: %json {json.dumps({**strict(answer_schema), 'x-guidance': JSON_STYLE})}")
    else:
        start = "start: calls"
    return "\n".join(["%llguidance {}", start, calls, call, *rules]) + "\n"
