"""The compiled decoder layer (csrc/decode_layer.cpp, model/layers/decode_layer.py): a step through it gives the
bits the module-by-module path gives, logits and KV cache alike, on tiny quantised models of each dense
architecture, on two full-width layers of a synthetic Qwen2.5-1.5B (`ridgeline synth`, Q4_K_M) and on the default
model; a row's bits through it do not depend on its batch; and every case it does not cover still runs on the
modules."""

import functools

import pytest
import tiny_models
import torch
from compiled_kernels import needs_compiled
from tiny_models import build_hf_model, write_gguf

from ridgeline.engine.assemble import assemble_model
from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.model.attention_batch import ForwardChunk
from ridgeline.model.layers import decode_layer
from ridgeline.model.layers.decode_layer import FusedDecodeLayer, FusedDecodeStack
from ridgeline.model.quant import quantized_linear
from ridgeline.model.quant.quantize_file import quantize_gguf
from ridgeline.model.quant.quantized_linear import PREFILL_CHUNK_ROWS
from ridgeline.model.row_paths import RowPaths
from ridgeline.model.synth.writer import SynthOptions, write_synth
from ridgeline.model.transformer import ModelOptions, Transformer

PROMPT = [5, 17, 99, 3, 250, 42, 42, 7, 300, 11, 64, 128, 1, 2, 77, 380, 19, 23, 200, 8]
# Each architecture in a block-32 format (K-quants need rows of 256, wider than these models): llama without
# biases or QK-norm, qwen2 with q/k/v biases, gemma3 with sandwich norms, QK-norm, GELU and sliding windows.
FORMATS = {"llama": "q4_0", "qwen2": "q8_0", "gemma3": "q5_0", "qwen3": "q4_1"}
# And a real shape at full width, cut to two layers and a small vocabulary: `ridgeline synth`'s Qwen2.5-1.5B in
# Q4_K_M (Q4_K and Q6_K super-blocks, 1536 x 8960 matrices, 12 query heads of 128 over 2 KV heads).
SYNTH = {"synth-qwen2.5-1.5b": SynthOptions("qwen2.5-1.5b", "q4_k_m", layers=2, vocab=1024)}


def heads_of_32(hf_config, arch: str):
    """The compiled attention takes heads of a multiple of 32 values: llama's and qwen2's tiny 4 x 16 become 2 x 32."""
    config = hf_config(arch)
    if config.hidden_size // config.num_attention_heads == 16:
        config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 32
    return config


@pytest.fixture(scope="module", params=sorted(FORMATS) + sorted(SYNTH))
def tiny_quantized(request, tmp_path_factory):
    arch = request.param
    directory = tmp_path_factory.mktemp(arch)
    if arch in SYNTH:
        return write_synth(directory / "model.gguf", SYNTH[arch])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiny_models, "hf_config", functools.partial(heads_of_32, tiny_models.hf_config))
        write_gguf(build_hf_model(arch, directory), arch, directory / "f32.gguf")
    quantize_gguf(directory / "f32.gguf", directory / "model.gguf", FORMATS[arch])
    return directory / "model.gguf"


def runner_for(path, cache_dtype: str = "bf16", weights: str = "quantized"):
    return assemble_model(path, ModelOptions(weights=weights), KVCacheConfig(block_size=4, dtype=cache_dtype),
                          num_blocks=32).runner


class Counting:
    """Counts layers run by compiled calls while active: one per layer call, a stack call's layers."""

    def __init__(self, monkeypatch):
        self.calls = 0
        layer_call, stack_forward = FusedDecodeLayer.__call__, FusedDecodeStack.forward

        def layer(fused, *args):
            self.calls += 1
            return layer_call(fused, *args)

        def stack(fused, *args):
            self.calls += len(fused.layers)
            return stack_forward(fused, *args)

        monkeypatch.setattr(FusedDecodeLayer, "__call__", layer)
        monkeypatch.setattr(FusedDecodeStack, "forward", stack)


def use_path(monkeypatch, path: str) -> None:
    """"stack": every layer in one compiled call; "layers": one compiled call per layer; "modules": none."""
    if path == "layers":
        monkeypatch.setattr(Transformer, "fused_stack", lambda model: None)
    if path == "modules":
        monkeypatch.setattr(decode_layer, "enabled", False)


def two_sequences(runner, prompt_b: list[int], decode_steps: int = 4, with_b: bool = True) -> list[torch.Tensor]:
    """Sequence A prefilled, then (with B prefilled beside it) decode steps of generated rows; every logit row."""
    tables = runner.kv_cache.group_tables
    a_blocks, b_blocks = tables(list(range(0, 8))), tables(list(range(8, 16)))
    logits = [runner.run([ForwardChunk(PROMPT[:12], 0, a_blocks, all_logits=True)])[0]]
    if with_b:
        logits.append(runner.run([ForwardChunk(prompt_b, 0, b_blocks, all_logits=True)])[0])
    for step in range(decode_steps):
        chunks = [ForwardChunk([PROMPT[12 + step]], 12 + step, a_blocks, num_prompt_tokens=0)]
        if with_b:
            chunks.append(ForwardChunk([prompt_b[step]], len(prompt_b) + step, b_blocks, num_prompt_tokens=0))
        logits.extend(runner.run(chunks))
    return logits


def assert_same_bits(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert torch.equal(got, want)


@needs_compiled
@pytest.mark.parametrize("path", ["stack", "layers"])
@pytest.mark.parametrize("cache_dtype", ["bf16", "q8_0"])
def test_fused_steps_give_the_module_paths_bits(tiny_quantized, cache_dtype, path, monkeypatch):
    with monkeypatch.context() as patch:
        use_path(patch, path)
        fused_runner = runner_for(tiny_quantized, cache_dtype)
        counting = Counting(patch)
        fused = two_sequences(fused_runner, PROMPT[::-1][:9])
        layers = len(fused_runner.model.layers)
        assert counting.calls >= 4 * layers  # every decode step went through the compiled layers

    use_path(monkeypatch, "modules")
    counting = Counting(monkeypatch)
    module_runner = runner_for(tiny_quantized, cache_dtype)
    assert_same_bits(fused, two_sequences(module_runner, PROMPT[::-1][:9]))
    assert counting.calls == 0
    for written, expected in zip(fused_runner.kv_cache.tensors, module_runner.kv_cache.tensors):
        assert torch.equal(written, expected)


@needs_compiled
def test_a_rows_bits_through_the_fused_layers_do_not_depend_on_its_batch(tiny_quantized, monkeypatch):
    counting = Counting(monkeypatch)
    alone = two_sequences(runner_for(tiny_quantized), [], with_b=False)
    batched = two_sequences(runner_for(tiny_quantized), PROMPT[::-1][:9])
    assert counting.calls > 0
    assert torch.equal(batched[0], alone[0])  # A's prefill
    for step in range(4):  # A's decode rows: alone, and first of two
        assert torch.equal(batched[2 + 2 * step], alone[1 + step])


def three_long_prompts(path) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """One prefill step of three 100-token prompts: 300 rows, so the fused layer's feed-forward runs in slices of
    rows (csrc/decode_layer.cpp, kFeedForwardRows = 256), the second slice spanning two sequences."""
    runner = assemble_model(path, ModelOptions(weights="quantized"), KVCacheConfig(block_size=4, dtype="bf16"),
                            num_blocks=96).runner
    tables = runner.kv_cache.group_tables
    prompts = [(PROMPT * 5)[i : i + 100] for i in (0, 3, 7)]
    chunks = [ForwardChunk(prompt, 0, tables(list(range(32 * i, 32 * i + 26))), all_logits=True)
              for i, prompt in enumerate(prompts)]
    return runner.run(chunks), runner.kv_cache.tensors


@needs_compiled
def test_a_long_prefill_step_through_the_fused_layers_gives_the_module_paths_bits(tiny_quantized, monkeypatch):
    # Prompt rows take the fused layers only where no linear sends them to the GEMM, which the crossover this
    # machine measured decides (a CI machine once measured Q8_0's below a chunk, and no step was fused): pin it.
    monkeypatch.setattr(quantized_linear, "crossover_rows", lambda qtype: PREFILL_CHUNK_ROWS + 1)
    counting = Counting(monkeypatch)
    fused_logits, fused_cache = three_long_prompts(tiny_quantized)
    assert counting.calls > 0
    monkeypatch.setattr(decode_layer, "enabled", False)
    module_logits, module_cache = three_long_prompts(tiny_quantized)
    assert_same_bits(fused_logits, module_logits)
    for written, expected in zip(fused_cache, module_cache):
        assert torch.equal(written, expected)


@pytest.mark.slow
@needs_compiled
def test_the_default_model_steps_give_the_module_paths_bits(monkeypatch):
    """Real shapes and formats: Q4_K, Q5_0, Q6_K and Q8_0 matmuls, 4 query heads on one KV head of 256."""
    counting = Counting(monkeypatch)
    fused_runner = runner_for(None)
    fused = two_sequences(fused_runner, [2, 651, 1010, 2336, 808, 496, 1176, 236761])
    assert counting.calls > 0
    monkeypatch.setattr(decode_layer, "enabled", False)
    module_runner = runner_for(None)
    assert_same_bits(fused, two_sequences(module_runner, [2, 651, 1010, 2336, 808, 496, 1176, 236761]))
    for written, expected in zip(fused_runner.kv_cache.tensors, module_runner.kv_cache.tensors):
        assert torch.equal(written, expected)


def test_dense_weights_have_no_fused_layer(tiny_quantized):
    assert all(layer.fused() is None for layer in runner_for(tiny_quantized, weights="f32").model.layers)


def test_without_compiled_kernels_the_modules_run(tiny_quantized, monkeypatch):
    monkeypatch.setattr(decode_layer, "compiled", lambda: None)
    runner = runner_for(tiny_quantized)
    assert all(layer.fused() is None for layer in runner.model.layers)
    two_sequences(runner, PROMPT[::-1][:9], decode_steps=1)  # the modules' path still computes a step


@needs_compiled
def test_steps_the_fused_layer_does_not_take(tiny_quantized, monkeypatch):
    fused = runner_for(tiny_quantized).model.layers[0].fused()
    assert fused is not None
    decode_rows, h = RowPaths.from_prompt_mask(torch.tensor([False, False])), torch.zeros(2, 64)
    assert fused.fits(h, decode_rows)
    assert not fused.fits(h.to("meta"), decode_rows)  # off the CPU
    assert not fused.fits(h.bfloat16(), decode_rows)
    monkeypatch.setattr(fused, "prompt_rows_fit", False)  # as where prompt rows take the GEMM
    assert not fused.fits(h, RowPaths.from_prompt_mask(torch.tensor([True, False])))
    assert not fused.fits(h, RowPaths.from_prompt_mask(torch.tensor([True, True])))
    monkeypatch.setattr(decode_layer, "enabled", False)
    assert not fused.fits(h, decode_rows)


def test_moving_the_model_drops_the_fused_layers(tiny_quantized):
    model = runner_for(tiny_quantized).model
    model.fused_stack()
    model.float()  # any _apply: the weights' tensors may be new ones
    assert model._stack is False and all(layer._fused is False for layer in model.layers)


@needs_compiled
def test_a_new_cache_list_is_unpacked_again(tiny_quantized):
    runner = runner_for(tiny_quantized)
    stack = runner.model.fused_stack()
    assert stack._pages(runner.cache_layers) is stack._pages(list(runner.cache_layers))  # the same caches
    other = runner_for(tiny_quantized).cache_layers
    assert stack._pages(other)[0][0] is other[0][0]
