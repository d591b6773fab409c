// The small per-layer operations between the matmuls, each one call instead of several torch ops: a decode
// step at batch 1 makes ~20 of them per layer, and there each torch call costs more than its arithmetic.
// Every row is computed on its own with the same operations in the same order, so a row's bits do not depend
// on how many rows share the call. All take and return contiguous float32 tensors.
#include "kernels.h"
#include "parallel.h"
#include "simd_math.h"

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace {

using ridgeline::exp16;

constexpr int64_t kGrainElements = 1 << 14;  // below this much work a call stays on one thread

int64_t grain_rows(int64_t row_elements) { return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(row_elements, 1)); }

inline __m512 abs16(__m512 x) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7FFFFFFF))); }

// tanh-approximated GELU: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh from e^(-2|y|) <= 1.
inline __m512 gelu_tanh16(__m512 x) {
    const __m512 y = _mm512_mul_ps(_mm512_set1_ps(0.7978845608028654f),
                                   _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), x), _mm512_mul_ps(x, x), x));
    const __m512 e = exp16(_mm512_mul_ps(_mm512_set1_ps(-2.0f), abs16(y)));
    const __m512 magnitude = _mm512_div_ps(_mm512_sub_ps(_mm512_set1_ps(1.0f), e), _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    const __m512 tanh = _mm512_mask_sub_ps(magnitude, _mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_LT_OQ),
                                           _mm512_setzero_ps(), magnitude);
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(_mm512_set1_ps(1.0f), tanh));
}

// SiLU: x sigmoid(x), sigmoid from e^(-|x|) <= 1.
inline __m512 silu16(__m512 x) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), abs16(x)));
    const __m512 one_plus = _mm512_add_ps(_mm512_set1_ps(1.0f), e);
    const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 sigmoid = _mm512_mask_div_ps(_mm512_div_ps(_mm512_set1_ps(1.0f), one_plus), negative, e, one_plus);
    return _mm512_mul_ps(x, sigmoid);
}

void check_float_rows(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.device().is_cpu() && t.size(-1) % 16 == 0,
                name, " must be a contiguous float32 CPU tensor whose last dim is a multiple of 16");
}

// x[r] / rms(x[r]) * weight[r % weights]; the sum of squares in 16 lanes, then one fixed-order reduction.
void normalize_row(const float* x, const float* weight, float* out, int64_t dim, float eps) {
    __m512 squares = _mm512_setzero_ps();
    for (int64_t i = 0; i < dim; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        squares = _mm512_fmadd_ps(v, v, squares);
    }
    const __m512 inverse_rms = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(squares) / dim + eps));
    for (int64_t i = 0; i < dim; i += 16) {
        _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), inverse_rms), _mm512_loadu_ps(weight + i)));
    }
}

}  // namespace

namespace ridgeline {

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps, torch::Tensor residual) {
    check_float_rows(x, "rms_norm: x");
    check_float_rows(weight, "rms_norm: weight");
    const int64_t dim = x.size(-1), rows = x.numel() / dim, weights = weight.numel() / dim;
    TORCH_CHECK(weight.size(-1) == dim && rows % weights == 0, "rms_norm: weight must be [dim] or [heads, dim] of x");
    const bool add = residual.numel() > 0;
    if (add) {
        check_float_rows(residual, "rms_norm: residual");
        TORCH_CHECK(residual.sizes() == x.sizes(), "rms_norm: residual must have x's shape");
    }
    auto out = torch::empty_like(x);
    const float *src = x.data_ptr<float>(), *w = weight.data_ptr<float>(), *base = add ? residual.data_ptr<float>() : nullptr;
    float* dst = out.data_ptr<float>();
    parallel_chunks(rows, grain_rows(dim), [&](int64_t first, int64_t last) {
        for (int64_t r = first; r < last; ++r) {
            float* row = dst + r * dim;
            normalize_row(src + r * dim, w + r % weights * dim, row, dim, static_cast<float>(eps));
            if (add) {
                for (int64_t i = 0; i < dim; i += 16) {
                    _mm512_storeu_ps(row + i, _mm512_add_ps(_mm512_loadu_ps(base + r * dim + i), _mm512_loadu_ps(row + i)));
                }
            }
        }
    });
    return out;
}

torch::Tensor rope(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
    check_float_rows(x, "rope: x");
    TORCH_CHECK(x.dim() == 3 && cos.is_contiguous() && sin.is_contiguous() && cos.scalar_type() == torch::kFloat32 &&
                    sin.scalar_type() == torch::kFloat32 && cos.numel() == x.size(0) * x.size(2) && sin.numel() == cos.numel(),
                "rope: x must be [tokens, heads, head_dim] with cos and sin of [tokens, head_dim]");
    const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2), half = dim / 2;
    TORCH_CHECK(half % 16 == 0, "rope: head_dim must be a multiple of 32");
    auto out = torch::empty_like(x);
    const float *src = x.data_ptr<float>(), *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    parallel_chunks(tokens * heads, grain_rows(dim), [&](int64_t first, int64_t last) {
        for (int64_t row = first; row < last; ++row) {
            const float *in = src + row * dim, *ct = c + row / heads * dim, *st = s + row / heads * dim;
            float* o = dst + row * dim;
            for (int64_t i = 0; i < half; i += 16) {  // (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)
                const __m512 x1 = _mm512_loadu_ps(in + i), x2 = _mm512_loadu_ps(in + half + i);
                _mm512_storeu_ps(o + i, _mm512_sub_ps(_mm512_mul_ps(x1, _mm512_loadu_ps(ct + i)),
                                                      _mm512_mul_ps(x2, _mm512_loadu_ps(st + i))));
                _mm512_storeu_ps(o + half + i, _mm512_add_ps(_mm512_mul_ps(x2, _mm512_loadu_ps(ct + half + i)),
                                                             _mm512_mul_ps(x1, _mm512_loadu_ps(st + half + i))));
            }
        }
    });
    return out;
}

torch::Tensor gated_activation(torch::Tensor gate, torch::Tensor up, bool gelu) {
    check_float_rows(gate, "gated_activation: gate");
    check_float_rows(up, "gated_activation: up");
    TORCH_CHECK(gate.sizes() == up.sizes(), "gated_activation: gate and up must have one shape");
    auto out = torch::empty_like(gate);
    const float *g = gate.data_ptr<float>(), *u = up.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    parallel_chunks(gate.numel() / 16, kGrainElements / 16, [&](int64_t first, int64_t last) {
        for (int64_t i = first * 16; i < last * 16; i += 16) {
            const __m512 x = _mm512_loadu_ps(g + i);
            _mm512_storeu_ps(dst + i, _mm512_mul_ps(gelu ? gelu_tanh16(x) : silu16(x), _mm512_loadu_ps(u + i)));
        }
    });
    return out;
}

}  // namespace ridgeline
