// A whole decoder layer in one call from Python: the same kernels the layer's modules call one by one
// (kernels.h), called back to back from C++. A batch-1 decode step otherwise crosses from Python into the
// kernels ~12 times per layer, and at that size each crossing (argument checks, torch dispatch, the Python
// around it) costs about what the kernel does. The arithmetic is the kernels', in the modules' order, so a
// row's output is bit for bit what the module-by-module path gives (tests/test_decode_layer.py).
//
// Only the shape of layer this covers is built (model/layers/decode_layer.py decides): quantised matmuls on the
// compiled path, RMSNorms, a dense gated MLP with a compiled activation. Everything else stays on the modules.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

namespace ridgeline {

// One packed quantised weight as model/quant/quantized_linear.py holds it; decode rows take its gemv.
struct PackedLinear {
    int64_t qtype, rows;
    std::vector<torch::Tensor> planes;  // quants, high, d, dmin, sc, m
    torch::Tensor bias;                 // empty when there is none

    torch::Tensor operator()(const torch::Tensor& x) const;
};

// Projections of one input (layers/shared_input.py): one matmul per storage format, each projection a column
// slice of one of their outputs.
struct SharedInput {
    std::vector<PackedLinear> linears;
    std::vector<std::tuple<int64_t, int64_t, int64_t>> outputs;  // (linear, first column, end column)

    std::vector<torch::Tensor> operator()(const torch::Tensor& x) const;
};

// The norms' weights in DecoderLayer's order; an empty tensor where the layer has no such norm.
struct LayerNorms {
    torch::Tensor attn, post_attn, ffn, post_ffn, q, k;
    double eps;
};

// One layer's part of a step's attention batch (model/attention_batch.py) and its cache (kv_pages.h).
struct LayerStep {
    torch::Tensor cos, sin;                                // [tokens, head_dim] rope of the layer's kind
    torch::Tensor k_cache, k_scales, v_cache, v_scales;    // scales empty for float pages
    torch::Tensor slots;                                   // [tokens] int64
    torch::Tensor block_tables, row_seq, key_begin, key_end;
    int64_t block_size;
};

class DecodeLayer {
public:
    DecodeLayer(LayerNorms norms, SharedInput qkv, PackedLinear o, SharedInput gate_up, PackedLinear down, bool gelu,
                int64_t heads, double scale, torch::Tensor sinks);

    // h [tokens, hidden] float32 -> the layer's output, as DecoderLayer.forward computes it.
    torch::Tensor forward(const torch::Tensor& h, const LayerStep& step) const;

private:
    LayerNorms norms_;
    SharedInput qkv_, gate_up_;
    PackedLinear o_, down_;
    bool gelu_;
    int64_t heads_;
    double scale_;
    torch::Tensor sinks_;
};

// Every layer of the model in one call: one crossing from Python per step instead of one per layer. A layer
// reads the rope of its kind (global or sliding) and its layer group's slots, tables and key ranges.
struct StackStep {
    std::vector<std::pair<torch::Tensor, torch::Tensor>> ropes;  // (cos, sin) per kind of rope
    std::vector<std::vector<torch::Tensor>> caches;               // per layer: k_cache, k_scales, v_cache, v_scales
    std::vector<torch::Tensor> slots, block_tables, key_begin;    // per layer group
    torch::Tensor row_seq, key_end;
    int64_t block_size;
};

class DecodeStack {
public:
    DecodeStack(std::vector<std::shared_ptr<DecodeLayer>> layers, std::vector<int64_t> rope_of_layer,
                std::vector<int64_t> group_of_layer);

    torch::Tensor forward(torch::Tensor h, const StackStep& step) const;

private:
    std::vector<std::shared_ptr<DecodeLayer>> layers_;
    std::vector<int64_t> rope_of_layer_, group_of_layer_;
};

}  // namespace ridgeline
