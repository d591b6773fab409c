"""A worker's side of disaggregated prefill and decode, in the request fields vLLM's P/D connectors use.

A front sends the client's request to a prefill worker (`--role prefill`) with max_tokens=1 and
`kv_transfer_params: {"do_remote_decode": true}`: the worker computes the prompt and the first token, keeps the
pages under a lease, and answers with `kv_transfer_params` naming them (its KV address, the manifest, the first
token's logprobs). The front then sends the same request to a decode worker (`--role decode`) with those
`kv_transfer_params` plus `"do_remote_prefill": true`: the decode worker admits it as usual, pulls the pages its
prefix cache lacks, and streams the whole answer from the first token on, so text, stop strings, logprobs and
usage are computed in one place, exactly as when colocated.
"""

import time
from dataclasses import dataclass

from ridgeline.cluster.kv_transfer.messages import KVOffer, KVTransferParams, MalformedMessage
from ridgeline.cluster.kv_transfer.source import KVSource, PagesGone
from ridgeline.engine.admission import AdmittedRequest
from ridgeline.engine.messages import AddRequest, ReceiveKV
from ridgeline.server.errors import APIError
from ridgeline.server.sampling import choice_requests

ROLES = ("both", "prefill", "decode")


@dataclass
class WorkerRole:
    name: str = "both"
    kv_source: KVSource | None = None  # a prefill worker's held pages
    kv_address: str | None = None  # where decode workers pull them (tcp://host:port)


def engine_requests(role: WorkerRole, request_id: str, admitted: AdmittedRequest, n: int,
                    kv_params: dict | None) -> list[AddRequest | ReceiveKV]:
    """The engine messages for one prompt's n choices, as this worker's role and the request's kv params say."""
    if not kv_params:
        return choice_requests(request_id, admitted, n)
    try:
        remote_decode, remote_prefill = KVTransferParams.flags(kv_params)
        if not (remote_decode or remote_prefill):
            return choice_requests(request_id, admitted, n)
        if n != 1:
            raise APIError(400, "'kv_transfer_params' (disaggregated prefill/decode) needs n=1", "n")
        wanted = "prefill" if remote_decode else "decode"
        if role.name != wanted:
            raise APIError(400, f"this server's role is {role.name!r}: only a {wanted} worker "
                                + ("keeps KV for a decode worker" if remote_decode else "pulls KV from a prefill worker"),
                           "kv_transfer_params")
        params = KVTransferParams.from_json(kv_params)
    except MalformedMessage as error:
        raise APIError(400, error.reason, param_of(error)) from None
    if params.do_remote_decode:
        return [AddRequest(f"{request_id}-0", admitted, time.monotonic(), hold_kv=True)]
    offer = params.offer
    return [ReceiveKV(f"{request_id}-0", admitted, offer.manifest, offer.remote_address, time.monotonic(),
                      offer.first_logprobs, offer.lease_seconds)]


def param_of(error: MalformedMessage) -> str:
    """The request field at fault, as an OpenAI error's `param`: kv_transfer_params.manifest.pages[0][1]."""
    if error.field in ("", "kv_transfer_params"):
        return "kv_transfer_params"
    return f"kv_transfer_params.{error.field}"


def offer_prefilled(role: WorkerRole, output) -> KVOffer | None:
    """A prefill worker's answer for a finished hold_kv request: where and what to pull, its lease starting now. A
    request that ended before the decode worker has anything to do (EOS or a stop string at the first token) has
    nothing to offer (its pages were freed as it finished). Pages gone meanwhile (held a whole lease unoffered: the
    answer could not go out) are a 503 `kv_pages_gone`: the request was valid, and a front prefills it again."""
    if role.kv_source is None:
        return None
    if output.finish_reason != "length":
        role.kv_source.drop(output.request_id)  # (an unattached source's; an attached one freed them already)
        return None
    try:
        manifest = role.kv_source.offer(output.request_id)
    except PagesGone as error:
        raise APIError(503, f"the prefilled KV pages are gone: {error.reason}; prefill the request again",
                       code="kv_pages_gone", headers={"Retry-After": "1"}) from None
    first = output.logprobs[0] if output.logprobs else None
    return KVOffer(role.kv_address, manifest, first, role.kv_source.lease_seconds)


def offered_params(role: WorkerRole, output) -> dict | None:
    """The answer's `kv_transfer_params`: offer_prefilled's offer on the wire."""
    offer = offer_prefilled(role, output)
    return None if offer is None else offer.to_json()
