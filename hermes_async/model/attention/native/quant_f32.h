// int8_gemv and int4_gemv for float32 activations, on AVX2 + FMA (every x86 CPU since Haswell
// and Zen 1; the AVX-512 ones too): the CPUs without native bfloat16, whose auto dtype is
// float32 (dtype.py), and float32 models anywhere.
//
// The same packed weights as the bfloat16 kernels (int8_gemv.h, int4_gemv.h): pair rows of 16
// outputs x 2 k, int8 a byte each, int4 a nibble each. Half a pair row (8 outputs) widens in
// registers to two float32 vectors, k even and k odd (exact: small integers), and each row of x
// adds x[k] and x[k + 1] broadcast times them (FMA, float32 accumulation); each scale group's
// sum is scaled once (int4: scale * sum(x q) + min * sum(x over the group), the row sums of x
// per group computed once per call). So the product is x times the dequantized weight up to
// float32 rounding, streaming a byte (int8) or half a byte (int4) per weight.
//   quant_f32_gemv<INT4>(out [M, N] f32, x [M, K] f32, packed, scales, mins or nullptr):
//     any M, in passes of up to 8 rows (6 with groups), each reading the weight once.
#pragma once

#include "common.h"

namespace hermes_native {

inline bool quant_f32_supported() {
#if defined(__AVX2__) && defined(__FMA__)
  return true;
#else
  return false;
#endif
}

#if defined(__AVX2__) && defined(__FMA__)
// rows per weight pass, one scale per output (12 spilled registers: 2.6x 8's time per row)
constexpr int64_t QF32_PASS_ROWS = 8;
constexpr int64_t QF32_GROUPED_PASS_ROWS = 6;   // with scale groups (partial sums too)
constexpr int64_t QF32_PREFETCH = 16;           // pair rows ahead

// Half a pair row (8 outputs x 2 k) as float32 vectors of the even and the odd k.
template <bool INT4>
inline void widen_half(const uint8_t* p, __m256& even, __m256& odd) {
  if constexpr (INT4) {  // 8 bytes, low nibble k even
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    even = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));
    odd = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
  } else {  // 16 bytes: the int16 word of output i is q[2p + 1] * 256 + (uint8) q[2p]
    const __m256i w = _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    even = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(w, 24), 24));
    odd = _mm256_cvtepi32_ps(_mm256_srai_epi32(w, 8));
  }
}

// What one call's passes share: the weight's geometry and pointers.
struct QuantF32Weight {
  const uint8_t* w;
  const float* scales;
  const float* mins;  // int4 only
  int64_t k, k2, gp, groups;
};

// M rows x J halves (8 outputs each) from half h0; xs: [M][groups] row sums of x (int4)
template <bool INT4, bool GROUPED, int M, int J>
inline void quant_f32_halves(const QuantF32Weight& q, const float* x, const float* xs,
                             int64_t h0, float* out, int64_t n) {
  constexpr int64_t row_bytes = INT4 ? 16 : 32, half_bytes = row_bytes / 2;
  const uint8_t* base[J];
  for (int j = 0; j < J; ++j)
    base[j] = q.w + ((h0 + j) / 2) * q.k2 * row_bytes + ((h0 + j) % 2) * half_bytes;
  __m256 acc[M][J];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < J; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t g = 0; g < q.groups; ++g) {
    __m256 part[M][J];
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < J; ++j) part[m][j] = _mm256_setzero_ps();
    for (int64_t p = g * q.gp; p < (g + 1) * q.gp; ++p) {
      if (p + QF32_PREFETCH < q.k2 && (p * row_bytes) % 64 == 0)
        for (int j = 0; j < J; j += 2)  // one cache line of each block's stream
          _mm_prefetch(reinterpret_cast<const char*>(base[j] + (p + QF32_PREFETCH) * row_bytes),
                       _MM_HINT_T0);
      for (int j = 0; j < J; ++j) {
        __m256 even, odd;
        widen_half<INT4>(base[j] + p * row_bytes, even, odd);
        for (int m = 0; m < M; ++m) {
          const float* xm = x + m * q.k + 2 * p;
          part[m][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(xm), even, part[m][j]);
          part[m][j] = _mm256_fmadd_ps(_mm256_broadcast_ss(xm + 1), odd, part[m][j]);
        }
      }
    }
    if constexpr (GROUPED) {
      for (int j = 0; j < J; ++j) {
        const int64_t at = (((h0 + j) / 2) * q.groups + g) * 16 + ((h0 + j) % 2) * 8;
        const __m256 s = _mm256_loadu_ps(q.scales + at);
        for (int m = 0; m < M; ++m) acc[m][j] = _mm256_fmadd_ps(part[m][j], s, acc[m][j]);
        if constexpr (INT4) {
          const __m256 z = _mm256_loadu_ps(q.mins + at);
          for (int m = 0; m < M; ++m)
            acc[m][j] = _mm256_fmadd_ps(_mm256_set1_ps(xs[m * q.groups + g]), z, acc[m][j]);
        }
      }
    } else {
      for (int m = 0; m < M; ++m)
        for (int j = 0; j < J; ++j) acc[m][j] = part[m][j];
    }
  }
  for (int j = 0; j < J; ++j) {
    const __m256 s = GROUPED ? _mm256_set1_ps(1.0f)
                             : _mm256_loadu_ps(q.scales + ((h0 + j) / 2) * 16 + ((h0 + j) % 2) * 8);
    for (int m = 0; m < M; ++m) _mm256_storeu_ps(out + m * n + (h0 + j) * 8,
                                                 _mm256_mul_ps(acc[m][j], s));
  }
}

// halves [begin, end) for M rows: J halves at a time while the accumulators fit 16 registers
template <bool INT4, bool GROUPED, int M>
void quant_f32_rows(const QuantF32Weight& q, const float* x, const float* xs, int64_t begin,
                    int64_t end, float* out, int64_t n) {
  constexpr int J = GROUPED ? (M == 1 ? 4 : (M == 2 ? 2 : 1))
                            : (M == 1 ? 8 : (M == 2 ? 4 : (M <= 6 ? 2 : 1)));  // M <= 8
  int64_t h = begin;
  for (; h + J <= end; h += J) quant_f32_halves<INT4, GROUPED, M, J>(q, x, xs, h, out, n);
  for (; h < end; ++h) quant_f32_halves<INT4, GROUPED, M, 1>(q, x, xs, h, out, n);
}

#define HERMES_QF32_ROWS(M) \
  case M: quant_f32_rows<INT4, GROUPED, M>(q, x, xs, begin, end, out, n); break;

template <bool INT4, bool GROUPED>
void quant_f32_pass(int64_t m, const QuantF32Weight& q, const float* x, const float* xs,
                    int64_t begin, int64_t end, float* out, int64_t n) {
  switch (m) {
    HERMES_QF32_ROWS(1) HERMES_QF32_ROWS(2) HERMES_QF32_ROWS(3) HERMES_QF32_ROWS(4)
    HERMES_QF32_ROWS(5)
    default:
      if constexpr (GROUPED) {
        quant_f32_rows<INT4, GROUPED, 6>(q, x, xs, begin, end, out, n);
      } else {
        switch (m) {
          HERMES_QF32_ROWS(6) HERMES_QF32_ROWS(7)
          default: quant_f32_rows<INT4, GROUPED, 8>(q, x, xs, begin, end, out, n); break;
        }
      }
  }
}
#undef HERMES_QF32_ROWS
#endif

// out [M, N] = x [M, K] @ dequantized weight^T, float32; groups of 2 * gp inputs along K
template <bool INT4>
void quant_f32_gemv(at::Tensor& out, const at::Tensor& x, const uint8_t* packed,
                    const float* scales, const float* mins, int64_t n, int64_t k, int64_t gp) {
  TORCH_CHECK(quant_f32_supported(), "the float32 quantized GEMV needs AVX2 and FMA");
#if defined(__AVX2__) && defined(__FMA__)
  const int64_t m = x.size(0), k2 = k / 2, groups = k2 / gp, halves = n / 8;
  const QuantF32Weight q{packed, scales, mins, k, k2, gp, groups};
  const float* xp = x.data_ptr<float>();
  std::vector<float> sums;  // each row's sums of x over each group (the mins' factor)
  if (INT4) {
    sums.resize(m * groups);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        float s = 0.0f;
        for (int64_t i = g * 2 * gp; i < (g + 1) * 2 * gp; ++i) s += xp[r * k + i];
        sums[r * groups + g] = s;
      }
  }
  const bool grouped = INT4 || groups > 1;
  const int64_t pass = grouped ? QF32_GROUPED_PASS_ROWS : QF32_PASS_ROWS;
  for (int64_t r0 = 0; r0 < m; r0 += pass) {
    const int64_t rows = std::min(pass, m - r0);
    const float* xr = xp + r0 * k;
    const float* xs = INT4 ? sums.data() + r0 * groups : nullptr;
    float* op = out.data_ptr<float>() + r0 * n;
    at::parallel_for(0, (halves + 7) / 8, 1, [&](int64_t begin, int64_t end) {
      const int64_t h0 = begin * 8, h1 = std::min(halves, end * 8);
      if (grouped)
        quant_f32_pass<INT4, true>(rows, q, xr, xs, h0, h1, op, n);
      else
        quant_f32_pass<INT4, false>(rows, q, xr, xs, h0, h1, op, n);
    });
  }
#endif
}

}  // namespace hermes_native
