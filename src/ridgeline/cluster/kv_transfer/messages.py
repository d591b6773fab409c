"""The wire messages of a KV transfer, and their framing: a JSON header frame, then one frame per page's bytes.

The header says what the page frames are, so bytes on the wire = the pages' bytes + the headers (framing_bytes).
"""

import json
from dataclasses import dataclass

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
        if message.code is not None:
            body["code"] = message.code
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
        if kind == "KeepAlive":
            return KeepAlive(request_id)
        if kind == "Failed":
            return Failed(request_id, str(body["reason"]), body.get("code"))
    except (ValueError, KeyError, TypeError) as error:
        raise TransferFailed(f"malformed KV transfer message: {error}") from None
    raise TransferFailed(f"unknown KV transfer message type {kind!r}")


def manifest_to_json(manifest: KVManifest) -> dict:
    """A manifest as JSON, for a prefill worker's answer (`kv_transfer_params`) that a front hands the decode worker."""
    return {"request_id": manifest.request_id, "prompt_token_ids": list(manifest.prompt_token_ids),
            "first_token_id": manifest.first_token_id, "pages": [_ref(ref) for ref in manifest.pages],
            "layout_digest": manifest.layout_digest, "num_cached_tokens": manifest.num_cached_tokens}


def manifest_from_json(body: dict) -> KVManifest:
    try:
        return KVManifest(str(body["request_id"]), tuple(int(t) for t in body["prompt_token_ids"]),
                          int(body["first_token_id"]), tuple(_unref(ref) for ref in body["pages"]),
                          str(body["layout_digest"]), int(body.get("num_cached_tokens", 0)))
    except (KeyError, TypeError, ValueError) as error:
        raise TransferFailed(f"malformed KV manifest: {error!r}") from None


def logprobs_to_json(entry: TokenLogprobs | None) -> dict | None:
    return None if entry is None else {"token_id": entry.token_id, "logprob": entry.logprob,
                                       "top_token_ids": entry.top_token_ids, "top_logprobs": entry.top_logprobs}


def logprobs_from_json(body: dict | None) -> TokenLogprobs | None:
    if body is None:
        return None
    try:
        return TokenLogprobs(int(body["token_id"]), float(body["logprob"]), [int(t) for t in body["top_token_ids"]],
                             [float(v) for v in body["top_logprobs"]])
    except (KeyError, TypeError, ValueError) as error:
        raise TransferFailed(f"malformed first-token logprobs: {error!r}") from None
