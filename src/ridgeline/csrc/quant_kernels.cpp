// Kernels for GGML block-quantised weights in ridgeline's packed layout (see model/quant/packing.py).
//
// Every supported type is held as unsigned quants u (4, 5, 6 or 8 bits) plus per-sub-block scales, so a
// weight is  w = a_s * u - b_s  with a_s, b_s constant over a group of 16 weights. A chunk is 128 weights
// (8 groups of 16) of one output row. Layout of one row, per chunk c:
//   8-bit types: quants[128c .. 128c+127]             byte j = u_j
//   4/5/6-bit:   quants[64c .. 64c+63]                byte j = (u_j & 15) | (u_{64+j} & 15) << 4
//   5-bit:       high[16c .. 16c+15]                  two little-endian 64-bit masks, bit j = (u_j >> 4) & 1
//   6-bit:       high[32c .. 32c+31]                  per 64 weights, byte j holds (u_{16k+j} >> 4) & 3 at bits 2k
//
// gemv: the memory-bound path. Activation rows are quantised to int8 blocks of 32 (llama.cpp's Q8_0 idea),
// then each weight chunk is decoded to 64-byte vectors of u and multiplied with VPDPBUSD (u8 x s8 -> s32),
// so the weight bytes are read once per call. dequantize: the compute-bound path's first half (a GEMM
// in torch does the rest) and the embedding row gather.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstdint>
#include <vector>

namespace {

enum QType : int { Q8_0 = 8, Q4_0 = 2, Q5_0 = 6, Q4_K = 12, Q5_K = 13, Q6_K = 14 };  // GGML's type ids

constexpr int kChunk = 128;
constexpr int kGroupsPerChunk = kChunk / 16;

// Pointers to one output row's planes.
struct Row {
    const uint8_t* quants;
    const uint8_t* high;
    const uint16_t* d;     // fp16: per block of 32 (Q8_0/Q4_0/Q5_0) or per 256 (K-quants)
    const uint16_t* dmin;  // fp16 per 256 (Q4_K/Q5_K)
    const uint8_t* sc;     // per sub-block: u8 (Q4_K/Q5_K, 32 wide) or i8 (Q6_K, 16 wide)
    const uint8_t* m;      // u8 per 32-wide sub-block (Q4_K/Q5_K)
};

struct Planes {
    torch::Tensor quants, high, d, dmin, sc, m;

    template <typename T>
    static const T* row_ptr(const torch::Tensor& t, int64_t n) {
        return t.numel() ? reinterpret_cast<const T*>(t.data_ptr()) + n * t.stride(0) : nullptr;
    }
    Row row(int64_t n) const {
        return {row_ptr<uint8_t>(quants, n), row_ptr<uint8_t>(high, n), row_ptr<uint16_t>(d, n),
                row_ptr<uint16_t>(dmin, n),  row_ptr<uint8_t>(sc, n),    row_ptr<uint8_t>(m, n)};
    }
};

inline float fp16_to_float(uint16_t h) { return _cvtsh_ss(h); }

// The 128 quants of chunk c as two vectors of 64 unsigned bytes, in weight order.
template <int QT>
inline void decode_chunk(const Row& w, int64_t c, __m512i& u0, __m512i& u1) {
    if constexpr (QT == Q8_0) {
        u0 = _mm512_loadu_si512(w.quants + kChunk * c);
        u1 = _mm512_loadu_si512(w.quants + kChunk * c + 64);
    } else {
        const __m512i nibble = _mm512_set1_epi8(0x0F);
        const __m512i packed = _mm512_loadu_si512(w.quants + 64 * c);
        u0 = _mm512_and_si512(packed, nibble);
        u1 = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
        if constexpr (QT == Q5_0 || QT == Q5_K) {
            const __m512i bit4 = _mm512_set1_epi8(0x10);
            uint64_t h0, h1;
            std::memcpy(&h0, w.high + 16 * c, 8);
            std::memcpy(&h1, w.high + 16 * c + 8, 8);
            u0 = _mm512_mask_add_epi8(u0, _cvtu64_mask64(h0), u0, bit4);
            u1 = _mm512_mask_add_epi8(u1, _cvtu64_mask64(h1), u1, bit4);
        } else if constexpr (QT == Q6_K) {
            const __m512i shifts = _mm512_set_epi64(0x0006000600060006, 0x0006000600060006, 0x0004000400040004,
                                                    0x0004000400040004, 0x0002000200020002, 0x0002000200020002, 0, 0);
            const __m512i two_bits = _mm512_set1_epi8(0x03);
            auto high_bits = [&](const uint8_t* p) {
                const __m512i b = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
                return _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(b, shifts), two_bits), 4);
            };
            u0 = _mm512_or_si512(u0, high_bits(w.high + 32 * c));
            u1 = _mm512_or_si512(u1, high_bits(w.high + 32 * c + 16));
        }
    }
}

// Per group of 16 weights in chunk c: scale a and offset b (w = a*u - b).
template <int QT>
inline void chunk_scales(const Row& w, int64_t c, __m256& a, __m256& b) {
    const __m256i pairs = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);  // a 32-wide sub-block covers two groups
    if constexpr (QT == Q8_0 || QT == Q4_0 || QT == Q5_0) {
        constexpr float offset = QT == Q8_0 ? 128.0f : QT == Q4_0 ? 8.0f : 16.0f;
        const __m128 d4 = _mm_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.d + 4 * c)));
        a = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d4), pairs);
        b = _mm256_mul_ps(a, _mm256_set1_ps(offset));
    } else if constexpr (QT == Q4_K || QT == Q5_K) {
        int32_t sc4, m4;
        std::memcpy(&sc4, w.sc + 4 * c, 4);
        std::memcpy(&m4, w.m + 4 * c, 4);
        const __m128 sc = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(sc4)));
        const __m128 mn = _mm_cvtepi32_ps(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(m4)));
        const __m128 a4 = _mm_mul_ps(sc, _mm_set1_ps(fp16_to_float(w.d[c / 2])));
        const __m128 b4 = _mm_mul_ps(mn, _mm_set1_ps(fp16_to_float(w.dmin[c / 2])));
        a = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(a4), pairs);
        b = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(b4), pairs);
    } else {  // Q6_K: signed 8-bit scale per 16 weights, offset 32
        const __m128i sc8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.sc + 8 * c));
        a = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc8)), _mm256_set1_ps(fp16_to_float(w.d[c / 2])));
        b = _mm256_mul_ps(a, _mm256_set1_ps(32.0f));
    }
}

// One activation row quantised to int8 blocks of 32: x ~= scale16[g] * q over group g of 16.
struct QuantizedActivation {
    const int8_t* q;
    const float* scale16;      // per group of 16 (the block-of-32 scale, repeated)
    const float* scaled_sum16; // scale16[g] * sum of q over group g: multiplies the weight offsets b
};

void quantize_activation(const float* x, int64_t k, int64_t padded_k, int8_t* q, float* scale16, float* scaled_sum16) {
    for (int64_t start = 0; start < padded_k; start += 32) {
        const int64_t valid = std::max<int64_t>(0, std::min<int64_t>(32, k - start));
        const __m512 lo = _mm512_maskz_loadu_ps(valid >= 16 ? 0xFFFF : (1u << valid) - 1, x + start);
        const __m512 hi = _mm512_maskz_loadu_ps(valid >= 32 ? 0xFFFF : valid > 16 ? (1u << (valid - 16)) - 1 : 0,
                                                x + start + 16);
        const float amax = std::max(_mm512_reduce_max_ps(_mm512_abs_ps(lo)), _mm512_reduce_max_ps(_mm512_abs_ps(hi)));
        const float scale = amax / 127.0f;
        const __m512 inverse = _mm512_set1_ps(scale > 0 ? 1.0f / scale : 0.0f);
        const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inverse));
        const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inverse));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + start), _mm512_cvtsepi32_epi8(qlo));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + start + 16), _mm512_cvtsepi32_epi8(qhi));
        const int64_t g = start / 16;
        scale16[g] = scale16[g + 1] = scale;
        scaled_sum16[g] = scale * static_cast<float>(_mm512_reduce_add_epi32(qlo));
        scaled_sum16[g + 1] = scale * static_cast<float>(_mm512_reduce_add_epi32(qhi));
    }
}

// Dot products of weight row n with MT activation rows; each weight chunk is decoded once for all MT.
template <int QT, int MT>
inline void dot_row(const Row& w, int64_t chunks, const QuantizedActivation* x, float* const* out, int64_t n) {
    // Lane i of a VPDPBUSD result sums weights 4i..4i+3 of a 64-weight vector: group i/4 of that half.
    const __m512i lanes_lo = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i lanes_hi = _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    // Two accumulators per activation row: independent FMA chains, so consecutive chunks overlap.
    __m512 acc_lo[MT], acc_hi[MT];
    for (int t = 0; t < MT; ++t) acc_lo[t] = acc_hi[t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < chunks; ++c) {
        __m512i u0, u1;
        __m256 a, b;
        decode_chunk<QT>(w, c, u0, u1);
        chunk_scales<QT>(w, c, a, b);
#pragma GCC unroll 4
        for (int t = 0; t < MT; ++t) {
            const int8_t* q = x[t].q + kChunk * c;
            const __m256 factor = _mm256_mul_ps(a, _mm256_loadu_ps(x[t].scale16 + kGroupsPerChunk * c));
            const __m256 offset = _mm256_mul_ps(b, _mm256_loadu_ps(x[t].scaled_sum16 + kGroupsPerChunk * c));
            const __m512 f = _mm512_castps256_ps512(factor);
            const __m512i dot0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u0, _mm512_loadu_si512(q));
            const __m512i dot1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u1, _mm512_loadu_si512(q + 64));
            const __m512 lo = _mm512_fmsub_ps(_mm512_cvtepi32_ps(dot0), _mm512_permutexvar_ps(lanes_lo, f),
                                              _mm512_zextps256_ps512(offset));  // the b*u offsets, folded in
            acc_lo[t] = _mm512_add_ps(acc_lo[t], lo);
            acc_hi[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot1), _mm512_permutexvar_ps(lanes_hi, f), acc_hi[t]);
        }
    }
    for (int t = 0; t < MT; ++t) out[t][n] = _mm512_reduce_add_ps(_mm512_add_ps(acc_lo[t], acc_hi[t]));
}

constexpr int kMaxTile = 4;

template <int QT>
void gemv_typed(const Planes& planes, const std::vector<QuantizedActivation>& x, float* out, int64_t rows, int64_t chunks) {
    const int64_t m_total = static_cast<int64_t>(x.size());
    const int64_t bytes_per_row = planes.quants.size(1) + (planes.high.numel() ? planes.high.size(1) : 0);
    const int64_t grain = std::max<int64_t>(16, (64 << 10) / std::max<int64_t>(1, bytes_per_row));
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        for (int64_t n = begin; n < end; ++n) {
            const Row w = planes.row(n);
            for (int64_t m0 = 0; m0 < m_total; m0 += kMaxTile) {
                float* outs[kMaxTile];
                const int64_t tile = std::min<int64_t>(kMaxTile, m_total - m0);
                for (int64_t t = 0; t < tile; ++t) outs[t] = out + (m0 + t) * rows;
                switch (tile) {
                    case 1: dot_row<QT, 1>(w, chunks, &x[m0], outs, n); break;
                    case 2: dot_row<QT, 2>(w, chunks, &x[m0], outs, n); break;
                    case 3: dot_row<QT, 3>(w, chunks, &x[m0], outs, n); break;
                    default: dot_row<QT, 4>(w, chunks, &x[m0], outs, n); break;
                }
            }
        }
    });
}

template <typename F>
void dispatch(int64_t qtype, F&& f) {
    switch (qtype) {
        case Q8_0: f(std::integral_constant<int, Q8_0>{}); break;
        case Q4_0: f(std::integral_constant<int, Q4_0>{}); break;
        case Q5_0: f(std::integral_constant<int, Q5_0>{}); break;
        case Q4_K: f(std::integral_constant<int, Q4_K>{}); break;
        case Q5_K: f(std::integral_constant<int, Q5_K>{}); break;
        case Q6_K: f(std::integral_constant<int, Q6_K>{}); break;
        default: TORCH_CHECK(false, "ridgeline quant kernels: unsupported GGML type ", qtype);
    }
}

Planes make_planes(torch::Tensor quants, torch::Tensor high, torch::Tensor d, torch::Tensor dmin, torch::Tensor sc,
                   torch::Tensor m) {
    for (const auto* t : {&quants, &high, &d, &dmin, &sc, &m}) {
        TORCH_CHECK(t->device().is_cpu() && (t->numel() == 0 || (t->dim() == 2 && (t->size(1) == 1 || t->stride(1) == 1))),
                    "ridgeline quant kernels: planes must be row-contiguous 2-D CPU tensors");
    }
    return {quants, high, d, dmin, sc, m};
}

// x: [M, K] float32. Returns [M, rows] float32.
torch::Tensor gemv(int64_t qtype, torch::Tensor x, torch::Tensor quants, torch::Tensor high, torch::Tensor d,
                   torch::Tensor dmin, torch::Tensor sc, torch::Tensor m, int64_t padded_k) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(), "x must be [M, K] float32 CPU");
    const Planes planes = make_planes(quants, high, d, dmin, sc, m);
    x = x.contiguous();
    const int64_t m_total = x.size(0), k = x.size(1), rows = quants.size(0);
    TORCH_CHECK(padded_k % kChunk == 0 && k <= padded_k, "padded_k must be a multiple of 128 covering K");
    std::vector<int8_t> q(m_total * padded_k);
    std::vector<float> scale16(m_total * padded_k / 16), scaled_sum16(m_total * padded_k / 16);
    std::vector<QuantizedActivation> activations(m_total);
    for (int64_t i = 0; i < m_total; ++i) {
        const int64_t groups = i * padded_k / 16;
        quantize_activation(x.data_ptr<float>() + i * k, k, padded_k, q.data() + i * padded_k, scale16.data() + groups,
                            scaled_sum16.data() + groups);
        activations[i] = {q.data() + i * padded_k, scale16.data() + groups, scaled_sum16.data() + groups};
    }
    auto out = torch::empty({m_total, rows}, x.options());
    dispatch(qtype, [&](auto type) { gemv_typed<decltype(type)::value>(planes, activations, out.data_ptr<float>(), rows, padded_k / kChunk); });
    return out;
}

// Round-to-nearest-even float -> bf16 bits, without requiring AVX512-BF16.
inline __m256i to_bf16(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i rounding = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1)),
                                              _mm512_set1_epi32(0x7FFF));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(bits, rounding), 16));
}

template <int QT, typename Out>
void dequantize_row(const Row& w, int64_t k, Out* out) {
    alignas(32) float a[kGroupsPerChunk], b[kGroupsPerChunk];
    for (int64_t c = 0; c * kChunk < k; ++c) {
        __m512i u[2];
        __m256 av, bv;
        decode_chunk<QT>(w, c, u[0], u[1]);
        chunk_scales<QT>(w, c, av, bv);
        _mm256_store_ps(a, av);
        _mm256_store_ps(b, bv);
        for (int g = 0; g < kGroupsPerChunk && c * kChunk + 16 * g < k; ++g) {
            __m128i lane;  // the extract index must be an immediate
            switch (g % 4) {
                case 0: lane = _mm512_extracti32x4_epi32(u[g / 4], 0); break;
                case 1: lane = _mm512_extracti32x4_epi32(u[g / 4], 1); break;
                case 2: lane = _mm512_extracti32x4_epi32(u[g / 4], 2); break;
                default: lane = _mm512_extracti32x4_epi32(u[g / 4], 3); break;
            }
            const __m512 values = _mm512_fmsub_ps(_mm512_set1_ps(a[g]), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lane)),
                                                  _mm512_set1_ps(b[g]));
            Out* dst = out + c * kChunk + 16 * g;
            if constexpr (std::is_same_v<Out, float>) {
                _mm512_storeu_ps(dst, values);
            } else {
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), to_bf16(values));
            }
        }
    }
}

// Rows `rows` (int64, or empty for all) of the weight as [len, K] float32 or bfloat16.
torch::Tensor dequantize(int64_t qtype, torch::Tensor quants, torch::Tensor high, torch::Tensor d, torch::Tensor dmin,
                         torch::Tensor sc, torch::Tensor m, int64_t k, torch::Tensor rows, bool bf16) {
    const Planes planes = make_planes(quants, high, d, dmin, sc, m);
    const bool all_rows = rows.numel() == 0;
    TORCH_CHECK(all_rows || rows.scalar_type() == torch::kInt64, "rows must be int64");
    rows = rows.contiguous();
    const int64_t count = all_rows ? quants.size(0) : rows.numel();
    const int64_t* index = all_rows ? nullptr : rows.data_ptr<int64_t>();
    for (int64_t i = 0; i < count && index; ++i) {
        TORCH_CHECK(index[i] >= 0 && index[i] < quants.size(0), "row index ", index[i], " out of range");
    }
    auto out = torch::empty({count, k}, torch::dtype(bf16 ? torch::kBFloat16 : torch::kFloat32));
    dispatch(qtype, [&](auto type) {
        constexpr int QT = decltype(type)::value;
        at::parallel_for(0, count, 16, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) {
                const Row w = planes.row(index ? index[i] : i);
                if (bf16) {
                    dequantize_row<QT>(w, k, reinterpret_cast<uint16_t*>(out.data_ptr()) + i * k);
                } else {
                    dequantize_row<QT>(w, k, out.data_ptr<float>() + i * k);
                }
            }
        });
    });
    return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
    module.def("gemv", &gemv, "Quantised weight x float activations via int8 dot products (memory-bound path)");
    module.def("dequantize", &dequantize, "Selected rows of a packed quantised weight as float32/bfloat16");
}
