// A decoder layer's kernels back to back (decode_layer.h). Each step below is the call the corresponding module
// makes, with the same arguments, so every intermediate has the bits it has on the module-by-module path.
#include "decode_layer.h"

#include "kernels.h"
#include "large_buffers.h"

#include <algorithm>

namespace ridgeline {

constexpr int64_t kFeedForwardRows = 256;  // rows per pass through the feed-forward in a long prefill step

torch::Tensor PackedLinear::operator()(const torch::Tensor& x) const {
    torch::Tensor y = gemv(qtype, x, planes[0], planes[1], planes[2], planes[3], planes[4], planes[5], rows);
    return bias.numel() ? y.add_(bias) : y;  // QuantizedLinear._finish: y + bias, the same float adds
}

std::vector<torch::Tensor> SharedInput::operator()(const torch::Tensor& x) const {
    std::vector<torch::Tensor> results, sliced;
    results.reserve(linears.size());
    for (const auto& linear : linears) results.push_back(linear(x));
    for (const auto& [linear, first, end] : outputs) sliced.push_back(results[linear].slice(1, first, end));
    return sliced;
}

DecodeLayer::DecodeLayer(LayerNorms norms, SharedInput qkv, PackedLinear o, SharedInput gate_up, PackedLinear down,
                         bool gelu, int64_t heads, double scale, torch::Tensor sinks)
    : norms_(std::move(norms)), qkv_(std::move(qkv)), gate_up_(std::move(gate_up)), o_(std::move(o)),
      down_(std::move(down)), gelu_(gelu), heads_(heads), scale_(scale), sinks_(std::move(sinks)) {
    TORCH_CHECK(qkv_.outputs.size() == 3 && gate_up_.outputs.size() == 2,
                "DecodeLayer: q/k/v are three projections and gate/up two");
}

torch::Tensor DecodeLayer::forward(const torch::Tensor& h, const LayerStep& step) const {
    const torch::Tensor none = torch::empty({0});
    // The residual adds: a sandwich norm adds inside rms_norm, as RMSNorm(x, residual=h) does; without one the
    // layer adds in torch (h + x), as DecoderLayer.forward does.
    auto add_residual = [&](const torch::Tensor& x, const torch::Tensor& norm, const torch::Tensor& residual) {
        return norm.numel() ? rms_norm(x, norm, norms_.eps, residual) : residual + x;
    };
    const int64_t tokens = h.size(0);

    // attention: PagedAttention.forward
    const auto qkv = qkv_(rms_norm(h, norms_.attn, norms_.eps, none));
    const double qk_eps = norms_.q.numel() ? norms_.eps : 0.0;
    const torch::Tensor q = prepare_attention(qkv[0], qkv[1], qkv[2], norms_.q, norms_.k, qk_eps, step.cos, step.sin,
                                              step.k_cache, step.k_scales, step.v_cache, step.v_scales, step.slots);
    const torch::Tensor attended = paged_attention(q, step.k_cache, step.k_scales, step.v_cache, step.v_scales,
                                                   step.block_tables, step.row_seq, step.key_begin, step.key_end,
                                                   step.block_size, scale_, sinks_);
    const torch::Tensor after_attention = add_residual(o_(attended.view({tokens, -1})), norms_.post_attn, h);

    // feed-forward: GatedMLP.forward, a slice of rows at a time for a long prefill step. Every op of it treats each
    // row alone, so the bits are the same; what changes is the size of the intermediates. At 2,048 rows the gate/up
    // output is 2,048 x 4,096 float32s (32 MiB): above glibc's largest mmap threshold, so each layer mapped it
    // afresh (~8,000 page faults) and it spilled out of the caches between the matmul and the activation.
    const torch::Tensor normed = rms_norm(after_attention, norms_.ffn, norms_.eps, none);
    auto feed_forward = [&](const torch::Tensor& rows) {
        const auto gate_up = gate_up_(rows);
        return down_(gated_activation(gate_up[0], gate_up[1], gelu_));
    };
    torch::Tensor mixed;
    if (tokens <= kFeedForwardRows) {
        mixed = feed_forward(normed);
    } else {
        mixed = large_buffers().empty_float(after_attention.sizes());
        for (int64_t first = 0; first < tokens; first += kFeedForwardRows) {
            const int64_t end = std::min(tokens, first + kFeedForwardRows);
            mixed.slice(0, first, end).copy_(feed_forward(normed.slice(0, first, end)));
        }
    }
    return add_residual(mixed, norms_.post_ffn, after_attention);
}

DecodeStack::DecodeStack(std::vector<std::shared_ptr<DecodeLayer>> layers, std::vector<int64_t> rope_of_layer,
                         std::vector<int64_t> group_of_layer)
    : layers_(std::move(layers)), rope_of_layer_(std::move(rope_of_layer)), group_of_layer_(std::move(group_of_layer)) {
    TORCH_CHECK(rope_of_layer_.size() == layers_.size() && group_of_layer_.size() == layers_.size(),
                "DecodeStack: one rope kind and one layer group per layer");
}

torch::Tensor DecodeStack::forward(torch::Tensor h, const StackStep& step) const {
    TORCH_CHECK(step.caches.size() == layers_.size(), "DecodeStack: one cache per layer");
    for (size_t i = 0; i < layers_.size(); ++i) {
        const auto& [cos, sin] = step.ropes.at(rope_of_layer_[i]);
        const auto& cache = step.caches[i];
        TORCH_CHECK(cache.size() == 4, "DecodeStack: a layer's cache is k_cache, k_scales, v_cache, v_scales");
        const auto group = static_cast<size_t>(group_of_layer_[i]);
        h = layers_[i]->forward(h, {cos, sin, cache[0], cache[1], cache[2], cache[3], step.slots.at(group),
                                    step.block_tables.at(group), step.row_seq, step.key_begin.at(group), step.key_end,
                                    step.block_size});
    }
    return h;
}

}  // namespace ridgeline
