"""Reading tool calls out of a model's answer, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
among text, as OpenAI shapes them: whole (`parse_tool_calls`) or as a stream of content pieces and tool-call
deltas (`ToolCallStream`). The whole answer is parsed by the same stream fed at once, so the two always agree.

A block that does not parse, or names no given tool, stays text: with tool_choice "auto" the model may write
anything. A grammar-forced answer (tool_choice "required" or named) always parses; its arguments are then
streamed in pieces as they are written, the way OpenAI streams them.
"""

import json
import re
import uuid
from dataclasses import dataclass

from ridgeline.tool_calls.grammar import CALL_CLOSE, CALL_OPEN

# The call's JSON up to where its arguments begin, in the order the grammar (and most models) write it.
_ARGUMENTS_START = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it


@dataclass(frozen=True)
class ToolCallDelta:
    """One piece of a streamed call: the first of each call carries its id and name, the rest argument text."""

    index: int
    arguments: str = ""
    id: str | None = None
    name: str | None = None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _held_back(text: str, tag: str) -> int:
    """How many trailing characters of `text` could be the start of `tag` (kept until the next piece decides)."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0


class ToolCallStream:
    def __init__(self, tool_names: set[str] | frozenset[str], incremental: bool = False):
        self._names = tool_names
        self._incremental = incremental  # stream arguments as written (only for grammar-forced calls)
        self._pending = ""  # text not yet decided: a possible tag start
        self._in_call = False
        self._body = ""
        self._streaming: tuple[str, int, int] | None = None  # (id, where the arguments start, characters sent)
        self.calls: list[ToolCall] = []

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """The content to send now and the tool-call deltas, for one more piece of the answer."""
        self._pending += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        while True:
            tag = CALL_CLOSE if self._in_call else CALL_OPEN
            at = self._pending.find(tag)
            if at < 0:
                keep = _held_back(self._pending, tag)
                ready, self._pending = self._pending[:len(self._pending) - keep], self._pending[len(self._pending) - keep:]
                if self._in_call:
                    self._body += ready
                    deltas += self._stream_arguments()
                else:
                    content.append(ready)
                return "".join(content), deltas
            ready, self._pending = self._pending[:at], self._pending[at + len(tag):]
            if self._in_call:
                self._body += ready
                text_piece, call_deltas = self._close_call()
                content.append(text_piece)
                deltas += call_deltas
            else:
                content.append(ready)
                self._in_call, self._body, self._streaming = True, "", None

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """The rest, once the answer has ended (a call cut off by max_tokens is read as far as it parses)."""
        if not self._in_call:
            rest, self._pending = self._pending, ""
            return rest, []
        self._body += self._pending
        self._pending = ""
        return self._close_call(closed=False)

    def _stream_arguments(self) -> list[ToolCallDelta]:
        if not self._incremental:
            return []
        deltas = []
        if self._streaming is None:
            found = _ARGUMENTS_START.match(self._body)
            if found is None or _unescape(found.group(1)) not in self._names or self._body[found.end()] != "{":
                return []  # not (yet) a call to a given tool whose arguments are an object: read it when it closes
            self._streaming = (new_call_id(), found.end(), 0)
            deltas.append(ToolCallDelta(len(self.calls), "", self._streaming[0], _unescape(found.group(1))))
        call_id, start, sent = self._streaming
        arguments = self._body[start:]
        # A closing brace at the end may be the call's own, not the arguments': held until more text shows.
        end = len(arguments.rstrip().removesuffix("}").rstrip()) if arguments.rstrip().endswith("}") else len(arguments)
        if end > sent:
            deltas.append(ToolCallDelta(len(self.calls), arguments[sent:end]))
            self._streaming = (call_id, start, end)
        return deltas

    def _close_call(self, closed: bool = True) -> tuple[str, list[ToolCallDelta]]:
        self._in_call = False
        call = self._parse(self._body)
        if call is None:
            if self._streaming is not None:  # arguments cut off mid-way (max_tokens): what was sent stands
                return "", []
            return CALL_OPEN + self._body + (CALL_CLOSE if closed else ""), []
        index = len(self.calls)
        if self._streaming is not None:
            call_id, _, sent = self._streaming
            call = ToolCall(call_id, call.name, call.arguments)
            deltas = [ToolCallDelta(index, call.arguments[sent:])] if len(call.arguments) > sent else []
        else:
            deltas = [ToolCallDelta(index, call.arguments, call.id, call.name)]
        self.calls.append(call)
        self._streaming = None
        return "", deltas

    def _parse(self, body: str) -> ToolCall | None:
        try:
            value = json.loads(body)
        except ValueError:
            return None
        if not isinstance(value, dict) or value.get("name") not in self._names:
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        found = _ARGUMENTS_START.match(body)
        if found is not None:  # the model's own text of the arguments: what a stream sent piece by piece
            text = body[found.end():].rstrip().removesuffix("}").rstrip()
            try:
                if json.loads(text) == arguments:
                    return ToolCall(new_call_id(), value["name"], text)
            except ValueError:
                pass
        return ToolCall(new_call_id(), value["name"], json.dumps(arguments, ensure_ascii=False))


def _unescape(name: str) -> str:
    try:
        return json.loads(f'"{name}"')
    except ValueError:
        return name


def parse_tool_calls(text: str, tool_names: set[str] | frozenset[str]) -> tuple[str | None, list[ToolCall]]:
    """The answer's text outside calls (None when it is only calls and white space) and its calls."""
    stream = ToolCallStream(tool_names)
    content, _ = stream.feed(text)
    rest, _ = stream.finish()
    content += rest
    if stream.calls and not content.strip():
        return None, stream.calls
    return content, stream.calls
