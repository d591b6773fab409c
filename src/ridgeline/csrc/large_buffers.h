// Large kernel outputs, kept for reuse once freed. glibc maps every allocation above its largest mmap threshold
// (32 MiB) afresh, and the first writes fault it in page by page; below that, freed heap memory beyond its trim
// threshold goes back to the OS and comes back the same way. Two places made that cost real on the 2-core Zen 4:
// - a step's logits, rows x vocabulary float32s: from 32 rows of a 262,144-token vocabulary they pass 32 MiB,
//   ~8,200 faults, ~5-7 ms of a ~35 ms decode step, every step;
// - a long prefill step's activations: at 8,192 prompt rows a layer's queries and attention output are 32 MiB each
//   and its norms' outputs 20 MiB, and one such step faulted 80,000-230,000 pages in, 0.6-1.0 s of kernel time of
//   a ~5 s step (a burst of 32 x 256-token prompts prefilled at once).
// (Raising the thresholds with mallopt stops the faults but makes the heap grow: with torch's aligned allocations
// each same-sized buffer landed past the last one.)
//
// A buffer is handed out again only after the tensor that held it is freed (its deleter brings it back), so no
// two live tensors ever share memory. Outputs below kMinBytes keep torch's allocator, which glibc serves from
// its heap. At most kKeepBytes of freed buffers are kept; the rest go back to the OS.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace ridgeline {

class LargeBuffers {
public:
    static constexpr size_t kMinBytes = size_t{16} << 20;
    static constexpr size_t kKeepBytes = size_t{512} << 20;

    // An uninitialised float32 CPU tensor of this shape.
    torch::Tensor empty_float(c10::IntArrayRef sizes) {
        const size_t bytes = static_cast<size_t>(c10::multiply_integers(sizes)) * sizeof(float);
        if (bytes < kMinBytes) return torch::empty(sizes, torch::kFloat32);
        void* data = nullptr;
        size_t size = 0;
        {
            std::lock_guard<std::mutex> hold(mutex_);
            size_t best = free_.size();  // the smallest kept buffer that fits and wastes at most half of itself
            for (size_t i = 0; i < free_.size(); ++i) {
                if (free_[i].bytes >= bytes && free_[i].bytes <= 2 * bytes &&
                    (best == free_.size() || free_[i].bytes < free_[best].bytes)) {
                    best = i;
                }
            }
            if (best < free_.size()) {
                data = free_[best].data, size = free_[best].bytes;
                kept_ -= size;
                free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
            }
        }
        if (data == nullptr) {
            size = (bytes + kAlign - 1) / kAlign * kAlign;
            data = std::aligned_alloc(kAlign, size);
            TORCH_CHECK(data != nullptr, "ridgeline: out of memory for a ", bytes, "-byte kernel output");
        }
        return torch::from_blob(data, sizes, [this, size](void* freed) { give_back(freed, size); },
                                torch::TensorOptions().dtype(torch::kFloat32));
    }

private:
    static constexpr size_t kAlign = size_t{2} << 20;  // whole huge-page-sized pieces: no partial pages to share

    struct Kept {
        void* data;
        size_t bytes;
    };

    void give_back(void* data, size_t bytes) {
        if (bytes > kKeepBytes) {  // too large to keep at all: leave the kept ones be
            std::free(data);
            return;
        }
        std::lock_guard<std::mutex> hold(mutex_);
        while (!free_.empty() && kept_ + bytes > kKeepBytes) {  // the oldest go first
            std::free(free_.front().data);
            kept_ -= free_.front().bytes;
            free_.erase(free_.begin());
        }
        free_.push_back({data, bytes});
        kept_ += bytes;
    }

    std::mutex mutex_;
    std::vector<Kept> free_;
    size_t kept_ = 0;
};

// The process's pool. Never destroyed: tensors freed during interpreter shutdown still call back into it.
inline LargeBuffers& large_buffers() {
    static LargeBuffers* pool = new LargeBuffers();
    return *pool;
}

}  // namespace ridgeline
