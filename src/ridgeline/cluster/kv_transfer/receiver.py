"""The decode side of a KV transfer: reserve pages, pull the missing ones, verify, write, admit -- or free what
was reserved and say why. Transport-agnostic: `transport.fetch(address, pull, page_bytes)` returns the payloads
in the order asked, or raises TransferFailed; `transport.keep_alive(address, request_id)` extends the prefill side's
lease on a request's pages while the decode side waits for room to take them, or raises TransferFailed;
`keep_alive_many` does it for several requests at one address (server/kv_leases.py)."""

from dataclasses import dataclass
from typing import Protocol

from ridgeline.cluster.kv_transfer.messages import Failed, Message, Pages, Pull, TransferFailed
from ridgeline.engine.admission import AdmittedRequest
from ridgeline.engine.kv_handoff import KVHandoffError, KVLayout, KVManifest, PageRef, payload_digest
from ridgeline.engine.sampler import TokenLogprobs


class KVTransport(Protocol):
    def fetch(self, address: str, pull: Pull, page_bytes: int) -> list[bytes]: ...

    def keep_alive(self, address: str, request_id: str) -> None: ...

    def keep_alive_many(self, address: str, request_ids: list[str], timeout: float = 5.0) -> dict[str, str | None]: ...


@dataclass(frozen=True)
class Received:
    pages_moved: int
    pages_cached: int  # skipped: the decode side's prefix cache held them
    bytes_moved: int


def verify(pull: Pull, reply: Message, frames: list[bytes], page_bytes: int) -> list[bytes]:
    """The payloads of a Pages reply that answers `pull` page for page, each of page_bytes with its digest."""
    if isinstance(reply, Failed):
        raise reply.error()
    if not isinstance(reply, Pages) or reply.request_id != pull.request_id:
        raise TransferFailed(f"unexpected reply {type(reply).__name__} to a pull of {pull.request_id!r}")
    if reply.pages != pull.pages or len(frames) != len(pull.pages) or len(reply.digests) != len(frames):
        raise TransferFailed(f"{len(frames)} pages arrived for the {len(pull.pages)} asked")
    for ref, frame, digest in zip(pull.pages, frames, reply.digests):
        if len(frame) != page_bytes:
            raise TransferFailed(f"page (group {ref.group}, block {ref.block}) has {len(frame)} bytes, not {page_bytes}")
        if payload_digest(frame) != digest:
            raise TransferFailed(f"page (group {ref.group}, block {ref.block}) does not match its sha256")
    return frames


def reserve(engine, request_id: str, request: AdmittedRequest, manifest: KVManifest,
            first_logprobs: TokenLogprobs | None = None) -> list[PageRef] | None:
    """On the engine's thread: pages for the request, and which of them to fetch (None: no room now)."""
    try:
        return engine.receive_kv(request_id, request, manifest, first_logprobs=first_logprobs)
    except KVHandoffError as error:  # another layout, another prompt: prefilling again would not help
        raise TransferFailed(str(error), retriable=False) from error


def fetch(transport: KVTransport, address: str, manifest: KVManifest, refs: list[PageRef], layout: KVLayout) -> list[bytes]:
    """On any thread: the pages' bytes from the prefill side (which names the request by its own id)."""
    return transport.fetch(address, Pull(manifest.request_id, layout.digest(), tuple(refs)), layout.page_bytes)


def commit(engine, request_id: str, refs: list[PageRef], payloads: list[bytes]) -> None:
    """On the engine's thread: write the pages; the request decodes from the next step."""
    engine.write_kv_pages(request_id, refs, payloads)
    engine.commit_kv(request_id)


def receive(engine, transport: KVTransport, address: str, request_id: str, request: AdmittedRequest,
            manifest: KVManifest, first_logprobs: TokenLogprobs | None = None) -> Received | None:
    """reserve -> fetch -> commit in one call, for callers on the engine's thread. None: no room now (nothing was
    reserved; try again later). On TransferFailed the reserved pages are freed before it propagates."""
    refs = reserve(engine, request_id, request, manifest, first_logprobs)
    if refs is None:
        return None
    try:
        payloads = fetch(transport, address, manifest, refs, engine.kv_layout())
        commit(engine, request_id, refs, payloads)
    except BaseException:
        engine.abort(request_id)  # frees the reserved pages at once
        raise
    return Received(len(refs), len(manifest.pages) - len(refs), sum(map(len, payloads)))
