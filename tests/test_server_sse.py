"""A server-sent event is one line of JSON to every client, whatever characters the model's text holds."""

import json

import pytest
from httpx._decoders import LineDecoder
from pydantic import BaseModel

from ridgeline.server.serving import sse


class Chunk(BaseModel):
    text: str


@pytest.mark.parametrize("text", ["a\x85b", "a\u2028b", "a\u2029b", "\u2028", "line\nbreak\r", "\x0b\x0c\x1c\x1d\x1e"])
@pytest.mark.parametrize("payload", [Chunk, dict])
def test_an_event_stays_one_line_for_a_splitlines_reader_and_keeps_the_text(text, payload):
    event = sse(payload(text=text))
    # httpx's aiter_lines splits on everything str.splitlines() does, not only SSE's CR and LF
    lines = [line for line in LineDecoder().decode(event) if line]
    assert len(lines) == 1 and lines[0].startswith("data: ")
    assert json.loads(lines[0].removeprefix("data: "))["text"] == text
