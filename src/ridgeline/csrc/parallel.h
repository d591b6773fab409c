// Work sharing that survives a busy machine: on 2 cores the server's event loop and its clients run beside
// the kernels, and a static split makes every call wait for the thread the OS preempted. Here the range is
// cut into chunks that threads take one at a time, so a preempted thread delays only its current chunk. Which
// thread computes a chunk never changes what is computed.
//
// Chunks shrink as the range runs out (guided scheduling): each takes a share of what is left, never less than
// the grain. Early chunks stay long sequential streams for the prefetcher, and the last ones are short, so the
// thread that finishes first waits for at most a short chunk of the other's. With fixed chunks of 1/16 of the
// range, that wait was up to a 16th of the LM head's 178 MB (~0.3 ms) at the end of every batch-1 step.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace ridgeline {

constexpr int64_t kChunksPerThread = 8;  // how finely a range is worth splitting at all (see `threads` below)
constexpr int64_t kGuidedShare = 2;      // a chunk takes 1 / (kGuidedShare * threads) of what is left

template <typename F>
void parallel_chunks(int64_t n, int64_t min_grain, const F& body) {
    const int64_t threads_wanted = at::get_num_threads();
    const int64_t grain = std::max(min_grain, (n + threads_wanted * kChunksPerThread - 1) / (threads_wanted * kChunksPerThread));
    const int64_t chunks = (n + grain - 1) / grain;
    const int64_t threads = std::min<int64_t>(threads_wanted, chunks);
    if (threads <= 1 || at::in_parallel_region()) {
        if (n > 0) body(0, n);
        return;
    }
    std::atomic<int64_t> next{0};
    const int64_t share = kGuidedShare * threads;
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
        int64_t first = next.load(std::memory_order_relaxed);
        while (first < n) {
            const int64_t size = std::max(min_grain, (n - first) / share);
            if (next.compare_exchange_weak(first, first + size, std::memory_order_relaxed)) {
                body(first, std::min(n, first + size));
                first = next.load(std::memory_order_relaxed);
            }  // else `first` now holds the other thread's update: try again from there
        }
    });
}

}  // namespace ridgeline
