// The quantised-weight kernels alone, built against include/ (SIMDe) instead of the compiler's intrinsics.
#include "../../src/ridgeline/csrc/quant_kernels.cpp"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    module.def("gemv", &ridgeline::gemv);
    module.def("dequantize", &ridgeline::dequantize);
}
