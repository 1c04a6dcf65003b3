// int8_gemv: linears over int8 weights (weight-only quantization), bfloat16 activations here
// (AVX512-BF16), float32 ones in quant_f32.h (AVX2 + FMA) over the same packed weight.
//
// The weight's integers are packed at load in gemv_packed's pair layout, one byte each:
// [N / 16][K / 2][16 outputs][2 k] int8, with float32 scales per output and group of K
// ([N / 16][K / group][16]; group == K: one scale per output channel). A pair row (32 bytes:
// 16 outputs x 2 k) is widened in registers (int8 -> int32 -> float32 -> bfloat16 pairs: exact,
// |q| <= 127 fits bfloat16's 8 bits) and multiplied by x[k], x[k + 1] broadcast with
// vdpbf16ps, float32 accumulation; each group's sum is scaled once. So the product is exactly
// x times the dequantized weight (q * scale, in float32) up to float32 rounding, reading one
// byte per weight: a decode step streams half of bfloat16's bytes.
//   int8_gemv(out [M, N] bf16, x [M, K] bf16, packed [N / 16, K / 2, 16, 2] int8,
//             scales [N / 16, K / group, 16] float32): out = x @ (q * scale)^T; any M, in
//             passes of up to 24 rows (8 with groups), each reading the weight once; from 9
//             rows one block of 16 outputs at a time (the rows' accumulators fill the
//             registers), so a 32-row decode step reads the int8 weight twice, bfloat16's
//             bytes once.
//   int8_dequantize(out [N, K] bf16 or f32, packed, scales): the weight, for steps of many
//             rows (bfloat16 vectorized on AVX512-BF16; otherwise a plain loop).
#pragma once

#include "common.h"
#include "quant_f32.h"

namespace hermes_native {

constexpr int64_t INT8_PASS_ROWS = 24;          // rows per weight pass, one scale per output
constexpr int64_t INT8_GROUPED_PASS_ROWS = 8;   // with scale groups (partial sums too)
constexpr int64_t INT8_PREFETCH = 32;  // pair rows ahead (1 KB of each stream)

// bfloat16 activations on AVX512-BF16 (here), float32 on AVX2 + FMA (quant_f32.h)
inline bool int8_gemv_supported(c10::ScalarType dtype) {
  if (dtype == at::kFloat) return quant_f32_supported();
#if defined(HERMES_PACKED)
  return dtype == at::kBFloat16;
#else
  return false;
#endif
}

#if defined(HERMES_PACKED)
// 32 int8 (16 outputs x 2 k) as 16 bfloat16 pairs, lane i = output i.
inline __m512i widen_pairs(const int8_t* p) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1)));
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

// J blocks of 16 outputs from block nb0, M rows; pairs per group gp (k2 / gp groups).
template <int M, int J, bool GROUPED>
inline void int8_blocks(const uint32_t* x, int64_t k2, int64_t gp, const int8_t* w,
                        const float* scales, int64_t nb0, bf16* out, int64_t n) {
  const int64_t groups = k2 / gp;
  __m512 acc[M][J];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < J; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 part[M][J];
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < J; ++j) part[m][j] = _mm512_setzero_ps();
    for (int64_t p = g * gp; p < (g + 1) * gp; ++p) {
      if ((p & 1) == 0 && p + INT8_PREFETCH < k2)  // a cache line (2 pair rows) per stream
        for (int j = 0; j < J; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(w + ((nb0 + j) * k2 + p + INT8_PREFETCH) *
                                                           32),
                       _MM_HINT_T0);
      __m512i wv[J];
      for (int j = 0; j < J; ++j) wv[j] = widen_pairs(w + ((nb0 + j) * k2 + p) * 32);
      for (int m = 0; m < M; ++m) {
        const __m512i xv = _mm512_set1_epi32(static_cast<int>(x[m * k2 + p]));
        for (int j = 0; j < J; ++j)
          part[m][j] = _mm512_dpbf16_ps(part[m][j], (__m512bh)xv, (__m512bh)wv[j]);
      }
    }
    if constexpr (GROUPED) {
      for (int j = 0; j < J; ++j) {
        const __m512 s = _mm512_loadu_ps(scales + ((nb0 + j) * groups + g) * 16);
        for (int m = 0; m < M; ++m) acc[m][j] = _mm512_fmadd_ps(part[m][j], s, acc[m][j]);
      }
    } else {
      for (int m = 0; m < M; ++m)
        for (int j = 0; j < J; ++j) acc[m][j] = part[m][j];
    }
  }
  for (int j = 0; j < J; ++j) {
    const __m512 s = GROUPED ? _mm512_set1_ps(1.0f) : _mm512_loadu_ps(scales + (nb0 + j) * 16);
    for (int m = 0; m < M; ++m)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * n + (nb0 + j) * 16),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[m][j], s)));
  }
}

template <int M, bool GROUPED>
void int8_rows(const uint32_t* x, int64_t k2, int64_t gp, const int8_t* w, const float* scales,
               int64_t begin, int64_t end, bf16* out, int64_t n) {
  // accumulators (and per-group partial sums) stay in the 32 registers
  constexpr int J = GROUPED ? (M <= 2 ? 4 : (M <= 4 ? 2 : 1))
                            : (M <= 4 ? 4 : (M <= 8 ? 2 : 1));
  int64_t nb = begin;
  for (; nb + J <= end; nb += J) int8_blocks<M, J, GROUPED>(x, k2, gp, w, scales, nb, out, n);
  for (; nb < end; ++nb) int8_blocks<M, 1, GROUPED>(x, k2, gp, w, scales, nb, out, n);
}

#define HERMES_INT8_WIDE(M) \
  case M: int8_rows<M, false>(x, k2, gp, w, scales, b0, b1, out, n); break;

template <bool GROUPED>
void int8_pass(int64_t m, const uint32_t* x, int64_t k2, int64_t gp, const int8_t* w,
               const float* scales, int64_t b0, int64_t b1, bf16* out, int64_t n) {
  if constexpr (!GROUPED) {
    if (m > 8) {
      switch (m) {
        HERMES_INT8_WIDE(9) HERMES_INT8_WIDE(10) HERMES_INT8_WIDE(11) HERMES_INT8_WIDE(12)
        HERMES_INT8_WIDE(13) HERMES_INT8_WIDE(14) HERMES_INT8_WIDE(15) HERMES_INT8_WIDE(16)
        HERMES_INT8_WIDE(17) HERMES_INT8_WIDE(18) HERMES_INT8_WIDE(19) HERMES_INT8_WIDE(20)
        HERMES_INT8_WIDE(21) HERMES_INT8_WIDE(22) HERMES_INT8_WIDE(23)
        default: int8_rows<24, false>(x, k2, gp, w, scales, b0, b1, out, n); break;
      }
      return;
    }
  }
  switch (m) {
    case 1: int8_rows<1, GROUPED>(x, k2, gp, w, scales, b0, b1, out, n); break;
    case 2: int8_rows<2, GROUPED>(x, k2, gp, w, scales, b0, b1, out, n); break;
    case 3: int8_rows<3, GROUPED>(x, k2, gp, w, scales, b0, b1, out, n); break;
    case 4: int8_rows<4, GROUPED>(x, k2, gp, w, scales, b0, b1, out, n); break;
    case 5: int8_rows<5, GROUPED>(x, k2, gp, w, scales, b0, b1, out, n); break;
    case 6: int8_rows<6, GROUPED>(x, k2, gp, w, scales, b0, b1, out, n); break;
    case 7: int8_rows<7, GROUPED>(x, k2, gp, w, scales, b0, b1, out, n); break;
    default: int8_rows<8, GROUPED>(x, k2, gp, w, scales, b0, b1, out, n); break;
  }
}
#undef HERMES_INT8_WIDE
#endif

// the weight's shape from its packed form: (N, K, pairs per scale group)
inline std::tuple<int64_t, int64_t, int64_t> int8_shape(const at::Tensor& packed,
                                                        const at::Tensor& scales) {
  TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.size(2) == 16 &&
                  packed.size(3) == 2 && packed.scalar_type() == at::kChar,
              "packed must be int8 [N / 16, K / 2, 16, 2]");
  const int64_t nb = packed.size(0), k2 = packed.size(1);
  TORCH_CHECK(scales.dim() == 3 && scales.is_contiguous() && scales.size(0) == nb &&
                  scales.size(2) == 16 && scales.scalar_type() == at::kFloat,
              "scales must be float32 [N / 16, K / group, 16]");
  const int64_t groups = scales.size(1);
  TORCH_CHECK(groups >= 1 && k2 % groups == 0, "K / 2 = ", k2, " pairs do not split into ",
              groups, " groups");
  return {nb * 16, k2 * 2, k2 / groups};
}

inline void int8_gemv(at::Tensor out, const at::Tensor& x, const at::Tensor& packed,
                      const at::Tensor& scales) {
  const auto [n, k, gp] = int8_shape(packed, scales);
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (dtype == at::kBFloat16 ||
                  dtype == at::kFloat) && x.size(1) == k,
              "x must be a contiguous bfloat16 or float32 [M, ", k, "]");
  const int64_t m = x.size(0);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == dtype && out.dim() == 2 &&
                  out.size(0) == m && out.size(1) == n,
              "out must be a contiguous [", m, ", ", n, "] of x's dtype");
  TORCH_CHECK(int8_gemv_supported(dtype), "int8_gemv in ", dtype, " needs ",
              dtype == at::kFloat ? "AVX2 and FMA" : "AVX512-BF16");
  if (dtype == at::kFloat) {
    quant_f32_gemv<false>(out, x, reinterpret_cast<const uint8_t*>(packed.data_ptr<int8_t>()),
                          scales.data_ptr<float>(), nullptr, n, k, gp);
    return;
  }
#if defined(HERMES_PACKED)
  const int64_t k2 = k / 2, blocks = n / 16;
  const bool grouped = gp != k2;
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  const int64_t pass = grouped ? INT8_GROUPED_PASS_ROWS : INT8_PASS_ROWS;
  for (int64_t r0 = 0; r0 < m; r0 += pass) {
    const int64_t rows = std::min(pass, m - r0);
    const uint32_t* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<bf16>() + r0 * k);
    bf16* op = out.data_ptr<bf16>() + r0 * n;
    at::parallel_for(0, (blocks + 3) / 4, 1, [&](int64_t begin, int64_t end) {
      const int64_t b0 = begin * 4, b1 = std::min(blocks, end * 4);
      if (grouped)
        int8_pass<true>(rows, xp, k2, gp, wp, sp, b0, b1, op, n);
      else
        int8_pass<false>(rows, xp, k2, gp, wp, sp, b0, b1, op, n);
    });
  }
#endif
}

// the weight row by row as q * scale, rounded to T (the scalar form of the vectorized loop)
template <typename T>
void int8_dequantize_rows(T* op, const int8_t* wp, const float* sp, int64_t n, int64_t k,
                          int64_t gp) {
  const int64_t k2 = k / 2, groups = k2 / gp;
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t nb = row / 16, lane = row % 16;
      T* o = op + row * k;
      for (int64_t g = 0; g < groups; ++g) {
        const float s = sp[(nb * groups + g) * 16 + lane];
        for (int64_t p = g * gp; p < (g + 1) * gp; ++p) {
          const int8_t* q = wp + ((nb * k2 + p) * 16 + lane) * 2;
          o[2 * p] = static_cast<T>(q[0] * s);
          o[2 * p + 1] = static_cast<T>(q[1] * s);
        }
      }
    }
  });
}

inline void int8_dequantize(at::Tensor out, const at::Tensor& packed, const at::Tensor& scales) {
  const auto [n, k, gp] = int8_shape(packed, scales);
  TORCH_CHECK(out.is_contiguous() && (out.scalar_type() == at::kBFloat16 ||
                  out.scalar_type() == at::kFloat) && out.dim() == 2 &&
                  out.size(0) == n && out.size(1) == k,
              "out must be a contiguous bfloat16 or float32 [", n, ", ", k, "]");
  const int64_t k2 = k / 2, groups = k2 / gp;
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  if (out.scalar_type() == at::kFloat) {
    int8_dequantize_rows(out.data_ptr<float>(), wp, sp, n, k, gp);
    return;
  }
  bf16* op = out.data_ptr<bf16>();
#if defined(HERMES_PACKED)
  // a block of 16 outputs at a time: 16 pair rows (32 bytes each) widened, scaled and rounded
  // to 16 bfloat16 pairs per output (the same float32 product and round-to-nearest-even as the
  // scalar loop), staged in L1 and written out row by row (a scatter straight to the 16 rows
  // thrashes one L1 set when K is a multiple of 2048)
  const __m512i lo_lanes = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i hi_lanes = _mm512_add_epi32(lo_lanes, _mm512_set1_epi32(8));
  at::parallel_for(0, n / 16, 1, [&](int64_t begin, int64_t end) {
    alignas(64) uint32_t stage[16][16];  // [pair][output]
    for (int64_t nb = begin; nb < end; ++nb) {
      uint32_t* o = reinterpret_cast<uint32_t*>(op + nb * 16 * k);
      const int8_t* w = wp + nb * k2 * 32;
      const float* sb = sp + nb * groups * 16;
      int64_t g = -1;
      __m512 s_lo = _mm512_setzero_ps(), s_hi = _mm512_setzero_ps();
      for (int64_t p0 = 0; p0 < k2; p0 += 16) {
        const int64_t count = std::min<int64_t>(16, k2 - p0);
        for (int64_t j = 0; j < count; ++j) {
          const int64_t p = p0 + j;
          if (p / gp != g) {
            g = p / gp;
            const __m512 s16 = _mm512_loadu_ps(sb + g * 16);
            s_lo = _mm512_permutexvar_ps(lo_lanes, s16);
            s_hi = _mm512_permutexvar_ps(hi_lanes, s16);
          }
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + p * 32));
          const __m512 lo = _mm512_mul_ps(
              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v))), s_lo);
          const __m512 hi = _mm512_mul_ps(
              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1))), s_hi);
          _mm512_store_si512(stage[j], (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
        for (int64_t lane = 0; lane < 16; ++lane) {
          uint32_t* row = o + lane * k2 + p0;
          for (int64_t j = 0; j < count; ++j) row[j] = stage[j][lane];
        }
      }
    }
  });
#else
  int8_dequantize_rows(op, wp, sp, n, k, gp);
#endif
}

}  // namespace hermes_native
