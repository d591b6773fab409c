"""Reading tool calls back out of an answer (ridgeline/tool_calls/parser.py) and showing them to a template
(presentation.py): the whole answer and any split of it into streamed pieces give the same content and calls."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.tool_calls import FunctionTool, ToolCallStream, parse_tool_calls, present_tools

NAMES = frozenset({"get_weather", "add"})
ANSWERS = [
    'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Lima", "note": "a } and a <tool_call>"}}</tool_call>',
    'No tools needed: 4.',
    '<tool_call>{"name": "unknown", "arguments": {}}</tool_call> stays text',
    '<tool_call>{"name": "add", "arguments": "{\\"a\\": 5}"}</tool_call>',
    '<tool_call>{"name": "add", "arguments": {"a": 1, "b"',  # cut off by max_tokens
    'a < b and <tool_ca not a tag',
]


def test_calls_and_text_are_separated():
    content, calls = parse_tool_calls(ANSWERS[0], NAMES)
    assert content == "Let me look.\n"
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]

    content, calls = parse_tool_calls(ANSWERS[1], NAMES)
    assert content is None  # only calls (and white space): OpenAI's content is null
    assert [c.name for c in calls] == ["add", "get_weather"]
    assert json.loads(calls[1].arguments)["note"] == "a } and a <tool_call>"
    assert len({c.id for c in calls}) == 2


def test_what_is_not_a_call_to_a_given_tool_stays_text():
    assert parse_tool_calls(ANSWERS[2], NAMES) == (ANSWERS[2], [])
    assert parse_tool_calls(ANSWERS[3], NAMES) == (ANSWERS[3], [])
    assert parse_tool_calls(ANSWERS[6], NAMES) == (ANSWERS[6], [])
    content, calls = parse_tool_calls(ANSWERS[5], NAMES)
    assert calls == [] and content == ANSWERS[5]


def test_arguments_written_as_a_json_string_are_read_as_the_object():
    _, calls = parse_tool_calls(ANSWERS[4], NAMES)
    assert json.loads(calls[0].arguments) == {"a": 5}


def streamed(answer: str, cuts: list[int], incremental: bool):
    stream = ToolCallStream(NAMES, incremental=incremental)
    pieces = [answer[i:j] for i, j in zip([0, *cuts], [*cuts, len(answer)])]
    content, deltas = "", []
    for piece in pieces:
        text, new = stream.feed(piece)
        content, deltas = content + text, deltas + new
    text, new = stream.finish()
    return content + text, deltas + new, stream.calls


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ANSWERS), st.lists(st.integers(0, 200), max_size=12), st.booleans())
def test_any_split_of_a_stream_gives_the_whole_answers_content_and_calls(answer, cuts, incremental):
    cuts = sorted({c for c in cuts if 0 < c < len(answer)})
    content, deltas, calls = streamed(answer, cuts, incremental)
    whole_content, whole_calls = parse_tool_calls(answer, NAMES)
    if whole_content is None:  # only calls: what a stream sends between them is white space
        assert not content.strip()
    elif not (incremental and answer is ANSWERS[5]):  # a streamed call cut off stays what was sent of it
        assert content == whole_content
    assert [(c.name, c.arguments) for c in calls] == [(c.name, c.arguments) for c in whole_calls]
    for index, call in enumerate(calls):  # OpenAI's delta shape: id and name first, then argument text
        mine = [d for d in deltas if d.index == index]
        assert (mine[0].id, mine[0].name) == (call.id, call.name)
        assert all(d.id is None and d.name is None for d in mine[1:])
        assert "".join(d.arguments for d in mine) == call.arguments


def test_a_template_without_a_tool_section_gets_the_default_presentation():
    tools = [FunctionTool("add", "Adds.", {"type": "object", "properties": {"a": {"type": "integer"}}})]
    history = [{"role": "user", "content": "1+1?"},
               {"role": "assistant", "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a":1}'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "2"},
               {"role": "user", "content": "thanks"}]
    messages, template_tools = present_tools(history, tools, takes_tools=False)
    assert template_tools is None
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]  # tool result merged, alternating
    assert '"name": "add"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
    assert messages[2]["content"] == '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    # the result names the call it answers (found by tool_call_id), as Hermes 2 Pro's template writes results
    assert messages[3]["content"].startswith('<tool_response>\n{"name": "add", "content": 2}\n</tool_response>')
    assert "thanks" in messages[3]["content"]


def test_a_template_with_a_tool_section_gets_tools_and_calls_as_objects():
    tools = [FunctionTool("add")]
    history = [{"role": "assistant", "content": "",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]}]
    messages, template_tools = present_tools(history, tools, takes_tools=True)
    assert template_tools == [tools[0].as_openai()]
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


def test_a_forced_answer_is_only_its_calls_and_parallel_calls_are_bounded():
    from ridgeline.tool_calls import ToolChoice, Toolset, tool_call_grammar
    from ridgeline.tool_calls.grammar import MAX_PARALLEL_CALLS

    toolset = Toolset([FunctionTool("add")], ToolChoice("required"))
    one = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
    content, calls = toolset.read(f"{one}{one}\n<tool_call>{{")  # a third call cut short by max_tokens
    assert content is None and [(c.name, c.arguments) for c in calls] == [("add", "{}")] * 2
    grammar = tool_call_grammar(toolset.tools, toolset.choice)
    assert grammar.count("(call") == MAX_PARALLEL_CALLS - 1
    assert "(call" not in tool_call_grammar(toolset.tools, ToolChoice("required", parallel=False))
