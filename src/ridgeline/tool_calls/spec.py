"""A request's tools and its tool choice, as plain typed values (the server's pydantic models become these)."""

import re
from dataclasses import dataclass, field
from typing import Any

from ridgeline.errors import InvalidParameterError
from ridgeline.json_schemas import schema_too_large

# OpenAI's rule for function names.
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
MAX_TOOLS = 128  # OpenAI's limit


@dataclass(frozen=True)
class FunctionTool:
    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_openai(self) -> dict:
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """"none" (answer in text; tools are not shown), "auto" (the model picks text or calls), "required" (one or more
    calls), or "function" with `name` (exactly that call)."""

    mode: str = "auto"
    name: str | None = None
    parallel: bool = True  # parallel_tool_calls: more than one call in one answer

    @property
    def forces_call(self) -> bool:
        return self.mode in ("required", "function")


def check_tools(tools: list[FunctionTool], choice: ToolChoice) -> None:
    if len(tools) > MAX_TOOLS:
        raise InvalidParameterError(f"at most {MAX_TOOLS} tools may be given, got {len(tools)}", param="tools")
    seen = set()
    for index, tool in enumerate(tools):
        if not NAME.fullmatch(tool.name):
            raise InvalidParameterError(f"tools[{index}].function.name {tool.name!r} must be 1-64 letters, digits, "
                                        f"'_' or '-'", param=f"tools.{index}.function.name")
        if tool.name in seen:
            raise InvalidParameterError(f"two tools are named {tool.name!r}", param=f"tools.{index}.function.name")
        seen.add(tool.name)
        if not isinstance(tool.parameters, dict):
            raise InvalidParameterError(f"tools[{index}].function.parameters must be a JSON schema object",
                                        param=f"tools.{index}.function.parameters")
        if (problem := schema_too_large(tool.parameters)) is not None:
            raise InvalidParameterError(f"tools[{index}].function.parameters is too large: {problem}",
                                        param=f"tools.{index}.function.parameters")
    if choice.forces_call and not tools:
        raise InvalidParameterError(f"tool_choice {choice.mode!r} needs at least one tool in 'tools'",
                                    param="tool_choice")
    if choice.mode == "function" and choice.name not in seen:
        raise InvalidParameterError(f"tool_choice names the function {choice.name!r}, which is not in 'tools'",
                                    param="tool_choice")
