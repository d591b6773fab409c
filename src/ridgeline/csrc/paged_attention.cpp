// Attention over a paged KV cache, one query row at a time.
//
// Row r attends keys [key_begin[r], key_end[r]) of sequence row_seq[r]; key position p lives in slot
// block_tables[seq][p / block_size] * block_size + p % block_size of the layer's [slots, kv_heads, head_dim]
// cache. A causal mask is key_end = position + 1, a sliding window raises key_begin: no mask tensors, no
// gathered copies of K and V, and keys are read straight from the cache in its own type: bf16, fp16 or fp32
// pages, or Q8_0 pages dequantised in registers 32 values at a time (kv_pages.h), K and V each in its own type.
//
// Why one row at a time: a request's tokens must not depend on how it was batched or chunked. Every row runs
// the same operations in the same order whatever else is in the call (its scores key by key, a softmax over
// exactly its keys, its values key by key), so a row computed as a decode, inside a prefill chunk of any size,
// or next to other sequences gives the same bits. Work items are (row, KV head, bundle of the query heads
// sharing it); the bundle only decides which heads share a pass over the keys, never a head's arithmetic.
// Reading Q8_0 keeps this: a key's values are dequantised the same way whichever row reads them.
//
// Attention sinks (gpt-oss): a learned logit per query head that joins the softmax's denominator (and its max)
// but has no value, so a head can put weight "nowhere". Without sinks the kernel takes an empty tensor.
#include "kernels.h"
#include "kv_pages.h"
#include "large_buffers.h"
#include "parallel.h"
#include "simd_math.h"

#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using ridgeline::exp16;
using ridgeline::reduce_add;
using ridgeline::reduce_add_16;
using ridgeline::kv::Into;

constexpr int kMaxBundle = 8;  // query heads per pass over one KV head's keys (accumulators stay in registers)

// Keys from DRAM come in two hops. Each key's K and V head vectors are asked into L2 kFarAhead keys before use,
// then its K into L1 kPrefetchAhead keys before. Prefetching into L1 alone could not keep enough lines in flight:
// L1 tracks few outstanding misses, and a page of 16 keys (8 KB of K) is too short for the hardware prefetcher
// to get going on before the table jumps to another page. A 32-row decode step over scattered pages (18 layers,
// ~300 keys, 177 MB of bf16 K and V) took 14.5 ms with L1 prefetches only and 9.5 ms with these; 16 keys ahead
// measured best of 8-32 (benchmarks/attention_decode.py).
constexpr int64_t kPrefetchAhead = 4;  // keys, into L1
constexpr int64_t kFarAhead = 16;      // keys, into L2

struct Item {
    const float* q;       // [B, D]: the bundle's query heads
    float* out;           // [B, D]
    const int64_t* keys;  // element offset of each key's head vector in the K (and V) cache
    int64_t n;            // number of keys
    const float* sinks;   // [B]: the bundle's sink logits, or nullptr
};

// Scores q.k * scale of B query heads for key i of the item, one key at a time.
template <int B, typename K>
inline void score_one_key(const Item& item, const K& k_cache, int64_t head_dim, float scale, int64_t i, float* scores) {
    const int64_t key = item.keys[i];
    __m512 acc[B];
    for (int b = 0; b < B; ++b) acc[b] = _mm512_setzero_ps();
    for (int64_t c = 0; c < head_dim; c += 32) {  // each head's sum runs over c in order, 16 lanes at a time
        __m512 k0, k1;
        k_cache.load32(key + c, k0, k1);
        for (int b = 0; b < B; ++b) acc[b] = _mm512_fmadd_ps(_mm512_loadu_ps(item.q + b * head_dim + c), k0, acc[b]);
        for (int b = 0; b < B; ++b) acc[b] = _mm512_fmadd_ps(_mm512_loadu_ps(item.q + b * head_dim + c + 16), k1, acc[b]);
    }
    for (int b = 0; b < B; ++b) scores[b * item.n + i] = reduce_add(acc[b]) * scale;
}

// scores[b * n + i] = (q_b . k_i) * scale for the keys from the first, 16 / B at a time while whole groups are
// left (B dividing 16); returns how many were scored. Each query vector loaded serves all 16 / B keys, and their
// 16 sums are reduced together (reduce_add_16). For keys already in cache: 13-15 % faster than one at a time.
template <int B, typename K, typename V>
int64_t key_scores_grouped(const Item& item, const K& k_cache, const V& v_cache, int64_t head_dim, float scale,
                           float* scores) {
    constexpr int kKeys = 16 / B;
    const int64_t n = item.n;
    const __m512 scales = _mm512_set1_ps(scale);
    int64_t i = 0;
    for (; i + kKeys <= n; i += kKeys) {
        // The next keys, and these keys' values for the last pass, into L1: one line of each per 32 values.
        const int ahead = static_cast<int>(std::min<int64_t>(kKeys, n - i - kKeys));
        __m512 acc[16];  // acc[b * kKeys + j]: head b, key i + j
        for (int a = 0; a < 16; ++a) acc[a] = _mm512_setzero_ps();
        for (int64_t c = 0; c < head_dim; c += 32) {
            for (int j = 0; j < ahead; ++j) k_cache.prefetch_head(item.keys[i + kKeys + j] + c, 32);
            for (int j = 0; j < kKeys; ++j) v_cache.prefetch_head(item.keys[i + j] + c, 32);
            __m512 q0[B], q1[B];
            for (int b = 0; b < B; ++b) {
                q0[b] = _mm512_loadu_ps(item.q + b * head_dim + c);
                q1[b] = _mm512_loadu_ps(item.q + b * head_dim + c + 16);
            }
            for (int j = 0; j < kKeys; ++j) {
                __m512 k0, k1;
                k_cache.load32(item.keys[i + j] + c, k0, k1);
                for (int b = 0; b < B; ++b) acc[b * kKeys + j] = _mm512_fmadd_ps(q0[b], k0, acc[b * kKeys + j]);
                for (int b = 0; b < B; ++b) acc[b * kKeys + j] = _mm512_fmadd_ps(q1[b], k1, acc[b * kKeys + j]);
            }
        }
        alignas(64) float sums[16];
        _mm512_store_ps(sums, _mm512_mul_ps(reduce_add_16(acc), scales));
        for (int b = 0; b < B; ++b) std::memcpy(scores + b * n + i, sums + b * kKeys, kKeys * sizeof(float));
    }
    return i;
}

// scores[b * n + i] = (q_b . k_i) * scale for every key. Keys in cache (`keys_hot`: a prompt's rows after its
// first) go in groups (key_scores_grouped). Keys from DRAM (a decode row's) go one at a time, fetched a few
// ahead: in groups, 4 keys' lines at once, a 32-row decode step's attention over cold pages ran ~20 % slower.
// Every sum takes the same multiply-adds in the same order, and the same reduction tree, either way: the same
// bits, so which way a row goes never changes its output. The values of the keys scored are fetched meanwhile,
// for the pass that weighs them.
template <int B, typename K, typename V>
void key_scores(const Item& item, const K& k_cache, const V& v_cache, int64_t head_dim, float scale, float* scores,
                bool keys_hot) {
    const int64_t n = item.n;
    int64_t i = 0;
    if constexpr (16 % B == 0 && B <= 4) {  // (8 heads: 16 query vectors would leave too few registers)
        if (keys_hot) i = key_scores_grouped<B>(item, k_cache, v_cache, head_dim, scale, scores);
    }
    for (; i < n; ++i) {
        if (i + kFarAhead < n) {
            k_cache.prefetch_head(item.keys[i + kFarAhead], head_dim, Into::L2);
            v_cache.prefetch_head(item.keys[i + kFarAhead], head_dim, Into::L2);
        }
        if (i + kPrefetchAhead < n) k_cache.prefetch_head(item.keys[i + kPrefetchAhead], head_dim);
        v_cache.prefetch_head(item.keys[i], head_dim);
        score_one_key<B>(item, k_cache, head_dim, scale, i, scores);
    }
}

// out_b = sum_i p_bi v_i * inverse_sum_b over `chunks` runs of 32 values starting at value c.
template <int B, int kChunks, typename V>
inline void weighted_values(const Item& item, const V& v_cache, int64_t head_dim, int64_t c, const float* scores,
                            const float* inverse_sum) {
    const int64_t n = item.n;
    __m512 acc[B][2 * kChunks];
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < 2 * kChunks; ++h) acc[b][h] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < n; ++i) {
        __m512 v[2 * kChunks];
        for (int h = 0; h < kChunks; ++h) v_cache.load32(item.keys[i] + c + 32 * h, v[2 * h], v[2 * h + 1]);
        for (int b = 0; b < B; ++b) {
            const __m512 w = _mm512_set1_ps(scores[b * n + i]);
            for (int h = 0; h < 2 * kChunks; ++h) acc[b][h] = _mm512_fmadd_ps(w, v[h], acc[b][h]);
        }
    }
    for (int b = 0; b < B; ++b) {
        const __m512 inv = _mm512_set1_ps(inverse_sum[b]);
        for (int h = 0; h < 2 * kChunks; ++h) _mm512_storeu_ps(item.out + b * head_dim + c + 16 * h, _mm512_mul_ps(acc[b][h], inv));
    }
}

// Softmax(q k^T * scale) v for B query heads sharing one KV head. `scores` is [B, n] scratch. K and V are
// kv_pages.h's FloatPages<T> or Q8Pages: each hands over 32 values of a head vector as floats, so the arithmetic
// below is the same whatever the pages hold.
template <int B, typename K, typename V>
void attend(const Item& item, const K& k_cache, const V& v_cache, int64_t head_dim, float scale, float* scores,
            bool keys_hot) {
    const int64_t n = item.n;
    key_scores<B>(item, k_cache, v_cache, head_dim, scale, scores, keys_hot);
    float inverse_sum[B];
    for (int b = 0; b < B; ++b) {
        float* s = scores + b * n;
        __m512 max = _mm512_set1_ps(-INFINITY);
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 lanes = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
            max = _mm512_mask_max_ps(max, lanes, max, _mm512_maskz_loadu_ps(lanes, s + i));
        }
        const float sink = item.sinks ? item.sinks[b] : -INFINITY;
        const __m512 top = _mm512_set1_ps(std::max(_mm512_reduce_max_ps(max), sink));
        __m512 sum = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i += 16) {
            const __mmask16 lanes = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, s + i), top));
            _mm512_mask_storeu_ps(s + i, lanes, e);
            sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(lanes, e));
        }
        float total = _mm512_reduce_add_ps(sum);
        if (item.sinks) {  // exp16 of one lane, so the sink's term is rounded as every score's is
            total += _mm512_cvtss_f32(exp16(_mm512_set1_ps(sink - _mm512_cvtss_f32(top))));
        }
        inverse_sum[b] = 1.0f / total;
    }
    // 32 values at a time (one 64-byte line of bf16, one Q8_0 block per key), or 64 where the accumulators fit in
    // registers: each probability broadcast then serves twice the multiply-adds. Each output value's sum runs over
    // the keys in order either way.
    constexpr int kWide = B <= 4 ? 2 : 1;
    int64_t c = 0;
    for (; c + 32 * kWide <= head_dim; c += 32 * kWide) weighted_values<B, kWide>(item, v_cache, head_dim, c, scores, inverse_sum);
    for (; c < head_dim; c += 32) weighted_values<B, 1>(item, v_cache, head_dim, c, scores, inverse_sum);
}

template <typename F>
void with_bundle(int bundle, F&& f) {
    switch (bundle) {
        case 1: return f(std::integral_constant<int, 1>{});
        case 2: return f(std::integral_constant<int, 2>{});
        case 3: return f(std::integral_constant<int, 3>{});
        case 4: return f(std::integral_constant<int, 4>{});
        case 5: return f(std::integral_constant<int, 5>{});
        case 6: return f(std::integral_constant<int, 6>{});
        case 7: return f(std::integral_constant<int, 7>{});
        case 8: return f(std::integral_constant<int, 8>{});
    }
    TORCH_CHECK(false, "paged_attention: bundle of ", bundle, " heads");
}

// Largest divisor of `groups` up to kMaxBundle, made smaller while that leaves threads idle (a batch-1 decode
// has one row and often one KV head).
int bundle_size(int64_t groups, int64_t units) {
    auto largest_divisor_upto = [&](int64_t limit) {
        int64_t b = std::min<int64_t>(limit, groups);
        while (groups % b) --b;
        return static_cast<int>(b);
    };
    int b = largest_divisor_upto(kMaxBundle);
    while (b > 1 && units * (groups / b) < at::get_num_threads()) b = largest_divisor_upto(b - 1);
    return b;
}

}  // namespace

namespace ridgeline {

torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor k_scales, torch::Tensor v_cache,
                              torch::Tensor v_scales, torch::Tensor block_tables, torch::Tensor row_seq,
                              torch::Tensor key_begin, torch::Tensor key_end, int64_t block_size, double scale,
                              torch::Tensor sinks) {
    TORCH_CHECK(q.dim() == 3 && q.scalar_type() == torch::kFloat32 && q.is_contiguous() && q.device().is_cpu(),
                "paged_attention: q must be a contiguous [rows, heads, head_dim] float32 CPU tensor");
    kv::check_side(k_cache, k_scales, "paged_attention: the K cache");
    kv::check_side(v_cache, v_scales, "paged_attention: the V cache");
    TORCH_CHECK(k_cache.sizes() == v_cache.sizes(), "paged_attention: K and V caches must have one shape");
    for (const auto* t : {&block_tables, &row_seq, &key_begin, &key_end}) {
        TORCH_CHECK(t->scalar_type() == torch::kInt32 && t->is_contiguous(), "paged_attention: indices must be contiguous int32");
    }
    const int64_t rows = q.size(0), heads = q.size(1), head_dim = q.size(2);
    const int64_t kv_heads = k_cache.size(1), slots = k_cache.size(0);
    const int64_t num_seqs = block_tables.size(0), width = block_tables.size(1);
    TORCH_CHECK(k_cache.size(2) == head_dim && head_dim % 32 == 0 && heads % kv_heads == 0,
                "paged_attention: head_dim must be a multiple of 32 and match the cache; heads a multiple of kv_heads");
    TORCH_CHECK(row_seq.numel() == rows && key_begin.numel() == rows && key_end.numel() == rows,
                "paged_attention: one sequence and key range per row");
    TORCH_CHECK(sinks.numel() == 0 || (sinks.numel() == heads && sinks.scalar_type() == torch::kFloat32 &&
                                       sinks.is_contiguous()),
                "paged_attention: sinks must be empty or one float32 logit per query head");
    const float* sink_data = sinks.numel() ? sinks.data_ptr<float>() : nullptr;

    const int32_t* seq_of = row_seq.data_ptr<int32_t>();
    const int32_t* begin_of = key_begin.data_ptr<int32_t>();
    const int32_t* end_of = key_end.data_ptr<int32_t>();
    const int32_t* tables = block_tables.data_ptr<int32_t>();
    int64_t max_keys = 0;
    for (int64_t r = 0; r < rows; ++r) {  // every block a row reads must be a real page
        TORCH_CHECK(seq_of[r] >= 0 && seq_of[r] < num_seqs && 0 <= begin_of[r] && begin_of[r] < end_of[r] &&
                        end_of[r] <= width * block_size, "paged_attention: row ", r, " has no valid key range");
        max_keys = std::max<int64_t>(max_keys, end_of[r] - begin_of[r]);
        for (int64_t block = begin_of[r] / block_size; block <= (end_of[r] - 1) / block_size; ++block) {
            const int32_t page = tables[seq_of[r] * width + block];
            TORCH_CHECK(page >= 0 && (page + 1) * block_size <= slots, "paged_attention: block ", block, " of row ", r,
                        " is not a page of the cache");
        }
    }

    auto out = large_buffers().empty_float(q.sizes());  // (a long prefill step's rows: see large_buffers.h)
    const int64_t groups = heads / kv_heads;
    const int bundle = bundle_size(groups, rows * kv_heads);
    const int64_t bundles = groups / bundle, items = rows * kv_heads * bundles;
    const float* q_data = q.data_ptr<float>();
    float* out_data = out.data_ptr<float>();
    const float softmax_scale = static_cast<float>(scale);

    auto run = [&](const auto& k_pages, const auto& v_pages) {
        with_bundle(bundle, [&](auto b_const) {
            constexpr int B = decltype(b_const)::value;
            parallel_chunks(items, 1, [&](int64_t first, int64_t last) {
                thread_local std::vector<float> scores;
                thread_local std::vector<int64_t> keys;
                scores.resize(B * max_keys);
                keys.resize(max_keys);
                for (int64_t index = first; index < last; ++index) {
                    const int64_t r = index / (kv_heads * bundles), kv_head = index / bundles % kv_heads;
                    const int64_t head = kv_head * groups + index % bundles * B;
                    const int32_t* table = tables + seq_of[r] * width;
                    const int64_t n = end_of[r] - begin_of[r];
                    for (int64_t i = 0; i < n; ++i) {
                        const int64_t p = begin_of[r] + i;
                        keys[i] = ((table[p / block_size] * block_size + p % block_size) * kv_heads + kv_head) * head_dim;
                    }
                    const Item item{q_data + (r * heads + head) * head_dim, out_data + (r * heads + head) * head_dim,
                                    keys.data(), n, sink_data ? sink_data + head : nullptr};
                    // This thread's item of the row before, of the same sequence, read the same keys but the last
                    // just now (a prompt's rows come one after another): they are in cache.
                    const bool keys_hot = r > 0 && seq_of[r - 1] == seq_of[r] && index - kv_heads * bundles >= first;
                    attend<B>(item, k_pages, v_pages, head_dim, softmax_scale, scores.data(), keys_hot);
                }
            });
        });
    };
    kv::with_pages(k_cache, k_scales, [&](const auto& k_pages) {
        kv::with_pages(v_cache, v_scales, [&](const auto& v_pages) { run(k_pages, v_pages); });
    });
    return out;
}

}  // namespace ridgeline
