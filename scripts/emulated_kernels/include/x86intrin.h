#pragma once
// x86intrin.h would pull in the real intrinsic headers next to SIMDe's names: the emulated immintrin.h only.
#include <immintrin.h>
