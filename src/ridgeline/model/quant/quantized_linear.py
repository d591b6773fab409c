"""A linear layer whose GGUF weight stays quantised in memory, with the path chosen by how many rows come in.

Few rows (decode, small batches) are memory-bound: stream the quantised bytes once through the int8 kernel.
Many rows (prefill) are compute-bound: either the same int8 kernel, whose 16-row x 8-activation tiles keep the
dot-product units busy, or dequantise the weight to bf16 once per call and run a GEMM. Which wins from how many
rows is measured per machine (crossover.py), not guessed. On AVX-512 VNNI machines the int8 kernel wins up to
hundreds of rows; on AVX2 ones without bf16 arithmetic (AMD Zen 3) it wins at every row count measured; off the
CPU (no compiled kernels) the GEMM always does.

Without the compiled kernels (a CPU without AVX2, or a GPU) dequantising the packed weight on every call
costs far more than the matmul itself, so the weight is dequantised once, to float32, and kept beside the packed
planes (4 bytes a weight in memory instead of ~0.6: the price of running where the kernels do not). torch's matmul
picks its kernel by row count (a gemv for one row, edge kernels for a ragged tail), so a row's bits would depend on
how many rows share the call; rows therefore go through in zero-padded tiles of one fixed size per kind of row
(`tiled_matmul`), each its own matmul of the same shape, which keeps every row's bits batch-invariant there too.
"""


import torch
from torch import nn

from ridgeline.model.native import compiled
from ridgeline.model.quant import kernels
from ridgeline.model.quant.crossover import crossover_rows
from ridgeline.model.quant.pack_cache import cached_dense, cached_pack
from ridgeline.model.quant.packing import PackedWeight, dequantize_reference
from ridgeline.model.weights import StoredTensor

_PLANE_NAMES = ("quants", "high", "d", "dmin", "sc", "m")
PREFILL_CHUNK_ROWS = 256  # prompt rows take the GEMM when it wins at a chunk of this size (a typical prefill chunk)
DECODE_TILE_ROWS = 8  # without compiled kernels: rows of generated tokens go through in tiles of this many
PROMPT_TILE_ROWS = 64  # ... and rows of prompt tokens in tiles of this many


def tiled_matmul(x: torch.Tensor, weight: torch.Tensor, tile: int) -> torch.Tensor:
    """x [M, in] @ weight[out, in]ᵀ in zero-padded tiles of `tile` rows, each one matmul of the same shape: a row's
    result depends on the row and the weight alone, never on M or on its neighbours."""
    rows = x.shape[0]
    padding = (-rows) % tile
    if padding:
        x = torch.cat([x, x.new_zeros(padding, x.shape[1])])
    tiles = [torch.mm(x[start:start + tile], weight.T) for start in range(0, x.shape[0], tile)]
    return (tiles[0] if len(tiles) == 1 else torch.cat(tiles))[:rows]


class QuantizedLinear(nn.Module):
    """y = x Wᵀ (+ b) for x [..., in] float32/bfloat16; the output has x's dtype."""

    def __init__(self, weight: PackedWeight, bias: torch.Tensor | None, crossover: int):
        super().__init__()
        self.qtype, self.in_features, self.out_features = weight.qtype, weight.in_features, weight.out_features
        self.crossover = crossover
        # Prompt rows take the GEMM only where it wins at a prefill-sized chunk. Fixed per layer, not per call,
        # so a prompt row gets the same bits however its prompt was chunked.
        self.prompt_uses_gemm = crossover <= PREFILL_CHUNK_ROWS
        for name, plane in zip(_PLANE_NAMES, weight.planes):
            self.register_buffer(name, plane, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.to(torch.float32), persistent=False)
        self._dense: torch.Tensor | None = None  # float32 copy, only where the compiled kernels do not run
        self._bind(weight)

    def _bind(self, weight: PackedWeight) -> None:
        # Resolve the kernel once, not per call: a decode step makes ~80 of these calls.
        self.weight = weight
        self._has_bias = self.bias is not None
        self.compiled = kernels.uses_compiled_kernels(weight)
        self._gemv = lambda x: tiled_matmul(x, self.dense_weight(), DECODE_TILE_ROWS)
        if self.compiled:
            module, planes, qtype, rows = compiled(), weight.planes, int(weight.qtype), weight.out_features
            self._gemv = lambda x: module.gemv(qtype, x, *planes, rows)

    def dense_weight(self) -> torch.Tensor:
        """The weight dequantised to float32, made on first use and kept (the path without compiled kernels)."""
        if self._dense is None:
            self._dense = dequantize_reference(self.weight, torch.float32)
        return self._dense

    def rows(self, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `index` of the weight as a dense [len(index), in] tensor (a tied embedding's lookup)."""
        if self.compiled:
            return kernels.dequantize(self.weight, dtype, rows=index)
        return self.dense_weight()[index].to(dtype)

    @classmethod
    def from_stored(
        cls,
        weight: StoredTensor,
        bias: torch.Tensor | None = None,
        device: torch.device | str = "cpu",
        crossover: int | None = None,
    ) -> "QuantizedLinear":
        """Pack a quantised GGUF weight; `crossover` (rows from which the GEMM path wins) defaults to the measured one."""
        packed = cached_pack(weight).to(torch.device(device))
        if crossover is None:
            crossover = crossover_rows(weight.qtype) if kernels.uses_compiled_kernels(packed) else 1
        layer = cls(packed, None if bias is None else bias.to(device), crossover)
        if not layer.compiled:  # gguf's vectorised dequantiser now, rather than torch's unpacking on first use
            layer._dense = cached_dense(weight).to(device)
        return layer

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)  # moves the plane buffers; rebuild the view the kernels take
        if self._dense is not None:
            self._dense = fn(self._dense)
        planes = [getattr(self, name) for name in _PLANE_NAMES]
        self._bind(PackedWeight(self.qtype, self.out_features, self.in_features, *planes))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Path by row count (the measured crossover); the model instead picks per row (layers/linear.py)."""
        rows = x.reshape(-1, self.in_features)
        y = self.memory_bound(rows) if rows.shape[0] < self.crossover else self.compute_bound(rows)
        return y.reshape(*x.shape[:-1], self.out_features)

    def memory_bound(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, in] -> [M, out]: stream the quantised weight once, int8 dot products (decode; prefill where it wins)."""
        if x.dtype is torch.float32 and not self._has_bias:  # the common case, without the no-op casts
            return self._gemv(x)
        return self._finish(self._gemv(x.to(torch.float32)), x.dtype)

    def compute_bound(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, in] -> [M, out]: dequantise to bf16 once for this call, then a GEMM (prefill, many rows)."""
        if not self.compiled:
            return self._finish(tiled_matmul(x.to(torch.float32), self.dense_weight(), PROMPT_TILE_ROWS), x.dtype)
        return self._finish(torch.mm(x.to(torch.bfloat16), kernels.dequantize(self.weight, torch.bfloat16).T), x.dtype)

    def _finish(self, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype)

    @property
    def nbytes(self) -> int:
        return self.weight.nbytes

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {self.qtype.name}, crossover={self.crossover}"

