// Large kernel outputs, kept for reuse once freed: a step's logits are rows x vocabulary float32s, and from 32
// rows of a 262,144-token vocabulary they pass 32 MiB, glibc's largest mmap threshold. Above it every allocation
// is a fresh mapping that the first writes fault in page by page: at 32 rows ~8,200 faults, ~5-7 ms of a ~35 ms
// decode step on the 2-core Zen 4, every step. (Raising the threshold with mallopt stops the faults but makes
// the heap grow: with torch's aligned allocations each same-sized buffer landed past the last one.)
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

    // An uninitialised [rows, cols] float32 CPU tensor.
    torch::Tensor empty_float(int64_t rows, int64_t cols) {
        const size_t bytes = static_cast<size_t>(rows) * static_cast<size_t>(cols) * sizeof(float);
        if (bytes < kMinBytes) return torch::empty({rows, cols}, torch::kFloat32);
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
        return torch::from_blob(data, {rows, cols}, [this, size](void* freed) { give_back(freed, size); },
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
