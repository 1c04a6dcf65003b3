// hermes_native: paged attention over the hnd KV pool, for the `native-cpu` backend.
//
// Pool layout (one layer, K and V alike): [num_blocks, kv_heads, block_size, head_dim], the
// last two dimensions contiguous. Ops (torch.ops.hermes_native.*):
//   write_kv(key, value, key_cache, value_cache, slot_mapping)
//       key/value [T, kv_heads, d] into slot slot_mapping[t] = block * block_size + offset
//       (negative slots are skipped).
//   paged_attention(out, query, key_cache, value_cache, query_start_loc, seq_lens,
//                   block_table, scale, window=0)
//       one whole mixed step: sequence b owns query rows [query_start_loc[b],
//       query_start_loc[b + 1]); its context is seq_lens[b] tokens, the new ones last, so
//       new token i sits at position seq_lens[b] - n_new + i and attends causally to keys
//       0..position through block_table[b] (with window > 0: only keys after
//       position - window, as a sliding-window layer). GQA: query head h reads kv head
//       h / (H / KVH).
//
// Work is split into items (sequence, kv head, tile of new tokens); an item's rows are the
// tile's tokens x the kv head's query heads, and it walks the context with an online softmax
// (flash attention): nothing of size [rows, context] is formed. Items are handed out longest
// first to the threads of at::parallel_for. Three inner paths, all accumulating in float32:
//   rows path (float32, and bfloat16 on CPUs without AVX512-BF16): keys in chunks of
//     ROWS_CHUNK, scores [row][key] as dot products along head_dim (8-float vectors, GCC/Clang
//     vector extensions, FMA), K/V read from the pool in place (bfloat16 widened on load);
//   dot path (bfloat16 decodes, at most DIRECT_ROWS rows, on AVX512-BF16): the same layout,
//     Q.K^T on the bf16 dot-product instruction along head_dim, P.V as below;
//   packed path (bfloat16 prefill tiles of 16+ rows on AVX512-BF16): keys in chunks of CHUNK;
//     scores kept transposed [key][row] so the softmax runs down columns, 16 rows per vector;
//     Q.K^T on the dot-product instruction with Q packed as pairs along head_dim.
// P.V in both bf16 paths takes pairs of keys per instruction (V interleaved per pair, P
// rounded to bfloat16, as flash attention does on GPUs). The next pool block is prefetched.
//
// A step with too few items for the threads (one long decode) splits its decodes' contexts
// into parts merged by log-sum-exp afterwards (split.h).
//
// Files: common.h (vectors, work items, scratch), rows_path.h, columns_path.h, bf16_paths.h,
// split.h; this file splits the work, dispatches each item to its path and registers the ops,
// with two that are not attention: silu_and_mul (activations.h, the MLP activation) and
// pack_for_gemv / gemv_packed (gemv.h, the linears of decode steps with a few rows), and
// grouped_gemv (grouped_gemv.h, the experts of a mixture-of-experts block at decode sizes), and
// int8_gemv / int8_dequantize (int8_gemv.h) and int4_gemv / int4_dequantize (int4_gemv.h):
// linears over int8 and int4 weights; int4_a8_gemv / int8_a8_gemv (int4_a8_gemv.h,
// int8_a8_gemv.h): int4 / int8 weights times int8 activations (W4A8, W8A8) on AVX2.

#include <torch/library.h>

#include "activations.h"
#include "bf16_paths.h"
#include "columns_path.h"
#include "gemv.h"
#include "grouped_gemv.h"
#include "int4_a8_gemv.h"
#include "int8_a8_gemv.h"
#include "int4_gemv.h"
#include "int8_gemv.h"
#include "common.h"
#include "rows_path.h"
#include "split.h"

namespace hermes_native {
namespace {

enum class Path { rows, dot, packed, columns };

template <typename T>
Path path_for(int rows, const Shapes& sh) {
#if defined(__AVX512F__)
  if (std::is_same_v<T, float> && rows >= 16 && rows <= TILE_ROWS && sh.d % 16 == 0)
    return Path::columns;
#endif
#if defined(HERMES_PACKED)
  if (std::is_same_v<T, bf16> && rows >= 16 && rows <= TILE_ROWS && sh.d % 16 == 0)
    return Path::packed;
  if (std::is_same_v<T, bf16> && rows <= DIRECT_ROWS && sh.d % 16 == 0) return Path::dot;
#else
  (void)rows;
  (void)sh;
#endif
  return Path::rows;
}

template <typename T>
void run_items(const std::vector<Item>& items, const Shapes& sh, int64_t max_rows,
               const View<T>& view) {
  std::atomic<int64_t> next{0};
  const int64_t n = static_cast<int64_t>(items.size());
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), n);
  const Path small = path_for<T>(1, sh), large = path_for<T>(max_rows >= 16 ? 16 : 1, sh);
  const bool packed = small == Path::dot || large == Path::packed;
  const bool columns = large == Path::columns;
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t wkr = begin; wkr < end; ++wkr) {
      Scratch w(max_rows, sh, packed, columns);
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        const Item& it = items[i];
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<T, float>) {
          if (path_for<T>(it.tile_len * static_cast<int>(sh.group), sh) == Path::columns) {
            attend_columns(it, sh, view, w);
            continue;
          }
        }
#endif
#if defined(HERMES_PACKED)
        if constexpr (std::is_same_v<T, bf16>) {
          const Path path = path_for<T>(it.tile_len * static_cast<int>(sh.group), sh);
          if (path == Path::packed) {
            attend_packed(it, sh, view, w);
            continue;
          }
          if (path == Path::dot) {
            attend_dot(it, sh, view, w);
            continue;
          }
        }
#endif
        attend_rows<T>(it, sh, view, w);
      }
    }
  });
}

void check_cache(const at::Tensor& c, const at::Tensor& like, int64_t kv_heads, int64_t d,
                 const char* name) {
  TORCH_CHECK(c.dim() == 4, name, " must be [num_blocks, kv_heads, block_size, head_dim]");
  TORCH_CHECK(c.size(1) == kv_heads && c.size(3) == d, name, " has ", c.sizes(),
              ", expected kv_heads ", kv_heads, " and head_dim ", d);
  TORCH_CHECK(c.stride(3) == 1 && c.stride(2) == d, name, "'s blocks must be contiguous");
  TORCH_CHECK(c.scalar_type() == like.scalar_type(), name, " dtype differs from the query's");
  TORCH_CHECK(c.device().is_cpu(), name, " must be on the CPU");
}

void check_index(const at::Tensor& t, int64_t dims, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kInt && t.is_contiguous() &&
                  t.dim() == dims,
              name, " must be a contiguous CPU int32 tensor of ", dims, " dimension(s)");
}

void paged_attention(at::Tensor out, const at::Tensor& query, const at::Tensor& key_cache,
                     const at::Tensor& value_cache, const at::Tensor& query_start_loc,
                     const at::Tensor& seq_lens, const at::Tensor& block_table,
                     double scale, int64_t window) {
  TORCH_CHECK(query.dim() == 3 && query.is_contiguous() && query.device().is_cpu(),
              "query must be a contiguous CPU tensor [tokens, heads, head_dim]");
  TORCH_CHECK(out.sizes() == query.sizes() && out.is_contiguous() &&
                  out.scalar_type() == query.scalar_type(),
              "out must be contiguous, shaped and typed like query");
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16,
              "paged_attention runs float32 or bfloat16, not ", query.scalar_type());
  const int64_t heads = query.size(1), d = query.size(2), kv_heads = key_cache.size(1);
  TORCH_CHECK(d % VL == 0 && d > 0, "head_dim must be a multiple of 8, not ", d);
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "heads (", heads,
              ") must be a multiple of kv_heads (", kv_heads, ")");
  check_cache(key_cache, query, kv_heads, d, "key_cache");
  check_cache(value_cache, query, kv_heads, d, "value_cache");
  TORCH_CHECK(key_cache.strides() == value_cache.strides() &&
                  key_cache.sizes() == value_cache.sizes(),
              "key_cache and value_cache must be laid out alike");
  const int64_t bs = key_cache.size(2);
  TORCH_CHECK(bs % VL == 0, "block_size must be a multiple of 8, not ", bs);
  check_index(query_start_loc, 1, "query_start_loc");
  check_index(seq_lens, 1, "seq_lens");
  check_index(block_table, 2, "block_table");
  const int64_t nseq = seq_lens.size(0);
  TORCH_CHECK(query_start_loc.size(0) == nseq + 1 && block_table.size(0) == nseq,
              "query_start_loc needs one entry more than seq_lens, block_table one row each");
  const int32_t* qsl = query_start_loc.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  TORCH_CHECK(qsl[0] == 0 && qsl[nseq] == query.size(0),
              "query_start_loc must run from 0 to the number of query tokens");
  const int64_t group = heads / kv_heads;
  const int64_t tile = std::max<int64_t>(1, TILE_ROWS / group);
  const int64_t chunk = std::max<int64_t>(1, CHUNK / bs) * bs;
  const int64_t rows_chunk = std::max<int64_t>(1, ROWS_CHUNK / bs) * bs;
  TORCH_CHECK(window >= 0, "window must be 0 (none) or positive, not ", window);
  Shapes sh{heads, kv_heads, group, d, bs, chunk, rows_chunk, block_table.size(1), heads * d,
            key_cache.stride(0), key_cache.stride(1), window};
  std::vector<Item> items;
  int64_t max_rows = group;
  for (int64_t b = 0; b < nseq; ++b) {
    const int64_t n_new = qsl[b + 1] - qsl[b];
    TORCH_CHECK(n_new >= 0 && lens[b] >= n_new, "sequence ", b, ": ", n_new,
                " new tokens in a context of ", lens[b]);
    TORCH_CHECK((lens[b] + bs - 1) / bs <= sh.table_width, "sequence ", b,
                ": the block table is too narrow for ", lens[b], " tokens");
    for (int64_t t0 = 0; t0 < n_new; t0 += tile) {
      const int64_t tl = std::min(tile, n_new - t0);
      max_rows = std::max(max_rows, tl * group);
      const int64_t cost = tl * group * (lens[b] - n_new + t0 + tl);
      for (int64_t h = 0; h < kv_heads; ++h)
        items.push_back({static_cast<int32_t>(b), static_cast<int32_t>(h),
                         static_cast<int32_t>(t0), static_cast<int32_t>(tl), cost});
    }
  }
  if (items.empty()) return;
  const std::vector<SplitGroup> splits = split_decodes(items, sh, lens, at::get_num_threads());
  int64_t parts = 0;
  for (const SplitGroup& g : splits) parts += g.n;
  std::vector<float> part_o(parts * group * d), part_ml(parts * group * 2);
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  const auto fscale = static_cast<float>(scale);
  if (query.scalar_type() == at::kFloat) {
    View<float> v{query.data_ptr<float>(), key_cache.data_ptr<float>(),
                  value_cache.data_ptr<float>(), out.data_ptr<float>(), qsl, lens,
                  block_table.data_ptr<int32_t>(), fscale, part_o.data(), part_ml.data()};
    run_items<float>(items, sh, max_rows, v);
    if (!splits.empty()) merge_splits<float>(splits, sh, v);
  } else {
    View<bf16> v{query.data_ptr<bf16>(), key_cache.data_ptr<bf16>(),
                 value_cache.data_ptr<bf16>(), out.data_ptr<bf16>(), qsl, lens,
                 block_table.data_ptr<int32_t>(), fscale, part_o.data(), part_ml.data()};
    run_items<bf16>(items, sh, max_rows, v);
    if (!splits.empty()) merge_splits<bf16>(splits, sh, v);
  }
}

void write_kv(const at::Tensor& key, const at::Tensor& value, at::Tensor key_cache,
              at::Tensor value_cache, const at::Tensor& slot_mapping) {
  TORCH_CHECK(key.dim() == 3 && key.is_contiguous() && value.is_contiguous() &&
                  key.sizes() == value.sizes(),
              "key and value must be contiguous [tokens, kv_heads, head_dim] alike");
  const int64_t kv_heads = key.size(1), d = key.size(2);
  check_cache(key_cache, key, kv_heads, d, "key_cache");
  check_cache(value_cache, key, kv_heads, d, "value_cache");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous() &&
                  slot_mapping.numel() == key.size(0),
              "slot_mapping must be contiguous int64, one slot per token");
  const int64_t bs = key_cache.size(2), nslots = key_cache.size(0) * bs;
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  const int64_t esz = key.element_size(), row = d * esz;
  const char* ks = static_cast<const char*>(key.data_ptr());
  const char* vs = static_cast<const char*>(value.data_ptr());
  char* kd = static_cast<char*>(key_cache.data_ptr());
  char* vd = static_cast<char*>(value_cache.data_ptr());
  const int64_t sb = key_cache.stride(0) * esz, sh = key_cache.stride(1) * esz;
  for (int64_t t = 0; t < key.size(0); ++t)
    TORCH_CHECK(slots[t] < nslots, "slot ", slots[t], " is outside the pool");
  at::parallel_for(0, key.size(0), 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t s = slots[t];
      if (s < 0) continue;
      const int64_t base = (s / bs) * sb + (s % bs) * row;
      for (int64_t h = 0; h < kv_heads; ++h) {
        std::memcpy(kd + base + h * sh, ks + (t * kv_heads + h) * row, row);
        std::memcpy(vd + base + h * sh, vs + (t * kv_heads + h) * row, row);
      }
    }
  });
}

}  // namespace
}  // namespace hermes_native

using hermes_native::gemv_packed;
using hermes_native::gemv_supported;
using hermes_native::grouped_gemv;
using hermes_native::grouped_gemv_packed;
using hermes_native::grouped_gemv_supported;
using hermes_native::pack_experts;
using hermes_native::int4_a8_gemv;
using hermes_native::a8_supported;
using hermes_native::a8_vnni;
using hermes_native::a8_wide;
using hermes_native::int4_dequantize;
using hermes_native::int8_a8_gemv;
using hermes_native::int4_gemv;
using hermes_native::int4_gemv_supported;
using hermes_native::int8_dequantize;
using hermes_native::int8_gemv;
using hermes_native::int8_gemv_supported;
using hermes_native::pack_for_gemv;
using hermes_native::paged_attention;
using hermes_native::silu_and_mul;
using hermes_native::write_kv;

TORCH_LIBRARY(hermes_native, m) {
  m.def("write_kv(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping) -> ()");
  m.def("paged_attention(Tensor(a!) out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor query_start_loc, Tensor seq_lens, Tensor block_table, float scale, "
        "int window=0) -> ()");
  m.def("silu_and_mul(Tensor(a!) out, Tensor input) -> ()");
  m.def("gemv_supported() -> bool", &gemv_supported);
  m.def("pack_for_gemv(Tensor weight) -> Tensor", &pack_for_gemv);
  m.def("gemv_packed(Tensor(a!) out, Tensor x, Tensor packed) -> ()");
  m.def("grouped_gemv_supported() -> bool", &grouped_gemv_supported);
  m.def("grouped_gemv(Tensor(a!) out, Tensor x, Tensor w, Tensor offsets) -> ()");
  m.def("pack_experts(Tensor w) -> Tensor", &pack_experts);
  m.def("grouped_gemv_packed(Tensor(a!) out, Tensor x, Tensor packed, Tensor offsets) -> ()");
  m.def("int8_gemv_supported(ScalarType dtype) -> bool", &int8_gemv_supported);
  m.def("int8_gemv(Tensor(a!) out, Tensor x, Tensor packed, Tensor scales) -> ()");
  m.def("int8_dequantize(Tensor(a!) out, Tensor packed, Tensor scales) -> ()");
  m.def("int4_gemv_supported(ScalarType dtype) -> bool", &int4_gemv_supported);
  m.def("int4_gemv(Tensor(a!) out, Tensor x, Tensor packed, Tensor scales, Tensor mins) -> ()");
  m.def("int4_dequantize(Tensor(a!) out, Tensor packed, Tensor scales, Tensor mins) -> ()");
  m.def("a8_supported() -> bool", &a8_supported);
  m.def("a8_vnni() -> bool", &a8_vnni);
  m.def("a8_wide() -> bool", &a8_wide);
  m.def("int4_a8_gemv(Tensor(a!) out, Tensor x, Tensor packed, Tensor scales, Tensor mins) -> ()");
  m.def("int8_a8_gemv(Tensor(a!) out, Tensor x, Tensor packed, Tensor scales) -> ()");
}

TORCH_LIBRARY_IMPL(hermes_native, CPU, m) {
  m.impl("write_kv", &write_kv);
  m.impl("paged_attention", &paged_attention);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("gemv_packed", &gemv_packed);
  m.impl("grouped_gemv", &grouped_gemv);
  m.impl("grouped_gemv_packed", &grouped_gemv_packed);
  m.impl("int8_gemv", &int8_gemv);
  m.impl("int8_dequantize", &int8_dequantize);
  m.impl("int4_gemv", &int4_gemv);
  m.impl("int4_dequantize", &int4_dequantize);
  m.impl("int4_a8_gemv", &int4_a8_gemv);
  m.impl("int8_a8_gemv", &int8_a8_gemv);
}
