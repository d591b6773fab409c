"""KV transfer over TCP with ZeroMQ: the prefill side serves a ROUTER socket from its own thread; the decode side
opens a DEALER per fetch. A multipart message is one header frame (messages.encode) then one frame per page.

The pages asked for stream back as several `Pages` messages of at most CHUNK_BYTES each, not one: neither side
holds a whole long prompt's KV twice in one message, and a transfer has a "mid" (some pages here, the rest not)
that a dying prefill worker can really interrupt. `link_bytes_per_second` paces the stream page by page, to
emulate a slower link than loopback (a benchmark across a 1 Gb/s link; a test that kills the sender mid-stream).

No silent waits: a socket monitor turns a peer that closes, a connection refused, or heartbeats that stop
(ZMQ_HEARTBEAT_*: a hung or unplugged peer) into TransferFailed at once; an overall deadline bounds the rest.
"""

import threading
import time
from contextlib import contextmanager
import zmq.utils.monitor

import zmq

from ridgeline.cluster.kv_transfer.messages import Done, Failed, KeepAlive, Pages, Pull, TransferFailed, decode, encode
from ridgeline.cluster.kv_transfer.receiver import verify
from ridgeline.cluster.kv_transfer.source import KVSource

HEARTBEAT_MS = 250
HEARTBEAT_TIMEOUT_MS = 1500
CHUNK_BYTES = 4 << 20  # page bytes per Pages message: a few ms on a fast link, so streaming costs nothing
_PEER_GONE = {zmq.EVENT_DISCONNECTED: "the prefill side closed the connection",
              zmq.EVENT_CONNECT_RETRIED: "the prefill side refused the connection (nothing listens there)",
              zmq.EVENT_CLOSED: "the connection to the prefill side closed (refused or dropped)"}


class ZmqKVServer:
    """Serves `source` on `bind` (e.g. tcp://0.0.0.0:5557; port * picks a free one) until close()."""

    def __init__(self, source: KVSource, bind: str = "tcp://127.0.0.1:*", context: zmq.Context | None = None,
                 link_bytes_per_second: float | None = None):
        self.source = source
        self.link_bytes_per_second = link_bytes_per_second  # None: as fast as the link goes
        self._context = context or zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        self._socket.bind(bind)
        self.address = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.bytes_sent = 0  # everything on the wire, headers included
        self.pages_sent = 0  # pages (and their bytes) that left, chunk by chunk: a transfer's progress
        self.page_bytes_sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="ridgeline-kv-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(100):
                identity, header, *_ = self._socket.recv_multipart(copy=True)
                try:
                    reply, frames = self.source.handle(decode(header))
                except TransferFailed:
                    continue  # a malformed message: nothing to answer it about
                if reply is not None:
                    self._send(identity, reply, frames)
            self.source.expire()
        self._socket.close(linger=0)

    def _send(self, identity: bytes, reply, frames: list[bytes]) -> None:
        """A reply; a Pages reply in chunks, paced when the link is emulated slower."""
        if not isinstance(reply, Pages) or not frames:
            self._send_one(identity, reply, frames)
            return
        per_chunk = 1 if self.link_bytes_per_second else max(1, CHUNK_BYTES // len(frames[0]))
        for start in range(0, len(frames), per_chunk):
            end = start + per_chunk
            chunk = Pages(reply.request_id, reply.pages[start:end], reply.digests[start:end])
            self._send_one(identity, chunk, frames[start:end])
            self.pages_sent += len(chunk.pages)
            self.page_bytes_sent += sum(map(len, frames[start:end]))
            if self.link_bytes_per_second and end < len(frames):
                # Interruptible: close() (and a test's kill) must not wait out an emulated slow link.
                if self._stop.wait(sum(map(len, frames[start:end])) / self.link_bytes_per_second):
                    return

    def _send_one(self, identity: bytes, reply, frames: list[bytes]) -> None:
        head = encode(reply)
        self._socket.send_multipart([identity, head, *frames], copy=False)
        self.bytes_sent += len(head) + sum(map(len, frames))

    def close(self) -> None:
        """Stop serving: decode sides that are mid-transfer see the connection close (and fail at once)."""
        self._stop.set()
        self._thread.join()


class ZmqTransport:
    def __init__(self, timeout: float = 30.0, context: zmq.Context | None = None):
        self.timeout = timeout
        self._context = context or zmq.Context.instance()
        self.bytes_received = 0

    def fetch(self, address: str, pull: Pull, page_bytes: int) -> list[bytes]:
        with self._dealer(address) as (socket, monitor):
            socket.send(encode(pull))
            reply, frames = self._await_reply(socket, monitor, address, pull.request_id, len(pull.pages))
            payloads = verify(pull, reply, frames, page_bytes)
            socket.send(encode(Done(pull.request_id)))
            return payloads

    def keep_alive(self, address: str, request_id: str) -> None:
        with self._dealer(address) as (socket, monitor):
            socket.send(encode(KeepAlive(request_id)))
            reply, _ = self._await_reply(socket, monitor, address, request_id, 0)
        if isinstance(reply, Failed):
            raise reply.error()
        if not isinstance(reply, KeepAlive):
            raise TransferFailed(f"unexpected reply {type(reply).__name__} to a keep-alive of {request_id!r}")

    def keep_alive_many(self, address: str, request_ids: list[str], timeout: float = 5.0) -> dict[str, str | None]:
        """Keep-alives for several requests' pages at one prefill side, over one connection: request id -> None
        (held, lease extended) or why they are gone. A request the prefill side does not answer about within
        `timeout` is left out (try again later); TransferFailed if the prefill side itself is gone."""
        answers: dict[str, str | None] = {}
        with self._dealer(address) as (socket, monitor):
            for request_id in request_ids:
                socket.send(encode(KeepAlive(request_id)))
            poller = zmq.Poller()
            poller.register(socket, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            deadline = time.monotonic() + timeout
            while len(answers) < len(request_ids) and (left := deadline - time.monotonic()) > 0:
                ready = dict(poller.poll(int(left * 1000) + 1))
                if socket in ready:
                    header, *_ = socket.recv_multipart(copy=True)
                    reply = decode(header)
                    answers[reply.request_id] = reply.reason if isinstance(reply, Failed) else None
                elif monitor in ready:
                    event = zmq.utils.monitor.recv_monitor_message(monitor)["event"]
                    if event in _PEER_GONE:
                        raise TransferFailed(f"{_PEER_GONE[event]} at {address}")
        return answers

    @contextmanager
    def _dealer(self, address: str):
        """A DEALER connected to `address`, and a monitor that reports the peer going away."""
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RECONNECT_IVL, 100)
        socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
        monitor = socket.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
                                            | zmq.EVENT_CLOSED)
        try:
            socket.connect(address)
            yield socket, monitor
        finally:
            socket.disable_monitor()
            monitor.close(linger=0)
            socket.close(linger=0)

    def _await_reply(self, socket, monitor, address: str, request_id: str, num_pages: int):
        """The reply about `request_id`: num_pages pages as one Pages (joined from its chunks), or the first reply
        that is not Pages (a keep-alive's echo, or a Failed for verify to refuse). The deadline restarts with every
        chunk: a slow link that keeps delivering is alive; one that stops is not."""
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        refs, digests, frames = [], [], []
        deadline = time.monotonic() + self.timeout
        while (left := deadline - time.monotonic()) > 0:
            ready = dict(poller.poll(int(left * 1000) + 1))
            if socket in ready:
                header, *chunk = socket.recv_multipart(copy=True)
                self.bytes_received += len(header) + sum(map(len, chunk))
                reply = decode(header)
                if not isinstance(reply, Pages) or reply.request_id != request_id:
                    return reply, chunk
                refs += reply.pages
                digests += reply.digests
                frames += chunk
                if len(refs) >= num_pages:
                    return Pages(request_id, tuple(refs), tuple(digests)), frames
                deadline = time.monotonic() + self.timeout
            elif monitor in ready:
                event = zmq.utils.monitor.recv_monitor_message(monitor)["event"]
                if event in _PEER_GONE:
                    got = f" after {len(refs)} of {num_pages} pages" if refs else ""
                    raise TransferFailed(f"{_PEER_GONE[event]} at {address}{got}")
        raise TransferFailed(f"no answer from the prefill side at {address} within {self.timeout:g} s")


def advertised(bound: str, host: str | None) -> str:
    """The address peers should dial for a socket bound at `bound` (tcp://0.0.0.0:PORT is no address to dial)."""
    if host is None:
        return bound
    port = bound.rsplit(":", 1)[1]
    return f"tcp://{host}:{port}"
