"""Stop strings for one request, on streamed text.

Text arrives in chunks (one per decoded token), and a stop string may straddle chunks. The checker
emits text only when it can no longer turn out to be part of a stop string: it holds back the
longest tail of the text that is the beginning of some stop string, so a client never sees a
partial stop string, and releases that tail if generation ends for another reason.
"""

from dataclasses import dataclass


@dataclass
class StopUpdate:
    text: str  # new text the client may see now
    stopped: bool  # a stop string completed: generation must end


class StopChecker:
    def __init__(self, stop: list[str], include_stop_str_in_output: bool = False):
        self.stop = list(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.matched: str | None = None  # the stop string that ended generation
        self._text = ""  # everything decoded so far (cut at the stop string once one completes)
        self._emitted = 0  # length of the prefix of _text already handed out
        self._longest = max((len(s) for s in self.stop), default=0)

    @property
    def output_text(self) -> str:
        """Everything emitted so far: the request's text once finished (after flush())."""
        return self._text[: self._emitted]

    def append(self, new_text: str) -> StopUpdate:
        if not self.stop:  # nothing to look for or hold back: every request without stop strings, every token
            self._text += new_text
            self._emitted = len(self._text)
            return StopUpdate(new_text, False)
        if self.matched is not None:
            return StopUpdate("", True)
        # A stop string completed by this chunk starts no earlier than len(stop) - 1 characters before it.
        search_from = max(0, len(self._text) - self._longest + 1)
        self._text += new_text
        found = self._first_stop(search_from)
        if found is not None:
            start, stop = found
            self.matched = stop
            self._text = self._text[: start + len(stop) if self.include_stop_str_in_output else start]
            return StopUpdate(self._release(len(self._text)), True)
        return StopUpdate(self._release(len(self._text) - self._held_back()), False)

    def flush(self) -> str:
        """Generation ended without a stop string (EOS, length, abort): release the held-back tail."""
        return self._release(len(self._text))

    def _first_stop(self, search_from: int) -> tuple[int, str] | None:
        """The occurrence that completes first (earliest end; at equal ends the earlier start), which is
        where token-by-token generation would have stopped, so the result never depends on chunking."""
        hits = [(index + len(s), index, s) for s in self.stop if (index := self._text.find(s, search_from)) >= 0]
        if not hits:
            return None
        _, start, stop = min(hits)
        return start, stop

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        for length in range(min(self._longest - 1, len(self._text) - self._emitted), 0, -1):
            tail = self._text[-length:]
            if any(s.startswith(tail) for s in self.stop if len(s) > length):
                return length
        return 0

    def _release(self, end: int) -> str:
        released = self._text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return released
