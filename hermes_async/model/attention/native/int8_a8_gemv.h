// int8_a8_gemv: int8 weights times int8 activations (W8A8) on AVX2, for float32 or bfloat16
// activations (out in their dtype):
// llama.cpp's Q8_0 x Q8_0 byte arithmetic over gemv_packed's int8 pair layout.
//
// The activations are quantized as int4_a8_gemv's (int4_a8_gemv.h: blocks of 32 inputs,
// d = max|x| / 127, q_x = round(x / d)); the weight is int8_gemv's: w[n, k] = q[n, k] *
// scale[n, g], |q| <= 127 (-128 taken too), groups of 16 (Q6_K's), a multiple of 32 along K,
// or one per output channel. The product is x^ times the dequantized weight, up to float32 rounding:
//   y[n] = sum_g scale[n, g] * sum_{b in g} d_b * sum_{k in b} q[n, k] q_x[k],
// the inner sums exact in int32. Two pair rows (64 bytes: 16 outputs x 4 inputs) interleave to
// two registers of 8 outputs x 4 bytes; vpmaddubsw takes |q| (unsigned) times q_x carrying q's
// sign (vpsignb), pairs summed to int16 (at most 2 * 128 * 127 = 32512: no saturation), and
// vpmaddwd by ones sums each output's two pairs to int32 (with AVX512-VNNI one vpdpbusd does
// both). About 9 instructions per row per 64
// weights against quant_f32's 16: the rows of a batch cost less than half. With AVX512-VBMI
// (HERMES_A8_WIDE) the block is 512 bits wide: one vpermb turns two pair rows into 16 outputs
// x 4 inputs, the weights go unsigned (q + 128) for vpdpbusd, and 128 times each half-block's
// sum of q_x comes off the int32 sums (int8_a8_block_wide).
//   int8_a8_gemv(out [M, N], x [M, K] (both f32 or both bf16, as int4_a8_gemv's),
//                packed [N / 16, K / 2, 16, 2] int8,
//                scales [N / 16, K / group, 16] f32): any M, in int4_a8_gemv's tiles
//                of A8_TILE_ROWS rows, each reading the weight once; K % 32 == 0;
//                groups of 16, a multiple of 32, or K.
#pragma once

#include "common.h"
#include "int4_a8_gemv.h"
#include "int8_gemv.h"

namespace hermes_native {

#if defined(__AVX2__) && defined(__FMA__)
// one block of 16 outputs, M rows from x row 0 of the pass
template <int M, typename O>
inline void int8_a8_block(const int8_t* w, const float* scales, const int8_t* xq,
                          const float* xd, int64_t k, int64_t groups, int64_t gp, O* out,
                          int64_t n, int64_t nb) {
  const int64_t k2 = k / 2, blocks = k / A8_BLOCK;
  const int8_t* wb = w + nb * k2 * 32;
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  // acc[m][0]: outputs 0-3 (lane 0) and 8-11 (lane 1); acc[m][1]: 4-7 and 12-15
  __m256 acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  // chunks of one scale each: a weight group (16, 32 or more inputs) within an x block
  const int64_t chunk = std::min<int64_t>(gp, A8_BLOCK / 2);  // pair rows
  for (int64_t p0 = 0; p0 < k2; p0 += chunk) {
    const int64_t at = (nb * groups + p0 / gp) * 16;
    // the group's scales in the accumulators' order of outputs, times the x block's
    const __m256 sa = _mm256_loadu_ps(scales + at), sb = _mm256_loadu_ps(scales + at + 8);
    const __m256 s0 = _mm256_permute2f128_ps(sa, sb, 0x20);  // 0-3, 8-11
    const __m256 s1 = _mm256_permute2f128_ps(sa, sb, 0x31);  // 4-7, 12-15
    __m256i sum[M][2];
    for (int m = 0; m < M; ++m) sum[m][0] = sum[m][1] = _mm256_setzero_si256();
    for (int64_t p = p0; p < p0 + chunk; p += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(wb + p * 32 + A8_PREFETCH), _MM_HINT_T0);
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + p * 32));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + p * 32 + 32));
      // each output's 4 inputs 2p..2p+3 in a 32-bit lane
      const __m256i u0 = _mm256_unpacklo_epi16(v0, v1);  // outputs 0-3, 8-11
      const __m256i u1 = _mm256_unpackhi_epi16(v0, v1);  // outputs 4-7, 12-15
      const __m256i a0 = _mm256_abs_epi8(u0), a1 = _mm256_abs_epi8(u1);
      for (int m = 0; m < M; ++m) {
        int32_t four;
        std::memcpy(&four, xq + m * k + 2 * p, 4);
        const __m256i xv = _mm256_set1_epi32(four);
#ifdef HERMES_A8_VNNI
        sum[m][0] = _mm256_dpbusd_epi32(sum[m][0], a0, _mm256_sign_epi8(xv, u0));
        sum[m][1] = _mm256_dpbusd_epi32(sum[m][1], a1, _mm256_sign_epi8(xv, u1));
#else
        const __m256i d0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(xv, u0));
        const __m256i d1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(xv, u1));
        sum[m][0] = _mm256_add_epi32(sum[m][0], _mm256_madd_epi16(d0, ones));
        sum[m][1] = _mm256_add_epi32(sum[m][1], _mm256_madd_epi16(d1, ones));
#endif
      }
    }
    const int64_t b = (2 * p0) / A8_BLOCK;
    for (int m = 0; m < M; ++m) {
      const __m256 d = _mm256_set1_ps(xd[m * blocks + b]);
      acc[m][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m][0]), _mm256_mul_ps(d, s0),
                                  acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[m][1]), _mm256_mul_ps(d, s1),
                                  acc[m][1]);
    }
  }
  for (int m = 0; m < M; ++m) {
    a8_store(out + m * n + nb * 16, _mm256_permute2f128_ps(acc[m][0], acc[m][1], 0x20));
    a8_store(out + m * n + nb * 16 + 8, _mm256_permute2f128_ps(acc[m][0], acc[m][1], 0x31));
  }
}

#endif

#ifdef HERMES_A8_WIDE
// vpermb's index for two pair rows: byte 4 j + 2 r + t of the result (output j, pair row r,
// input t of the pair) is byte 32 r + 2 j + t of the rows
struct Int8PairRowsToLanes {
  alignas(64) uint8_t index[64];
  constexpr Int8PairRowsToLanes() : index() {
    for (int i = 0; i < 64; ++i)
      index[i] = static_cast<uint8_t>(32 * ((i % 4) / 2) + 2 * (i / 4) + i % 2);
  }
};
inline constexpr Int8PairRowsToLanes INT8_PAIR_ROWS_TO_LANES{};

// int8_a8_block, 512 bits wide: one vpermb puts 16 outputs x 4 inputs in 16 lanes, and the
// weights go unsigned (q + 128, 0..255: -128 too) for vpdpbusd with the activations as they
// are; each chunk's sum then carries 128 times the chunk's sum of q_x, taken off before it is
// scaled (halves128: quantize_a8's half-block sums, times 128)
template <int M, typename O>
inline void int8_a8_block_wide(const int8_t* w, const float* scales, const int8_t* xq,
                               const float* xd, const int32_t* halves128, int64_t k,
                               int64_t groups, int64_t gp, O* out, int64_t n, int64_t nb) {
  const int64_t k2 = k / 2, blocks = k / A8_BLOCK;
  const int8_t* wb = w + nb * k2 * 32;
  const __m512i to_lanes = _mm512_load_si512(INT8_PAIR_ROWS_TO_LANES.index);
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[M];  // lane j: output j
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  const int64_t chunk = std::min<int64_t>(gp, A8_BLOCK / 2);  // pair rows of one scale
  for (int64_t p0 = 0; p0 < k2; p0 += chunk) {
    const __m512 s = _mm512_loadu_ps(scales + (nb * groups + p0 / gp) * 16);
    __m512i sum[M][2];  // two dependency chains
    for (int m = 0; m < M; ++m) sum[m][0] = sum[m][1] = _mm512_setzero_si512();
    for (int64_t p = p0; p < p0 + chunk; p += 4) {
      _mm_prefetch(reinterpret_cast<const char*>(wb + p * 32 + A8_PREFETCH), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(wb + p * 32 + A8_PREFETCH + 64), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const __m512i v = _mm512_xor_si512(
            _mm512_permutexvar_epi8(to_lanes, _mm512_loadu_si512(
                                                  reinterpret_cast<const void*>(wb + (p + 2 * h) * 32))),
            offset);
        for (int m = 0; m < M; ++m) {
          int32_t four;
          std::memcpy(&four, xq + m * k + 2 * (p + 2 * h), 4);
          sum[m][h] = _mm512_dpbusd_epi32(sum[m][h], v, _mm512_set1_epi32(four));
        }
      }
    }
    const int64_t b = (2 * p0) / A8_BLOCK, half = (2 * p0) / (A8_BLOCK / 2);
    for (int m = 0; m < M; ++m) {
      const int32_t* h128 = halves128 + m * 2 * blocks;
      const int32_t off = chunk == A8_BLOCK / 2 ? h128[half] + h128[half + 1] : h128[half];
      const __m512i exact = _mm512_sub_epi32(_mm512_add_epi32(sum[m][0], sum[m][1]),
                                             _mm512_set1_epi32(off));
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact),
                               _mm512_mul_ps(_mm512_set1_ps(xd[m * blocks + b]), s), acc[m]);
    }
  }
  for (int m = 0; m < M; ++m) a8_store(out + m * n + nb * 16, acc[m]);
}

// int8_a8_block_wide for one scale per output channel (the int8 scheme's weights), in passes of
// up to A8_CHANNEL_PASS_ROWS rows: each x block's int32 sums, offset included, are scaled by
// the block's d alone into float32 (one conversion and one fma a row per 8 vpdpbusd), and the
// row's offset (sum over the blocks of d x 128 x the block's sum of q_x: offsets) and the
// channel's scale come off once at the end. Twice the rows of a pass read each vpermb'd
// weight register twice as often: at 32 rows the byte products, not the rearranging, fill the
// pipes.
constexpr int A8_CHANNEL_PASS_ROWS = 8;

template <int M, typename O>
inline void int8_a8_channel_wide(const int8_t* w, const float* scales, const int8_t* xq,
                                 const float* xd, const float* offsets, int64_t k, O* out,
                                 int64_t n, int64_t nb) {
  const int64_t k2 = k / 2, blocks = k / A8_BLOCK;
  const int8_t* wb = w + nb * k2 * 32;
  const __m512i to_lanes = _mm512_load_si512(INT8_PAIR_ROWS_TO_LANES.index);
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  constexpr int C = M <= 2 ? 2 : 1;  // dependency chains a row: two for one or two rows (the
                                     // last pass of a call)
  __m512 acc[M];                     // lane j: output j
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i sum[M][C];
    for (int m = 0; m < M; ++m)
      for (int c = 0; c < C; ++c) sum[m][c] = _mm512_setzero_si512();
    for (int64_t p = b * (A8_BLOCK / 2); p < (b + 1) * (A8_BLOCK / 2); p += 2 * C) {
      for (int c = 0; c < C; ++c) {
        const int8_t* at = wb + (p + 2 * c) * 32;  // two pair rows: one cache line
        _mm_prefetch(reinterpret_cast<const char*>(at + A8_PREFETCH), _MM_HINT_T0);
        const __m512i v = _mm512_xor_si512(
            _mm512_permutexvar_epi8(to_lanes, _mm512_loadu_si512(reinterpret_cast<const void*>(at))),
            offset);
        for (int m = 0; m < M; ++m) {
          int32_t four;
          std::memcpy(&four, xq + m * k + 2 * (p + 2 * c), 4);
          sum[m][c] = _mm512_dpbusd_epi32(sum[m][c], v, _mm512_set1_epi32(four));
        }
      }
    }
    for (int m = 0; m < M; ++m) {
      __m512i total = sum[m][0];
      if constexpr (C == 2) total = _mm512_add_epi32(total, sum[m][1]);
      acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(xd[m * blocks + b]),
                               acc[m]);
    }
  }
  const __m512 s = _mm512_loadu_ps(scales + nb * 16);
  for (int m = 0; m < M; ++m)
    a8_store(out + m * n + nb * 16,
               _mm512_mul_ps(s, _mm512_sub_ps(acc[m], _mm512_set1_ps(offsets[m]))));
}

// each row's offset of int8_a8_channel_wide: sum over the blocks of d x 128 x sum of q_x
inline std::vector<float> int8_a8_row_offsets(const A8Activations& a, int64_t m,
                                              int64_t blocks) {
  std::vector<float> offsets(m);
  for (int64_t r = 0; r < m; ++r) {
    double total = 0.0;
    const int32_t* h128 = a.halves128.data() + r * 2 * blocks;
    for (int64_t b = 0; b < blocks; ++b)
      total += static_cast<double>(a.d[r * blocks + b]) * (h128[2 * b] + h128[2 * b + 1]);
    offsets[r] = static_cast<float>(total);
  }
  return offsets;
}
#endif

inline void int8_a8_gemv(at::Tensor out, const at::Tensor& x, const at::Tensor& packed,
                         const at::Tensor& scales) {
  TORCH_CHECK(a8_supported(), "int8_a8_gemv needs AVX2 and FMA");
  const auto [n, k, gp] = int8_shape(packed, scales);
  TORCH_CHECK(k % A8_BLOCK == 0 && (2 * gp == A8_BLOCK / 2 || (2 * gp) % A8_BLOCK == 0),
              "int8_a8_gemv takes K in multiples of ", A8_BLOCK, " and groups of 16 or a "
              "multiple of ", A8_BLOCK, " (K = ", k, ", group ", 2 * gp, ")");
  const int64_t m = a8_rows(out, x, n, k);
#if defined(__AVX2__) && defined(__FMA__)
  const int64_t groups = k / (2 * gp), blocks = k / A8_BLOCK, nblocks = n / 16;
  const int8_t* wp = packed.data_ptr<int8_t>();
  const float* sp = scales.data_ptr<float>();
  a8_dispatch(out, x, [&](const auto* xp, auto* op) {
    const A8Activations a = quantize_a8(xp, m, k, 0, false, a8_wide());
#ifdef HERMES_A8_WIDE
    if (groups == 1 && m > 2) {  // per output channel, three rows or more (at one or two the
                                 // blocks' kernel below measured faster: 0.93x)
      const std::vector<float> offsets = int8_a8_row_offsets(a, m, blocks);
      a8_passes<A8_CHANNEL_PASS_ROWS>(m, nblocks, [&](auto rows, int64_t r0, int64_t nb) {
        int8_a8_channel_wide<decltype(rows)::value>(wp, sp, a.q.data() + r0 * k,
                                                    a.d.data() + r0 * blocks,
                                                    offsets.data() + r0, k, op + r0 * n, n, nb);
      });
      return;
    }
#endif
    a8_passes(m, nblocks, [&](auto rows, int64_t r0, int64_t nb) {
#ifdef HERMES_A8_WIDE
      int8_a8_block_wide<decltype(rows)::value>(wp, sp, a.q.data() + r0 * k,
                                                a.d.data() + r0 * blocks,
                                                a.halves128.data() + r0 * 2 * blocks, k, groups,
                                                gp, op + r0 * n, n, nb);
#else
      int8_a8_block<decltype(rows)::value>(wp, sp, a.q.data() + r0 * k, a.d.data() + r0 * blocks,
                                           k, groups, gp, op + r0 * n, n, nb);
#endif
    });
  });
#endif
}

}  // namespace hermes_native
