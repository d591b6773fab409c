"""Disaggregated prefill and decode at the engine level: a prompt prefilled on one engine, its KV pages moved by
the transfer layer, decoded on another engine, gives exactly the colocated tokens; the bytes moved are the pages'
bytes; and every way a transfer can fail ends in an explicit TransferFailed with no page leaked on either side.

On a tiny random Gemma 3 (one full-attention layer group, two sliding groups of window 8, blocks of 4 tokens), so
sliding groups move only their window's pages."""

import itertools
import threading
import time

import pytest
from tiny_models import build_hf_model, save_tokenizer

from ridgeline.cluster.kv_transfer.inprocess import InProcessTransport
from ridgeline.cluster.kv_transfer.messages import TransferFailed
from ridgeline.cluster.kv_transfer.receiver import receive
from ridgeline.cluster.kv_transfer.source import KVSource, PagesGone
from ridgeline.cluster.kv_transfer.zmq_transport import ZmqKVServer, ZmqTransport
from ridgeline.engine.block_manager import first_readable_block
from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig

BLOCK, WINDOW = 4, 8
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
SHARED = [(5 * i) % 300 + 7 for i in range(26)]
PROMPTS = [[11, 12, 13], SHARED + [40, 41], [(3 * i) % 200 + 9 for i in range(37)], SHARED + [50] * 9, SHARED[:16]]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("gemma3")
    build_hf_model("gemma3", directory)
    save_tokenizer(directory)
    return str(directory)


def engine(model: str, kv_dtype: str = "fp32", value_dtype: str | None = None) -> LLMEngine:
    return LLMEngine(EngineConfig(model=model, kv_cache=KVCacheConfig(BLOCK, kv_dtype, 1 << 22, value_dtype=value_dtype),
                                  scheduler=SchedulerConfig(max_num_batched_tokens=16)))


def run(engine: LLMEngine) -> dict[str, list[int]]:
    finals = {}
    while engine.has_unfinished():
        for output in engine.step():
            if output.finished:
                finals[output.request_id] = output.output_token_ids
    return finals


def prefill(engine: LLMEngine, source: KVSource, request_id: str, prompt: list[int]):
    """What a prefill worker does: compute the prompt and the first token, keep the pages, offer them."""
    first_only = SamplingParams(**{**GREEDY.__dict__, "max_tokens": 1})
    engine.add_request(request_id, prompt, first_only, hold_kv=True)
    run(engine)
    return source.offer(request_id)


def assert_no_pages_leaked(*engines: LLMEngine) -> None:
    for each in engines:
        stats = each.stats()
        assert stats.num_free_pages == stats.num_total_pages, "a KV page leaked"


@pytest.fixture(params=["in-process", "tcp"])
def link(request, model):
    """(prefill engine, its source, transport, address, close) over one transport."""
    prefill_engine = engine(model)
    source = KVSource(prefill_engine)
    if request.param == "in-process":
        transport = InProcessTransport()
        transport.serve("prefill-0", source)
        yield prefill_engine, source, transport, "prefill-0"
        return
    server = ZmqKVServer(source)
    try:
        yield prefill_engine, source, ZmqTransport(timeout=10), server.address
    finally:
        server.close()


def test_prefill_transfer_decode_gives_the_colocated_tokens(model, link):
    prefill_engine, source, transport, address = link
    colocated = engine(model)
    for index, prompt in enumerate(PROMPTS):
        colocated.add_request(f"r{index}", prompt, GREEDY)
    expected = run(colocated)

    decode_engine = engine(model)
    for index, prompt in enumerate(PROMPTS):
        manifest = prefill(prefill_engine, source, f"r{index}", prompt)
        received = receive(decode_engine, transport, address, f"r{index}", decode_engine.admission.admit(prompt, GREEDY),
                           manifest)
        assert received is not None
    assert run(decode_engine) == expected
    assert source.num_leased == 0
    assert_no_pages_leaked(prefill_engine, decode_engine)


def test_bytes_moved_are_the_uncached_pages_and_sliding_groups_move_only_their_window(model):
    prefill_engine, decode_engine = engine(model), engine(model)
    source, transport = KVSource(prefill_engine), InProcessTransport()
    transport.serve("p", source)
    layout = decode_engine.kv_layout()
    prompt = PROMPTS[2]  # 37 tokens: 10 blocks, the last one partial
    received = receive(decode_engine, transport, "p", "a", decode_engine.admission.admit(prompt, GREEDY),
                       prefill(prefill_engine, source, "a", prompt))
    blocks = -(-len(prompt) // BLOCK)
    per_group = [blocks - first_readable_block(len(prompt), window, BLOCK) for window in layout.windows]
    assert layout.windows == (None, WINDOW, WINDOW) and per_group == [10, 3, 3]
    # A page: block_size tokens of K and V of one group's layer(s): 2 x kv_heads x head_dim x 4 B per token and layer.
    config = decode_engine.model_config
    assert layout.page_bytes == BLOCK * 2 * config.num_kv_heads * config.head_dim * 4
    assert received.bytes_moved == transport.bytes_moved == sum(per_group) * layout.page_bytes
    assert received.pages_cached == 0

    # A second prompt sharing the first's 9 full blocks (36 tokens) finds them in the decode side's prefix cache:
    # a hit needs every block in the full group but only the window's blocks (7, 8) in the sliding groups, which
    # the first transfer brought. Of the second's 11 + 3 + 3 pages only blocks 9 and 10 of each group move.
    run(decode_engine)
    second = prompt[:36] + [3, 4, 5, 6, 7, 8]
    received = receive(decode_engine, transport, "p", "b", decode_engine.admission.admit(second, GREEDY),
                       prefill(prefill_engine, source, "b", second))
    assert (received.pages_moved, received.pages_cached) == (6, 11)
    assert received.bytes_moved == 6 * layout.page_bytes
    run(decode_engine)
    assert_no_pages_leaked(prefill_engine, decode_engine)


def test_a_prompt_longer_than_the_window_is_found_again_after_its_transfer(model):
    """Issue 32, item 2. A repeat of a prompt is a hit of at most N - 1 tokens, in whole blocks, so its first query
    can sit a block lower than the original's next one and reads one sliding block further back. A 40-token prompt
    (10 blocks of 4, window 8): its next query reads blocks 8 and 9 of a sliding group, a repeat resuming at token
    36 reads block 7 too. That block moves with the rest, so the decode side finds the whole prompt again: a repeat
    prefills one block there, and a transfer of it moves no page. A prompt sharing 9 blocks moves only its tenth."""
    prompt = [(7 * i) % 250 + 5 for i in range(40)]
    shares_36 = prompt[:36] + [1, 2, 3, 4]
    colocated = engine(model)
    for index, each in enumerate([prompt, shares_36]):
        colocated.add_request(f"c{index}", each, GREEDY)
    expected = run(colocated)
    # Colocated, a repeat after the pages were released (below the window during its prefill, the rest when it
    # finished) hits all but its last block too.
    before = colocated.stats().num_prefilled_tokens
    assert colocated.cached_prefix_tokens(prompt) == 36
    colocated.add_request("c-again", prompt, GREEDY)
    assert run(colocated)["c-again"] == expected["c0"]
    assert colocated.stats().num_prefilled_tokens - before == 4

    prefill_engine, decode_engine = engine(model), engine(model)
    source, transport = KVSource(prefill_engine), InProcessTransport()
    transport.serve("p", source)
    windows = decode_engine.kv_layout().windows
    received = receive(decode_engine, transport, "p", "a", decode_engine.admission.admit(prompt, GREEDY),
                       prefill(prefill_engine, source, "a", prompt))
    assert first_readable_block(len(prompt), WINDOW, BLOCK) == 8  # what moved before: blocks 8 and 9
    assert received.pages_moved == 10 + 3 + 3 and windows == (None, WINDOW, WINDOW)
    assert run(decode_engine)["a"] == expected["c0"]

    assert decode_engine.cached_prefix_tokens(prompt) == 36  # what /v1/kv/lookup answers a front: prefill here
    before = decode_engine.stats().num_prefilled_tokens
    decode_engine.add_request("a-again", prompt, GREEDY)
    assert run(decode_engine)["a-again"] == expected["c0"]
    assert decode_engine.stats().num_prefilled_tokens - before == 4
    # Sent over anyway, the repeat's pages are all there already.
    received = receive(decode_engine, transport, "p", "a-sent", decode_engine.admission.admit(prompt, GREEDY),
                       prefill(prefill_engine, source, "a-sent", prompt))
    assert (received.pages_moved, received.pages_cached) == (0, 16)
    assert run(decode_engine)["a-sent"] == expected["c0"]

    # Sharing blocks 0-8: block 9 of each group moves; blocks 7 and 8 of the sliding groups are the first's.
    received = receive(decode_engine, transport, "p", "b", decode_engine.admission.admit(shares_36, GREEDY),
                       prefill(prefill_engine, source, "b", shares_36))
    assert (received.pages_moved, received.pages_cached) == (3, 9 + 2 + 2)
    assert run(decode_engine)["b"] == expected["c1"]
    assert_no_pages_leaked(prefill_engine, decode_engine)


def test_tcp_framing_overhead_is_the_headers_alone(model):
    prefill_engine, decode_engine = engine(model), engine(model)
    source = KVSource(prefill_engine)
    server, transport = ZmqKVServer(source), ZmqTransport(timeout=10)
    try:
        prompt = PROMPTS[3]
        received = receive(decode_engine, transport, server.address, "a", decode_engine.admission.admit(prompt, GREEDY),
                           prefill(prefill_engine, source, "a", prompt))
        overhead = transport.bytes_received - received.bytes_moved
        # The JSON header: per page its group, block, chain hash and sha256 (two 64-digit hex strings), ~140 B.
        assert 0 < overhead < 100 + 160 * received.pages_moved
    finally:
        server.close()
    run(decode_engine)
    assert_no_pages_leaked(prefill_engine, decode_engine)


def test_q8_pages_move_at_their_real_size_and_give_the_colocated_tokens(model):
    """A q8_0 page is int8 values plus an fp16 scale per 32: 1.0625 B per value, and decoding on the pages moved
    gives what decoding where they were computed gives."""
    colocated = engine(model, "q8_0")
    colocated.add_request("a", PROMPTS[2], GREEDY)
    expected = run(colocated)["a"]
    prefill_engine, decode_engine = engine(model, "q8_0"), engine(model, "q8_0")
    source, transport = KVSource(prefill_engine), InProcessTransport()
    transport.serve("p", source)
    received = receive(decode_engine, transport, "p", "a", decode_engine.admission.admit(PROMPTS[2], GREEDY),
                       prefill(prefill_engine, source, "a", PROMPTS[2]))
    config, layout = decode_engine.model_config, decode_engine.kv_layout()
    assert layout.page_bytes == BLOCK * 2 * config.num_kv_heads * config.head_dim * (1 + 2 / 32)
    assert received.bytes_moved == received.pages_moved * layout.page_bytes
    assert run(decode_engine)["a"] == expected
    assert_no_pages_leaked(prefill_engine, decode_engine)


@pytest.mark.parametrize("decode_types", [("fp16", None), ("q8_0", None), ("fp32", "q8_0")],
                         ids=["fp16", "q8_0", "V-q8_0"])
def test_a_layout_mismatch_is_refused_and_the_prefill_pages_are_freed_when_the_lease_lapses(model, decode_types):
    ticks = itertools.count()
    prefill_engine, decode_engine = engine(model), engine(model, *decode_types)
    source = KVSource(prefill_engine, lease_seconds=5, clock=lambda: float(next(ticks)))
    transport = InProcessTransport()
    transport.serve("p", source)
    manifest = prefill(prefill_engine, source, "a", PROMPTS[1])
    with pytest.raises(TransferFailed, match="layout"):
        receive(decode_engine, transport, "p", "a", decode_engine.admission.admit(PROMPTS[1], GREEDY), manifest)
    assert_no_pages_leaked(decode_engine)
    while source.num_leased:
        source.expire()
    assert source.num_lapsed == 1
    assert_no_pages_leaked(prefill_engine)


def test_a_client_gone_between_prefill_and_decode_frees_the_pages_and_a_late_pull_fails(model):
    prefill_engine, decode_engine = engine(model), engine(model)
    source, transport = KVSource(prefill_engine), InProcessTransport()
    transport.serve("p", source)
    manifest = prefill(prefill_engine, source, "a", PROMPTS[2])
    source.drop("a")  # the front saw the client leave
    assert_no_pages_leaked(prefill_engine)
    with pytest.raises(TransferFailed, match="no KV held"):
        receive(decode_engine, transport, "p", "a", decode_engine.admission.admit(PROMPTS[2], GREEDY), manifest)
    assert_no_pages_leaked(decode_engine)


def test_a_front_releases_by_its_own_name_whenever_its_word_arrives(model):
    """A front that never read the answer (cancelled while it was on the wire) releases by the name it sent: the
    pages are freed whether they are held already, still being prefilled, or the word came before the request."""
    prefill_engine = engine(model)
    source = KVSource(prefill_engine)
    source.expect("front-1", "a")
    prefill(prefill_engine, source, "a", PROMPTS[2])  # offered: the answer went out
    source.settle("a")
    source.release("front-1")
    assert_no_pages_leaked(prefill_engine)
    source.expect("front-2", "b")
    source.release("front-2")  # while it is still to be prefilled
    with pytest.raises(PagesGone, match="released by its front"):
        prefill(prefill_engine, source, "b", PROMPTS[1])
    assert_no_pages_leaked(prefill_engine)
    source.release("front-3")  # before the request reached this worker
    source.expect("front-3", "c")
    with pytest.raises(PagesGone, match="released by its front"):
        prefill(prefill_engine, source, "c", PROMPTS[3])
    assert_no_pages_leaked(prefill_engine)
    assert source.num_names == 0 and source.num_released == 3


def test_pages_of_another_prompt_are_refused(model):
    prefill_engine, decode_engine = engine(model), engine(model)
    source, transport = KVSource(prefill_engine), InProcessTransport()
    transport.serve("p", source)
    manifest = prefill(prefill_engine, source, "a", PROMPTS[2])
    other = PROMPTS[2][:-1] + [99]
    with pytest.raises(TransferFailed, match="another prompt"):
        receive(decode_engine, transport, "p", "a", decode_engine.admission.admit(other, GREEDY), manifest)
    source.drop("a")
    assert_no_pages_leaked(prefill_engine, decode_engine)


@pytest.mark.parametrize("how", ["closed before the pull", "never listened"])
def test_a_prefill_worker_that_is_gone_fails_the_transfer_at_once(model, how):
    prefill_engine, decode_engine = engine(model), engine(model)
    source = KVSource(prefill_engine)
    server = ZmqKVServer(source)
    manifest = prefill(prefill_engine, source, "a", PROMPTS[2])
    address = server.address if how == "closed before the pull" else "tcp://127.0.0.1:9"
    server.close()
    started = time.monotonic()
    with pytest.raises(TransferFailed, match="prefill side"):
        receive(decode_engine, ZmqTransport(timeout=120), address, "a", decode_engine.admission.admit(PROMPTS[2], GREEDY),
                manifest)
    assert time.monotonic() - started < 30, "a dead peer must fail the transfer, not wait out the timeout"
    assert_no_pages_leaked(decode_engine)


def test_a_prefill_side_gone_mid_transfer_fails_at_once_and_both_sides_free_their_pages(model):
    """Pages stream in chunks; a link paced at 1 byte/s sends the first page and would take minutes for the next,
    so the sender can be stopped with one page delivered and the rest not: the fetch fails naming how far it got,
    the decode side frees its reservation, and the prefill side's lease lapses."""
    now = [0.0]
    prefill_engine, decode_engine = engine(model), engine(model)
    source = KVSource(prefill_engine, lease_seconds=5, clock=lambda: now[0])
    server = ZmqKVServer(source, link_bytes_per_second=1)
    manifest = prefill(prefill_engine, source, "a", PROMPTS[2])
    failures: list[TransferFailed] = []

    def pull() -> None:
        try:
            receive(decode_engine, ZmqTransport(timeout=120), server.address, "a",
                    decode_engine.admission.admit(PROMPTS[2], GREEDY), manifest)
        except TransferFailed as error:
            failures.append(error)

    puller = threading.Thread(target=pull)
    puller.start()
    deadline = time.monotonic() + 30
    while server.pages_sent < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.pages_sent == 1
    server.close()
    puller.join(timeout=30)
    assert not puller.is_alive(), "the decode side is still waiting"
    assert [f"after 1 of {len(manifest.pages)} pages" in failure.reason for failure in failures] == [True]
    assert_no_pages_leaked(decode_engine)
    now[0] += 10
    assert source.expire() == ["a"]
    assert_no_pages_leaked(prefill_engine)


def test_pages_stream_in_chunks_that_join_into_the_whole_reply(model, monkeypatch):
    """With chunks of one page (a tiny CHUNK_BYTES), a transfer is many messages and still gives the same pages."""
    from ridgeline.cluster.kv_transfer import zmq_transport

    monkeypatch.setattr(zmq_transport, "CHUNK_BYTES", 1)
    prefill_engine, decode_engine, colocated = engine(model), engine(model), engine(model)
    source = KVSource(prefill_engine)
    server = ZmqKVServer(source)
    try:
        received = receive(decode_engine, ZmqTransport(timeout=10), server.address, "a",
                           decode_engine.admission.admit(PROMPTS[3], GREEDY), prefill(prefill_engine, source, "a", PROMPTS[3]))
    finally:
        server.close()
    assert received.pages_moved > 1 and server.pages_sent == received.pages_moved
    colocated.add_request("a", PROMPTS[3], GREEDY)
    assert run(decode_engine) == run(colocated)
    assert_no_pages_leaked(prefill_engine, decode_engine)


class TamperingTransport(InProcessTransport):
    """Flips one bit of the first page on its way."""

    def fetch(self, address, pull, page_bytes):
        source = self._sources[address]
        original = source.handle

        def tampered(message):
            reply, frames = original(message)
            if frames:
                frames = [bytes([frames[0][0] ^ 1]) + frames[0][1:], *frames[1:]]
            return reply, frames

        source.handle = tampered
        try:
            return super().fetch(address, pull, page_bytes)
        finally:
            source.handle = original


def test_a_page_damaged_on_the_way_fails_its_sha256_and_nothing_leaks(model):
    prefill_engine, decode_engine = engine(model), engine(model)
    source, transport = KVSource(prefill_engine), TamperingTransport()
    transport.serve("p", source)
    manifest = prefill(prefill_engine, source, "a", PROMPTS[2])
    with pytest.raises(TransferFailed, match="sha256"):
        receive(decode_engine, transport, "p", "a", decode_engine.admission.admit(PROMPTS[2], GREEDY), manifest)
    source.drop("a")
    assert_no_pages_leaked(prefill_engine, decode_engine)


def test_a_keep_alive_extends_the_lease_and_fails_once_the_pages_are_gone(model, link):
    """A decode side still waiting for room keeps the prefill side's lease alive; once the pages are gone (lapsed,
    collected, or dropped) a keep-alive fails, saying so, instead of leaving the decode side to wait."""
    prefill_engine, source, transport, address = link
    now = [0.0]
    source._clock = lambda: now[0]
    source.lease_seconds = 5
    prefill(prefill_engine, source, "a", PROMPTS[2])
    for _ in range(4):  # 16 s in all, three times the lease
        now[0] += 4
        transport.keep_alive(address, "a")
    assert source.expire() == [] and source.num_leased == 1
    now[0] += 6
    assert source.expire() == ["a"]
    assert_no_pages_leaked(prefill_engine)
    with pytest.raises(TransferFailed, match="no KV held"):
        transport.keep_alive(address, "a")
