"""The messages between a disaggregated front and its workers are typed values: each survives its JSON unchanged,
the wire form is the one the workers have always exchanged, and a malformed one is refused naming its field."""

import json

import pytest

from ridgeline.cluster.kv_transfer.messages import (Done, Failed, KeepAlive, KVOffer, KVTransferParams,
                                                    MalformedMessage, Pages, Pull, decode, encode)
from ridgeline.engine.kv_handoff import KVManifest, PageRef
from ridgeline.engine.sampler import TokenLogprobs
from ridgeline.server.disaggregation import WorkerRole, engine_requests
from ridgeline.server.disaggregation_messages import KVLookupAnswer, KVRelease, TokenizeAnswer
from ridgeline.server.errors import APIError

MANIFEST = KVManifest("cmpl-7-0", (1, 2, 3, 4, 5), 42, (PageRef(0, 3, bytes(range(32))), PageRef(0, 9, None)),
                      "layout-digest", num_cached_tokens=16)
OFFER = KVOffer("tcp://10.0.0.2:5557", MANIFEST, TokenLogprobs(42, -0.25, [42, 7], [-0.25, -1.5]), 30.0)


def wire(value) -> dict:
    """What crosses HTTP: the JSON text, read back."""
    return json.loads(json.dumps(value.to_json()))


@pytest.mark.parametrize("message", [
    OFFER, KVOffer("tcp://h:1", MANIFEST),
    KVLookupAnswer(100, 64, True, 2, 64, 4096), KVLookupAnswer(5, 0, False, 64, 64),
    TokenizeAnswer((1, 2, 3), 2048), KVRelease("cmpl-7-0"),
])
def test_every_http_message_survives_its_json(message):
    assert type(message).from_json(wire(message)) == message


@pytest.mark.parametrize("message", [
    Pull("r", "digest", MANIFEST.pages), Pages("r", MANIFEST.pages, (b"\x01" * 32, b"\x02" * 32)), Done("r"),
    KeepAlive("r"), Failed("r", "gone"), Failed("r", "layouts differ", "layout_mismatch"),
])
def test_every_kv_server_message_survives_its_frame(message):
    assert decode(encode(message)) == message


def test_the_kv_transfer_params_keep_the_wire_form_of_vllms_connectors():
    """To the prefill worker the one flag; to the decode worker the prefill worker's answer as it came, flag added."""
    assert KVTransferParams(do_remote_decode=True).to_json() == {"do_remote_decode": True}
    to_decode = KVTransferParams(do_remote_prefill=True, offer=OFFER).to_json()
    assert to_decode == {**OFFER.to_json(), "do_remote_prefill": True}
    assert list(to_decode) == ["remote_address", "manifest", "first_logprobs", "lease_seconds", "do_remote_prefill"]
    assert to_decode["manifest"]["pages"] == [[0, 3, bytes(range(32)).hex()], [0, 9, None]]
    assert KVTransferParams.from_json(json.loads(json.dumps(to_decode))) == KVTransferParams(False, True, OFFER)
    assert KVTransferParams.from_json({}) == KVTransferParams()


@pytest.mark.parametrize("mutate, field", [
    (lambda m: m.pop("remote_address"), "remote_address"),
    (lambda m: m["manifest"].update(first_token_id="42"), "manifest.first_token_id"),
    (lambda m: m["manifest"]["pages"][1].__setitem__(1, None), "manifest.pages[1][1]"),
    (lambda m: m["manifest"]["pages"][0].__setitem__(2, "not hex"), "manifest.pages[0][2]"),
    (lambda m: m["manifest"]["prompt_token_ids"].append(True), "manifest.prompt_token_ids[5]"),
    (lambda m: m["first_logprobs"].pop("logprob"), "first_logprobs.logprob"),
    (lambda m: m.update(lease_seconds="long"), "lease_seconds"),
])
def test_a_malformed_offer_names_its_field(mutate, field):
    body = wire(OFFER)
    mutate(body)
    with pytest.raises(MalformedMessage) as caught:
        KVOffer.from_json(body)
    assert caught.value.field == field and repr(field) in str(caught.value)


def test_a_malformed_lookup_answer_or_frame_names_its_field():
    with pytest.raises(MalformedMessage, match="'accepting' must be true or false"):
        KVLookupAnswer.from_json({**wire(KVLookupAnswer(1, 0, True, 0, 1)), "accepting": "yes"})
    with pytest.raises(MalformedMessage, match="'max_kv_waiting' is missing"):
        KVLookupAnswer.from_json({"prompt_tokens": 1, "cached_tokens": 0, "accepting": True, "kv_waiting": 0})
    with pytest.raises(MalformedMessage) as caught:
        decode(b'{"type":"Pages","request_id":"r","pages":[[0,1,null]],"digests":["zz"]}')
    assert caught.value.field == "digests[0]"
    with pytest.raises(MalformedMessage, match="'type' is 'Push'"):
        decode(b'{"type":"Push","request_id":"r"}')


class _Admitted:
    """engine_requests only carries the admitted request into the engine messages."""


def test_a_decode_worker_answers_a_malformed_hand_over_400_naming_the_field():
    body = {**wire(OFFER), "do_remote_prefill": True}
    body["manifest"]["pages"] = "all of them"
    with pytest.raises(APIError) as caught:
        engine_requests(WorkerRole("decode"), "cmpl-1", _Admitted(), 1, body)
    assert caught.value.status == 400 and caught.value.param == "kv_transfer_params.manifest.pages"
    assert "must be a list" in caught.value.message
    # Sent to the wrong worker, the request is told that first, whatever its offer lacks.
    with pytest.raises(APIError) as caught:
        engine_requests(WorkerRole("both"), "cmpl-1", _Admitted(), 1, {"do_remote_prefill": True})
    assert caught.value.param == "kv_transfer_params" and "role" in caught.value.message
    (receive,) = engine_requests(WorkerRole("decode"), "cmpl-1", _Admitted(), 1,
                                 KVTransferParams(do_remote_prefill=True, offer=OFFER).to_json())
    assert (receive.manifest, receive.source_address, receive.first_logprobs, receive.lease_seconds) == (
        MANIFEST, OFFER.remote_address, OFFER.first_logprobs, 30.0)


def test_what_the_front_sends_is_what_the_workers_endpoints_validate():
    """The release and the lookup request are validated by the workers' pydantic models (their OpenAPI schema)."""
    from ridgeline.server.protocol import KVLookupRequest, KVReleaseRequest

    assert KVReleaseRequest.model_validate(wire(KVRelease("cmpl-7-0"))).request_id == "cmpl-7-0"
    assert KVLookupRequest.model_validate({"prompt": list(MANIFEST.prompt_token_ids)}).prompt == [1, 2, 3, 4, 5]
