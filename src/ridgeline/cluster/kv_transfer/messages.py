"""The wire messages of disaggregated prefill and decode, as typed values with their JSON.

Two conversations. Between a decode side and a prefill side's KV server (ZeroMQ): a JSON header frame, then one
frame per page's bytes (`encode`/`decode`: Pull, Pages, Done, KeepAlive, Failed); the header says what the page
frames are, so bytes on the wire = the pages' bytes + the headers. And over HTTP, through a front: the prefill
worker's answer names its held pages (`KVOffer`, in the answer's `kv_transfer_params`), which the front hands to a
decode worker in the request's `kv_transfer_params` (`KVTransferParams`, the fields vLLM's P/D connectors use).

Defined here, the lowest layer both sides import (the front and the workers in server/, the transfer in
cluster/kv_transfer/), so each side builds and reads the same value rather than a dict each spells its own way.
Parsing is strict and says which field is at fault (MalformedMessage.field): a worker answers a bad request
400 naming it, a front answers 502 for a worker's bad answer.
"""

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ridgeline.engine.kv_handoff import KVManifest, PageRef
from ridgeline.engine.sampler import TokenLogprobs


class TransferFailed(RuntimeError):
    """A KV transfer ended without its pages; `reason` says why (refused handshake, lapsed lease, peer gone...).
    `retriable`: prefilling the prompt again can succeed (the pages are gone: lapsed, released, their worker
    restarted or unreachable, damaged on the way); False where it cannot (the two sides' KV layouts differ)."""

    def __init__(self, reason: str, retriable: bool = True):
        super().__init__(reason)
        self.reason = reason
        self.retriable = retriable


class MalformedMessage(TransferFailed):
    """A message that does not parse: `field` is the dotted path of the part at fault ("manifest.pages[2]")."""

    def __init__(self, what: str, field: str, problem: str):
        super().__init__(f"malformed {what}: {field!r} {problem}")
        self.what = what
        self.field = field
        self.problem = problem


# A Failed reply's code where retrying cannot help (see TransferFailed.retriable).
LAYOUT_MISMATCH = "layout_mismatch"


@dataclass(frozen=True)
class Pull:
    """Decode side -> prefill side: send me these pages of this request (after checking our layouts agree)."""

    request_id: str
    layout_digest: str
    pages: tuple[PageRef, ...]


@dataclass(frozen=True)
class Pages:
    """Prefill side -> decode side: the pages asked for, each with the sha256 of its bytes (bytes in frames)."""

    request_id: str
    pages: tuple[PageRef, ...]
    digests: tuple[bytes, ...]


@dataclass(frozen=True)
class Done:
    """Decode side -> prefill side: every page arrived intact; free them."""

    request_id: str


@dataclass(frozen=True)
class KeepAlive:
    """Decode side -> prefill side: still coming for this request's pages (it waits for room here); hold them.
    The prefill side extends the lease and echoes it back, or answers Failed when it no longer holds them."""

    request_id: str


@dataclass(frozen=True)
class Failed:
    """Either side: the transfer of this request is over without success (`code`: LAYOUT_MISMATCH, or None)."""

    request_id: str
    reason: str
    code: str | None = None

    def error(self) -> TransferFailed:
        return TransferFailed(self.reason, retriable=self.code != LAYOUT_MISMATCH)


Message = Pull | Pages | Done | KeepAlive | Failed



# ---------------------------------------------------------------- strict JSON reading, naming the field at fault

T = TypeVar("T")
Convert = Callable[[str, Any, str], T]  # (what, value, field path) -> value; raises MalformedMessage
_REQUIRED = object()


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def as_object(what: str, body: Any, where: str) -> dict:
    if not isinstance(body, dict):
        raise MalformedMessage(what, where, f"must be an object, not {_type_name(body)}")
    return body


def field(what: str, body: dict, where: str, name: str, convert: "Convert[T]", default: Any = _REQUIRED) -> T:
    """body[name] converted, or `default` where it is absent (required where no default is given)."""
    path = f"{where}.{name}" if where else name
    if name not in body:
        if default is _REQUIRED:
            raise MalformedMessage(what, path, "is missing")
        return default
    return convert(what, body[name], path)


def as_int(what: str, value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedMessage(what, where, f"must be an integer, not {_type_name(value)}")
    return value


def as_float(what: str, value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedMessage(what, where, f"must be a number, not {_type_name(value)}")
    return float(value)


def as_str(what: str, value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise MalformedMessage(what, where, f"must be a string, not {_type_name(value)}")
    return value


def as_bool(what: str, value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise MalformedMessage(what, where, f"must be true or false, not {_type_name(value)}")
    return value


def as_hex(what: str, value: Any, where: str) -> bytes:
    try:
        return bytes.fromhex(as_str(what, value, where))
    except ValueError:
        raise MalformedMessage(what, where, "must be hexadecimal") from None


def optional(convert: "Convert[T]") -> "Convert[T | None]":
    return lambda what, value, where: None if value is None else convert(what, value, where)


def list_of(convert: "Convert[T]") -> "Convert[tuple[T, ...]]":
    def read(what: str, value: Any, where: str) -> tuple:
        if not isinstance(value, list):
            raise MalformedMessage(what, where, f"must be a list, not {_type_name(value)}")
        return tuple(convert(what, item, f"{where}[{i}]") for i, item in enumerate(value))

    return read


# ---------------------------------------------------------------- the KV server's messages (ZeroMQ header frames)


def _ref(ref: PageRef) -> list:
    return [ref.group, ref.block, None if ref.chain_hash is None else ref.chain_hash.hex()]


def _unref(what: str, item: Any, where: str) -> PageRef:
    """A page as [group, block, chain hash hex or null]."""
    if not isinstance(item, list) or len(item) != 3:
        raise MalformedMessage(what, where, "must be [group, block, chain hash or null]")
    return PageRef(as_int(what, item[0], f"{where}[0]"), as_int(what, item[1], f"{where}[1]"),
                   optional(as_hex)(what, item[2], f"{where}[2]"))


def encode(message: Message) -> bytes:
    body: dict = {"type": type(message).__name__, "request_id": message.request_id}
    if isinstance(message, Pull):
        body |= {"layout_digest": message.layout_digest, "pages": [_ref(r) for r in message.pages]}
    elif isinstance(message, Pages):
        body |= {"pages": [_ref(r) for r in message.pages], "digests": [d.hex() for d in message.digests]}
    elif isinstance(message, Failed):
        body["reason"] = message.reason
        if message.code is not None:
            body["code"] = message.code
    return json.dumps(body, separators=(",", ":")).encode()


def decode(frame: bytes) -> Message:
    """A header frame's message; MalformedMessage (a TransferFailed) naming the field at fault."""
    what = "KV transfer message"
    try:
        body = json.loads(frame)
    except ValueError as error:
        raise MalformedMessage(what, "(frame)", f"is not JSON: {error}") from None
    body = as_object(what, body, "(frame)")
    kind = field(what, body, "", "type", as_str)
    request_id = field(what, body, "", "request_id", as_str)
    if kind == "Pull":
        return Pull(request_id, field(what, body, "", "layout_digest", as_str),
                    field(what, body, "", "pages", list_of(_unref)))
    if kind == "Pages":
        return Pages(request_id, field(what, body, "", "pages", list_of(_unref)),
                     field(what, body, "", "digests", list_of(as_hex)))
    if kind == "Done":
        return Done(request_id)
    if kind == "KeepAlive":
        return KeepAlive(request_id)
    if kind == "Failed":
        return Failed(request_id, field(what, body, "", "reason", as_str), field(what, body, "", "code",
                                                                                   optional(as_str), None))
    raise MalformedMessage(what, "type", f"is {kind!r}, not one of Pull, Pages, Done, KeepAlive, Failed")


# ---------------------------------------------------------------- the HTTP hand-over through a front

_OFFER = "kv_transfer_params"


def manifest_to_json(manifest: KVManifest) -> dict:
    """A manifest as JSON, for a prefill worker's answer (`kv_transfer_params`) that a front hands the decode worker."""
    return {"request_id": manifest.request_id, "prompt_token_ids": list(manifest.prompt_token_ids),
            "first_token_id": manifest.first_token_id, "pages": [_ref(ref) for ref in manifest.pages],
            "layout_digest": manifest.layout_digest, "num_cached_tokens": manifest.num_cached_tokens}


def manifest_from_json(body: Any, where: str = "manifest", what: str = _OFFER) -> KVManifest:
    body = as_object(what, body, where)
    return KVManifest(field(what, body, where, "request_id", as_str),
                      field(what, body, where, "prompt_token_ids", list_of(as_int)),
                      field(what, body, where, "first_token_id", as_int),
                      field(what, body, where, "pages", list_of(_unref)),
                      field(what, body, where, "layout_digest", as_str),
                      field(what, body, where, "num_cached_tokens", as_int, 0))


def logprobs_to_json(entry: TokenLogprobs | None) -> dict | None:
    return None if entry is None else {"token_id": entry.token_id, "logprob": entry.logprob,
                                       "top_token_ids": entry.top_token_ids, "top_logprobs": entry.top_logprobs}


def logprobs_from_json(body: Any, where: str = "first_logprobs", what: str = _OFFER) -> TokenLogprobs | None:
    if body is None:
        return None
    body = as_object(what, body, where)
    return TokenLogprobs(field(what, body, where, "token_id", as_int), field(what, body, where, "logprob", as_float),
                         list(field(what, body, where, "top_token_ids", list_of(as_int))),
                         list(field(what, body, where, "top_logprobs", list_of(as_float))))


@dataclass(frozen=True)
class KVOffer:
    """A prefill worker's answer for a request it prefilled and holds (the answer's `kv_transfer_params`): where a
    decode worker pulls the pages (`remote_address`, its KV server), which they are (the manifest), the first
    token's logprobs, and how long the pages are held unasked (None: the prefill worker's default)."""

    remote_address: str
    manifest: KVManifest
    first_logprobs: TokenLogprobs | None = None
    lease_seconds: float | None = None

    def to_json(self) -> dict:
        return {"remote_address": self.remote_address, "manifest": manifest_to_json(self.manifest),
                "first_logprobs": logprobs_to_json(self.first_logprobs), "lease_seconds": self.lease_seconds}

    @classmethod
    def from_json(cls, body: Any, where: str = "") -> "KVOffer":
        """MalformedMessage naming the field (as `where`.field) where one is missing or of the wrong type."""
        what = _OFFER
        body = as_object(what, body, where or _OFFER)
        prefix = f"{where}." if where else ""
        return cls(field(what, body, where, "remote_address", as_str),
                   manifest_from_json(field(what, body, where, "manifest", as_object), f"{prefix}manifest"),
                   logprobs_from_json(body.get("first_logprobs"), f"{prefix}first_logprobs"),
                   field(what, body, where, "lease_seconds", optional(as_float), None))


@dataclass(frozen=True)
class KVTransferParams:
    """A request's `kv_transfer_params`, as a front sends them: to a prefill worker, `do_remote_decode` (prefill it
    and hold its pages for a decode worker); to a decode worker, `do_remote_prefill` with the prefill worker's offer
    (pull the pages it names, then decode). Neither: an ordinary request."""

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    offer: KVOffer | None = None  # with do_remote_prefill: the pages to pull
    # With do_remote_decode: the name the front gave the request, so that it can release the pages by it even when
    # it is cancelled while the answer (which holds the worker's own id) is still on the wire.
    front_request_id: str | None = None

    def __post_init__(self) -> None:
        if self.do_remote_prefill and not self.do_remote_decode and self.offer is None:
            raise MalformedMessage(_OFFER, "do_remote_prefill", "needs the prefill worker's offer beside it "
                                                                "(remote_address, manifest)")

    @property
    def disaggregated(self) -> bool:
        return self.do_remote_decode or self.do_remote_prefill

    def to_json(self) -> dict:
        """The wire form: the offer's fields and the flag side by side in one object, as vLLM's connectors have it."""
        body = self.offer.to_json() if self.offer is not None else {}
        if self.do_remote_decode:
            body["do_remote_decode"] = True
        if self.do_remote_prefill:
            body["do_remote_prefill"] = True
        if self.front_request_id is not None:
            body["front_request_id"] = self.front_request_id
        return body

    @staticmethod
    def flags(body: Any) -> tuple[bool, bool]:
        """(do_remote_decode, do_remote_prefill) alone: a worker checks its role against them before it reads the
        offer, so a request sent to the wrong worker is told that rather than what its offer lacks."""
        body = as_object(_OFFER, body, _OFFER)
        return (field(_OFFER, body, "", "do_remote_decode", optional(as_bool), None) or False,
                field(_OFFER, body, "", "do_remote_prefill", optional(as_bool), None) or False)

    @classmethod
    def from_json(cls, body: Any) -> "KVTransferParams":
        """MalformedMessage naming the field at fault (its path inside `kv_transfer_params`)."""
        remote_decode, remote_prefill = cls.flags(body)
        offer = KVOffer.from_json(body) if remote_prefill and not remote_decode else None
        name = field(_OFFER, body, "", "front_request_id", optional(as_str), None)
        return cls(remote_decode, remote_prefill, offer, name)
