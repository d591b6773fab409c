"""The workload trace: one JSON object per line, shared by `bench serve --record/--trace` and `simulate`.

Each line is one request: `arrival_s` (seconds after the first request), `output_tokens`, and the prompt as
`prompt_ids` (token ids: what the simulator needs for real prefix-cache hits), `prompt` (text, for a server) or
just `prompt_tokens` (a count: the simulator then draws ids that share nothing). Lines may carry more keys
(bench serve records what it measured); readers ignore them.
"""

import json
from dataclasses import dataclass
from pathlib import Path

from ridgeline.errors import RidgelineError


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float
    output_tokens: int
    prompt_ids: tuple[int, ...] | None = None
    prompt: str | None = None
    prompt_tokens: int | None = None  # a count, when neither ids nor text are given (or as recorded)

    @property
    def num_prompt_tokens(self) -> int | None:
        return len(self.prompt_ids) if self.prompt_ids is not None else self.prompt_tokens

    def to_json(self) -> dict:
        row: dict = {"arrival_s": round(self.arrival_s, 6), "output_tokens": self.output_tokens}
        if self.prompt_ids is not None:
            row["prompt_ids"] = list(self.prompt_ids)
        if self.prompt is not None:
            row["prompt"] = self.prompt
        if self.prompt_tokens is not None:
            row["prompt_tokens"] = self.prompt_tokens
        return row


def parse_row(row: object, where: str) -> TraceRequest:
    if not isinstance(row, dict):
        raise RidgelineError(f"{where}: expected a JSON object, got {type(row).__name__}")
    arrival, output = row.get("arrival_s"), row.get("output_tokens")
    if not isinstance(arrival, (int, float)) or isinstance(arrival, bool) or arrival < 0:
        raise RidgelineError(f"{where}: 'arrival_s' must be a number of seconds >= 0, got {arrival!r}")
    if not isinstance(output, int) or isinstance(output, bool) or output < 1:
        raise RidgelineError(f"{where}: 'output_tokens' must be an integer >= 1, got {output!r}")
    ids, text, count = row.get("prompt_ids"), row.get("prompt"), row.get("prompt_tokens")
    if ids is not None and (not isinstance(ids, list) or not ids
                            or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
        raise RidgelineError(f"{where}: 'prompt_ids' must be a non-empty list of token ids >= 0")
    if text is not None and (not isinstance(text, str) or not text):
        raise RidgelineError(f"{where}: 'prompt' must be a non-empty string")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 1):
        raise RidgelineError(f"{where}: 'prompt_tokens' must be an integer >= 1, got {count!r}")
    if ids is None and text is None and count is None:
        raise RidgelineError(f"{where}: give the prompt as 'prompt_ids', 'prompt' or 'prompt_tokens'")
    return TraceRequest(float(arrival), output, tuple(ids) if ids is not None else None, text, count)


def read_trace(path: str | Path) -> list[TraceRequest]:
    """Every request of a trace file, sorted by arrival; a malformed line is an error naming its line."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as error:
        raise RidgelineError(f"cannot read trace {path}: {error.strerror or error}") from None
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise RidgelineError(f"trace {path} line {number}: not JSON ({error.msg})") from None
        requests.append(parse_row(row, f"trace {path} line {number}"))
    if not requests:
        raise RidgelineError(f"trace {path} holds no requests")
    return sorted(requests, key=lambda r: r.arrival_s)


def write_trace(path: str | Path, requests: list[TraceRequest], extra: list[dict] | None = None) -> Path:
    """One line per request; `extra[i]` (measured figures, say) is merged into line i."""
    path = Path(path)
    rows = [r.to_json() | (extra[i] if extra else {}) for i, r in enumerate(requests)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
