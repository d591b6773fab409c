// The one place the kernels get their intrinsics from. They are written against AVX-512 (16 float lanes,
// 64-byte quant rows); where the compiler targets AVX2 only, avx512_on_avx2.h supplies the same names with the
// same lane semantics from pairs of 256-bit registers. The standard headers come first so that none of them
// sees the AVX-512 names redefined.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include <immintrin.h>

// The AVX-512 names are real where the compiler targets AVX-512, and where scripts/emulated_kernels puts SIMDe's
// portable AVX-512 in place of <immintrin.h> (to check the AVX-512 path on machines without it).
#if defined(__AVX512F__) || defined(SIMDE_ENABLE_NATIVE_ALIASES)
#define RIDGELINE_AVX512_NAMES_NATIVE 1
#else
#include "avx512_on_avx2.h"
#endif

namespace ridgeline {

// VPDPBUSD where every unsigned byte is known to be below 128 (quants of 7 bits or fewer). Native AVX-512 has
// one instruction either way; the AVX2 form then needs one VPMADDUBSW instead of two (no saturation to dodge).
#ifdef RIDGELINE_AVX512_NAMES_NATIVE
inline __m512i dpbusd_u7(__m512i acc, __m512i u, __m512i s) { return _mm512_dpbusd_epi32(acc, u, s); }
#else
inline rl_m512i dpbusd_u7(rl_m512i acc, rl_m512i u, rl_m512i s) {
    return {rl_avx2::dpbusd_u7(acc.lo, u.lo, s.lo), rl_avx2::dpbusd_u7(acc.hi, u.hi, s.hi)};
}
#endif

}  // namespace ridgeline
