// The small per-layer operations between the matmuls, each one call instead of several torch ops: a decode
// step at batch 1 makes ~20 of them per layer, and there each torch call costs more than its arithmetic.
// Every row is computed on its own with the same operations in the same order, so a row's bits do not depend
// on how many rows share the call. All take and return contiguous float32 tensors.
#include "kernels.h"
#include "large_buffers.h"
#include "parallel.h"
#include "kv_pages.h"
#include "simd_math.h"

#include "simd.h"

#include <cmath>
#include <cstdint>
#include <vector>

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

// x / rms(x) * weight for one row; the sum of squares in 16 lanes, then one fixed-order reduction.
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

// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) for one head of `dim` values.
void rotate_half(const float* in, const float* cos, const float* sin, float* out, int64_t dim) {
    const int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i += 16) {
        const __m512 x1 = _mm512_loadu_ps(in + i), x2 = _mm512_loadu_ps(in + half + i);
        _mm512_storeu_ps(out + i, _mm512_sub_ps(_mm512_mul_ps(x1, _mm512_loadu_ps(cos + i)),
                                                _mm512_mul_ps(x2, _mm512_loadu_ps(sin + i))));
        _mm512_storeu_ps(out + half + i, _mm512_add_ps(_mm512_mul_ps(x2, _mm512_loadu_ps(cos + half + i)),
                                                       _mm512_mul_ps(x1, _mm512_loadu_ps(sin + half + i))));
    }
}

// One head vector into one side of the cache, at element `offset` of its values, in the side's type: float
// pages, or Q8_0 when the side has scales (quantised as kv_slots.quantize_q8_0 does, bit for bit).
void store_head(const float* values, const torch::Tensor& cache, const torch::Tensor& scales, int64_t offset, int64_t dim) {
    if (scales.numel()) {
        ridgeline::kv::store_q8_0(values, cache.data_ptr<int8_t>() + offset, scales.data_ptr<c10::Half>() + offset / 32, dim);
        return;
    }
    const auto dtype = cache.scalar_type();
    for (int64_t i = 0; i < dim; i += 16) {
        const __m512 v = _mm512_loadu_ps(values + i);
        if (dtype == torch::kFloat32) {
            _mm512_storeu_ps(cache.data_ptr<float>() + offset + i, v);
        } else {
            const __m256i half = dtype == torch::kBFloat16 ? ridgeline::to_bf16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(cache.data_ptr()) + offset + i), half);
        }
    }
}

}  // namespace

namespace ridgeline {

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps, torch::Tensor residual) {
    check_float_rows(x, "rms_norm: x");
    check_float_rows(weight, "rms_norm: weight");
    const int64_t dim = x.size(-1), rows = x.numel() / dim;
    TORCH_CHECK(weight.numel() == dim, "rms_norm: weight must be [dim] of x");
    const bool add = residual.numel() > 0;
    if (add) {
        check_float_rows(residual, "rms_norm: residual");
        TORCH_CHECK(residual.sizes() == x.sizes(), "rms_norm: residual must have x's shape");
    }
    auto out = large_buffers().empty_float(x.sizes());  // (a long prefill step's rows: see large_buffers.h)
    const float *src = x.data_ptr<float>(), *w = weight.data_ptr<float>(), *base = add ? residual.data_ptr<float>() : nullptr;
    float* dst = out.data_ptr<float>();
    parallel_chunks(rows, grain_rows(dim), [&](int64_t first, int64_t last) {
        for (int64_t r = first; r < last; ++r) {
            float* row = dst + r * dim;
            normalize_row(src + r * dim, w, row, dim, static_cast<float>(eps));
            if (add) {
                for (int64_t i = 0; i < dim; i += 16) {
                    _mm512_storeu_ps(row + i, _mm512_add_ps(_mm512_loadu_ps(base + r * dim + i), _mm512_loadu_ps(row + i)));
                }
            }
        }
    });
    return out;
}

// gate and up may be column slices of one wider matrix (see layers/shared_input.py): rows are strided.
torch::Tensor gated_activation(torch::Tensor gate, torch::Tensor up, bool gelu) {
    for (const auto* t : {&gate, &up}) {
        TORCH_CHECK(t->dim() == 2 && t->scalar_type() == torch::kFloat32 && t->device().is_cpu() && t->stride(1) == 1 &&
                        t->size(1) % 16 == 0, "gated_activation: gate and up must be [rows, n] float32 CPU tensors with "
                        "unit column stride, n a multiple of 16");
    }
    TORCH_CHECK(gate.sizes() == up.sizes(), "gated_activation: gate and up must have one shape");
    const int64_t rows = gate.size(0), width = gate.size(1);
    auto out = large_buffers().empty_float({rows, width});
    const float *g = gate.data_ptr<float>(), *u = up.data_ptr<float>();
    float* dst = out.data_ptr<float>();
    parallel_chunks(rows, grain_rows(width), [&](int64_t first, int64_t last) {
        for (int64_t r = first; r < last; ++r) {
            const float *gate_row = g + r * gate.stride(0), *up_row = u + r * up.stride(0);
            for (int64_t i = 0; i < width; i += 16) {
                const __m512 x = _mm512_loadu_ps(gate_row + i);
                _mm512_storeu_ps(dst + r * width + i, _mm512_mul_ps(gelu ? gelu_tanh16(x) : silu16(x), _mm512_loadu_ps(up_row + i)));
            }
        }
    });
    return out;
}

// A layer's new tokens on their way into attention: QK-norm (when the weights are not empty) and RoPE for the
// queries and keys, and the keys and values written to their cache slots. q, k, v are [tokens, heads * head_dim]
// column slices of the projections' output (unit column stride); returns the queries as [tokens, heads, head_dim].
// Each side of the cache is float pages (its scales empty) or Q8_0 pages with their scales (kv_pages.h).
torch::Tensor prepare_attention(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor q_norm,
                                torch::Tensor k_norm, double eps, torch::Tensor cos, torch::Tensor sin,
                                torch::Tensor k_cache, torch::Tensor k_scales, torch::Tensor v_cache,
                                torch::Tensor v_scales, torch::Tensor slots) {
    for (const auto* t : {&q, &k, &v}) {
        TORCH_CHECK(t->dim() == 2 && t->scalar_type() == torch::kFloat32 && t->device().is_cpu() && t->stride(1) == 1,
                    "prepare_attention: q, k, v must be [tokens, n] float32 CPU tensors with unit column stride");
    }
    ridgeline::kv::check_side(k_cache, k_scales, "prepare_attention: the K cache");
    ridgeline::kv::check_side(v_cache, v_scales, "prepare_attention: the V cache");
    TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "prepare_attention: K and V caches must have one shape");
    const int64_t tokens = q.size(0), kv_heads = k_cache.size(1), dim = k_cache.size(2), num_slots = k_cache.size(0);
    const int64_t heads = q.size(1) / dim;
    TORCH_CHECK(dim % 32 == 0 && q.size(1) == heads * dim && k.size(1) == kv_heads * dim && v.size(1) == kv_heads * dim &&
                    k.size(0) == tokens && v.size(0) == tokens, "prepare_attention: shapes do not match the cache");
    TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous() && cos.numel() == tokens * dim && sin.numel() == tokens * dim,
                "prepare_attention: cos and sin must be [tokens, head_dim]");
    const bool normed = q_norm.numel() > 0;
    TORCH_CHECK(!normed || (q_norm.numel() == dim && k_norm.numel() == dim && q_norm.is_contiguous() && k_norm.is_contiguous()),
                "prepare_attention: QK-norm weights must be [head_dim]");
    TORCH_CHECK(slots.scalar_type() == torch::kInt64 && slots.numel() == tokens, "prepare_attention: one int64 slot per token");
    const int64_t* slot = slots.data_ptr<int64_t>();
    for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(0 <= slot[t] && slot[t] < num_slots, "prepare_attention: slot out of range");

    auto out = large_buffers().empty_float({tokens, heads, dim});
    parallel_chunks(tokens, grain_rows((heads + 2 * kv_heads) * dim), [&](int64_t first, int64_t last) {
        std::vector<float> scratch(dim), key(dim);
        for (int64_t t = first; t < last; ++t) {
            const float *c = cos.data_ptr<float>() + t * dim, *s = sin.data_ptr<float>() + t * dim;
            auto rotated = [&](const float* head, const torch::Tensor& weight, float* into) {
                const float* source = head;
                if (normed) {
                    normalize_row(head, weight.data_ptr<float>(), scratch.data(), dim, static_cast<float>(eps));
                    source = scratch.data();
                }
                rotate_half(source, c, s, into, dim);
            };
            for (int64_t h = 0; h < heads; ++h) {
                rotated(q.data_ptr<float>() + t * q.stride(0) + h * dim, q_norm, out.data_ptr<float>() + (t * heads + h) * dim);
            }
            for (int64_t h = 0; h < kv_heads; ++h) {
                rotated(k.data_ptr<float>() + t * k.stride(0) + h * dim, k_norm, key.data());
                store_head(key.data(), k_cache, k_scales, (slot[t] * kv_heads + h) * dim, dim);
                store_head(v.data_ptr<float>() + t * v.stride(0) + h * dim, v_cache, v_scales,
                           (slot[t] * kv_heads + h) * dim, dim);
            }
        }
    });
    return out;
}

}  // namespace ridgeline
