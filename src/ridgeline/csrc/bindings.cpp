// The Python module of ridgeline's compiled kernels. Every kernel releases the GIL while it runs, so the
// server's event loop keeps streaming tokens during a forward pass.
#include "decode_layer.h"
#include "kernels.h"

#include <pybind11/stl.h>

namespace {

namespace py = pybind11;
using ridgeline::DecodeLayer;
using ridgeline::DecodeStack;

// (qtype, rows, [quants, high, d, dmin, sc, m], bias or an empty tensor): tuples, not a bound class, since a
// layer is described once, at load (model/layers/decode_layer.py).
using LinearSpec = std::tuple<int64_t, int64_t, std::vector<torch::Tensor>, torch::Tensor>;
using Slices = std::vector<std::tuple<int64_t, int64_t, int64_t>>;

ridgeline::PackedLinear packed(const LinearSpec& spec) {
    const auto& [qtype, rows, planes, bias] = spec;
    TORCH_CHECK(planes.size() == 6, "DecodeLayer: a linear has six planes");
    return {qtype, rows, planes, bias};
}

ridgeline::SharedInput shared(const std::vector<LinearSpec>& specs, const Slices& outputs) {
    ridgeline::SharedInput projections{{}, outputs};
    for (const auto& spec : specs) projections.linears.push_back(packed(spec));
    for (const auto& [linear, first, end] : outputs) {
        TORCH_CHECK(0 <= linear && linear < static_cast<int64_t>(specs.size()), "DecodeLayer: no such linear");
    }
    return projections;
}

void bind_decode_layer(py::module_& module) {
    py::class_<DecodeLayer, std::shared_ptr<DecodeLayer>>(module, "DecodeLayer", "A decoder layer's kernels in one call (decode_layer.h)")
        .def(py::init([](const std::vector<torch::Tensor>& norms, double eps, const std::vector<LinearSpec>& qkv,
                         const Slices& qkv_outputs, const LinearSpec& o, const std::vector<LinearSpec>& gate_up,
                         const Slices& gate_up_outputs, const LinearSpec& down, bool gelu, int64_t heads,
                         double scale, torch::Tensor sinks) {
                 TORCH_CHECK(norms.size() == 6, "DecodeLayer: norms are attn, post_attn, ffn, post_ffn, q, k");
                 return DecodeLayer({norms[0], norms[1], norms[2], norms[3], norms[4], norms[5], eps},
                                    shared(qkv, qkv_outputs), packed(o), shared(gate_up, gate_up_outputs), packed(down),
                                    gelu, heads, scale, std::move(sinks));
             }))
        .def("forward",
             [](const DecodeLayer& layer, const torch::Tensor& h, torch::Tensor cos, torch::Tensor sin,
                torch::Tensor k_cache, torch::Tensor k_scales, torch::Tensor v_cache, torch::Tensor v_scales,
                torch::Tensor slots, torch::Tensor block_tables, torch::Tensor row_seq, torch::Tensor key_begin,
                torch::Tensor key_end, int64_t block_size) {
                 TORCH_CHECK(h.dim() == 2 && h.is_contiguous(), "DecodeLayer: h must be a contiguous [tokens, hidden]");
                 return layer.forward(h, {cos, sin, k_cache, k_scales, v_cache, v_scales, slots, block_tables, row_seq,
                                          key_begin, key_end, block_size});
             },
             "h [tokens, hidden] through the layer; K and V of the new tokens written to the cache",
             py::call_guard<py::gil_scoped_release>());
    py::class_<DecodeStack>(module, "DecodeStack", "Every decoder layer in one call (decode_layer.h)")
        .def(py::init<std::vector<std::shared_ptr<DecodeLayer>>, std::vector<int64_t>, std::vector<int64_t>>())
        .def("forward",
             [](const DecodeStack& stack, const torch::Tensor& h,
                std::vector<std::pair<torch::Tensor, torch::Tensor>> ropes,
                std::vector<std::vector<torch::Tensor>> caches, std::vector<torch::Tensor> slots,
                std::vector<torch::Tensor> block_tables, std::vector<torch::Tensor> key_begin, torch::Tensor row_seq,
                torch::Tensor key_end, int64_t block_size) {
                 TORCH_CHECK(h.dim() == 2 && h.is_contiguous(), "DecodeStack: h must be a contiguous [tokens, hidden]");
                 return stack.forward(h, {std::move(ropes), std::move(caches), std::move(slots), std::move(block_tables),
                                          std::move(key_begin), std::move(row_seq), std::move(key_end), block_size});
             },
             "h [tokens, hidden] through every layer; K and V of the new tokens written to each layer's cache",
             py::call_guard<py::gil_scoped_release>());
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    using release_gil = pybind11::call_guard<pybind11::gil_scoped_release>;
    module.def("gemv", &ridgeline::gemv,
               "Quantised weight x float activations via int8 dot products (memory-bound path)", release_gil());
    module.def("dequantize", &ridgeline::dequantize,
               "Selected rows of a packed quantised weight as float32/bfloat16", release_gil());
    module.def("paged_attention", &ridgeline::paged_attention,
               "Attention of each query row over its key range in a paged KV cache", release_gil());
    module.def("rms_norm", &ridgeline::rms_norm, "RMSNorm of each row (plus a residual when it is not empty)", release_gil());
    module.def("gated_activation", &ridgeline::gated_activation, "act(gate) * up, act = tanh-GELU or SiLU", release_gil());
    module.def("prepare_attention", &ridgeline::prepare_attention,
               "QK-norm and RoPE of new tokens, their keys and values written to the cache", release_gil());
    module.def("instruction_peaks", &ridgeline::instruction_peaks,
               "[int8 ops/s of VPDPBUSD, FLOP/s of fp32 FMA] with every thread busy: the kernels' ceilings",
               release_gil());
    bind_decode_layer(module);
}
