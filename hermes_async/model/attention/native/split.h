// Split decodes (flash decoding): when a step has fewer work items than the threads can keep
// busy (one sequence with a long context has just kv_heads items), a decode item's context
// is cut into parts, each walked by its own item with its own online softmax; the parts'
// unnormalised outputs, maxima and sums are then merged exactly by log-sum-exp.
#pragma once

#include "common.h"

namespace hermes_native {

constexpr int64_t ITEMS_PER_THREAD = 4;  // split until a step has about this many per thread
constexpr int64_t MIN_PART_KEYS = 256;   // never parts shorter than this

struct SplitGroup {  // the parts of one (sequence, kv head): partial slots [first, first + n)
  Item whole;
  int32_t first, n;
};

// Replace long decode items (one new token, a group of at most DIRECT_ROWS query rows: the
// rows and dot paths) by parts of whole key chunks; returns the groups to merge.
inline std::vector<SplitGroup> split_decodes(std::vector<Item>& items, const Shapes& sh,
                                             const int32_t* lens, int64_t threads) {
  std::vector<SplitGroup> groups;
  const int64_t want = ITEMS_PER_THREAD * threads;
  const int64_t n_items = static_cast<int64_t>(items.size());
  if (n_items >= want || sh.group > DIRECT_ROWS) return groups;
  const int64_t per_item = (want + n_items - 1) / n_items;  // parts wanted per item
  std::vector<Item> out;
  int32_t slot = 0;
  for (const Item& it : items) {
    const int64_t keys = lens[it.seq];  // a one-token item attends to the whole context
    const int64_t start = window_start(keys - 1, sh);  // or to its window of it
    int64_t part_keys = (keys - start + per_item - 1) / per_item;
    part_keys = std::max(MIN_PART_KEYS, (part_keys + sh.rows_chunk - 1) / sh.rows_chunk *
                                            sh.rows_chunk);
    if (it.tile_len != 1 || it.tile_start != 0 || part_keys >= keys - start) {
      out.push_back(it);
      continue;
    }
    const int32_t first = slot;
    for (int64_t k0 = start; k0 < keys; k0 += part_keys) {
      Item p = it;
      p.key_begin = k0;
      p.key_end = std::min(keys, k0 + part_keys);
      p.cost = (p.key_end - k0) * sh.group;
      p.part = slot++;
      out.push_back(p);
    }
    groups.push_back({it, first, slot - first});
  }
  items.swap(out);
  return groups;
}

// out rows of each group = sum_p o_p e^(m_p - M) / sum_p l_p e^(m_p - M), M = max_p m_p.
template <typename T>
void merge_splits(const std::vector<SplitGroup>& groups, const Shapes& sh, const View<T>& v) {
  const int64_t d = sh.d, g = sh.group;
  at::parallel_for(0, static_cast<int64_t>(groups.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(d), weight;
    for (int64_t gi = begin; gi < end; ++gi) {
      const SplitGroup& sg = groups[gi];
      const Geometry<T> geo(sg.whole, sh, v);
      weight.resize(sg.n);
      for (int64_t r = 0; r < g; ++r) {
        float mx = NEG_INF;
        for (int32_t p = 0; p < sg.n; ++p)
          mx = std::max(mx, v.part_ml[((sg.first + p) * g + r) * 2]);
        float sum = 0.f;
        for (int32_t p = 0; p < sg.n; ++p) {
          const float* ml = v.part_ml + ((sg.first + p) * g + r) * 2;
          weight[p] = ml[1] > 0.f ? std::exp(ml[0] - mx) : 0.f;
          sum += weight[p] * ml[1];
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int32_t p = 0; p < sg.n; ++p) {
          const float* o = v.part_o + ((sg.first + p) * g + r) * d;
          for (int64_t i = 0; i < d; ++i) acc[i] += weight[p] * o[i];
        }
        T* dst = geo.out_row(v, sg.whole, sh, static_cast<int>(r));
        const float inv = 1.f / sum;
        for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<T>(acc[i] * inv);
      }
    }
  });
}

}  // namespace hermes_native
