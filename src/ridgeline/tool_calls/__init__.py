"""Tool (function) calling: how tools and past calls are shown to a model, the grammar that makes a required call
valid, and reading the calls back out of what the model wrote, whole or as a stream of OpenAI deltas.

Calls are written the Hermes way, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen 2.5/3, Hermes,
SmolLM3 and many fine-tunes were trained on it), both where a model's own template presents tools and in the
default presentation used for templates that have no tool section (Gemma 3, SmolLM2). Nothing here knows about
HTTP: the server reads requests into these plain values.
"""

from ridgeline.tool_calls.grammar import tool_call_grammar
from ridgeline.tool_calls.parser import ToolCall, ToolCallDelta, ToolCallStream, parse_tool_calls
from ridgeline.tool_calls.presentation import present_tools
from ridgeline.tool_calls.spec import FunctionTool, ToolChoice
from ridgeline.tool_calls.toolset import Toolset

__all__ = ["FunctionTool", "ToolCall", "ToolCallDelta", "ToolCallStream", "ToolChoice", "parse_tool_calls",
           "Toolset", "present_tools", "tool_call_grammar"]
