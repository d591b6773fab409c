"""The quantised kernels against gguf's reference dequantisation, for every supported GGUF type.

Random blocks are built byte-wise (random_blocks.py), so types gguf cannot quantise to (the K-quants, the
IQ4 codebook types, MXFP4) are covered with every bit pattern their quants allow.

The int8 gemv quantises each activation block of 32 to int8 (scale = max|x| / 127, round to nearest) and is
otherwise exact, so it is compared with that same quantisation applied to a float64 dequantise-then-matmul:
agreement to float32 rounding (rel 1e-4) shows the layout and the integer arithmetic are right. Against the
unquantised activations the error is that of 8-bit rounding: about 0.3 % of each element's block maximum,
averaging out over a dot product to well under 2 %.
"""

import resource

import numpy as np
import pytest

import torch
from compiled_kernels import needs_compiled
from gguf import GGMLQuantizationType as T

from ridgeline.model.quant import kernels
from ridgeline.model.quant.packing import QUANT_BITS, dequantize_reference, pack
from ridgeline.model.quant.random_blocks import FP16_SCALE_FIELDS, random_stored
from ridgeline.model.weights import QUANTIZED_TYPES, StoredTensor

SIMPLE = (T.Q8_0, T.Q4_0, T.Q5_0, T.Q4_1, T.Q5_1, T.IQ4_NL, T.MXFP4)  # blocks of 32
K_QUANTS = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS)  # super-blocks of 256
# (output rows, input dim): one row; rows not a multiple of the 16-row interleaved block (padded), over
# several blocks; one and several scale groups.
SHAPES = {t: [(1, 32), (37, 96), (9, 640)] for t in SIMPLE} | {t: [(1, 256), (37, 256), (9, 768)] for t in K_QUANTS}
CASES = [(qtype, shape) for qtype, shapes in SHAPES.items() for shape in shapes]


def test_every_type_the_loader_accepts_is_packed_and_tested():
    assert set(QUANTIZED_TYPES) == set(QUANT_BITS) == set(SHAPES)


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """x after the kernel's activation quantisation (blocks of 32 along the input dim), in float64."""
    blocks = x.to(torch.float32).reshape(x.shape[0], -1, 32)
    scale = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
    return (torch.round(blocks * inverse).double() * scale.double()).reshape(x.shape)


@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_packing_round_trips_to_gguf_dequantisation(qtype, shape):
    stored = random_stored(qtype, shape, seed=1)
    assert torch.equal(dequantize_reference(pack(stored)), stored.dequantize())


@needs_compiled
@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_compiled_dequantize_matches_gguf(qtype, shape):
    stored = random_stored(qtype, shape, seed=2)
    expected = stored.dequantize()
    packed = pack(stored)
    assert torch.equal(kernels.dequantize(packed, torch.float32), expected)
    assert torch.equal(kernels.dequantize(packed, torch.bfloat16), expected.bfloat16())
    rows = torch.tensor([shape[0] - 1, 0, shape[0] - 1])
    assert torch.equal(kernels.dequantize(packed, torch.float32, rows=rows), expected[rows])


@needs_compiled
@pytest.mark.parametrize("activation_rows", [1, 3, 6, 11])  # tiles of 8 rows: 11 = a full one + 3
@pytest.mark.parametrize(("qtype", "shape"), CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_gemv_is_a_matmul_with_int8_activations(qtype, shape, activation_rows):
    stored = random_stored(qtype, shape, seed=3)
    weight = stored.dequantize().double()
    x = torch.randn(activation_rows, shape[1], generator=torch.Generator().manual_seed(4))
    y = kernels.gemv(pack(stored), x)
    assert y.shape == (activation_rows, shape[0]) and y.dtype == torch.float32
    exact = int8_activations(x) @ weight.T
    torch.testing.assert_close(y.double(), exact, rtol=1e-4, atol=1e-4 * exact.abs().max().item())
    unquantised = x.double() @ weight.T
    assert ((y.double() - unquantised).norm() / unquantised.norm()).item() < 0.02


@needs_compiled
@pytest.mark.parametrize("qtype", list(QUANT_BITS), ids=lambda t: t.name)
def test_gemv_rows_do_not_depend_on_their_batch(qtype):
    packed = pack(random_stored(qtype, (40, 512), seed=8))
    x = torch.randn(11, 512, generator=torch.Generator().manual_seed(9))
    together = kernels.gemv(packed, x)  # a tile of 8 rows, then one of 3
    for i in (0, 5, 9):
        assert torch.equal(kernels.gemv(packed, x[i : i + 1])[0], together[i])


@needs_compiled
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_gemv_rows_over_panels_of_blocks_match_one_row_at_a_time(qtype):
    # 51 row blocks (the last one ragged) of 512 inputs: more than one L2 panel of blocks, and 19 activation rows
    # in tiles of 8, 8 and 3, so each tile sweeps every panel. Each row must equal its own call's bits.
    stored = random_stored(qtype, (805, 512), seed=10)
    x = torch.randn(19, 512, generator=torch.Generator().manual_seed(11))
    together = kernels.gemv(pack(stored), x)
    for i in range(19):
        assert torch.equal(kernels.gemv(pack(stored), x[i : i + 1])[0], together[i]), f"row {i}"
    exact = int8_activations(x) @ stored.dequantize().double().T
    torch.testing.assert_close(together.double(), exact, rtol=1e-4, atol=1e-4 * exact.abs().max().item())


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@needs_compiled
def test_a_large_gemv_output_is_reused_once_freed_without_page_faults():
    # 144 rows x 65,536 outputs: a 36 MiB result, above glibc's largest mmap threshold (32 MiB), which maps such
    # an allocation afresh every time (~9,200 page faults to write it). Kept by csrc/large_buffers.h once freed,
    # its buffer serves the next such call with no new mapping.
    packed = pack(random_stored(T.Q8_0, (65536, 64), seed=12))
    x = torch.randn(144, 64, generator=torch.Generator().manual_seed(13))
    expected = kernels.gemv(packed, x).clone()
    kernels.gemv(packed, x)  # made and freed: its buffer is kept
    before = minor_faults()
    again = kernels.gemv(packed, x)
    faults = minor_faults() - before
    assert torch.equal(again, expected)
    assert faults < 1000, f"{faults} page faults writing a reused 36 MiB output"


@needs_compiled
def test_large_gemv_outputs_alive_together_never_share_memory():
    packed = pack(random_stored(T.Q8_0, (65536, 64), seed=12))
    x1, x2 = torch.randn(80, 64), torch.randn(80, 64)
    first = kernels.gemv(packed, x1)
    kept = first.clone()
    second = kernels.gemv(packed, x2)
    assert first.data_ptr() != second.data_ptr()
    assert torch.equal(first, kept)  # the second call wrote elsewhere
    del first
    third = kernels.gemv(packed, x1)  # may take the freed buffer back, never the one `second` holds
    assert third.data_ptr() != second.data_ptr() and torch.equal(third, kept)


@needs_compiled
def test_gemv_handles_zero_and_non_contiguous_activations():
    packed = pack(random_stored(T.Q4_K, (8, 256), seed=5))
    assert torch.equal(kernels.gemv(packed, torch.zeros(2, 256)), torch.zeros(2, 8))
    wide = torch.randn(256, 3)
    torch.testing.assert_close(kernels.gemv(packed, wide.T), kernels.gemv(packed, wide.T.contiguous()))


@pytest.mark.parametrize("qtype", list(QUANT_BITS))
def test_torch_fallback_is_an_exact_dequantised_matmul(qtype, monkeypatch):
    monkeypatch.setattr(kernels, "compiled", lambda: None)  # as on a CPU without AVX2, or off the CPU
    stored = random_stored(qtype, (5, 256), seed=6)
    packed = pack(stored)
    x = torch.randn(2, 256)
    torch.testing.assert_close(kernels.gemv(packed, x), x @ stored.dequantize().T)
    assert torch.equal(kernels.dequantize(packed, rows=torch.tensor([4, 1])), stored.dequantize()[[4, 1]])


@pytest.mark.parametrize("qtype", list(QUANT_BITS))
def test_packed_weights_stay_near_their_file_size(qtype):
    stored = random_stored(qtype, (16, 1024), seed=7)
    packed = pack(stored)
    # Only types with sub-byte sub-block scales grow: those are unpacked to a byte each.
    allowance = {T.Q4_K: 0.125, T.Q5_K: 0.125, T.Q3_K: 0.125, T.IQ4_XS: 0.0625}.get(qtype, 0.0)
    assert packed.bits_per_weight == pytest.approx(stored.bits_per_weight + allowance)


@needs_compiled
@pytest.mark.parametrize("fill", [0x00, 0x7F, 0x80, 0xFF], ids=hex)
@pytest.mark.parametrize("qtype", [T.Q2_K, T.Q3_K, T.Q6_K], ids=lambda t: t.name)
def test_gemv_groups_of_16_at_their_extremes(qtype, fill):
    """The types with groups of 16 sum two groups' dot products times their integer scales (and Q2_K's minima) in
    int32 before going to float: every quant and scale byte at one extreme (largest or most negative scale, largest
    or smallest quant), against activations all +-max, still matches the exact sum."""
    stored = random_stored(qtype, (16, 512), seed=10)
    blocks = stored.data.numpy().reshape(16, 2, -1).copy()
    scale_fields = FP16_SCALE_FIELDS[qtype]
    kept = [blocks[..., field].copy() for field in scale_fields]
    blocks[...] = fill
    for field, values in zip(scale_fields, kept):
        blocks[..., field] = values
    stored = StoredTensor(qtype, stored.shape, torch.from_numpy(blocks.reshape(16, -1)))
    weight = stored.dequantize().double()
    for sign in (1.0, -1.0):
        x = torch.full((2, 512), sign)
        x[1, ::2] = -sign  # and alternating signs, so that the activation sums per group are not all extreme
        y = kernels.gemv(pack(stored), x)
        exact = int8_activations(x) @ weight.T
        torch.testing.assert_close(y.double(), exact, rtol=1e-4, atol=1e-4 * exact.abs().max().item())


# --- an 8B layer's matrices at full size, from a `ridgeline synth` file ------------------------------------------


@pytest.fixture(scope="module")
def llama_8b_layer(tmp_path_factory):
    """Layer 0 of a synthetic Llama-3.1-8B in Q4_K_M (one of llama.cpp's 'more bits' layers): ffn_gate is 14336 x
    4096 in Q4_K, ffn_down 4096 x 14336 in Q6_K, as a downloaded Q4_K_M file holds them."""
    from ridgeline.model.checkpoint import read_checkpoint
    from ridgeline.model.synth.writer import SynthOptions, write_synth

    options = SynthOptions("llama-3.1-8b", "q4_k_m", layers=1, vocab=512)
    return read_checkpoint(str(write_synth(tmp_path_factory.mktemp("synth") / "8b.gguf", options))).tensors


@needs_compiled
@pytest.mark.parametrize("activation_rows", [1, 3])
@pytest.mark.parametrize(("name", "qtype", "shape"), [("blk.0.ffn_gate.weight", T.Q4_K, (14336, 4096)),
                                                      ("blk.0.ffn_down.weight", T.Q6_K, (4096, 14336))])
def test_an_8b_matrix_through_the_quantised_linear_is_ggufs_dequantised_matmul(llama_8b_layer, name, qtype, shape,
                                                                             activation_rows):
    from gguf.quants import dequantize

    from ridgeline.model.quant.quantized_linear import QuantizedLinear

    stored = llama_8b_layer[name]
    assert (stored.qtype, tuple(stored.shape)) == (qtype, shape)
    layer = QuantizedLinear.from_stored(stored)
    assert layer.compiled
    weight = torch.from_numpy(dequantize(stored.data.numpy(), qtype)).double()  # gguf's own dequantiser
    x = torch.randn(activation_rows, shape[1], generator=torch.Generator().manual_seed(5))
    y = layer.memory_bound(x)  # a decode step's path: the int8 gemv
    exact = int8_activations(x) @ weight.T
    torch.testing.assert_close(y.double(), exact, rtol=1e-4, atol=1e-4 * exact.abs().max().item())
    unquantised = x.double() @ weight.T
    assert ((y.double() - unquantised).norm() / unquantised.norm()).item() < 0.02
