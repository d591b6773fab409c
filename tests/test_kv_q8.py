"""The 8-bit (Q8_0) KV cache: llama.cpp's block format, written once per token and read back by attention page by
page; as close to a float cache as Q8_0's half-step error allows; batch invariant; served end to end; and
priced (capacity, page bytes) from the one table in napkin/kv_dtypes.py.

Accuracy on the real model (KL divergence against bf16 KV, perplexity, decode speed) is measured by
benchmarks/kv_cache_q8.py, not asserted here."""

import gguf
import numpy as np
import openai
import pytest
import torch
from compiled_kernels import needs_compiled
from server_helpers import serve_tiny_model, tiny_model_path
from tiny_models import build_hf_model, save_tokenizer

from ridgeline.engine.kv_cache import KVCache, KVCacheConfig, page_bytes, pages_for_budget, pages_per_sequence
from ridgeline.engine.llm import LLM
from ridgeline.engine.llm_engine import EngineConfig
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.errors import RidgelineError
from ridgeline.model.attention_batch import AttentionBatch, ForwardChunk
from ridgeline.model.config import ModelConfig
from ridgeline.model.layers.attention_kernel import paged_attention, paged_attention_reference
from ridgeline.model.layers.kv_slots import Q8Slots, dequantize_q8_0, kernel_pages, quantize_q8_0, write_slots
from ridgeline.model.native import NO_TENSOR, compiled

# Gemma 3 270M's attention shape (the default model): 18 layers, 1 KV head of 256, 5 of 6 layers sliding.
GEMMA3_270M = ModelConfig("gemma3", 262144, 640, 2048, 18, 4, 1, 256, 32768, 1e-6, 1e6, rope_local_theta=1e4,
                          sliding_window=512, sliding_layers=tuple(i for i in range(18) if i % 6 != 5))


def random_rows(rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """Rows whose 32-value blocks span magnitudes from 1e-2 to 1e3, with one block all zeros. (Blocks below ~1e-2
    get subnormal fp16 scales, coarser than half a step: so in llama.cpp too; K and V are not that small.)"""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=generator)
    magnitudes = 10 ** torch.empty(rows, width // 32, 1).uniform_(-2, 3, generator=generator)
    x *= magnitudes.expand(-1, -1, 32).reshape(rows, width)
    x[0, :32] = 0
    return x


def test_dequantisation_is_gguf_q8_0_bit_for_bit():
    """Blocks quantised by gguf's reference Q8_0 quantiser, read back by our dequantiser: gguf's values exactly."""
    x = random_rows(8, 256).numpy()
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0).reshape(-1, 34)  # per block: fp16 d, 32 int8
    scales = torch.from_numpy(raw[:, :2].copy().view(np.float16)).view(8, 8)
    values = torch.from_numpy(raw[:, 2:].copy().view(np.int8)).view(8, 256)
    expected = gguf.quants.dequantize(raw.reshape(8, -1), gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(dequantize_q8_0(values, scales), torch.from_numpy(expected))


def test_round_trip_is_within_half_a_step_of_each_block():
    x = random_rows(64, 512, seed=1)
    values, scales = quantize_q8_0(x)
    assert values.dtype == torch.int8 and scales.dtype == torch.float16 and scales.shape == (64, 16)
    amax = x.view(64, 16, 32).abs().amax(-1)
    assert torch.equal(scales, (amax / 127).half())  # llama.cpp's scale: the block's largest magnitude maps to 127
    error = (dequantize_q8_0(values, scales) - x).abs().view(64, 16, 32).amax(-1)
    assert (error <= scales.float() / 2 * (1 + 1e-6)).all()
    assert torch.equal(dequantize_q8_0(values[0, :32], scales[0, :1]), torch.zeros(32))  # a zero block stays zero


def shuffled_batch(shapes, block, pages, window, generator) -> tuple[list[ForwardChunk], AttentionBatch]:
    """Chunks of (start, length) tokens, each on pages taken in a shuffled order, so no page is where its index says,
    and their batch."""
    free = torch.randperm(pages, generator=generator).tolist()
    chunks = []
    for start, length in shapes:
        count = -(-(start + length) // block)
        chunks.append(ForwardChunk([0] * length, start, [free[:count]]))
        free = free[count:]
    return chunks, AttentionBatch.build(chunks, block, [window], torch.device("cpu"))


def attention_inputs(heads=4, kv_heads=2, head_dim=64, block=4, pages=32, seed=0):
    """A decode deep in its sequence, a prefill chunk from 0 and one continuing a prefill, on shuffled pages."""
    generator = torch.Generator().manual_seed(seed)
    _, batch = shuffled_batch([(37, 1), (0, 11), (9, 14)], block, pages, None, generator)
    q = torch.randn(batch.positions.numel(), heads, head_dim, generator=generator)
    k, v = (torch.randn(pages * block, kv_heads, head_dim, generator=generator) for _ in range(2))
    return batch, q, k, v


def q8_cache_of(x: torch.Tensor) -> Q8Slots:
    cache = Q8Slots(torch.zeros(x.shape, dtype=torch.int8), torch.zeros(x.shape[0], x[0].numel() // 32, dtype=torch.float16))
    write_slots(cache, torch.arange(x.shape[0]), x)
    return cache


def test_attention_over_a_q8_cache_is_attention_over_its_dequantised_values_and_close_to_float():
    batch, q, k, v = attention_inputs()
    k8, v8 = q8_cache_of(k), q8_cache_of(v)
    out = paged_attention(q, k8, v8, batch, batch.groups[0], 0.125)
    all_slots = torch.arange(k.shape[0])
    read_back = paged_attention(q, k8.read(all_slots, torch.float32), v8.read(all_slots, torch.float32), batch,
                                batch.groups[0], 0.125)
    torch.testing.assert_close(out, read_back, rtol=1e-6, atol=1e-6)
    exact = paged_attention(q, k, v, batch, batch.groups[0], 0.125)
    assert (out - exact).abs().max() < 0.02 and (out - exact).norm() / exact.norm() < 0.01


def test_the_cache_holds_int8_values_and_fp16_scales_and_each_side_its_own_type():
    cache = KVCache(GEMMA3_270M, KVCacheConfig(16, "q8_0", 0, value_dtype="bf16"), num_pages=12, device=torch.device("cpu"))
    assert [t.dtype for t in cache.tensors] == [torch.int8, torch.float16, torch.bfloat16]
    k, v = cache.layers()[0]
    assert isinstance(k, Q8Slots) and isinstance(v, torch.Tensor)
    stored = sum(t.numel() * t.element_size() for t in cache.tensors)
    assert stored == 12 * page_bytes(GEMMA3_270M, KVCacheConfig(16, "q8_0", 0, value_dtype="bf16"))


def test_q8_0_holds_1_88x_the_sequences_of_bf16():
    bf16, q8 = (KVCacheConfig(16, dtype, 2 << 30) for dtype in ("bf16", "q8_0"))
    pages = {c.dtype: pages_for_budget(GEMMA3_270M, c) for c in (bf16, q8)}
    assert pages["q8_0"] / pages["bf16"] == pytest.approx(2 / (1 + 2 / 32), rel=1e-3)
    sequences = {c.dtype: pages[c.dtype] // pages_per_sequence(GEMMA3_270M, c, 4096) for c in (bf16, q8)}
    assert 1.8 < sequences["q8_0"] / sequences["bf16"] < 2


def test_q8_0_needs_rows_of_whole_blocks_and_unknown_types_are_named():
    odd = ModelConfig("llama", 100, 48, 64, 2, 3, 1, 16, 64, 1e-6, 1e4)  # K rows of 16 values
    with pytest.raises(RidgelineError, match="blocks of 32"):
        KVCache(odd, KVCacheConfig(4, "q8_0", 0), num_pages=2, device=torch.device("cpu"))
    with pytest.raises(RidgelineError, match="unknown KV cache dtype 'q4_0'.*q8_0"):
        KVCacheConfig(key_dtype="q4_0")


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory) -> str:
    """Tiny random Gemma 3: a full-attention group and two sliding groups of window 8."""
    directory = tmp_path_factory.mktemp("gemma3")
    build_hf_model("gemma3", directory)
    save_tokenizer(directory)
    return str(directory)


GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [[(7 * i + 3 * j) % 300 + 5 for j in range(3 + 11 * i)] for i in range(9)]


def greedy(model: str, prompts, budget: int = 256, prefix_caching: bool = False, memory: int = 1 << 22):
    llm = LLM(config=EngineConfig(model=model, kv_cache=KVCacheConfig(4, "q8_0", memory),
                                  scheduler=SchedulerConfig(max_num_batched_tokens=budget,
                                                            enable_prefix_caching=prefix_caching)))
    return [out.output_token_ids for out in llm.generate(prompts, GREEDY, use_tqdm=False)]


def test_q8_kv_is_batch_invariant(gemma3):
    """Alone, in one batch, chunked under a 16-token budget, and again as prefix-cache hits: the same tokens."""
    alone = [greedy(gemma3, [prompt])[0] for prompt in PROMPTS]
    assert greedy(gemma3, PROMPTS) == alone
    assert greedy(gemma3, PROMPTS, budget=16) == alone
    llm_prompts = PROMPTS + PROMPTS  # the second copy of each finds the first's full blocks cached
    assert greedy(gemma3, llm_prompts, prefix_caching=True) == alone + alone


def test_greedy_tokens_through_the_server_with_q8_kv():
    """The real server and the official client on a q8_0 cache give the offline engine's q8_0 greedy tokens."""
    prompts = [[0] + [(5 * i + 2 * j) % 300 + 3 for j in range(4 + 9 * i)] for i in range(4)]
    offline = LLM(str(tiny_model_path()), kv_cache_dtype="q8_0")
    expected = offline.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    with serve_tiny_model(kv_dtype="q8_0") as server:
        engine = server.server.config.app.state.serving.engine.engine
        assert [t.dtype for t in engine.runner.kv_cache.tensors] == [torch.int8, torch.float16] * 2
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        model = client.models.list().data[0].id
        for prompt, want in zip(prompts, expected):
            got = client.completions.create(model=model, prompt=prompt, max_tokens=12, temperature=0, logprobs=0,
                                            extra_body={"ignore_eos": True}).choices[0]
            assert got.text == want.text and len(got.logprobs.tokens) == len(want.output_token_ids) == 12


# ---- the compiled kernels read and write Q8_0 pages in place (csrc/kv_pages.h)

def block_scaled(shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Values whose 32-value blocks differ in magnitude (0.1x to 3x), so a block read with another block's scale
    changes the result; small enough that softmax is not saturated."""
    x = torch.randn(shape, generator=generator)
    blocks = x.view(*shape[:-1], -1, 32)
    return (blocks * 10 ** torch.empty(*blocks.shape[:-1], 1).uniform_(-1, 0.5, generator=generator)).view(shape)


BLOCK, PAGES = 4, 32
SHAPES = [(37, 1), (0, 11), (9, 14), (0, 1)]  # decode deep in, prefill from 0, continued chunk, one-token prompt


def mixed_caches(k_type: str, v_type: str, heads=4, kv_heads=1, head_dim=256, window=None, seed=0):
    """A ragged batch on shuffled pages whose K and V sides are each 'q8_0' or a torch float dtype's name; also
    each side as the fp32 values the kernel must read from it (Q8_0 through kv_slots' dequantiser)."""
    generator = torch.Generator().manual_seed(seed)
    chunks, batch = shuffled_batch(SHAPES, BLOCK, PAGES, window, generator)
    q = torch.randn(batch.positions.numel(), heads, head_dim, generator=generator)
    sides, read_as = [], []
    for kind in (k_type, v_type):
        x = block_scaled((PAGES * BLOCK, kv_heads, head_dim), generator)
        cache = q8_cache_of(x) if kind == "q8_0" else x.to(getattr(torch, kind))
        sides.append(cache)
        read_as.append(cache.read(torch.arange(x.shape[0]), torch.float32) if kind == "q8_0" else cache.float())
    return chunks, batch, q, sides, read_as


@needs_compiled
@pytest.mark.parametrize("k_type,v_type", [("q8_0", "q8_0"), ("q8_0", "bfloat16"), ("bfloat16", "q8_0"),
                                           ("q8_0", "float16"), ("float32", "q8_0")])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 1, 256), (8, 2, 64), (6, 2, 128)])
@pytest.mark.parametrize("window", [None, 5])
def test_the_kernel_reads_q8_pages_as_their_dequantised_values(k_type, v_type, heads, kv_heads, head_dim, window):
    """The compiled kernel on Q8_0 pages (either side or both) gives, bit for bit, what it gives on float pages
    holding the dequantised values (its int8 x fp16 products are exact), and matches the torch path."""
    _, batch, q, (k_cache, v_cache), (k_read, v_read) = mixed_caches(k_type, v_type, heads, kv_heads, head_dim, window)
    scale = head_dim**-0.5
    out = paged_attention(q, k_cache, v_cache, batch, batch.groups[0], scale)
    assert torch.equal(out, paged_attention(q, k_read, v_read, batch, batch.groups[0], scale))
    expected = paged_attention_reference(q, k_cache, v_cache, batch, batch.groups[0], scale)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@needs_compiled
def test_the_kernel_on_q8_pages_with_sinks_matches_torch():
    _, batch, q, (k_cache, v_cache), _ = mixed_caches("q8_0", "q8_0", 8, 2, 64, window=6, seed=2)
    sinks = torch.randn(8, generator=torch.Generator().manual_seed(3)) * 2
    out = paged_attention(q, k_cache, v_cache, batch, batch.groups[0], 0.125, sinks)
    expected = paged_attention_reference(q, k_cache, v_cache, batch, batch.groups[0], 0.125, sinks)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@needs_compiled
@pytest.mark.parametrize("k_type,v_type", [("q8_0", "q8_0"), ("bfloat16", "q8_0")])
@pytest.mark.parametrize("window", [None, 6])
def test_a_rows_bits_on_q8_pages_do_not_depend_on_its_batch_or_chunk(k_type, v_type, window):
    """Each row of a ragged batch over Q8_0 pages equals, bit for bit, the same row computed alone."""
    chunks, batch, q, (k_cache, v_cache), _ = mixed_caches(k_type, v_type, window=window, seed=4)
    together = paged_attention(q, k_cache, v_cache, batch, batch.groups[0], 0.0625)
    row = 0
    for chunk in chunks:
        for position in range(chunk.start, chunk.start + len(chunk.token_ids)):
            alone_batch = AttentionBatch.build([ForwardChunk([0], position, chunk.block_tables)], BLOCK, [window],
                                               torch.device("cpu"))
            alone = paged_attention(q[row:row + 1], k_cache, v_cache, alone_batch, alone_batch.groups[0], 0.0625)
            assert torch.equal(alone[0], together[row]), f"row {row} (position {position}) changed bits"
            row += 1


@needs_compiled
@pytest.mark.parametrize("sides", [("q8_0", "q8_0"), ("q8_0", "bf16"), ("bf16", "q8_0")])
def test_prepare_attention_quantises_as_kv_slots_does_bit_for_bit(sides):
    """The compiled cache write stores the int8 values and fp16 scales kv_slots.write_slots stores for the same
    keys and values: a token's cache bits do not depend on which path wrote it. (RoPE at angle 0 keeps the keys
    as they are, so both paths quantise the same floats.)"""
    generator = torch.Generator().manual_seed(5)
    tokens, heads, kv_heads, dim = 6, 4, 2, 64
    projected = block_scaled((tokens, (heads + 2 * kv_heads) * dim), generator)
    projected[1, heads * dim:heads * dim + 32] = 0  # an all-zero block of K
    v_start = (heads + kv_heads) * dim
    projected[2, v_start:v_start + 32] *= 1e-3  # a V block with a subnormal fp16 scale
    projected[3, v_start + 64:v_start + 96] *= 1e-9  # one whose scale rounds to 0
    q, k, v = projected.split((heads * dim, kv_heads * dim, kv_heads * dim), dim=1)
    cos, sin = torch.ones(tokens, dim), torch.zeros(tokens, dim)
    slots = torch.tensor([9, 2, 30, 17, 0, 5])

    def empty(kind):
        if kind == "q8_0":
            return Q8Slots(torch.zeros(32, kv_heads, dim, dtype=torch.int8),
                           torch.zeros(32, kv_heads * dim // 32, dtype=torch.float16))
        return torch.zeros(32, kv_heads, dim, dtype=torch.bfloat16)

    by_kernel, by_torch = [empty(kind) for kind in sides], [empty(kind) for kind in sides]
    compiled().prepare_attention(q, k, v, NO_TENSOR, NO_TENSOR, 0.0, cos, sin, *kernel_pages(by_kernel[0]),
                                 *kernel_pages(by_kernel[1]), slots)
    for cache, x in zip(by_torch, (k, v)):
        write_slots(cache, slots, x.reshape(tokens, kv_heads, dim))
    for written, expected in zip(by_kernel, by_torch):
        for got, want in zip(kernel_pages(written), kernel_pages(expected)):
            assert torch.equal(got, want)
    if sides[1] == "q8_0":  # the small blocks were quantised, not skipped
        assert 0 < by_kernel[1].scales[30, 0] < 6.1e-5 and by_kernel[1].values[30, 0, :32].abs().max() > 100
        assert by_kernel[1].scales[17, 2] == 0 and not by_kernel[1].values[17, 1, :32].any()
