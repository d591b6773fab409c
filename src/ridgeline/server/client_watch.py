"""Work nobody waits for stops: an awaited upstream call (a prefill worker's answer, a replica's headers, the
engine's outputs) raced against the client's connection and the request's deadline.

A proxy that only asks `is_disconnected()` after its upstream call returns spends the whole call on a client that
left at its start: a prefill queued behind minutes of others is computed for nobody (issue 38). Here the client's
ASGI channel is read concurrently (`http.disconnect` arrives the moment the socket closes), and when it says the
client left, or the deadline passes, the awaited call is cancelled. Cancelling an httpx request closes its
connection, which is what the worker behind sees and aborts on, so an abort travels hop by hop to the engine
that holds the work.
"""

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from ridgeline.server.deadline import Deadline

T = TypeVar("T")


class ClientLeft(Exception):
    """The client closed its connection before the answer was ready; the work was cancelled."""


class DeadlinePassed(Exception):
    """The request's deadline (server/deadline.py) passed before the answer was ready; the work was cancelled."""


async def client_left(raw: Request) -> None:
    """Returns when the client's connection closes (the request's body must have been read already)."""
    while (await raw.receive())["type"] != "http.disconnect":
        pass


async def while_client_waits(raw: Request, work: Awaitable[T], deadline: Deadline | None = None) -> T:
    """Await `work` (re-raising what it raises), unless the client leaves first (ClientLeft) or the deadline
    passes (DeadlinePassed): then `work` is cancelled, and awaited until its cleanup (releases) has run."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(client_left(raw))
    try:
        timeout = deadline.remaining() if deadline is not None else None
        done, _ = await asyncio.wait({task, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler itself is cancelled (server shutdown)
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task in done:
        return task.result()
    try:
        await task  # its finally blocks (a lease let go, KV released) run before the handler answers
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - nobody is left to tell
        pass
    if watcher in done:
        raise ClientLeft()
    raise DeadlinePassed()
