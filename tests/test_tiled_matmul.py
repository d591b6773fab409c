"""The path without compiled kernels keeps rows batch-invariant: tiled_matmul gives a row the same bits whether it
comes alone, first, last or in the middle of any number of rows, and matches the plain product closely."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ridgeline.model.quant.quantized_linear import DECODE_TILE_ROWS, PROMPT_TILE_ROWS, tiled_matmul


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 150), out=st.sampled_from([16, 96, 640, 1000]), inner=st.sampled_from([32, 64, 640]),
       tile=st.sampled_from([DECODE_TILE_ROWS, PROMPT_TILE_ROWS]), seed=st.integers(0, 2**16))
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(rows, out, inner, tile, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, inner, generator=generator)
    x = torch.randn(rows, inner, generator=generator)
    together = tiled_matmul(x, weight, tile)
    assert together.shape == (rows, out)
    torch.testing.assert_close(together, x @ weight.T, rtol=1e-4, atol=1e-4)
    for row in {0, rows // 2, rows - 1}:
        assert torch.equal(tiled_matmul(x[row:row + 1], weight, tile), together[row:row + 1])
        assert torch.equal(tiled_matmul(x[row:], weight, tile)[0], together[row])
