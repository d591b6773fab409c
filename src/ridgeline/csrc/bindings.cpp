// The Python module of ridgeline's compiled kernels. Every kernel releases the GIL while it runs, so the
// server's event loop keeps streaming tokens during a forward pass.
#include "kernels.h"

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
}
