// Vectorised float maths shared by the kernels (AVX-512, 16 lanes): each lane is computed on its own, so a
// value's result does not depend on its neighbours.
#pragma once

#include "simd.h"

namespace ridgeline {

// e^x for x <= 0: x = n ln2 + r with |r| <= ln2 / 2, e^r by the Cephes expf polynomial, times 2^n.
inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 in two parts: exact first product
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

// The horizontal sum of one vector in a fixed tree: lanes i + i+8, then j + j+4, then j + j^2, then 0 + 1 (float
// addition is commutative, so only the pairing decides the bits). Written out rather than left to the compiler's
// _mm512_reduce_add_ps, whose tree is its own choice: reduce_add_16 below must give the same bits, so that a
// score summed with 15 others equals the same score summed alone. Where AVX-512 is emulated (avx512_on_avx2.h)
// both go through the emulation's one reduction, which agrees with itself.
inline float reduce_add(__m512 v) {
#ifdef RIDGELINE_AVX512_NAMES_NATIVE
    const __m256 halves = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 quarters = _mm_add_ps(_mm256_castps256_ps128(halves), _mm256_extractf128_ps(halves, 1));
    const __m128 pairs = _mm_add_ps(quarters, _mm_movehl_ps(quarters, quarters));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
#else
    return _mm512_reduce_add_ps(v);
#endif
}

// The horizontal sums of 16 vectors at once: element j is reduce_add(v[j]), bit for bit, the lanes paired in the
// same tree, but four shuffle-and-add rounds serve all 16 vectors: 30 shuffles and 15 adds instead of ~8
// instructions per vector.
inline __m512 reduce_add_16(const __m512* v) {
#ifdef RIDGELINE_AVX512_NAMES_NATIVE
    __m512 r[8], s[4], t[2];
    for (int k = 0; k < 8; ++k) {  // r[k]: lanes i + i+8 of v[2k] in its low half, of v[2k+1] in its high half
        r[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    for (int k = 0; k < 4; ++k) {  // s[k]: 128-bit lane m holds j + j+4 of v[4k + m]
        s[k] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(r[2 * k], r[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    }
    for (int k = 0; k < 2; ++k) {  // t[k]: lane m holds j + j^2 (j = 0, 1) of v[8k + m], then of v[8k + 4 + m]
        t[k] = _mm512_add_ps(_mm512_shuffle_ps(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(s[2 * k], s[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    }
    // Element 4m + e is now the sum of v[4e + m]; the permutation puts the sum of v[j] at element j.
    const __m512 sums = _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                      _mm512_shuffle_ps(t[0], t[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), sums);
#else
    alignas(64) float sums[16];
    for (int j = 0; j < 16; ++j) sums[j] = reduce_add(v[j]);
    return _mm512_loadu_ps(sums);
#endif
}

// float -> bf16, rounding to nearest even (as torch's .to(torch.bfloat16) does for finite values).
inline __m256i to_bf16(__m512 v) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i rounding = _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1)),
                                              _mm512_set1_epi32(0x7FFF));
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_add_epi32(bits, rounding), 16));
}

}  // namespace ridgeline
