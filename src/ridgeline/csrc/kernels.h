// Entry points of ridgeline's compiled kernels, bound to Python in bindings.cpp.
#pragma once

#include <torch/extension.h>

#include <vector>

namespace ridgeline {

// quant_kernels.cpp
torch::Tensor gemv(int64_t qtype, torch::Tensor x, torch::Tensor quants, torch::Tensor high, torch::Tensor d,
                   torch::Tensor dmin, torch::Tensor sc, torch::Tensor m, int64_t rows);
torch::Tensor dequantize(int64_t qtype, torch::Tensor quants, torch::Tensor high, torch::Tensor d, torch::Tensor dmin,
                         torch::Tensor sc, torch::Tensor m, int64_t rows, int64_t k, torch::Tensor index, bool bf16);

// paged_attention.cpp
// K and V are each float pages (scales empty) or Q8_0 int8 pages with their fp16 scales (kv_pages.h).
torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor k_scales, torch::Tensor v_cache,
                              torch::Tensor v_scales, torch::Tensor block_tables, torch::Tensor row_seq,
                              torch::Tensor key_begin, torch::Tensor key_end, int64_t block_size, double scale,
                              torch::Tensor sinks);

// layer_ops.cpp
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps, torch::Tensor residual);
torch::Tensor gated_activation(torch::Tensor gate, torch::Tensor up, bool gelu);
torch::Tensor prepare_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor q_norm,
                                torch::Tensor k_norm, double eps, torch::Tensor cos, torch::Tensor sin,
                                torch::Tensor k_cache, torch::Tensor k_scales, torch::Tensor v_cache,
                                torch::Tensor v_scales, torch::Tensor slots);

// instruction_peaks.cpp
// [int8 ops/s of VPDPBUSD, FLOP/s of fp32 FMA] with every thread busy, each timed for about `seconds`.
std::vector<double> instruction_peaks(double seconds);

}  // namespace ridgeline
