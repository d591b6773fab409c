// One side (K or V) of a layer's KV cache as the kernels read and write it: float pages (bf16, fp16, fp32) or
// Q8_0 pages. K and V each have their own type (bf16 K with a Q8_0 V is a valid cache), so paged_attention and
// prepare_attention take each side as one of these and are compiled for every pair.
//
// Q8_0 is llama.cpp's 8-bit block (model/layers/kv_slots.py): a token's row of kv_heads x head_dim values is
// int8, with one fp16 scale per 32 consecutive values, in a tensor of scales beside the values. head_dim is a
// multiple of 32, so a block never straddles two heads, and the scale of the block holding value `at` of the
// values tensor is scales[at / 32].
//
// Why dequantise in registers, 32 values at a time: attention then reads 1.06 bytes per value from the pages
// (against bf16's 2) and never writes a float copy of them. The product int8 x fp16 scale is exact in fp32
// (8 + 11 significant bits), so a value read here is bit for bit the value kv_slots.dequantize_q8_0 gives, and
// attention over Q8_0 pages computes exactly what it computes over float pages holding the dequantised values.
#pragma once

#include "simd.h"

#include <torch/extension.h>

#include <cstdint>

namespace ridgeline::kv {

struct BFloat16 { uint16_t bits; };  // the 16-bit float page types, told apart by type
struct Half { uint16_t bits; };

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load16(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

inline __m512 load16(const BFloat16* p) {  // bf16 is the upper half of a float
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

enum class Into { L1, L2 };  // where a prefetch brings its lines: L2 only for the far hop (paged_attention.cpp)

// Asks for `bytes` from `start`, a line at a time. (`into` is a constant at every call: the branch folds away.)
inline void prefetch(const void* start, int64_t bytes, Into into = Into::L1) {
    const char* first = static_cast<const char*>(start);
    for (int64_t line = 0; line < bytes; line += 64) {
        if (into == Into::L1) {
            _mm_prefetch(first + line, _MM_HINT_T0);
        } else {
            _mm_prefetch(first + line, _MM_HINT_T1);
        }
    }
}

// Float pages of element type T; `at` counts elements of the [slots, kv_heads, head_dim] tensor.
template <typename T>
struct FloatPages {
    const T* data;

    // Values at .. at + 31 (at a multiple of 32) as two vectors of 16 floats.
    void load32(int64_t at, __m512& lo, __m512& hi) const { lo = load16(data + at), hi = load16(data + at + 16); }

    // Ask for one head vector of `dim` values ahead of its use (pages are scattered and the cache is cold).
    void prefetch_head(int64_t at, int64_t dim, Into into = Into::L1) const {
        prefetch(data + at, dim * static_cast<int64_t>(sizeof(T)), into);
    }
};

// Q8_0 pages: int8 values [slots, kv_heads, head_dim] and fp16 scales [slots, kv_heads * head_dim / 32].
struct Q8Pages {
    const int8_t* values;
    const c10::Half* scales;

    void load32(int64_t at, __m512& lo, __m512& hi) const {
        const __m512 scale = _mm512_set1_ps(static_cast<float>(scales[at / 32]));
        const __m128i* q = reinterpret_cast<const __m128i*>(values + at);
        lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), scale);
        hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), scale);
    }

    void prefetch_head(int64_t at, int64_t dim, Into into = Into::L1) const {
        prefetch(values + at, dim, into);
        prefetch(scales + at / 32, dim / 32 * 2, into);  // a head's scales are adjacent: one line for head_dim <= 1024
    }
};

// One head vector of `dim` floats written as Q8_0, as kv_slots.quantize_q8_0 writes it, bit for bit: the scale
// is the block's largest magnitude / 127 rounded to fp16, each value x / scale (with the rounded scale, so the
// value read back is within half a step) rounded to nearest even and kept within +-127; an all-zero block (or
// one whose scale rounds to zero) is all zeros. The same bits whichever path wrote a token keeps a sequence's
// cache, and so its attention, independent of how it was batched.
inline void store_q8_0(const float* x, int8_t* values, c10::Half* scales, int64_t dim) {
    const __m512 low = _mm512_set1_ps(-127.0f), high = _mm512_set1_ps(127.0f);
    for (int64_t i = 0; i < dim; i += 32) {
        const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));  // order-free
        const c10::Half scale(amax / 127.0f);  // round to nearest even, as torch's .half()
        scales[i / 32] = scale;
        const float step = static_cast<float>(scale);
        for (int half = 0; half < 2; ++half) {
            __m128i q = _mm_setzero_si128();
            if (step > 0) {
                // clamping before rounding equals clamping after: +-127 are integers and rounding is monotonic
                const __m512 v = _mm512_div_ps(half ? b : a, _mm512_set1_ps(step));
                q = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, low), high)));
            }
            _mm_storeu_si128(reinterpret_cast<__m128i*>(values + i + 16 * half), q);
        }
    }
}

// One side of the cache as a kernel takes it from Python: `values` [slots, kv_heads, head_dim] bf16, fp16 or fp32
// with `scales` empty, or int8 with `scales` the fp16 [slots, kv_heads * head_dim / 32] of its Q8_0 blocks.
inline void check_side(const torch::Tensor& values, const torch::Tensor& scales, const char* what) {
    TORCH_CHECK(values.dim() == 3 && values.is_contiguous() && values.device().is_cpu(), what,
                " must be a contiguous [slots, kv_heads, head_dim] CPU tensor");
    if (scales.numel() == 0) {
        const auto type = values.scalar_type();
        TORCH_CHECK(type == torch::kBFloat16 || type == torch::kHalf || type == torch::kFloat32, what,
                    " must be bf16, fp16 or fp32 pages, or int8 pages with their Q8_0 scales");
    } else {
        TORCH_CHECK(values.scalar_type() == torch::kInt8 && scales.scalar_type() == torch::kHalf &&
                        scales.is_contiguous() && scales.dim() == 2 && scales.size(0) == values.size(0) &&
                        scales.size(1) * 32 == values.size(1) * values.size(2) && values.size(2) % 32 == 0,
                    what, ": Q8_0 pages are int8 values with fp16 scales [slots, kv_heads * head_dim / 32]");
    }
}

// Calls f with the read-only pages of one side (checked by check_side): FloatPages<T> or Q8Pages.
template <typename F>
void with_pages(const torch::Tensor& values, const torch::Tensor& scales, F&& f) {
    if (scales.numel()) return f(Q8Pages{values.data_ptr<int8_t>(), scales.data_ptr<c10::Half>()});
    switch (values.scalar_type()) {
        case torch::kBFloat16: return f(FloatPages<BFloat16>{static_cast<const BFloat16*>(values.data_ptr())});
        case torch::kHalf: return f(FloatPages<Half>{static_cast<const Half*>(values.data_ptr())});
        default: return f(FloatPages<float>{values.data_ptr<float>()});
    }
}

}  // namespace ridgeline::kv
