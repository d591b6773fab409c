// The AVX-512 intrinsics the kernels use, built from AVX2 + FMA + F16C for CPUs without AVX-512 (AMD Zen 2/3,
// Intel client cores). Included by simd.h only when the compiler targets no AVX-512.
//
// Why emulate instead of writing the kernels twice: the kernels are written once against 16 float lanes and
// 64-byte rows of quants (the shape of one VPDPBUSD); here each 512-bit value is two 256-bit halves, and every
// function gives the AVX-512 instruction's exact lane semantics, so the AVX2 build computes the same bits as an
// AVX-512 machine (reductions follow GCC's reduction order too). Only the functions the kernels call exist;
// a new intrinsic in a kernel fails to compile here until it is added below.
//
// Names: after <immintrin.h>, macros point the AVX-512 names at the rl_ functions below (as SIMDe's native
// aliases do). Masks (__mmask16, __mmask64) are plain integers in both worlds and stay as they are.
#pragma once

#include <immintrin.h>

#include <cstdint>

struct rl_m512 { __m256 lo, hi; };
struct rl_m512i { __m256i lo, hi; };

namespace rl_avx2 {

// 16 lanes of all-ones where bit i of the mask is set.
inline rl_m512 lanes_of(uint32_t k) {
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i lo = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(k & 0xFF), bits), bits);
    const __m256i hi = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((k >> 8) & 0xFF), bits), bits);
    return {_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi)};
}

// 32 bytes of 0xFF where bit i of the 32-bit mask is set.
inline __m256i bytes_of(uint32_t k) {
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(k)),
                                               _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

inline rl_m512 blend(rl_m512 src, rl_m512 value, uint32_t k) {
    const rl_m512 m = lanes_of(k);
    return {_mm256_blendv_ps(src.lo, value.lo, m.lo), _mm256_blendv_ps(src.hi, value.hi, m.hi)};
}

// 2^n for integral n in [-126, 127], exactly.
inline __m256 exp2_int(__m256i n) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23)); }

// a * 2^floor(b) with one rounding, denormal results included: the power is applied in two halves that are
// each a normal float, and the first product stays normal whenever the result is (both scale the same way).
inline __m256 scalef(__m256 a, __m256 b) {
    __m256 n = _mm256_floor_ps(b);
    n = _mm256_max_ps(_mm256_min_ps(n, _mm256_set1_ps(254.0f)), _mm256_set1_ps(-252.0f));
    const __m256i whole = _mm256_cvtps_epi32(n);
    const __m256i first = _mm256_sub_epi32(whole, _mm256_srai_epi32(whole, 1));  // n - floor(n / 2)
    const __m256i second = _mm256_srai_epi32(whole, 1);
    return _mm256_mul_ps(_mm256_mul_ps(a, exp2_int(first)), exp2_int(second));
}

// VPDPBUSD on 8 int32 lanes: acc + the sum of four u8 x s8 products per lane, without saturation. VPMADDUBSW
// saturates a pair's sum at 16 bits, so the unsigned bytes go in as their low 7 bits and their top bit apart.
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i low = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(u, _mm256_set1_epi8(0x7F)), s), ones);
    const __m256i top = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(u, 7), _mm256_set1_epi8(1)), s), ones);
    return _mm256_add_epi32(acc, _mm256_add_epi32(low, _mm256_slli_epi32(top, 7)));
}

// The same where every unsigned byte is below 128: one pair sums to at most 2 x 127 x 128 and cannot saturate.
inline __m256i dpbusd_u7(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

}  // namespace rl_avx2

// ---- floats
inline rl_m512 rl_mm512_set1_ps(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
inline rl_m512 rl_mm512_setzero_ps() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline rl_m512 rl_mm512_loadu_ps(const void* p) {
    const float* f = static_cast<const float*>(p);
    return {_mm256_loadu_ps(f), _mm256_loadu_ps(f + 8)};
}
inline void rl_mm512_storeu_ps(void* p, rl_m512 a) {
    float* f = static_cast<float*>(p);
    _mm256_storeu_ps(f, a.lo), _mm256_storeu_ps(f + 8, a.hi);
}
inline rl_m512 rl_mm512_maskz_loadu_ps(uint32_t k, const void* p) {  // masked-off lanes are not read
    const rl_m512 m = rl_avx2::lanes_of(k);
    const float* f = static_cast<const float*>(p);
    return {_mm256_maskload_ps(f, _mm256_castps_si256(m.lo)), _mm256_maskload_ps(f + 8, _mm256_castps_si256(m.hi))};
}
inline void rl_mm512_mask_storeu_ps(void* p, uint32_t k, rl_m512 a) {
    const rl_m512 m = rl_avx2::lanes_of(k);
    float* f = static_cast<float*>(p);
    _mm256_maskstore_ps(f, _mm256_castps_si256(m.lo), a.lo), _mm256_maskstore_ps(f + 8, _mm256_castps_si256(m.hi), a.hi);
}

#define RL_BINARY_PS(name, op)                                                                        \
    inline rl_m512 rl_mm512_##name##_ps(rl_m512 a, rl_m512 b) { return {op(a.lo, b.lo), op(a.hi, b.hi)}; }
RL_BINARY_PS(add, _mm256_add_ps)
RL_BINARY_PS(sub, _mm256_sub_ps)
RL_BINARY_PS(mul, _mm256_mul_ps)
RL_BINARY_PS(div, _mm256_div_ps)
RL_BINARY_PS(max, _mm256_max_ps)
RL_BINARY_PS(min, _mm256_min_ps)
RL_BINARY_PS(scalef, rl_avx2::scalef)
#undef RL_BINARY_PS

#define RL_TERNARY_PS(name, op)                                                                                \
    inline rl_m512 rl_mm512_##name##_ps(rl_m512 a, rl_m512 b, rl_m512 c) { return {op(a.lo, b.lo, c.lo), op(a.hi, b.hi, c.hi)}; }
RL_TERNARY_PS(fmadd, _mm256_fmadd_ps)
RL_TERNARY_PS(fnmadd, _mm256_fnmadd_ps)
RL_TERNARY_PS(fmsub, _mm256_fmsub_ps)
#undef RL_TERNARY_PS

inline rl_m512 rl_mm512_abs_ps(rl_m512 a) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    return {_mm256_and_ps(a.lo, magnitude), _mm256_and_ps(a.hi, magnitude)};
}
inline rl_m512 rl_mm512_mask_sub_ps(rl_m512 src, uint32_t k, rl_m512 a, rl_m512 b) { return rl_avx2::blend(src, rl_mm512_sub_ps(a, b), k); }
inline rl_m512 rl_mm512_mask_div_ps(rl_m512 src, uint32_t k, rl_m512 a, rl_m512 b) { return rl_avx2::blend(src, rl_mm512_div_ps(a, b), k); }
inline rl_m512 rl_mm512_mask_max_ps(rl_m512 src, uint32_t k, rl_m512 a, rl_m512 b) { return rl_avx2::blend(src, rl_mm512_max_ps(a, b), k); }
inline rl_m512 rl_mm512_maskz_mov_ps(uint32_t k, rl_m512 a) { return rl_avx2::blend(rl_mm512_setzero_ps(), a, k); }

template <int Predicate>
inline uint16_t rl_cmp_ps_mask(rl_m512 a, rl_m512 b) {
    return static_cast<uint16_t>(_mm256_movemask_ps(_mm256_cmp_ps(a.lo, b.lo, Predicate)) |
                                 _mm256_movemask_ps(_mm256_cmp_ps(a.hi, b.hi, Predicate)) << 8);
}
#define rl_mm512_cmp_ps_mask(a, b, predicate) rl_cmp_ps_mask<(predicate)>(a, b)

template <int Rounding>
inline rl_m512 rl_roundscale_ps(rl_m512 a) {  // scale 0 (imm bits 7:4) is all the kernels use
    static_assert((Rounding >> 4) == 0, "roundscale with a scale is not emulated");
    return {_mm256_round_ps(a.lo, Rounding), _mm256_round_ps(a.hi, Rounding)};
}
#define rl_mm512_roundscale_ps(a, rounding) rl_roundscale_ps<(rounding)>(a)

inline float rl_mm512_cvtss_f32(rl_m512 a) { return _mm256_cvtss_f32(a.lo); }

// GCC's _mm512_reduce_{add,max}_ps order: halves of 256, of 128, then lanes (2, 3, 0, 1), then lane 0 op 1.
#define RL_REDUCE_PS(name, op256, op128)                                                   \
    inline float rl_mm512_reduce_##name##_ps(rl_m512 a) {                                 \
        const __m256 t3 = op256(a.hi, a.lo);                                               \
        const __m128 t6 = op128(_mm256_extractf128_ps(t3, 1), _mm256_castps256_ps128(t3)); \
        const __m128 t8 = op128(t6, _mm_shuffle_ps(t6, t6, _MM_SHUFFLE(1, 0, 3, 2)));      \
        return _mm_cvtss_f32(op128(t8, _mm_shuffle_ps(t8, t8, _MM_SHUFFLE(1, 1, 1, 1))));  \
    }
RL_REDUCE_PS(add, _mm256_add_ps, _mm_add_ps)
RL_REDUCE_PS(max, _mm256_max_ps, _mm_max_ps)
#undef RL_REDUCE_PS

inline rl_m512 rl_mm512_cvtph_ps(__m256i a) {
    return {_mm256_cvtph_ps(_mm256_castsi256_si128(a)), _mm256_cvtph_ps(_mm256_extracti128_si256(a, 1))};
}
template <int Rounding>
inline __m256i rl_cvtps_ph(rl_m512 a) {
    return _mm256_setr_m128i(_mm256_cvtps_ph(a.lo, Rounding), _mm256_cvtps_ph(a.hi, Rounding));
}
#define rl_mm512_cvtps_ph(a, rounding) rl_cvtps_ph<(rounding)>(a)

// ---- integers
inline rl_m512i rl_mm512_set1_epi32(int v) { return {_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
inline rl_m512i rl_mm512_set1_epi8(char v) { return {_mm256_set1_epi8(v), _mm256_set1_epi8(v)}; }
inline rl_m512i rl_mm512_setzero_si512() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline rl_m512i rl_mm512_loadu_si512(const void* p) {
    const __m256i* v = static_cast<const __m256i*>(p);
    return {_mm256_loadu_si256(v), _mm256_loadu_si256(v + 1)};
}
inline void rl_mm512_store_si512(void* p, rl_m512i a) {
    __m256i* v = static_cast<__m256i*>(p);
    _mm256_storeu_si256(v, a.lo), _mm256_storeu_si256(v + 1, a.hi);
}
inline void rl_mm512_store_ps(void* p, rl_m512 a) { rl_mm512_storeu_ps(p, a); }

inline rl_m512i rl_mm512_and_si512(rl_m512i a, rl_m512i b) { return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
inline rl_m512i rl_mm512_add_epi32(rl_m512i a, rl_m512i b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline rl_m512i rl_mm512_mullo_epi32(rl_m512i a, rl_m512i b) { return {_mm256_mullo_epi32(a.lo, b.lo), _mm256_mullo_epi32(a.hi, b.hi)}; }
inline rl_m512i rl_mm512_srli_epi16(rl_m512i a, int n) { return {_mm256_srli_epi16(a.lo, n), _mm256_srli_epi16(a.hi, n)}; }
inline rl_m512i rl_mm512_srli_epi32(rl_m512i a, int n) { return {_mm256_srli_epi32(a.lo, n), _mm256_srli_epi32(a.hi, n)}; }
inline rl_m512i rl_mm512_slli_epi32(rl_m512i a, int n) { return {_mm256_slli_epi32(a.lo, n), _mm256_slli_epi32(a.hi, n)}; }
inline rl_m512i rl_mm512_shuffle_epi8(rl_m512i table, rl_m512i index) {  // per 128-bit lane, as VPSHUFB zmm
    return {_mm256_shuffle_epi8(table.lo, index.lo), _mm256_shuffle_epi8(table.hi, index.hi)};
}
inline rl_m512i rl_mm512_broadcast_i32x4(__m128i a) { return {_mm256_broadcastsi128_si256(a), _mm256_broadcastsi128_si256(a)}; }
inline rl_m512i rl_mm512_mask_add_epi8(rl_m512i src, uint64_t k, rl_m512i a, rl_m512i b) {
    const __m256i lo = rl_avx2::bytes_of(static_cast<uint32_t>(k)), hi = rl_avx2::bytes_of(static_cast<uint32_t>(k >> 32));
    return {_mm256_blendv_epi8(src.lo, _mm256_add_epi8(a.lo, b.lo), lo), _mm256_blendv_epi8(src.hi, _mm256_add_epi8(a.hi, b.hi), hi)};
}
inline uint64_t rl_cvtu64_mask64(uint64_t k) { return k; }
inline rl_m512i rl_mm512_dpbusd_epi32(rl_m512i acc, rl_m512i u, rl_m512i s) {
    return {rl_avx2::dpbusd(acc.lo, u.lo, s.lo), rl_avx2::dpbusd(acc.hi, u.hi, s.hi)};
}
inline int32_t rl_mm512_reduce_add_epi32(rl_m512i a) {
    const __m256i t = _mm256_add_epi32(a.lo, a.hi);
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1))));
}

inline rl_m512 rl_mm512_castsi512_ps(rl_m512i a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
inline rl_m512i rl_mm512_castps_si512(rl_m512 a) { return {_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
inline rl_m512 rl_mm512_cvtepi32_ps(rl_m512i a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline rl_m512i rl_mm512_cvtps_epi32(rl_m512 a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }
inline rl_m512i rl_mm512_cvtepu8_epi32(__m128i a) { return {_mm256_cvtepu8_epi32(a), _mm256_cvtepu8_epi32(_mm_srli_si128(a, 8))}; }
inline rl_m512i rl_mm512_cvtepi8_epi32(__m128i a) { return {_mm256_cvtepi8_epi32(a), _mm256_cvtepi8_epi32(_mm_srli_si128(a, 8))}; }
inline rl_m512i rl_mm512_cvtepu16_epi32(__m256i a) {
    return {_mm256_cvtepu16_epi32(_mm256_castsi256_si128(a)), _mm256_cvtepu16_epi32(_mm256_extracti128_si256(a, 1))};
}
inline __m128i rl_mm512_cvtsepi32_epi8(rl_m512i a) {  // saturating to 16 bits, then to 8, is saturating to 8
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a.lo, a.hi), _MM_SHUFFLE(3, 1, 2, 0));
    return _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
}
inline __m256i rl_mm512_cvtepi32_epi16(rl_m512i a) {  // truncating: the low 16 bits of each lane
    const __m256i low_halves = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1,
                                                0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i lo = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(a.lo, low_halves), _MM_SHUFFLE(3, 1, 2, 0));
    const __m256i hi = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(a.hi, low_halves), _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_permute2x128_si256(lo, hi, 0x20);
}

// ---- the AVX-512 names, from here on
#define __m512 rl_m512
#define __m512i rl_m512i
#define _cvtu64_mask64 rl_cvtu64_mask64
#define _mm512_set1_ps rl_mm512_set1_ps
#define _mm512_setzero_ps rl_mm512_setzero_ps
#define _mm512_loadu_ps rl_mm512_loadu_ps
#define _mm512_storeu_ps rl_mm512_storeu_ps
#define _mm512_store_ps rl_mm512_store_ps
#define _mm512_maskz_loadu_ps rl_mm512_maskz_loadu_ps
#define _mm512_mask_storeu_ps rl_mm512_mask_storeu_ps
#define _mm512_add_ps rl_mm512_add_ps
#define _mm512_sub_ps rl_mm512_sub_ps
#define _mm512_mul_ps rl_mm512_mul_ps
#define _mm512_div_ps rl_mm512_div_ps
#define _mm512_max_ps rl_mm512_max_ps
#define _mm512_min_ps rl_mm512_min_ps
#define _mm512_scalef_ps rl_mm512_scalef_ps
#define _mm512_fmadd_ps rl_mm512_fmadd_ps
#define _mm512_fnmadd_ps rl_mm512_fnmadd_ps
#define _mm512_fmsub_ps rl_mm512_fmsub_ps
#define _mm512_abs_ps rl_mm512_abs_ps
#define _mm512_mask_sub_ps rl_mm512_mask_sub_ps
#define _mm512_mask_div_ps rl_mm512_mask_div_ps
#define _mm512_mask_max_ps rl_mm512_mask_max_ps
#define _mm512_maskz_mov_ps rl_mm512_maskz_mov_ps
#define _mm512_cmp_ps_mask rl_mm512_cmp_ps_mask
#define _mm512_roundscale_ps rl_mm512_roundscale_ps
#define _mm512_cvtss_f32 rl_mm512_cvtss_f32
#define _mm512_reduce_add_ps rl_mm512_reduce_add_ps
#define _mm512_reduce_max_ps rl_mm512_reduce_max_ps
#define _mm512_cvtph_ps rl_mm512_cvtph_ps
#define _mm512_cvtps_ph rl_mm512_cvtps_ph
#define _mm512_set1_epi32 rl_mm512_set1_epi32
#define _mm512_set1_epi8 rl_mm512_set1_epi8
#define _mm512_setzero_si512 rl_mm512_setzero_si512
#define _mm512_loadu_si512 rl_mm512_loadu_si512
#define _mm512_store_si512 rl_mm512_store_si512
#define _mm512_and_si512 rl_mm512_and_si512
#define _mm512_add_epi32 rl_mm512_add_epi32
#define _mm512_mullo_epi32 rl_mm512_mullo_epi32
#define _mm512_srli_epi16 rl_mm512_srli_epi16
#define _mm512_srli_epi32 rl_mm512_srli_epi32
#define _mm512_slli_epi32 rl_mm512_slli_epi32
#define _mm512_shuffle_epi8 rl_mm512_shuffle_epi8
#define _mm512_broadcast_i32x4 rl_mm512_broadcast_i32x4
#define _mm512_mask_add_epi8 rl_mm512_mask_add_epi8
#define _mm512_dpbusd_epi32 rl_mm512_dpbusd_epi32
#define _mm512_reduce_add_epi32 rl_mm512_reduce_add_epi32
#define _mm512_castsi512_ps rl_mm512_castsi512_ps
#define _mm512_castps_si512 rl_mm512_castps_si512
#define _mm512_cvtepi32_ps rl_mm512_cvtepi32_ps
#define _mm512_cvtps_epi32 rl_mm512_cvtps_epi32
#define _mm512_cvtepu8_epi32 rl_mm512_cvtepu8_epi32
#define _mm512_cvtepi8_epi32 rl_mm512_cvtepi8_epi32
#define _mm512_cvtepu16_epi32 rl_mm512_cvtepu16_epi32
#define _mm512_cvtsepi32_epi8 rl_mm512_cvtsepi32_epi8
#define _mm512_cvtepi32_epi16 rl_mm512_cvtepi32_epi16
