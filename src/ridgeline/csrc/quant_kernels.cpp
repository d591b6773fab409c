// Kernels for GGML block-quantised weights in ridgeline's packed layout (see model/quant/packing.py).
//
// Every supported type is held as unsigned quants u (2 to 8 bits) plus per-group scales, so a weight is
// w = a_g * (u - offset) - b_g with (a_g, b_g) constant over a group of 32 weights (16 for Q6_K, Q2_K, Q3_K).
// The non-linear types (IQ4_NL, IQ4_XS, MXFP4) hold a 4-bit index into a 16-entry int8 codebook; one byte
// shuffle per 64 weights turns indices into u = value + 128 as they are decoded. Output rows are interleaved in
// blocks of 16: a "step" is 4 consecutive input weights of all 16 rows, 64 bytes, byte 4r + i = row r, weight
// 4 * step + i. That is the shape of one VPDPBUSD: 16 int32 lanes, one per output row, each summing 4 u8 x s8
// products, with the 4 activation bytes broadcast. So a row block's 16 results build up in one register with
// no horizontal sums, and each decoded weight vector serves every activation row of a tile.
// Per row block, planes hold:
//   8-bit types:  quants  64 bytes per step
//   4 to 6 bits:  quants  64 bytes per pair of steps (2j, 2j+1): low nibble = step 2j, high nibble = step 2j+1
//   2 and 3 bits: quants  64 bytes per 4 steps (4j .. 4j+3), step 4j + i in bits 2i, 2i+1
//   high bits:    high    per step, one little-endian 64-bit mask per bit above the low ones (bit i = byte i)
//   scales:       per group, 16 values (one per row): d (fp16; per group, or per 256 for K-quants and IQ4_XS),
//                 dmin (fp16 per 256; Q4_1/Q5_1: the group's m per group), sc (u8 or i8 per group; Q2_K:
//                 sc | m << 4; MXFP4: e8m0 exponent) and m (u8 per group, Q4_K/Q5_K)
//
// gemv: the memory-bound path. Activation rows are quantised to int8 blocks of 32 (llama.cpp's Q8_0 idea) and
// the weight bytes are read once per call. dequantize: the compute-bound path's first half (a torch GEMM does
// the rest). Each activation row's result takes the same operations in the same order whatever the number of
// rows or the row's place in its tile, so a row's output does not depend on its batch.
#include "kernels.h"
#include "large_buffers.h"
#include "parallel.h"
#include "simd_math.h"

#include "simd.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace {

enum QType : int {  // GGML's type ids
    Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14,
    IQ4_NL = 20, IQ4_XS = 23, MXFP4 = 39,
};

constexpr int kRows = 16;     // output rows per interleaved block
constexpr int kMaxTile = 12;  // activation rows sharing one pass over a weight block (at most)

template <int QT>
constexpr int group_steps() { return QT == Q6_K || QT == Q2_K || QT == Q3_K ? 4 : 8; }  // steps under one scale

template <int QT>
constexpr int low_bits() { return QT == Q8_0 ? 8 : QT == Q2_K || QT == Q3_K ? 2 : 4; }

template <int QT>
constexpr int high_bits() { return QT == Q5_0 || QT == Q5_1 || QT == Q5_K || QT == Q3_K ? 1 : QT == Q6_K ? 2 : 0; }

template <int QT>
constexpr bool has_codebook() { return QT == IQ4_NL || QT == IQ4_XS || QT == MXFP4; }

template <int QT>
constexpr int32_t quant_offset() {  // w = a * (u - offset) for the types whose b is a multiple of a
    return QT == Q8_0 || has_codebook<QT>() ? 128 : QT == Q4_0 ? 8 : QT == Q5_0 ? 16 : QT == Q6_K ? 32 : QT == Q3_K ? 4 : 0;
}

template <int QT>
constexpr bool quants_below_128() { return low_bits<QT>() + high_bits<QT>() <= 7 && !has_codebook<QT>(); }

// One VPDPBUSD step of a row block; the AVX2 build takes a cheaper form when the quants fit in 7 bits.
template <int QT>
inline __m512i dot_step(__m512i acc, __m512i u, __m512i x) {
    if constexpr (quants_below_128<QT>()) {
        return ridgeline::dpbusd_u7(acc, u, x);
    } else {
        return _mm512_dpbusd_epi32(acc, u, x);
    }
}

template <int QT>
constexpr bool has_mins() { return QT == Q4_K || QT == Q5_K || QT == Q2_K || QT == Q4_1 || QT == Q5_1; }

// The int8 codebooks + 128 (gguf.quants: IQ4_NL.kvalues, MXFP4.kvalues), 16 bytes repeated per 128-bit lane.
alignas(16) constexpr uint8_t kIQ4Codebook[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};
alignas(16) constexpr uint8_t kMXFP4Codebook[16] = {128, 129, 130, 131, 132, 134, 136, 140,
                                                    128, 127, 126, 125, 124, 122, 120, 116};

// Pointers to one row block's planes.
struct Block {
    const uint8_t* quants;
    const uint8_t* high;
    const uint16_t* d;
    const uint16_t* dmin;
    const uint8_t* sc;
    const uint8_t* m;
};

struct Planes {
    torch::Tensor quants, high, d, dmin, sc, m;

    template <typename T>
    static const T* block_ptr(const torch::Tensor& t, int64_t b) {
        return t.numel() ? reinterpret_cast<const T*>(t.data_ptr()) + b * t.stride(0) : nullptr;
    }
    Block block(int64_t b) const {
        return {block_ptr<uint8_t>(quants, b), block_ptr<uint8_t>(high, b), block_ptr<uint16_t>(d, b),
                block_ptr<uint16_t>(dmin, b),  block_ptr<uint8_t>(sc, b),    block_ptr<uint8_t>(m, b)};
    }
};

inline __mmask64 load_mask(const uint8_t* p) {
    uint64_t bits;
    std::memcpy(&bits, p, 8);
    return _cvtu64_mask64(bits);
}

inline __m512 fp16x16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

template <typename T>
inline __m512 bytes_to_float(const T* p) {  // 16 u8 (or i8) -> 16 floats
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(std::is_signed_v<T> ? _mm512_cvtepi8_epi32(raw) : _mm512_cvtepu8_epi32(raw));
}

// Steps 2j and 2j+1 of a block as two vectors of 64 unsigned quants.
template <int QT>
inline void decode_pair(const Block& w, int64_t j, __m512i& u0, __m512i& u1) {
    if constexpr (low_bits<QT>() == 8) {
        u0 = _mm512_loadu_si512(w.quants + 128 * j);
        u1 = _mm512_loadu_si512(w.quants + 128 * j + 64);
    } else if constexpr (low_bits<QT>() == 4) {
        const __m512i nibble = _mm512_set1_epi8(0x0F);
        const __m512i packed = _mm512_loadu_si512(w.quants + 64 * j);
        u0 = _mm512_and_si512(packed, nibble);
        u1 = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
    } else {  // 2 bits: pair j is half j % 2 of the 64 bytes holding steps 4 (j / 2) .. 4 (j / 2) + 3
        const __m512i field = _mm512_set1_epi8(0x03);
        const __m512i packed = _mm512_loadu_si512(w.quants + 64 * (j / 2));
        const __m512i pair = (j & 1) ? _mm512_srli_epi16(packed, 4) : packed;
        u0 = _mm512_and_si512(pair, field);
        u1 = _mm512_and_si512(_mm512_srli_epi16(pair, 2), field);
    }
    constexpr int nh = high_bits<QT>();
    for (int i = 0; i < nh; ++i) {  // per step, one mask per bit above the low ones
        const __m512i bit = _mm512_set1_epi8(static_cast<char>(1 << (low_bits<QT>() + i)));
        u0 = _mm512_mask_add_epi8(u0, load_mask(w.high + 8 * (nh * 2 * j + i)), u0, bit);
        u1 = _mm512_mask_add_epi8(u1, load_mask(w.high + 8 * (nh * (2 * j + 1) + i)), u1, bit);
    }
    if constexpr (has_codebook<QT>()) {  // index -> value + 128, one byte shuffle per 64 weights
        const __m512i table = _mm512_broadcast_i32x4(
            _mm_load_si128(reinterpret_cast<const __m128i*>(QT == MXFP4 ? kMXFP4Codebook : kIQ4Codebook)));
        u0 = _mm512_shuffle_epi8(table, u0);
        u1 = _mm512_shuffle_epi8(table, u1);
    }
}

// Software prefetch for the few-row (decode) tiles. A batch-1 step streams each weight once from DRAM, and the
// hardware prefetcher alone (it stops at each 4 KiB page; a 1536-wide Q4_K row block's quants span three) kept too
// few lines in flight. The 1.5B Q4_K_M shape's 127 matmuls of a step (997 MB) on the 2-core Zen 4 VM, one process,
// distances interleaved over 25 passes, medians: 34.1 ms without, 28.6 / 26.5 / 24.4 ms at 1 / 2 / 4 KiB ahead
// (a whole step: 37.6, 33.2, 32.7, 31.3 ms); separate runs put 8 KiB behind 4. Prompt-sized tiles read panels
// that stay in L2 and take no prefetches. The distance runs on past a block's end into the next block's
// quants (the planes are row-contiguous); past the last block it touches nothing a prefetch could fault on.
constexpr int kPrefetchTile = 4;        // tiles of up to this many activation rows prefetch
constexpr int64_t kPrefetchBytes = 4096;  // how far ahead in the quants plane

// One prefetch per 64-byte line of a plane that holds `bytes` per pair of steps, at pair j.
template <int bytes>
inline void prefetch_plane(const uint8_t* plane, int64_t j, int64_t distance) {
    if constexpr (bytes >= 64) {
        for (int line = 0; line < bytes; line += 64) {
            _mm_prefetch(reinterpret_cast<const char*>(plane + bytes * j + line + distance), _MM_HINT_T0);
        }
    } else if ((bytes * j) % 64 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(plane + bytes * j + distance), _MM_HINT_T0);
    }
}

template <int QT>
inline void prefetch_pair(const Block& w, int64_t j) {
    constexpr int quant_bytes = low_bits<QT>() * 16;  // per pair of steps
    prefetch_plane<quant_bytes>(w.quants, j, kPrefetchBytes);
    constexpr int high_bytes = high_bits<QT>() * 16;  // the high-bit masks, the same number of weights ahead
    if constexpr (high_bytes > 0) prefetch_plane<high_bytes>(w.high, j, kPrefetchBytes * high_bytes / quant_bytes);
}

// Per row of the block, scale a and (types with mins only) offset b of group g.
template <int QT>
inline void group_scales(const Block& w, int64_t g, __m512& a, __m512& b) {
    if constexpr (QT == Q8_0 || QT == Q4_0 || QT == Q5_0 || QT == IQ4_NL) {
        a = fp16x16(w.d + kRows * g);
    } else if constexpr (QT == Q4_1 || QT == Q5_1) {  // w = d u + m
        a = fp16x16(w.d + kRows * g);
        b = _mm512_sub_ps(_mm512_setzero_ps(), fp16x16(w.dmin + kRows * g));
    } else if constexpr (QT == Q4_K || QT == Q5_K) {
        const int64_t super = g / 8;  // 8 groups of 32 per super-block of 256
        a = _mm512_mul_ps(fp16x16(w.d + kRows * super), bytes_to_float(w.sc + kRows * g));
        b = _mm512_mul_ps(fp16x16(w.dmin + kRows * super), bytes_to_float(w.m + kRows * g));
    } else if constexpr (QT == Q2_K) {  // 16 groups of 16; sc in the low nibble, m in the high one
        const __m512i packed = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sc + kRows * g)));
        const __m512i low = _mm512_and_si512(packed, _mm512_set1_epi32(0x0F));
        a = _mm512_mul_ps(fp16x16(w.d + kRows * (g / 16)), _mm512_cvtepi32_ps(low));
        b = _mm512_mul_ps(fp16x16(w.dmin + kRows * (g / 16)), _mm512_cvtepi32_ps(_mm512_srli_epi32(packed, 4)));
    } else if constexpr (QT == MXFP4) {  // 2^(e - 128), exact (scalef also yields the denormal ones)
        a = _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_sub_ps(bytes_to_float(w.sc + kRows * g), _mm512_set1_ps(128.0f)));
    } else {  // Q6_K, Q3_K: 16 groups of 16 per super-block; IQ4_XS: 8 groups of 32. Signed scales.
        constexpr int per_super = QT == IQ4_XS ? 8 : 16;
        a = _mm512_mul_ps(fp16x16(w.d + kRows * (g / per_super)),
                          bytes_to_float(reinterpret_cast<const int8_t*>(w.sc) + kRows * g));
    }
}

// The activation rows of one tile, quantised to int8 blocks of 32 (x ~= scale * q over a block) and interleaved
// as a GEMM packs its A panel: step s (4 bytes) of the tile's row t at q[4 * (mt * s + t)], and per group of 32
// (or 16) row t's value at [mt * g + t], for a tile of mt rows. So one pointer and constant offsets reach every
// row of the tile in the inner loop. With a pointer per row, 12 rows plus the weight planes outgrew the general
// registers, and the kernel spilled and reloaded row pointers inside it (~44 scalar loads per 96 VPDPBUSD of a
// Q5_0 group). A tile of one row is laid out exactly as the row itself.
struct TileActivations {
    const int8_t* q;
    const float* scale;    // per 32
    const int32_t* sum16;  // sum of q per 16 (groups of 16)
    const int32_t* sum32;  // sum of q per 32
    // -offset * sum of q per group of the weight's type (16 or 32), where the type has an offset: a group's dot
    // product starts from it, broadcast from memory (a load, not a vector ALU op as a broadcast from a register is).
    const int32_t* offset_sum = nullptr;
};

// One activation row quantised to int8 blocks of 32, written into its tile (row t of a tile of mt rows; see
// TileActivations): x ~= scale[i] * q over block i.
void quantize_activation(const float* x, int64_t k, int64_t mt, int64_t t, int8_t* q, float* scale, int32_t* sum16,
                         int32_t* sum32) {
    for (int64_t i = 0; i < k / 32; ++i) {
        const __m512 lo = _mm512_loadu_ps(x + 32 * i), hi = _mm512_loadu_ps(x + 32 * i + 16);
        const float amax = std::max(_mm512_reduce_max_ps(_mm512_abs_ps(lo)), _mm512_reduce_max_ps(_mm512_abs_ps(hi)));
        const float block_scale = amax / 127.0f;
        const __m512 inverse = _mm512_set1_ps(block_scale > 0 ? 1.0f / block_scale : 0.0f);
        const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inverse));
        const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inverse));
        alignas(16) int32_t steps[8];  // the block's 8 steps of 4 bytes, each to its place in the tile
        _mm_store_si128(reinterpret_cast<__m128i*>(steps), _mm512_cvtsepi32_epi8(qlo));
        _mm_store_si128(reinterpret_cast<__m128i*>(steps + 4), _mm512_cvtsepi32_epi8(qhi));
        for (int s = 0; s < 8; ++s) std::memcpy(q + 4 * (mt * (8 * i + s) + t), steps + s, 4);
        const int32_t low = _mm512_reduce_add_epi32(qlo), high = _mm512_reduce_add_epi32(qhi);
        scale[mt * i + t] = block_scale;
        sum16[mt * 2 * i + t] = low;
        sum16[mt * (2 * i + 1) + t] = high;
        sum32[mt * i + t] = low + high;
    }
}

// One VPDPBUSD step with the activation's 4 bytes read from memory. Native AVX-512 takes them as the
// instruction's broadcast operand ({1to16}); GCC would load them with a VPBROADCASTD of their own, one more
// instruction per dot product (~8 % of a 12-row tile's rate on Zen 4, measured on a register-resident loop).
template <int QT>
inline __m512i dot_step_at(__m512i acc, __m512i u, const int8_t* x4) {
#if defined(__AVX512VNNI__) && !defined(SIMDE_ENABLE_NATIVE_ALIASES)
    __asm__("vpdpbusd %1%{1to16%}, %2, %0" : "+v"(acc) : "m"(*reinterpret_cast<const int32_t*>(x4)), "v"(u));
    return acc;
#else
    int32_t x;
    std::memcpy(&x, x4, 4);
    return dot_step<QT>(acc, u, _mm512_set1_epi32(x));
#endif
}

// Per row of the block, the integer scale (and minimum) of group g of 16 and d (dmin) of its super-block: the
// types with groups of 16 (Q2_K, Q3_K, Q6_K), whose small integer scales can meet the dot products in integers.
template <int QT>
inline void int_group_scales(const Block& w, int64_t g, __m512i& sc, __m512i& m, __m512& d, __m512& dmin) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.sc + kRows * g));
    d = fp16x16(w.d + kRows * (g / 16));
    if constexpr (QT == Q2_K) {  // sc in the low nibble, m in the high one
        const __m512i packed = _mm512_cvtepu8_epi32(raw);
        sc = _mm512_and_si512(packed, _mm512_set1_epi32(0x0F));
        m = _mm512_srli_epi32(packed, 4);
        dmin = fp16x16(w.dmin + kRows * (g / 16));
    } else {  // Q3_K, Q6_K: signed
        sc = _mm512_cvtepi8_epi32(raw);
    }
}

// The 16 outputs of one row block for MT activation rows.
template <int QT, int MT>
inline void block_dot(const Block& w, int64_t groups, const TileActivations& x, float* const* out, __mmask16 valid) {
    constexpr int steps = group_steps<QT>();
    constexpr int32_t offset = quant_offset<QT>();
    constexpr bool two_chains = MT < 4;  // few rows: split each sum in two so VPDPBUSD latency overlaps
    __m512 acc[MT];
    for (int t = 0; t < MT; ++t) acc[t] = _mm512_setzero_ps();
    // The integer sum over group g of (u - offset) * q, per row of the block, for each activation row.
    auto group_dots = [&](int64_t g, __m512i* dots) {
        __m512i dot0[MT], dot1[MT];
        for (int t = 0; t < MT; ++t) {  // start from -offset * sum(q): the u - offset of every weight, in integers
            dot0[t] = offset ? _mm512_set1_epi32(x.offset_sum[MT * g + t]) : _mm512_setzero_si512();
            dot1[t] = _mm512_setzero_si512();
        }
#pragma GCC unroll 4
        for (int p = 0; p < steps / 2; ++p) {
            __m512i u0, u1;
            if constexpr (MT <= kPrefetchTile) prefetch_pair<QT>(w, g * (steps / 2) + p);
            decode_pair<QT>(w, g * (steps / 2) + p, u0, u1);
            const int8_t* x0 = x.q + 4 * MT * (g * steps + 2 * p);  // step 2p of the group, row 0
            const int8_t* x1 = x0 + 4 * MT;                           // step 2p + 1
            for (int t = 0; t < MT; ++t) {
                dot0[t] = dot_step_at<QT>(dot0[t], u0, x0 + 4 * t);
                if constexpr (two_chains) {
                    dot1[t] = dot_step_at<QT>(dot1[t], u1, x1 + 4 * t);
                } else {
                    dot0[t] = dot_step_at<QT>(dot0[t], u1, x1 + 4 * t);
                }
            }
        }
        for (int t = 0; t < MT; ++t) dots[t] = two_chains ? _mm512_add_epi32(dot0[t], dot1[t]) : dot0[t];
    };
    if constexpr (steps == 4) {
        // Groups of 16, activation scale per 32: the two groups under one activation scale are summed in integers,
        // each times its integer scale (and minimum), then go to float once. Exact: |dot| <= 16 * 127 * 32 (Q6_K) and a
        // scale at most 8 bits, far inside int32. Half the float work per weight of a group-at-a-time sum.
        for (int64_t g = 0; g < groups; g += 2) {
            __m512i sc0, sc1, m0, m1;
            __m512 d, dmin;
            int_group_scales<QT>(w, g, sc0, m0, d, dmin);
            int_group_scales<QT>(w, g + 1, sc1, m1, d, dmin);  // the same super-block: groups come 16 to one
            __m512i dots0[MT], dots1[MT];
            group_dots(g, dots0);
            group_dots(g + 1, dots1);
            for (int t = 0; t < MT; ++t) {
                const __m512 xs = _mm512_set1_ps(x.scale[MT * (g / 2) + t]);
                const __m512i dot = _mm512_add_epi32(_mm512_mullo_epi32(dots0[t], sc0), _mm512_mullo_epi32(dots1[t], sc1));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, xs), acc[t]);
                if constexpr (has_mins<QT>()) {
                    const __m512i mins = _mm512_add_epi32(_mm512_mullo_epi32(m0, _mm512_set1_epi32(x.sum16[MT * g + t])),
                                                          _mm512_mullo_epi32(m1, _mm512_set1_epi32(x.sum16[MT * (g + 1) + t])));
                    acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dmin, xs), acc[t]);
                }
            }
        }
    } else {
        for (int64_t g = 0; g < groups; ++g) {
            __m512 a, b;
            group_scales<QT>(w, g, a, b);
            __m512i dots[MT];
            group_dots(g, dots);
            for (int t = 0; t < MT; ++t) {
                const float xs = x.scale[MT * g + t];
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots[t]), _mm512_mul_ps(a, _mm512_set1_ps(xs)), acc[t]);
                if constexpr (has_mins<QT>()) {
                    acc[t] = _mm512_fnmadd_ps(b, _mm512_set1_ps(xs * static_cast<float>(x.sum32[MT * g + t])), acc[t]);
                }
            }
        }
    }
    for (int t = 0; t < MT; ++t) _mm512_mask_storeu_ps(out[t], valid, acc[t]);
}

template <int QT, int... Tiles>
inline void dispatch_tile(int tile, std::integer_sequence<int, Tiles...>, const Block& w, int64_t groups,
                          const TileActivations& x, float* const* out, __mmask16 valid) {
    ((tile == Tiles + 1 ? block_dot<QT, Tiles + 1>(w, groups, x, out, valid) : void()), ...);
}

inline __mmask16 valid_rows(int64_t rows, int64_t block) {
    const int64_t left = rows - block * kRows;
    return left >= kRows ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1);
}

// Each plane's first block and its row stride: a block's pointers by arithmetic alone, not data_ptr() per plane
// and block (which showed in profiles of batch-1 steps).
struct PlaneWalk {
    Block first;
    int64_t quants, high, d, dmin, sc, m;

    explicit PlaneWalk(const Planes& p)
        : first(p.block(0)), quants(p.quants.stride(0)), high(p.high.numel() ? p.high.stride(0) : 0),
          d(p.d.numel() ? p.d.stride(0) : 0), dmin(p.dmin.numel() ? p.dmin.stride(0) : 0),
          sc(p.sc.numel() ? p.sc.stride(0) : 0), m(p.m.numel() ? p.m.stride(0) : 0) {}

    Block block(int64_t b) const {
        auto at = [b](auto* base, int64_t stride) { return base ? base + b * stride : base; };
        return {at(first.quants, quants), at(first.high, high), at(first.d, d),
                at(first.dmin, dmin),     at(first.sc, sc),     at(first.m, m)};
    }
};

// Activation rows per tile: with groups of 16, each row holds two groups' sums at once, so fewer rows fit in the
// 32 vector registers.
template <int QT>
constexpr int max_tile() { return group_steps<QT>() == 4 ? 8 : kMaxTile; }

// A calling thread's scratch that outlives the call, never zeroed. A prompt-sized call quantises megabytes of
// activations (8,192 rows of 2,048 inputs: 16 MiB of int8, 8 MiB of scales and sums). As std::vectors they were
// zeroed on the calling thread while the other waited in the parallel region to come (~3 % of a long prefill
// step's samples, memset and the waiting together), and came back from the OS page by page whenever glibc had
// trimmed its heap in between. What one very long call needed is not kept past the next call that needs less
// than kKeepBytes.
template <typename T>
class Scratch {
public:
    static constexpr size_t kKeepBytes = size_t{64} << 20;

    T* get(size_t n) {
        const bool oversized = capacity_ * sizeof(T) > kKeepBytes && n * sizeof(T) <= kKeepBytes;
        if (n > capacity_ || oversized) {
            data_.reset();
            data_.reset(new T[n]);  // default-initialised: every element is written before it is read
            capacity_ = n;
        }
        return data_.get();
    }

private:
    std::unique_ptr<T[]> data_;
    size_t capacity_ = 0;
};

constexpr int64_t kSerialRows = 256;  // up to this many rows, per-row bookkeeping runs without a parallel region

// The activations of a call: every row quantised into its tile's interleaved layout (TileActivations), tile
// after tile, so the tile starting at row m0 begins at element m0 * (per-row count) of each array.
struct QuantizedTiles {
    int8_t* q;
    float* scale;
    int32_t *sum16, *sum32;
    int64_t m_total, k, balanced;  // rows, inputs, rows per tile (the last tile may have fewer)

    int64_t tile_rows(int64_t m0) const { return std::min(balanced, m_total - m0); }
    // The tile starting at row m0, as the kernel reads it.
    TileActivations tile(int64_t m0, const int32_t* offset_sums, int64_t groups) const {
        return {q + m0 * k, scale + m0 * k / 32, sum16 + m0 * k / 16, sum32 + m0 * k / 32,
                offset_sums ? offset_sums + m0 * groups : nullptr};
    }
    // Row i of the call (x: its k inputs), quantised into its place in its tile.
    void quantize_row(const float* x, int64_t i) const {
        const int64_t m0 = i / balanced * balanced;
        quantize_activation(x, k, tile_rows(m0), i - m0, q + m0 * k, scale + m0 * k / 32, sum16 + m0 * k / 16,
                            sum32 + m0 * k / 32);
    }
};

// The calling thread's scratch for a call's activations (one set for every weight type).
QuantizedTiles quantized_tiles(int64_t m_total, int64_t k, int64_t balanced) {
    thread_local Scratch<int8_t> q_scratch;
    thread_local Scratch<float> scale_scratch;
    thread_local Scratch<int32_t> sum16_scratch, sum32_scratch;
    return {q_scratch.get(m_total * k), scale_scratch.get(m_total * k / 32), sum16_scratch.get(m_total * k / 16),
            sum32_scratch.get(m_total * k / 32), m_total, k, balanced};
}

template <int QT>
void gemv_typed(const Planes& planes, const float* x, int64_t m_total, float* out, int64_t rows, int64_t k) {
    const int64_t blocks = planes.quants.size(0), groups = k / (4 * group_steps<QT>());
    constexpr int32_t offset = quant_offset<QT>();
    constexpr int tile_rows = max_tile<QT>();
    // Tiles of equal size rather than full ones and a remainder: 16 rows as 8 + 8, not 12 + 4, whose small tile
    // decodes every weight again for a third of the dot products.
    const int64_t tiles = (m_total + tile_rows - 1) / tile_rows, balanced = (m_total + tiles - 1) / tiles;
    const QuantizedTiles xq = quantized_tiles(m_total, k, balanced);
    // Rows are quantised independently (a row's bytes never depend on its neighbours), by both threads for a
    // prompt-sized call: 2,048 rows of 2,048 inputs took ~2 ms on one core.
    ridgeline::parallel_chunks(m_total, std::max<int64_t>(1, (64 << 10) / k), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) xq.quantize_row(x + i * k, i);
    });
    // On the stack for a decode step's few rows (no allocation in the ~80 calls of a batch-1 step).
    constexpr int64_t kOnStack = 2048;
    int32_t stack_sums[kOnStack];
    thread_local Scratch<int32_t> heap_sums;
    int32_t* offset_sums = nullptr;
    if constexpr (offset != 0) {
        // The sums' arrays are laid out as the offsets' ([tile][group][row of the tile]): one pass over them.
        const int32_t* sums = group_steps<QT>() == 4 ? xq.sum16 : xq.sum32;
        offset_sums = m_total * groups > kOnStack ? heap_sums.get(m_total * groups) : stack_sums;
        ridgeline::parallel_chunks(m_total * groups, kSerialRows * groups, [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) offset_sums[i] = -offset * sums[i];
        });
    }
    const int64_t bytes_per_block = planes.quants.size(1) + (planes.high.numel() ? planes.high.size(1) : 0);
    const int64_t grain = std::max<int64_t>(1, (32 << 10) / bytes_per_block);
    // Cache blocking for more than one tile of activation rows: each tile sweeps a panel of blocks small enough to
    // stay in L2, rather than every tile visiting each block in turn. A tile's activations then stay in L1 and its
    // outputs are written in runs of a panel's rows. Block by block, 16 rows through the LM head (262,144 output
    // rows) wrote 16 scattered 64-byte pieces per block and ran at ~60-70 % of a small matrix's rate (585 against
    // ~1,050 GFLOP/s on the 2-core Zen 4); by panels, ~80 %. Which tile or panel computes an output never changes
    // its bits: every output takes the same operations whatever the loop order.
    const int64_t panel = m_total > tile_rows ? std::max<int64_t>(1, (192 << 10) / bytes_per_block) : 1;
    const PlaneWalk walk(planes);
    ridgeline::parallel_chunks(blocks, grain, [&](int64_t begin, int64_t end) {
        for (int64_t first = begin; first < end; first += panel) {
            const int64_t last = std::min(end, first + panel);
            for (int64_t m0 = 0; m0 < m_total; m0 += balanced) {
                const int tile = static_cast<int>(xq.tile_rows(m0));
                const TileActivations activations = xq.tile(m0, offset_sums, groups);
                for (int64_t block = first; block < last; ++block) {
                    float* outs[kMaxTile];
                    for (int t = 0; t < tile; ++t) outs[t] = out + (m0 + t) * rows + block * kRows;
                    dispatch_tile<QT>(tile, std::make_integer_sequence<int, tile_rows>{}, walk.block(block), groups,
                                      activations, outs, valid_rows(rows, block));
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
        case Q4_1: f(std::integral_constant<int, Q4_1>{}); break;
        case Q5_1: f(std::integral_constant<int, Q5_1>{}); break;
        case Q2_K: f(std::integral_constant<int, Q2_K>{}); break;
        case Q3_K: f(std::integral_constant<int, Q3_K>{}); break;
        case Q4_K: f(std::integral_constant<int, Q4_K>{}); break;
        case Q5_K: f(std::integral_constant<int, Q5_K>{}); break;
        case Q6_K: f(std::integral_constant<int, Q6_K>{}); break;
        case IQ4_NL: f(std::integral_constant<int, IQ4_NL>{}); break;
        case IQ4_XS: f(std::integral_constant<int, IQ4_XS>{}); break;
        case MXFP4: f(std::integral_constant<int, MXFP4>{}); break;
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

}  // namespace

namespace ridgeline {

// x: [M, K] float32 with K a multiple of 32. Returns [M, rows] float32.
torch::Tensor gemv(int64_t qtype, torch::Tensor x, torch::Tensor quants, torch::Tensor high, torch::Tensor d,
                   torch::Tensor dmin, torch::Tensor sc, torch::Tensor m, int64_t rows) {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == torch::kFloat32 && x.device().is_cpu(), "x must be [M, K] float32 CPU");
    const Planes planes = make_planes(quants, high, d, dmin, sc, m);
    x = x.contiguous();
    const int64_t m_total = x.size(0), k = x.size(1);
    TORCH_CHECK(k % 32 == 0 && rows <= quants.size(0) * kRows, "gemv: K must be a multiple of 32 and rows fit the blocks");
    auto out = large_buffers().empty_float({m_total, rows});
    dispatch(qtype, [&](auto type) {
        gemv_typed<decltype(type)::value>(planes, x.data_ptr<float>(), m_total, out.data_ptr<float>(), rows, k);
    });
    return out;
}

// The rows of one block whose output pointer is not null, dequantised: w = a * u - b.
template <int QT, typename Out>
void dequantize_block(const Block& w, int64_t k, Out* const* rows) {
    constexpr int steps = group_steps<QT>();
    alignas(64) uint8_t u[steps * 64];
    alignas(64) float a[kRows], b[kRows];
    for (int64_t g = 0; g < k / (4 * steps); ++g) {
        __m512 av, bv;
        group_scales<QT>(w, g, av, bv);
        if constexpr (!has_mins<QT>()) bv = _mm512_mul_ps(av, _mm512_set1_ps(static_cast<float>(quant_offset<QT>())));
        _mm512_store_ps(a, av);
        _mm512_store_ps(b, bv);
        for (int p = 0; p < steps / 2; ++p) {
            __m512i u0, u1;
            decode_pair<QT>(w, g * (steps / 2) + p, u0, u1);
            _mm512_store_si512(u + 128 * p, u0);
            _mm512_store_si512(u + 128 * p + 64, u1);
        }
        for (int r = 0; r < kRows; ++r) {
            if (rows[r] == nullptr) continue;
            for (int half = 0; half < steps / 4; ++half) {  // 16 weights: the row's 4 bytes of 4 steps
                const uint8_t* s = u + 256 * half + 4 * r;
                int32_t w0, w1, w2, w3;
                std::memcpy(&w0, s, 4), std::memcpy(&w1, s + 64, 4), std::memcpy(&w2, s + 128, 4), std::memcpy(&w3, s + 192, 4);
                const __m512 quants = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_setr_epi32(w0, w1, w2, w3)));
                const __m512 values = _mm512_fmsub_ps(_mm512_set1_ps(a[r]), quants, _mm512_set1_ps(b[r]));
                Out* dst = rows[r] + g * 4 * steps + 16 * half;
                if constexpr (std::is_same_v<Out, float>) {
                    _mm512_storeu_ps(dst, values);
                } else {
                    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), to_bf16(values));
                }
            }
        }
    }
}

// Rows `index` (int64, or empty for all) of the weight as [len, K] float32 or bfloat16.
torch::Tensor dequantize(int64_t qtype, torch::Tensor quants, torch::Tensor high, torch::Tensor d, torch::Tensor dmin,
                         torch::Tensor sc, torch::Tensor m, int64_t rows, int64_t k, torch::Tensor index, bool bf16) {
    const Planes planes = make_planes(quants, high, d, dmin, sc, m);
    const bool all_rows = index.numel() == 0;
    TORCH_CHECK(all_rows || index.scalar_type() == torch::kInt64, "rows must be int64");
    index = index.contiguous();
    const int64_t* picked = all_rows ? nullptr : index.data_ptr<int64_t>();
    const int64_t count = all_rows ? rows : index.numel();
    for (int64_t i = 0; i < count && picked; ++i) {
        TORCH_CHECK(picked[i] >= 0 && picked[i] < rows, "row index ", picked[i], " out of range");
    }
    auto out = torch::empty({count, k}, torch::dtype(bf16 ? torch::kBFloat16 : torch::kFloat32));
    dispatch(qtype, [&](auto type) {
        constexpr int QT = decltype(type)::value;
        auto run = [&](auto* base) {
            using Out = std::remove_pointer_t<decltype(base)>;
            if (all_rows) {  // whole blocks: each decoded vector serves 16 rows
                ridgeline::parallel_chunks(quants.size(0), 1, [&](int64_t begin, int64_t end) {
                    for (int64_t block = begin; block < end; ++block) {
                        Out* targets[kRows] = {};
                        for (int r = 0; r < kRows && block * kRows + r < rows; ++r) targets[r] = base + (block * kRows + r) * k;
                        dequantize_block<QT>(planes.block(block), k, targets);
                    }
                });
            } else {
                ridgeline::parallel_chunks(count, 16, [&](int64_t begin, int64_t end) {
                    for (int64_t i = begin; i < end; ++i) {
                        Out* targets[kRows] = {};
                        targets[picked[i] % kRows] = base + i * k;
                        dequantize_block<QT>(planes.block(picked[i] / kRows), k, targets);
                    }
                });
            }
        };
        if (bf16) {
            run(reinterpret_cast<uint16_t*>(out.data_ptr()));
        } else {
            run(out.data_ptr<float>());
        }
    });
    return out;
}

}  // namespace ridgeline
