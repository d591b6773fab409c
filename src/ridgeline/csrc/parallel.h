// Work sharing that survives a busy machine: on 2 cores the server's event loop and its clients run beside
// the kernels, and a static split makes every call wait for the thread the OS preempted. Here the range is
// cut into chunks that threads take one at a time, so a preempted thread delays only its current chunk. Which
// thread computes a chunk never changes what is computed.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace ridgeline {

constexpr int64_t kChunksPerThread = 8;  // few enough that each chunk is a long sequential stream for the prefetcher

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
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
        for (int64_t chunk; (chunk = next.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
            body(chunk * grain, std::min(n, (chunk + 1) * grain));
        }
    });
}

}  // namespace ridgeline
