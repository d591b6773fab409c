"""KV transfer inside one process: sources registered by address, fetched by direct calls. For tests, and for a
prefill and a decode engine that share a process."""

from ridgeline.cluster.kv_transfer.messages import Done, Failed, KeepAlive, Pull, TransferFailed
from ridgeline.cluster.kv_transfer.receiver import verify
from ridgeline.cluster.kv_transfer.source import KVSource


class InProcessTransport:
    def __init__(self):
        self._sources: dict[str, KVSource] = {}
        self.bytes_moved = 0

    def serve(self, address: str, source: KVSource) -> None:
        self._sources[address] = source

    def close(self, address: str) -> None:
        """The source at address is gone (its worker died): later fetches fail."""
        self._sources.pop(address, None)

    def _source(self, address: str) -> KVSource:
        source = self._sources.get(address)
        if source is None:
            raise TransferFailed(f"no KV source at {address!r} (the prefill worker is gone)")
        source.expire()
        return source

    def keep_alive(self, address: str, request_id: str) -> None:
        reply, _ = self._source(address).handle(KeepAlive(request_id))
        if isinstance(reply, Failed):
            raise reply.error()

    def keep_alive_many(self, address: str, request_ids: list[str], timeout: float = 5.0) -> dict[str, str | None]:
        source = self._source(address)
        answers = {}
        for request_id in request_ids:
            reply, _ = source.handle(KeepAlive(request_id))
            answers[request_id] = reply.reason if isinstance(reply, Failed) else None
        return answers

    def fetch(self, address: str, pull: Pull, page_bytes: int) -> list[bytes]:
        source = self._source(address)
        reply, frames = source.handle(pull)
        payloads = verify(pull, reply, frames, page_bytes)
        self.bytes_moved += sum(map(len, payloads))
        source.handle(Done(pull.request_id))
        return payloads
