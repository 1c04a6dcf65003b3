// gemv_packed: the linears of a decode step with a few rows (M <= 8), bfloat16, AVX512-BF16.
//
// At one row a linear streams its whole weight for 2 FLOP per element: it is bound by memory,
// and oneDNN's blocked matmul moved ~21 GB/s here, about half of what two cores can read. This
// kernel reads the weight once, front to back: it is packed at start-up as pairs along K in
// blocks of 16 outputs, [N / 16][K / 2][16] pairs (64 bytes per pair row), so one vdpbf16ps
// takes 16 outputs x 2 k of the weight against x[k], x[k + 1] broadcast: no horizontal sums.
// Four blocks (64 outputs; two from 5 rows on) share each broadcast; threads split the blocks.
//   pack_for_gemv(weight [N, K]) -> packed [N / 16, K / 2, 16] int32
//   gemv_packed(out [M, N], x [M, K], packed): out = x @ weight^T, float32 accumulation.
#pragma once

#include "common.h"

namespace hermes_native {

constexpr int64_t GEMV_MAX_ROWS = 8;

inline bool gemv_supported() {
#if defined(HERMES_PACKED)
  return true;
#else
  return false;
#endif
}

inline at::Tensor pack_for_gemv(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kBFloat16 &&
                  weight.device().is_cpu(),
              "pack_for_gemv takes a 2-D bfloat16 CPU weight");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n % 16 == 0 && k % 2 == 0, "pack_for_gemv needs N % 16 == 0 and even K, not ",
              weight.sizes());
  // [N, K] -> [N/16, 16, K/2, 2] -> [N/16, K/2, 16, 2]: pairs along K, 16 outputs per row
  return weight.contiguous().view({n / 16, 16, k / 2, 2}).permute({0, 2, 1, 3})
      .contiguous().view(at::kInt).view({n / 16, k / 2, 16});
}

#if defined(HERMES_PACKED)
// J blocks of 16 outputs from block nb0, M rows.
template <int M, int J>
inline void gemv_blocks(const uint32_t* x, int64_t k2, const uint32_t* w, int64_t nb0,
                        bf16* out, int64_t n) {
  __m512 acc[M][J];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < J; ++j) acc[m][j] = _mm512_setzero_ps();
  const uint32_t* wb = w + nb0 * k2 * 16;
  for (int64_t p = 0; p < k2; ++p) {
    __m512i wv[J];
    for (int j = 0; j < J; ++j) wv[j] = _mm512_loadu_si512(wb + (j * k2 + p) * 16);
    for (int m = 0; m < M; ++m) {
      const __m512i xv = _mm512_set1_epi32(static_cast<int>(x[m * k2 + p]));
      for (int j = 0; j < J; ++j)
        acc[m][j] = _mm512_dpbf16_ps(acc[m][j], (__m512bh)xv, (__m512bh)wv[j]);
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < J; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * n + (nb0 + j) * 16),
                          (__m256i)_mm512_cvtneps_pbh(acc[m][j]));
}

template <int M>
void gemv_rows(const uint32_t* x, int64_t k2, const uint32_t* w, int64_t begin, int64_t end,
               bf16* out, int64_t n) {
  constexpr int J = M <= 4 ? 4 : 2;  // M x J accumulators stay in the 32 registers
  int64_t nb = begin;
  for (; nb + J <= end; nb += J) gemv_blocks<M, J>(x, k2, w, nb, out, n);
  for (; nb < end; ++nb) gemv_blocks<M, 1>(x, k2, w, nb, out, n);
}
#endif

inline void gemv_packed(at::Tensor out, const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(gemv_supported(), "gemv_packed needs a CPU with AVX512-BF16");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16 &&
                  x.device().is_cpu(),
              "x must be a contiguous bfloat16 CPU tensor [M, K]");
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.size(2) == 16 &&
                  packed.scalar_type() == at::kInt,
              "packed must come from pack_for_gemv");
  const int64_t m = x.size(0), k2 = packed.size(1), n = packed.size(0) * 16;
  TORCH_CHECK(x.size(1) == 2 * k2, "x has ", x.size(1), " columns, the weight ", 2 * k2);
  TORCH_CHECK(m >= 1 && m <= GEMV_MAX_ROWS, "gemv_packed takes 1 to ", GEMV_MAX_ROWS,
              " rows, not ", m);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kBFloat16 && out.dim() == 2 &&
                  out.size(0) == m && out.size(1) == n,
              "out must be a contiguous bfloat16 [M, N]");
#if defined(HERMES_PACKED)
  const uint32_t* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<bf16>());
  const uint32_t* wp = reinterpret_cast<const uint32_t*>(packed.data_ptr<int32_t>());
  bf16* op = out.data_ptr<bf16>();
  const int64_t blocks = n / 16;
  at::parallel_for(0, (blocks + 3) / 4, 1, [&](int64_t begin, int64_t end) {
    const int64_t b0 = begin * 4, b1 = std::min(blocks, end * 4);
    switch (m) {
      case 1: gemv_rows<1>(xp, k2, wp, b0, b1, op, n); break;
      case 2: gemv_rows<2>(xp, k2, wp, b0, b1, op, n); break;
      case 3: gemv_rows<3>(xp, k2, wp, b0, b1, op, n); break;
      case 4: gemv_rows<4>(xp, k2, wp, b0, b1, op, n); break;
      case 5: gemv_rows<5>(xp, k2, wp, b0, b1, op, n); break;
      case 6: gemv_rows<6>(xp, k2, wp, b0, b1, op, n); break;
      case 7: gemv_rows<7>(xp, k2, wp, b0, b1, op, n); break;
      default: gemv_rows<8>(xp, k2, wp, b0, b1, op, n); break;
    }
  });
#endif
}

}  // namespace hermes_native
