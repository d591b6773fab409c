// The rates of the two instructions the kernels' inner loops are built from, on this machine as it runs now: the
// ceilings benchmarks/bench_kernels.py reads each kernel's rate against. A matmul over int8 activations is a
// stream of VPDPBUSD (16 lanes, each summing 4 u8 x s8 products: 128 integer ops); attention's and the float
// kernels' are FMAs (16 lanes, 2 FLOPs each). Each thread runs kChains independent accumulators with nothing but
// the instruction under test in the loop (no loads, no other work), so the figure is what the core's ports give
// that instruction, with every thread busy at once as in a kernel: on the 2-core Zen 4 VM, ~1 VPDPBUSD zmm and
// ~1 FMA zmm a cycle per core. (The AVX2 build times its two-register stand-ins for the same names.)
#include "kernels.h"
#include "simd.h"

#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>

namespace {

constexpr int kChains = 12;          // independent accumulators: more than latency x throughput (~5 x 2)
constexpr int64_t kRound = 1 << 14;  // iterations between reads of the clock

volatile int32_t g_one = 0x01010101;  // operands the compiler cannot see through, so it cannot fold the loops
volatile float g_unit = 1.0f;
volatile int64_t g_sink = 0;          // where each loop's result goes, so that it is computed at all

// Instructions per second of kChains x `step` on the calling thread, run for about `seconds`.
template <typename Vec, typename Step, typename Reduce>
double rate(double seconds, Vec start, Step step, Reduce reduce) {
    Vec acc[kChains];
    for (int i = 0; i < kChains; ++i) acc[i] = start;
    using clock = std::chrono::steady_clock;
    const auto begin = clock::now();
    int64_t rounds = 0;
    double elapsed = 0;
    do {
        for (int64_t k = 0; k < kRound; ++k) {
#pragma GCC unroll 12
            for (int i = 0; i < kChains; ++i) acc[i] = step(acc[i]);
        }
        ++rounds;
        elapsed = std::chrono::duration<double>(clock::now() - begin).count();
    } while (elapsed < seconds);
    int64_t checksum = 0;
    for (int i = 0; i < kChains; ++i) checksum += reduce(acc[i]);
    g_sink = checksum;
    return static_cast<double>(rounds) * kRound * kChains / elapsed;
}

// Instructions per second summed over the threads, each running `one_thread` at the same time.
template <typename F>
double on_every_thread(const F& one_thread) {
    const int64_t threads = at::get_num_threads();
    std::atomic<double> total{0};
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
            const double mine = one_thread();
            double seen = total.load();
            while (!total.compare_exchange_weak(seen, seen + mine)) {
            }
        }
    });
    return total.load();
}

}  // namespace

namespace ridgeline {

std::vector<double> instruction_peaks(double seconds) {
    TORCH_CHECK(seconds > 0, "instruction_peaks: seconds must be positive");
    const __m512i ones = _mm512_set1_epi32(g_one);
    const double dot_products = on_every_thread([&] {
        return rate(seconds, _mm512_setzero_si512(), [&](__m512i acc) { return _mm512_dpbusd_epi32(acc, ones, ones); },
                    [](__m512i acc) { return static_cast<int64_t>(_mm512_reduce_add_epi32(acc)); });
    });
    const __m512 unit = _mm512_set1_ps(g_unit), zero = _mm512_setzero_ps();
    const double fmas = on_every_thread([&] {
        return rate(seconds, unit, [&](__m512 acc) { return _mm512_fmadd_ps(acc, unit, zero); },
                    [](__m512 acc) { return static_cast<int64_t>(_mm512_reduce_add_ps(acc)); });
    });
    return {dot_products * 16 * 4 * 2, fmas * 16 * 2};  // integer ops/s (a multiply and an add each), FLOP/s
}

}  // namespace ridgeline
