"""The HTTP bodies a disaggregated front (server/disaggregated_front.py) and its workers (server/app.py) exchange
besides the client's own request, as typed values with their JSON: the decode worker's prefix-cache lookup answer,
the prefill worker's /tokenize answer the front reads, and the release of pages nobody will collect.

The KV offer and the request's `kv_transfer_params` live one layer down, beside the transfer that uses them
(cluster/kv_transfer/messages.py). Both sides build and read these values, so a field renamed on one side is a
type error, not a KeyError in production; a malformed answer raises MalformedMessage naming the field.
"""

from dataclasses import dataclass
from typing import Any

from ridgeline.cluster.kv_transfer.messages import (MalformedMessage, as_bool, as_int, as_object, as_str, field,
                                                    list_of, optional)

__all__ = ["KVLookupAnswer", "KVRelease", "MalformedMessage", "TokenizeAnswer"]


@dataclass(frozen=True)
class KVLookupAnswer:
    """A decode worker's answer to POST /v1/kv/lookup: how much of the prompt its prefix cache holds, and whether it
    takes one more remote prefill now (a front refuses before it spends a prefill if not)."""

    prompt_tokens: int
    cached_tokens: int
    accepting: bool
    kv_waiting: int  # requests taken and waiting for KV room there
    max_kv_waiting: int  # the bound on kv_waiting beyond which it refuses
    max_model_len: int | None = None

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def to_json(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "accepting": self.accepting, "kv_waiting": self.kv_waiting, "max_kv_waiting": self.max_kv_waiting,
                "max_model_len": self.max_model_len}

    @classmethod
    def from_json(cls, body: Any) -> "KVLookupAnswer":
        what = "/v1/kv/lookup answer"
        body = as_object(what, body, "(body)")
        return cls(field(what, body, "", "prompt_tokens", as_int), field(what, body, "", "cached_tokens", as_int),
                   field(what, body, "", "accepting", as_bool), field(what, body, "", "kv_waiting", as_int),
                   field(what, body, "", "max_kv_waiting", as_int),
                   field(what, body, "", "max_model_len", optional(as_int), None))


@dataclass(frozen=True)
class TokenizeAnswer:
    """POST /tokenize's answer: the prompt's token ids as the request would be tokenized."""

    tokens: tuple[int, ...]
    max_model_len: int | None = None

    def to_json(self) -> dict:
        return {"tokens": list(self.tokens), "count": len(self.tokens), "max_model_len": self.max_model_len}

    @classmethod
    def from_json(cls, body: Any) -> "TokenizeAnswer":
        what = "/tokenize answer"
        body = as_object(what, body, "(body)")
        return cls(field(what, body, "", "tokens", list_of(as_int)),
                   field(what, body, "", "max_model_len", optional(as_int), None))


@dataclass(frozen=True)
class KVRelease:
    """A front to a prefill worker (POST /v1/kv/release): nobody will collect this request's pages (its client left,
    or no decode worker took it); free them now rather than when their lease lapses. `request_id` is the prefill
    worker's own (the offer's manifest.request_id). The answer echoes it as {"released": request_id}. The worker's
    endpoint validates it as server/protocol.py's KVReleaseRequest (so it appears in the OpenAPI schema);
    tests/test_disaggregation_messages.py checks the two agree."""

    request_id: str

    def to_json(self) -> dict:
        return {"request_id": self.request_id}

    @classmethod
    def from_json(cls, body: Any) -> "KVRelease":
        what = "/v1/kv/release request"
        return cls(field(what, as_object(what, body, "(body)"), "", "request_id", as_str))
