"""The wire messages of a KV transfer, and their framing: a JSON header frame, then one frame per page's bytes.

The header says what the page frames are, so bytes on the wire = the pages' bytes + the headers (framing_bytes).
"""

import json
from dataclasses import dataclass

from ridgeline.engine.kv_handoff import PageRef


class TransferFailed(RuntimeError):
    """A KV transfer ended without its pages; `reason` says why (refused handshake, lapsed lease, peer gone...)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


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
class Failed:
    """Either side: the transfer of this request is over without success."""

    request_id: str
    reason: str


Message = Pull | Pages | Done | Failed


def _ref(ref: PageRef) -> list:
    return [ref.group, ref.block, None if ref.chain_hash is None else ref.chain_hash.hex()]


def _unref(item: list) -> PageRef:
    group, block, chain = item
    return PageRef(int(group), int(block), None if chain is None else bytes.fromhex(chain))


def encode(message: Message) -> bytes:
    body: dict = {"type": type(message).__name__, "request_id": message.request_id}
    if isinstance(message, Pull):
        body |= {"layout_digest": message.layout_digest, "pages": [_ref(r) for r in message.pages]}
    elif isinstance(message, Pages):
        body |= {"pages": [_ref(r) for r in message.pages], "digests": [d.hex() for d in message.digests]}
    elif isinstance(message, Failed):
        body["reason"] = message.reason
    return json.dumps(body, separators=(",", ":")).encode()


def decode(frame: bytes) -> Message:
    try:
        body = json.loads(frame)
        kind, request_id = body["type"], str(body["request_id"])
        if kind == "Pull":
            return Pull(request_id, str(body["layout_digest"]), tuple(_unref(r) for r in body["pages"]))
        if kind == "Pages":
            return Pages(request_id, tuple(_unref(r) for r in body["pages"]),
                         tuple(bytes.fromhex(d) for d in body["digests"]))
        if kind == "Done":
            return Done(request_id)
        if kind == "Failed":
            return Failed(request_id, str(body["reason"]))
    except (ValueError, KeyError, TypeError) as error:
        raise TransferFailed(f"malformed KV transfer message: {error}") from None
    raise TransferFailed(f"unknown KV transfer message type {kind!r}")
