"""How tools and past calls reach the chat template.

A template with a tool section (it reads `tools`) gets them as Hugging Face templates expect: `tools` as OpenAI
function definitions, assistant `tool_calls` with their arguments as objects, `tool` messages as they are.

A template without one gets the default presentation: the tools listed in the system message with an instruction
to answer a call as `<tool_call>{...}</tool_call>`, past calls written back into the assistant's turn in that form,
and tool results as a user turn wrapped in `<tool_response>`, each naming the function it answers the way Hermes 2
Pro's template does (`{"name": ..., "content": ...}`); consecutive turns of one role are merged, since such
templates (Gemma's) insist that user and assistant alternate.
"""

import json

from ridgeline.tool_calls.grammar import CALL_CLOSE, CALL_OPEN
from ridgeline.tool_calls.spec import FunctionTool

DEFAULT_TOOL_PROMPT = (
    "You can call the functions listed below. To call one, answer with nothing but "
    f'{CALL_OPEN}{{"name": <function name>, "arguments": <arguments as a JSON object>}}{CALL_CLOSE} '
    "(one such line per call). A function's result comes back to you inside <tool_response></tool_response>. "
    "If no function is needed, answer normally.\n<tools>\n{tools}\n</tools>"
)


def template_takes_tools(template_source: str) -> bool:
    return "tools" in template_source


def present_tools(messages: list[dict], tools: list[FunctionTool], takes_tools: bool) -> tuple[list[dict], list | None]:
    """The messages to render and the `tools` value to give the template (None: none)."""
    if takes_tools:
        return [_for_template(m) for m in messages], [t.as_openai() for t in tools] or None
    rendered = [_as_text_turn(m, called) for m, called in zip(messages, _answered_calls(messages))]
    if tools:
        listing = "\n".join(json.dumps(t.as_openai()["function"]) for t in tools)
        prompt = DEFAULT_TOOL_PROMPT.replace("{tools}", listing)
        if rendered and rendered[0]["role"] in ("system", "developer"):
            rendered[0] = {"role": "system", "content": f"{rendered[0]['content']}\n\n{prompt}"}
        else:
            rendered.insert(0, {"role": "system", "content": prompt})
    return _merge_same_role(rendered), None


def call_text(name: str, arguments: str) -> str:
    """A past call as the grammar makes the model write one. Arguments that parse are written back in that JSON's
    style: a client may have re-serialised them (pydantic-ai sends `{"city":"Paris"}`), and the history should read
    as the model itself wrote it."""
    parsed = _arguments_object(arguments)
    if isinstance(parsed, dict):
        arguments = json.dumps(parsed, ensure_ascii=False)
    return f'{CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments or "{}"}}}{CALL_CLOSE}'


def _answered_calls(messages: list[dict]) -> list[str | None]:
    """For each message, the name of the function a `tool` message answers (from the assistant's call with its
    `tool_call_id`, or the message's own `name`), else None. OpenAI's tool messages carry only the call's id, so
    without this a result in the default presentation says nothing of which call it answers."""
    names: dict[str, str] = {}
    answered: list[str | None] = []
    for message in messages:
        for call in message.get("tool_calls") or []:
            if call.get("id"):
                names[call["id"]] = call["function"]["name"]
        answered.append(names.get(message.get("tool_call_id"), message.get("name"))
                        if message["role"] == "tool" else None)
    return answered


def tool_response_text(content: str, name: str | None) -> str:
    """A tool result as the model reads it. Named, as Hermes 2 Pro's template writes results: after parallel calls
    to different functions, bare results in a row would not say which is which. (For one call it changed nothing
    measured: Gemma 3 270M and SmolLM2-135M gave the same next turn either way, docs/structured_outputs.md.)"""
    if name is None:
        return f"<tool_response>\n{content}\n</tool_response>"
    value = _arguments_object(content)  # a JSON result is shown as JSON, anything else as a string
    return f"<tool_response>\n{json.dumps({'name': name, 'content': value}, ensure_ascii=False)}\n</tool_response>"


def _arguments_object(arguments: str):
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


def _for_template(message: dict) -> dict:
    if not message.get("tool_calls"):
        return message
    calls = [{**call, "function": {**call["function"], "arguments": _arguments_object(call["function"]["arguments"])}}
             for call in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def _as_text_turn(message: dict, answered: str | None) -> dict:
    role, content = message["role"], message.get("content") or ""
    if role == "tool":
        return {"role": "user", "content": tool_response_text(content, answered)}
    if role == "assistant" and message.get("tool_calls"):
        calls = "\n".join(call_text(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"])
        return {"role": "assistant", "content": f"{content}\n{calls}" if content else calls}
    if role == "developer":
        return {"role": "system", "content": content}
    return {"role": role, "content": content}


def _merge_same_role(messages: list[dict]) -> list[dict]:
    merged: list[dict] = []
    for message in messages:
        if merged and merged[-1]["role"] == message["role"]:
            merged[-1] = {"role": message["role"], "content": f"{merged[-1]['content']}\n\n{message['content']}"}
        else:
            merged.append(dict(message))
    return merged
