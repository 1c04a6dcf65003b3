// grouped_gemv: a mixture-of-experts projection at decode batch sizes, the experts read in place.
//
// torch's CPU _grouped_mm runs one matmul per expert (all of them, the empty ones too): at a
// decode step of a 128-expert model that is most of the step for a few routed rows. Here only
// the experts that have rows are read, each once per group of up to 4 rows, straight from the
// stacked weight [E, K, N] (x @ W layout, the one _grouped_mm takes: no second copy). A work
// item is (expert, up to 4 rows, a block of up to 128 columns); it walks K, loading a row of
// the block's weights (bfloat16 widened to float32 by a shift, or float32) and accumulating it
// times each row's x[k] broadcast: float32 accumulators, no horizontal sums.
//   grouped_gemv(out [P, N] float32, x [P, K] float32, w [E, K, N] bfloat16 | float32,
//                offsets [E] int32): rows offsets[e-1]..offsets[e] of x (sorted by expert)
//                times w[e]; out = the same rows of the result, float32.
//
// On AVX512-BF16 CPUs the bfloat16 experts are instead repacked at load, each in gemv_packed's
// pair layout ([E][N / 16][K / 2][16] pairs: every block of 16 outputs one contiguous stream),
// which serves every step size:
//   pack_experts(w [E, K, N] bf16) -> packed [E, N / 16, K / 2, 16] int32
//   grouped_gemv_packed(out [P, N] bf16, x [P, K] bf16, packed, offsets [E] int32)
// An item is (expert, 4 blocks of 16 outputs); its rows go through gemv_packed's kernel 8 at a
// time, the item's weights (4 x K x 32 bytes) staying in L2 between the passes: decode steps
// read each routed expert once, prefills run at the kernel's compute rate.
#pragma once

#include "common.h"
#include "gemv.h"

namespace hermes_native {

constexpr int GROUPED_ROWS = 4;     // rows of x per item (the accumulators are rows x vectors)
constexpr int GROUPED_VECTORS = 8;  // 16-column vectors per item at up to 2 rows
constexpr int64_t GROUPED_PREFETCH = 8;  // weight rows ahead (+5-10% measured at 8-16 tokens)

inline bool grouped_gemv_supported() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

#if defined(__AVX512F__)
template <typename W>
inline __m512 load_widened(const W* p) {
  if constexpr (std::is_same_v<W, float>) {
    return _mm512_loadu_ps(p);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// R rows of x (each K floats, rows apart by K) against V vectors of columns from n0 of one
// expert's weight w [K, N]; out rows are N apart.
template <typename W, int R, int V>
inline void grouped_block(const float* x, int64_t k, const W* w, int64_t n, int64_t n0,
                          float* out) {
  __m512 acc[R][V];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  const W* row = w + n0;
  for (int64_t i = 0; i < k; ++i, row += n) {
    if (i + GROUPED_PREFETCH < k)
      for (int v = 0; v < V; v += 64 / (16 * static_cast<int>(sizeof(W))))
        _mm_prefetch(reinterpret_cast<const char*>(row + GROUPED_PREFETCH * n + 16 * v),
                     _MM_HINT_T0);
    __m512 xb[R];
    for (int r = 0; r < R; ++r) xb[r] = _mm512_set1_ps(x[r * k + i]);
    for (int v = 0; v < V; ++v) {
      const __m512 wv = load_widened<W>(row + 16 * v);
      for (int r = 0; r < R; ++r) acc[r][v] = _mm512_fmadd_ps(xb[r], wv, acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < V; ++v) _mm512_storeu_ps(out + r * n + n0 + 16 * v, acc[r][v]);
}

template <int R>
constexpr int vectors_for() {  // R x V accumulators + R broadcasts + 1 weight in 32 registers
  return R <= 2 ? GROUPED_VECTORS : (R == 3 ? 6 : 5);
}

// columns [n0, n1) (multiples of 16) of R rows
template <typename W, int R>
inline void grouped_rows(const float* x, int64_t k, const W* w, int64_t n, int64_t n0,
                         int64_t n1, float* out) {
  constexpr int V = vectors_for<R>();
  int64_t c = n0;
  for (; c + 16 * V <= n1; c += 16 * V) grouped_block<W, R, V>(x, k, w, n, c, out);
  for (; c < n1; c += 16) grouped_block<W, R, 1>(x, k, w, n, c, out);
}

struct GroupedItem {
  int64_t expert, row, rows, n0, n1;
};

template <typename W>
void grouped_gemv_impl(float* out, const float* x, const W* w, const int32_t* offsets,
                       int64_t experts, int64_t k, int64_t n) {
  std::vector<GroupedItem> items;
  constexpr int64_t COLUMNS = 16 * GROUPED_VECTORS;
  int64_t start = 0;
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t end = offsets[e];
    for (int64_t r = start; r < end; r += GROUPED_ROWS)
      for (int64_t c = 0; c < n; c += COLUMNS)
        items.push_back({e, r, std::min<int64_t>(GROUPED_ROWS, end - r), c,
                         std::min(n, c + COLUMNS)});
    start = end;
  }
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t b, int64_t end) {
    for (int64_t i = b; i < end; ++i) {
      const GroupedItem& it = items[i];
      const float* xr = x + it.row * k;
      const W* we = w + it.expert * k * n;
      float* o = out + it.row * n;
      switch (it.rows) {
        case 1: grouped_rows<W, 1>(xr, k, we, n, it.n0, it.n1, o); break;
        case 2: grouped_rows<W, 2>(xr, k, we, n, it.n0, it.n1, o); break;
        case 3: grouped_rows<W, 3>(xr, k, we, n, it.n0, it.n1, o); break;
        default: grouped_rows<W, 4>(xr, k, we, n, it.n0, it.n1, o); break;
      }
    }
  });
}
#endif

// offsets [experts] int32, rising from 0 to exactly p rows: their data
inline const int32_t* checked_offsets(const at::Tensor& offsets, int64_t experts, int64_t p) {
  TORCH_CHECK(offsets.dim() == 1 && offsets.is_contiguous() && offsets.size(0) == experts &&
                  offsets.scalar_type() == at::kInt,
              "offsets must be int32 [", experts, "]");
  const int32_t* off = offsets.data_ptr<int32_t>();
  int64_t previous = 0;
  for (int64_t e = 0; e < experts; ++e) {
    TORCH_CHECK(off[e] >= previous && off[e] <= p, "offsets must rise from 0 to at most ", p);
    previous = off[e];
  }
  TORCH_CHECK(previous == p, "offsets end at ", previous, ", x has ", p, " rows");
  return off;
}

inline void grouped_gemv(at::Tensor out, const at::Tensor& x, const at::Tensor& w,
                         const at::Tensor& offsets) {
  TORCH_CHECK(grouped_gemv_supported(), "grouped_gemv needs a CPU with AVX512F");
  TORCH_CHECK(w.dim() == 3 && w.is_contiguous() && w.device().is_cpu() &&
                  (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kFloat),
              "w must be a contiguous bfloat16 or float32 CPU tensor [E, K, N]");
  const int64_t experts = w.size(0), k = w.size(1), n = w.size(2);
  TORCH_CHECK(n % 16 == 0, "grouped_gemv needs N % 16 == 0, not ", n);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kFloat &&
                  x.size(1) == k,
              "x must be a contiguous float32 [P, ", k, "]");
  const int64_t p = x.size(0);
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.scalar_type() == at::kFloat &&
                  out.size(0) == p && out.size(1) == n,
              "out must be a contiguous float32 [", p, ", ", n, "]");
  const int32_t* off = checked_offsets(offsets, experts, p);
#if defined(__AVX512F__)
  if (w.scalar_type() == at::kFloat)
    grouped_gemv_impl<float>(out.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(),
                             off, experts, k, n);
  else
    grouped_gemv_impl<bf16>(out.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<bf16>(), off,
                            experts, k, n);
#endif
}

inline at::Tensor pack_experts(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 3 && w.scalar_type() == at::kBFloat16 && w.device().is_cpu(),
              "pack_experts takes stacked bfloat16 CPU experts [E, K, N]");
  const int64_t e = w.size(0), k = w.size(1), n = w.size(2);
  TORCH_CHECK(n % 16 == 0 && k % 2 == 0, "pack_experts needs N % 16 == 0 and even K, not ",
              w.sizes());
  at::Tensor packed = w.new_empty({e, n / 16, k / 2, 16}, w.options().dtype(at::kInt));
  for (int64_t i = 0; i < e; ++i)  // one expert at a time: a small transient copy
    packed[i].copy_(pack_for_gemv(w[i].t().contiguous()));
  return packed;
}

inline void grouped_gemv_packed(at::Tensor out, const at::Tensor& x, const at::Tensor& packed,
                                const at::Tensor& offsets) {
  TORCH_CHECK(gemv_supported(), "grouped_gemv_packed needs a CPU with AVX512-BF16");
  TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.size(3) == 16 &&
                  packed.scalar_type() == at::kInt,
              "packed must come from pack_experts");
  const int64_t experts = packed.size(0), blocks = packed.size(1), k2 = packed.size(2);
  const int64_t n = blocks * 16, k = 2 * k2;
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16 &&
                  x.size(1) == k,
              "x must be a contiguous bfloat16 [P, ", k, "]");
  const int64_t p = x.size(0);
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() && out.scalar_type() == at::kBFloat16 &&
                  out.size(0) == p && out.size(1) == n,
              "out must be a contiguous bfloat16 [", p, ", ", n, "]");
  const int32_t* off = checked_offsets(offsets, experts, p);
#if defined(HERMES_PACKED)
  struct Item {
    int64_t expert, row0, row1, b0, b1;
  };
  std::vector<Item> items;
  int64_t start = 0;
  for (int64_t e = 0; e < experts; ++e) {
    if (off[e] > start)
      for (int64_t b = 0; b < blocks; b += 4)
        items.push_back({e, start, off[e], b, std::min(blocks, b + 4)});
    start = off[e];
  }
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<bf16>());
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  bf16* op = out.data_ptr<bf16>();
  at::parallel_for(0, static_cast<int64_t>(items.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const Item& it = items[i];
      const uint32_t* we = wp + it.expert * blocks * k2 * 16;
      for (int64_t r = it.row0; r < it.row1; r += GEMV_MAX_ROWS) {
        const uint32_t* xr = xp + r * k2;
        bf16* o = op + r * n;
        switch (std::min(GEMV_MAX_ROWS, it.row1 - r)) {
          case 1: gemv_rows<1>(xr, k2, we, it.b0, it.b1, o, n); break;
          case 2: gemv_rows<2>(xr, k2, we, it.b0, it.b1, o, n); break;
          case 3: gemv_rows<3>(xr, k2, we, it.b0, it.b1, o, n); break;
          case 4: gemv_rows<4>(xr, k2, we, it.b0, it.b1, o, n); break;
          case 5: gemv_rows<5>(xr, k2, we, it.b0, it.b1, o, n); break;
          case 6: gemv_rows<6>(xr, k2, we, it.b0, it.b1, o, n); break;
          case 7: gemv_rows<7>(xr, k2, we, it.b0, it.b1, o, n); break;
          default: gemv_rows<8>(xr, k2, we, it.b0, it.b1, o, n); break;
        }
      }
    }
  });
#endif
}

}  // namespace hermes_native
