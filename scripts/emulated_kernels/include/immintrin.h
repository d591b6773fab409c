// Emulated AVX-512 for scripts/emulated_kernels: SIMDe with native names, plus what SIMDe 0.7 lacks.
#pragma once
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#include <cstring>
#include <cstdint>
#include <cmath>
#include <algorithm>
typedef simde__mmask64 __mmask64;
typedef simde__mmask16 __mmask16;
typedef simde__mmask8 __mmask8;
typedef simde__mmask32 __mmask32;

template <typename V, typename E, int N>
struct Lanes { E v[N]; };
#define RL_TO(T, N, x) ([&] { Lanes<decltype(x), T, N> l; std::memcpy(l.v, &(x), sizeof(l.v)); return l; }())

#ifndef _cvtu64_mask64
static inline __mmask64 _cvtu64_mask64(uint64_t x) { return (__mmask64)x; }
#endif
static inline float rl_reduce_max_ps(__m512 a) { auto l = RL_TO(float, 16, a); float m = l.v[0]; for (int i = 1; i < 16; ++i) m = std::max(m, l.v[i]); return m; }
static inline float rl_reduce_add_ps(__m512 a) { auto l = RL_TO(float, 16, a); float m = 0; for (int i = 0; i < 16; ++i) m += l.v[i]; return m; }
static inline int32_t rl_reduce_add_epi32(__m512i a) { auto l = RL_TO(int32_t, 16, a); int32_t m = 0; for (int i = 0; i < 16; ++i) m += l.v[i]; return m; }
#define _mm512_reduce_max_ps rl_reduce_max_ps
#define _mm512_reduce_add_ps rl_reduce_add_ps
#define _mm512_reduce_add_epi32 rl_reduce_add_epi32
static inline __m512 rl_cvtph_ps(__m256i a) {
    uint16_t h[16]; std::memcpy(h, &a, 32); float f[16];
    for (int i = 0; i < 16; ++i) f[i] = simde_float16_to_float32(simde_uint16_as_float16(h[i]));
    __m512 r; std::memcpy(&r, f, 64); return r;
}
#define _mm512_cvtph_ps rl_cvtph_ps
static inline __m512i rl_cvtepu8_epi32(__m128i a) { uint8_t b[16]; std::memcpy(b, &a, 16); int32_t o[16]; for (int i = 0; i < 16; ++i) o[i] = b[i]; __m512i r; std::memcpy(&r, o, 64); return r; }
static inline __m512i rl_cvtepi8_epi32(__m128i a) { int8_t b[16]; std::memcpy(b, &a, 16); int32_t o[16]; for (int i = 0; i < 16; ++i) o[i] = b[i]; __m512i r; std::memcpy(&r, o, 64); return r; }
#ifndef _mm512_cvtepu8_epi32
#define _mm512_cvtepu8_epi32 rl_cvtepu8_epi32
#endif
#ifndef _mm512_cvtepi8_epi32
#define _mm512_cvtepi8_epi32 rl_cvtepi8_epi32
#endif
static inline void rl_mask_storeu_ps(void* p, __mmask16 k, __m512 a) { float f[16]; std::memcpy(f, &a, 64); for (int i = 0; i < 16; ++i) if (k >> i & 1) static_cast<float*>(p)[i] = f[i]; }
#ifndef _mm512_mask_storeu_ps
#define _mm512_mask_storeu_ps rl_mask_storeu_ps
#endif
static inline unsigned long long rl_rdtsc() { return __builtin_ia32_rdtsc(); }
#define __rdtsc rl_rdtsc
#ifndef _MM_FROUND_NO_EXC
#define _MM_FROUND_NO_EXC 0x08
#endif
#ifndef _MM_FROUND_TO_NEAREST_INT
#define _MM_FROUND_TO_NEAREST_INT 0x00
#endif
static inline __m256i rl_cvtepi32_epi16(__m512i a) { int32_t i[16]; std::memcpy(i, &a, 64); int16_t o[16]; for (int k = 0; k < 16; ++k) o[k] = (int16_t)i[k]; __m256i r; std::memcpy(&r, o, 32); return r; }
static inline __m512 rl_cvtepi32_ps(__m512i a) { int32_t i[16]; std::memcpy(i, &a, 64); float o[16]; for (int k = 0; k < 16; ++k) o[k] = (float)i[k]; __m512 r; std::memcpy(&r, o, 64); return r; }
static inline __m512i rl_cvtps_epi32(__m512 a) { float i[16]; std::memcpy(i, &a, 64); int32_t o[16]; for (int k = 0; k < 16; ++k) o[k] = (int32_t)std::nearbyint(i[k]); __m512i r; std::memcpy(&r, o, 64); return r; }
#ifndef _mm512_cvtepi32_epi16
#define _mm512_cvtepi32_epi16 rl_cvtepi32_epi16
#endif
#ifndef _mm512_cvtepi32_ps
#define _mm512_cvtepi32_ps rl_cvtepi32_ps
#endif
#ifndef _mm512_cvtps_epi32
#define _mm512_cvtps_epi32 rl_cvtps_epi32
#endif
