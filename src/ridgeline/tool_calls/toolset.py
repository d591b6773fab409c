"""One request's tools and tool choice, and the three things done with them: showing them to the chat template,
the grammar a forced call imposes, and reading the answer back. The server and the offline `LLM.chat` both use
it, so a request means the same through either."""

from collections.abc import Sequence
from dataclasses import dataclass, field

from ridgeline.tool_calls.grammar import tool_call_grammar
from ridgeline.tool_calls.parser import ToolCall, ToolCallStream, parse_tool_calls
from ridgeline.tool_calls.presentation import present_tools, template_takes_tools
from ridgeline.tool_calls.spec import FunctionTool, ToolChoice, check_tools


@dataclass(frozen=True)
class Toolset:
    tools: list[FunctionTool] = field(default_factory=list)
    choice: ToolChoice = field(default_factory=ToolChoice)

    def __post_init__(self):
        check_tools(self.tools, self.choice)

    @classmethod
    def from_openai(cls, tools: Sequence[dict | FunctionTool], tool_choice: str | dict | None = None,
                    parallel_tool_calls: bool | None = True) -> "Toolset":
        """From OpenAI's request fields: `tools` as function definitions, `tool_choice` "auto" (the default with
        tools), "none", "required" or {"type": "function", "function": {"name": ...}}."""
        functions = []
        for tool in tools:
            if isinstance(tool, dict):
                spec = tool.get("function", tool)
                parameters = spec.get("parameters")
                tool = FunctionTool(spec["name"], spec.get("description"),
                                    parameters if parameters is not None else {"type": "object", "properties": {}})
            functions.append(tool)
        if tool_choice is None:
            mode, name = ("auto" if functions else "none"), None
        elif isinstance(tool_choice, str):
            mode, name = tool_choice, None
        else:
            mode, name = "function", tool_choice["function"]["name"]
        return cls(functions, ToolChoice(mode, name, parallel_tool_calls is not False))

    @property
    def active(self) -> bool:
        """Tools are shown to the model and its answer is read for calls (tool_choice "none" hides them)."""
        return bool(self.tools) and self.choice.mode != "none"

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools)

    def template_input(self, messages: list[dict], template_source: str) -> tuple[list[dict], list | None]:
        """The messages and `tools` the chat template renders (the default presentation where the template has no
        tool section; the history's calls and results are rendered even when no tools are shown now)."""
        return present_tools(messages, self.tools if self.active else [], template_takes_tools(template_source))

    def grammar(self, answer_schema: dict | None = None) -> str | None:
        """The Lark grammar the answer must follow: a forced call's; with tool_choice "auto" and a JSON answer
        asked for (`answer_schema`), that JSON or calls (an agent with a typed output and tools asks exactly
        this); None when the answer is free."""
        if self.active and self.choice.forces_call:
            return tool_call_grammar(self.tools, self.choice)
        if self.active and answer_schema is not None:
            return tool_call_grammar(self.tools, self.choice, answer_schema)
        return None

    def read(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """A whole answer's content (None when it is only calls) and calls."""
        if not self.active:
            return text, []
        content, calls = parse_tool_calls(text, self.names)
        if self.choice.forces_call:  # the grammar allowed only calls: the rest is separators, or a call cut short
            return None, calls
        return content, calls

    def stream(self) -> ToolCallStream:
        """A reader of one streamed answer; a forced call's arguments stream as they are written."""
        return ToolCallStream(self.names, incremental=self.choice.forces_call)
