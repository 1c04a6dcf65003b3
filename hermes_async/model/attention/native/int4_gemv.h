// int4_gemv: linears over 4-bit weights in groups along K (weight-only), bfloat16 activations
// here (AVX512-BF16), float32 ones in quant_f32.h (AVX2 + FMA) over the same packed weight.
//
// w[n, k] = q[n, k] * scale[n, g] + min[n, g], q in 0..15, g = k / group. The integers are
// packed at load two to a byte in gemv_packed's pair layout: [N / 16][K / 2][16] bytes, byte
// (p, lane) = q[n, 2p] | q[n, 2p + 1] << 4 (16 bytes a pair row); scales and mins float32
// [N / 16][K / group][16]. A pair row widens in registers to 16 bfloat16 pairs (the nibbles
// spread to 16-bit lanes, then a 16-entry table lookup: small integers are exact in
// bfloat16), and vdpbf16ps multiplies them by x[k], x[k + 1] broadcast; each group's sum s of
// x * q becomes scale * s + min * sum(x over the group) (the row sums of x per group computed
// once per call). So the product is x times the dequantized weight up to float32 rounding,
// reading half a byte per weight plus the group's 8 bytes of scale and min.
//   int4_gemv(out [M, N] bf16, x [M, K] bf16, packed [N / 16, K / 2, 16] uint8,
//             scales, mins [N / 16, K / group, 16] float32); any M, in passes of 8 rows.
//   int4_dequantize(out [N, K] bf16 or f32, packed, scales, mins): the weight, for steps of
//             many rows (scales and mins float32 or float16).
#pragma once

#include "common.h"
#include "quant_f32.h"

namespace hermes_native {

constexpr int64_t INT4_PASS_ROWS = 8;
constexpr int64_t INT4_PREFETCH = 64;  // pair rows ahead (1 KB of each stream)

// bfloat16 activations on AVX512-BF16 (here), float32 on AVX2 + FMA (quant_f32.h)
inline bool int4_gemv_supported(c10::ScalarType dtype) {
  if (dtype == at::kFloat) return quant_f32_supported();
#if defined(HERMES_PACKED)
  return dtype == at::kBFloat16;
#else
  return false;
#endif
}

#if defined(HERMES_PACKED)
// 16 bytes (16 outputs x 2 k nibbles) as 16 bfloat16 pairs, lane i = output i.
inline __m512i widen_nibbles(const uint8_t* p, __m512i table) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i lo = _mm512_and_si512(b, _mm512_set1_epi32(0x0F));
  const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(b, _mm512_set1_epi32(0xF0)), 12);
  return _mm512_permutexvar_epi16(_mm512_or_si512(lo, hi), table);
}

inline __m512i nibble_table() {  // bfloat16 bits of 0..15 in the first 16 words
  alignas(64) uint16_t t[32];
  for (int i = 0; i < 32; ++i) {
    const float f = static_cast<float>(i & 15);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    t[i] = static_cast<uint16_t>(bits >> 16);
  }
  return _mm512_load_si512(t);
}

// J blocks of 16 outputs from block nb0, M rows; gp pairs per group; xs [M][groups] row sums
template <int M, int J>
inline void int4_blocks(const uint32_t* x, const float* xs, int64_t k2, int64_t gp,
                        const uint8_t* w, const float* scales, const float* mins, int64_t nb0,
                        bf16* out, int64_t n, __m512i table) {
  const int64_t groups = k2 / gp;
  __m512 acc[M][J];
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < J; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    __m512 part[M][J];
    for (int m = 0; m < M; ++m)
      for (int j = 0; j < J; ++j) part[m][j] = _mm512_setzero_ps();
    for (int64_t p = g * gp; p < (g + 1) * gp; ++p) {
      if ((p & 3) == 0 && p + INT4_PREFETCH < k2)  // a cache line (4 pair rows) per stream
        for (int j = 0; j < J; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(w + ((nb0 + j) * k2 + p + INT4_PREFETCH) *
                                                           16),
                       _MM_HINT_T0);
      __m512i wv[J];
      for (int j = 0; j < J; ++j) wv[j] = widen_nibbles(w + ((nb0 + j) * k2 + p) * 16, table);
      for (int m = 0; m < M; ++m) {
        const __m512i xv = _mm512_set1_epi32(static_cast<int>(x[m * k2 + p]));
        for (int j = 0; j < J; ++j)
          part[m][j] = _mm512_dpbf16_ps(part[m][j], (__m512bh)xv, (__m512bh)wv[j]);
      }
    }
    for (int j = 0; j < J; ++j) {
      const int64_t at = ((nb0 + j) * groups + g) * 16;
      const __m512 s = _mm512_loadu_ps(scales + at), z = _mm512_loadu_ps(mins + at);
      for (int m = 0; m < M; ++m)
        acc[m][j] = _mm512_fmadd_ps(_mm512_set1_ps(xs[m * groups + g]), z,
                                    _mm512_fmadd_ps(part[m][j], s, acc[m][j]));
    }
  }
  for (int m = 0; m < M; ++m)
    for (int j = 0; j < J; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * n + (nb0 + j) * 16),
                          (__m256i)_mm512_cvtneps_pbh(acc[m][j]));
}

template <int M>
void int4_rows(const uint32_t* x, const float* xs, int64_t k2, int64_t gp, const uint8_t* w,
               const float* scales, const float* mins, int64_t begin, int64_t end, bf16* out,
               int64_t n) {
  constexpr int J = M <= 2 ? 4 : (M <= 4 ? 2 : 1);  // accumulators and partial sums
  const __m512i table = nibble_table();
  int64_t nb = begin;
  for (; nb + J <= end; nb += J)
    int4_blocks<M, J>(x, xs, k2, gp, w, scales, mins, nb, out, n, table);
  for (; nb < end; ++nb) int4_blocks<M, 1>(x, xs, k2, gp, w, scales, mins, nb, out, n, table);
}
#endif

// (N, K, pairs per group) from the packed form
inline std::tuple<int64_t, int64_t, int64_t> int4_shape(const at::Tensor& packed,
                                                        const at::Tensor& scales,
                                                        const at::Tensor& mins) {
  TORCH_CHECK(packed.dim() == 3 && packed.is_contiguous() && packed.size(2) == 16 &&
                  packed.scalar_type() == at::kByte,
              "packed must be uint8 [N / 16, K / 2, 16]");
  const int64_t nb = packed.size(0), k2 = packed.size(1);
  for (const at::Tensor* t : {&scales, &mins})
    TORCH_CHECK(t->dim() == 3 && t->is_contiguous() && t->size(0) == nb && t->size(2) == 16 &&
                    (t->scalar_type() == at::kFloat || t->scalar_type() == at::kHalf) &&
                    t->scalar_type() == scales.scalar_type() && t->size(1) == scales.size(1),
                "scales and mins must be float32 (or both float16) [N / 16, K / group, 16]");
  const int64_t groups = scales.size(1);
  TORCH_CHECK(groups >= 1 && k2 % groups == 0, "K / 2 = ", k2, " pairs do not split into ",
              groups, " groups");
  return {nb * 16, k2 * 2, k2 / groups};
}

inline void int4_gemv(at::Tensor out, const at::Tensor& x, const at::Tensor& packed,
                      const at::Tensor& scales, const at::Tensor& mins) {
  const auto [n, k, gp] = int4_shape(packed, scales, mins);
  const auto dtype = x.scalar_type();
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (dtype == at::kBFloat16 ||
                  dtype == at::kFloat) && x.size(1) == k,
              "x must be a contiguous bfloat16 or float32 [M, ", k, "]");
  const int64_t m = x.size(0);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == dtype && out.dim() == 2 &&
                  out.size(0) == m && out.size(1) == n,
              "out must be a contiguous [", m, ", ", n, "] of x's dtype");
  TORCH_CHECK(int4_gemv_supported(dtype), "int4_gemv in ", dtype, " needs ",
              dtype == at::kFloat ? "AVX2 and FMA" : "AVX512-BF16");
  TORCH_CHECK(scales.scalar_type() == at::kFloat, "int4_gemv reads float32 scales and mins "
              "(float16 ones: int4_a8_gemv, int4_dequantize)");
  if (dtype == at::kFloat) {
    quant_f32_gemv<true>(out, x, packed.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                         mins.data_ptr<float>(), n, k, gp);
    return;
  }
#if defined(HERMES_PACKED)
  const int64_t k2 = k / 2, blocks = n / 16, groups = k2 / gp, group = 2 * gp;
  // each row's sums of x over each group (the mins' factor), float32
  std::vector<float> sums(m * groups);
  const bf16* xb = x.data_ptr<bf16>();
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.0f;
      for (int64_t i = g * group; i < (g + 1) * group; ++i) s += static_cast<float>(xb[r * k + i]);
      sums[r * groups + g] = s;
    }
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* zp = mins.data_ptr<float>();
  for (int64_t r0 = 0; r0 < m; r0 += INT4_PASS_ROWS) {
    const int64_t rows = std::min(INT4_PASS_ROWS, m - r0);
    const uint32_t* xp = reinterpret_cast<const uint32_t*>(xb + r0 * k);
    const float* xs = sums.data() + r0 * groups;
    bf16* op = out.data_ptr<bf16>() + r0 * n;
    at::parallel_for(0, (blocks + 3) / 4, 1, [&](int64_t begin, int64_t end) {
      const int64_t b0 = begin * 4, b1 = std::min(blocks, end * 4);
      switch (rows) {
        case 1: int4_rows<1>(xp, xs, k2, gp, wp, sp, zp, b0, b1, op, n); break;
        case 2: int4_rows<2>(xp, xs, k2, gp, wp, sp, zp, b0, b1, op, n); break;
        case 3: int4_rows<3>(xp, xs, k2, gp, wp, sp, zp, b0, b1, op, n); break;
        case 4: int4_rows<4>(xp, xs, k2, gp, wp, sp, zp, b0, b1, op, n); break;
        case 5: int4_rows<5>(xp, xs, k2, gp, wp, sp, zp, b0, b1, op, n); break;
        case 6: int4_rows<6>(xp, xs, k2, gp, wp, sp, zp, b0, b1, op, n); break;
        case 7: int4_rows<7>(xp, xs, k2, gp, wp, sp, zp, b0, b1, op, n); break;
        default: int4_rows<8>(xp, xs, k2, gp, wp, sp, zp, b0, b1, op, n); break;
      }
    });
  }
#endif
}

// the weight row by row as q * scale + min, rounded to T; S: the scales' type (float32, or
// float16 where quant/weights.py narrowed them)
template <typename T, typename S>
void int4_dequantize_rows(T* op, const uint8_t* wp, const S* sp, const S* zp, int64_t n,
                          int64_t k, int64_t gp) {
  const int64_t k2 = k / 2, groups = k2 / gp;
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t nb = row / 16, lane = row % 16;
      T* o = op + row * k;
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t at = (nb * groups + g) * 16 + lane;
        const float s = static_cast<float>(sp[at]), z = static_cast<float>(zp[at]);
        for (int64_t p = g * gp; p < (g + 1) * gp; ++p) {
          const uint8_t b = wp[(nb * k2 + p) * 16 + lane];
          o[2 * p] = static_cast<T>(static_cast<float>(b & 15) * s + z);
          o[2 * p + 1] = static_cast<T>(static_cast<float>(b >> 4) * s + z);
        }
      }
    }
  });
}

inline void int4_dequantize(at::Tensor out, const at::Tensor& packed, const at::Tensor& scales,
                            const at::Tensor& mins) {
  const auto [n, k, gp] = int4_shape(packed, scales, mins);
  TORCH_CHECK(out.is_contiguous() && (out.scalar_type() == at::kBFloat16 ||
                  out.scalar_type() == at::kFloat) && out.dim() == 2 &&
                  out.size(0) == n && out.size(1) == k,
              "out must be a contiguous bfloat16 or float32 [", n, ", ", k, "]");
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const auto rows = [&](const auto* sp, const auto* zp) {
    if (out.scalar_type() == at::kFloat)
      int4_dequantize_rows(out.data_ptr<float>(), wp, sp, zp, n, k, gp);
    else
      int4_dequantize_rows(out.data_ptr<bf16>(), wp, sp, zp, n, k, gp);
  };
  if (scales.scalar_type() == at::kHalf)
    rows(scales.data_ptr<at::Half>(), mins.data_ptr<at::Half>());
  else
    rows(scales.data_ptr<float>(), mins.data_ptr<float>());
}

}  // namespace hermes_native
