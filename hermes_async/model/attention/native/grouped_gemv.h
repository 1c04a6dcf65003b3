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
#pragma once

#include "common.h"

namespace hermes_native {

constexpr int GROUPED_ROWS = 4;     // rows of x per item (the accumulators are rows x vectors)
constexpr int GROUPED_VECTORS = 8;  // 16-column vectors per item at up to 2 rows

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
#if defined(__AVX512F__)
  if (w.scalar_type() == at::kFloat)
    grouped_gemv_impl<float>(out.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(),
                             off, experts, k, n);
  else
    grouped_gemv_impl<bf16>(out.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<bf16>(), off,
                            experts, k, n);
#endif
}

}  // namespace hermes_native
