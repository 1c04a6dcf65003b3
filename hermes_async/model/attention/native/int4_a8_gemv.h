// int4_a8_gemv: int4 weights times int8 activations (W4A8) on AVX2 (512 bits wide with
// AVX512-VNNI and -VBMI), for float32 or bfloat16 activations (out in x's dtype):
// the byte dot product llama.cpp runs its Q4 blocks on, over gemv_packed's int4 pair layout.
//
// The activations are quantized per row in blocks of 32 inputs when the call comes:
// d = max|x| / 127 over the block, q_x = round(x / d) (to nearest, ties to even; an all-zero
// block has d = 0), so x^ = q_x * d. The weight is int4_gemv's: w[n, k] = q[n, k] *
// scale[n, g] + min[n, g], q in 0..15, groups of a multiple of 32 along K. The product is
// x^ times the dequantized weight, up to float32 rounding:
//   y[n] = sum_g ( scale[n, g] * sum_{b in g} d_b * sum_{k in b} q[n, k] q_x[k]
//                  + min[n, g] * sum_{b in g} d_b * sum_{k in b} q_x[k] ),
// the inner sums exact in integers (vpmaddubsw: unsigned nibble times signed byte, pairs
// summed to int16, at most 2 * 15 * 127 = 3810, so 8 such steps of a 32-input block fit
// int16 before they widen to int32; with AVX512-VNNI vpdpbusd sums fours into int32). Two pair rows (32 bytes: 16 outputs x 4 inputs) are
// rearranged in registers (vpermq + vpshufb, then the nibbles split and interleaved) so that
// each 32-bit lane holds one output's 4 nibbles in input order: the row's 4 activation bytes
// then need only a broadcast, and the rearrangement is paid once for all the pass's rows (with
// AVX512-VBMI, int4_a8_block_wide: one vpermb for 64 bytes, 16 outputs a register). A
// weight costs about a sixth of an instruction against quant_f32's half at one row, and the
// activations' bytes are reused by every output. The activations are quantized by the threads,
// 8 floats at a time (the same division and rounding as the scalar definition). The
// approximation beyond the weight's own is the activations' rounding, up to half a step
// (max|x| / 254) per element: measured by loadtest/bench_quant_quality.py.
//   int4_a8_gemv(out [M, N], x [M, K] (both f32 or both bf16: bf16 x widened exactly as it
//                is quantized, out rounded once from the float32 sums), packed [N / 16, K / 2, 16] uint8,
//                scales, mins [N / 16, K / group, 16] f32, or both f16: 20 bytes a group
//                of 32 in place of 24): any M, in tiles of A8_TILE_ROWS rows, each
//                reading the weight once (passes of A8_PASS_ROWS over a block of 16
//                outputs held in cache); K % 32 == 0, group % 32 == 0.
#pragma once

#include "common.h"
#include "int4_gemv.h"

namespace hermes_native {

constexpr int64_t A8_BLOCK = 32;  // inputs per activation scale

inline bool a8_supported() {  // int4_a8_gemv and int8_a8_gemv (int8_a8_gemv.h)
#if defined(__AVX2__) && defined(__FMA__)
  return true;
#else
  return false;
#endif
}

// The byte dot products of both kernels. With AVX512-VNNI (its 256-bit form, AVX512VL:
// Zen 4, Ice Lake and later Xeons) vpdpbusd sums each 32-bit lane's four unsigned-by-signed
// byte products into an int32 accumulator in one instruction; plain AVX2 takes vpmaddubsw
// (pairs to int16) and vpmaddwd by ones (to int32). Both are exact (no saturation at the
// magnitudes these kernels feed them), so the results are the same bits either way.
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define HERMES_A8_VNNI 1
#endif

inline bool a8_vnni() {  // whether the byte kernels run on vpdpbusd
#ifdef HERMES_A8_VNNI
  return true;
#else
  return false;
#endif
}

// With AVX512-VBMI as well (Zen 4, Ice Lake and later Xeons) int4_a8_gemv runs 512 bits wide:
// one vpermb turns four pair rows (64 bytes: 16 outputs x 8 inputs) into 16 lanes of one
// output each, where the AVX2 form spends a vpermq, a vpshufb and two unpacks on 32 bytes. The
// lanes' low nibbles then hold the output's even inputs of the 8 and the high nibbles its odd
// ones, so the activations are stored evens first in each 8 (quantize_a8's interleave).
#if defined(HERMES_A8_VNNI) && defined(__AVX512VBMI__) && defined(__AVX512BW__)
#define HERMES_A8_WIDE 1
#endif

inline bool a8_wide() {  // whether int4_a8_gemv runs its 512-bit form
#ifdef HERMES_A8_WIDE
  return true;
#else
  return false;
#endif
}

// x [M, K] float32 as int8 blocks of 32: q [M, K], d [M, K / 32]; and, for a weight group
// (a multiple of 32; 0: none), each row's sum of x^ over each group (the mins' factor); where
// asked, each row's sums of q_x over each half block of 16, times 128 (halves128 [M, K / 16]:
// the offset the wide int8 kernel's unsigned weights add)
struct A8Activations {
  std::vector<int8_t> q;
  std::vector<float> d, sums;
  std::vector<int32_t> halves128;
};

// one block of 32: q_x into qb, returns d; *total = the sum of q_x. With evens_first each 8
// bytes are stored as inputs 0, 2, 4, 6, 1, 3, 5, 7 of their 8 (the wide int4 kernel's order).
#if defined(__AVX2__)
inline __m256 load8_x(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8_x(const bf16* p) {  // 8 bfloat16 widened exactly
  return _mm256_castsi256_ps(_mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
#endif

// the kernels' outputs (8 or 16 floats): float32 as summed, or rounded to bfloat16 to nearest
// even (the same bits as summing in float32 and converting after)
template <typename V>
inline void a8_store(float* p, V v) { std::memcpy(p, &v, sizeof v); }
template <typename V>
inline void a8_store(bf16* p, V v) { store_bf16(p, v); }

template <typename T>
inline float quantize_a8_block(const T* xb, int8_t* qb, int32_t* total,
                               bool evens_first = false) {
#if defined(__AVX2__)
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 v[4], m = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = load8_x(xb + 8 * i);
    m = _mm256_max_ps(m, _mm256_and_ps(v[i], magnitude));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_movehdup_ps(h));
  const float d = _mm_cvtss_f32(h) / 127.0f;
  if (d == 0.0f) {
    std::memset(qb, 0, A8_BLOCK);
    *total = 0;
    return d;
  }
  // x / d rounded to nearest, ties to even: the scalar path's std::nearbyint, exactly
  const __m256 dv = _mm256_set1_ps(d);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i q[4];
  for (int i = 0; i < 4; ++i)
    q[i] = _mm256_min_epi32(hi, _mm256_max_epi32(lo, _mm256_cvtps_epi32(_mm256_round_ps(
                                _mm256_div_ps(v[i], dv), _MM_FROUND_TO_NEAREST_INT |
                                                         _MM_FROUND_NO_EXC))));
  const __m256i sum4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum4), _mm256_extracti128_si256(sum4, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  *total = _mm_cvtsi128_si32(t);
  // int32 -> int8 packs work per 128-bit lane: put the 32 bytes back in order
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if (evens_first)
    ordered = _mm256_shuffle_epi8(ordered, _mm256_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14,
                                                            9, 11, 13, 15, 0, 2, 4, 6, 1, 3, 5,
                                                            7, 8, 10, 12, 14, 9, 11, 13, 15));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), ordered);
  return d;
#else
  float amax = 0.0f;
  for (int64_t i = 0; i < A8_BLOCK; ++i) amax = std::max(amax, std::fabs(static_cast<float>(xb[i])));
  const float d = amax / 127.0f;
  int32_t sum = 0;
  for (int64_t i = 0; i < A8_BLOCK; ++i) {
    const int32_t v =
        d == 0.0f ? 0 : static_cast<int32_t>(std::nearbyint(static_cast<float>(xb[i]) / d));
    const int64_t at = evens_first ? (i & ~7) + (i & 1) * 4 + (i & 7) / 2 : i;
    qb[at] = static_cast<int8_t>(std::clamp(v, -127, 127));
    sum += qb[at];
  }
  *total = sum;
  return d;
#endif
}

template <typename T>
inline A8Activations quantize_a8(const T* x, int64_t m, int64_t k, int64_t group,
                                 bool evens_first = false, bool halves = false) {
  const int64_t blocks = k / A8_BLOCK, per_group = group / A8_BLOCK;
  const int64_t groups = group ? k / group : 0;
  A8Activations a{std::vector<int8_t>(m * k), std::vector<float>(m * blocks),
                  std::vector<float>(m * groups, 0.0f),
                  std::vector<int32_t>(halves ? m * 2 * blocks : 0)};
  // rows over the threads: a prefill step's activations are megabytes
  at::parallel_for(0, m, std::max<int64_t>(1, 16384 / k), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < blocks; ++b) {
        int32_t total = 0;
        const float d = quantize_a8_block(x + r * k + b * A8_BLOCK,
                                          a.q.data() + r * k + b * A8_BLOCK, &total, evens_first);
        a.d[r * blocks + b] = d;
        if (group) a.sums[r * groups + b / per_group] += d * static_cast<float>(total);
        if (halves) {  // in input order (evens_first is the int4 kernel's, not asked with it)
          const int8_t* qb = a.q.data() + r * k + b * A8_BLOCK;
          int32_t first = 0;
          for (int64_t i = 0; i < A8_BLOCK / 2; ++i) first += qb[i];
          a.halves128[r * 2 * blocks + 2 * b] = 128 * first;
          a.halves128[r * 2 * blocks + 2 * b + 1] = 128 * (total - first);
        }
      }
  });
  return a;
}

#if defined(__AVX2__) && defined(__FMA__)
constexpr int64_t A8_PASS_ROWS = 4;
constexpr int64_t A8_PREFETCH = 4096;  // bytes ahead in a block's stream

// 8 scales (or mins) as float32, from float32 or float16 (F16C: every AVX2 CPU has it)
inline __m256 load8_ps(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8_ps(const at::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// one block of 16 outputs, M rows from x row 0 of the pass
template <int M, typename S, typename O>
inline void int4_a8_block(const uint8_t* w, const S* scales, const S* mins,
                          const int8_t* xq, const float* xd, const float* xs, int64_t k,
                          int64_t groups, int64_t gp, O* out, int64_t n, int64_t nb) {
  const int64_t k2 = k / 2, blocks = k / A8_BLOCK;
  const uint8_t* wb = w + nb * k2 * 16;
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  [[maybe_unused]] const __m256i ones = _mm256_set1_epi16(1);
  // after vpermq 0xD8, each lane's pair-p bytes (0-7) interleaved with its pair-p+1 bytes (8-15)
  const __m256i weave = _mm256_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
                                         0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  // acc[m][0]: outputs 0-3 (lane 0) and 8-11 (lane 1); acc[m][1]: 4-7 and 12-15
  __m256 acc[M][2];
  for (int m = 0; m < M; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t at = (nb * groups + g) * 16;
    const __m256 sa = load8_ps(scales + at), sb = load8_ps(scales + at + 8);
    const __m256 s0 = _mm256_permute2f128_ps(sa, sb, 0x20);  // 0-3, 8-11
    const __m256 s1 = _mm256_permute2f128_ps(sa, sb, 0x31);  // 4-7, 12-15
    for (int64_t p0 = g * gp; p0 < (g + 1) * gp; p0 += A8_BLOCK / 2) {  // one x block
      __m256i sum[M][2];
      for (int m = 0; m < M; ++m) sum[m][0] = sum[m][1] = _mm256_setzero_si256();
      for (int64_t p = p0; p < p0 + A8_BLOCK / 2; p += 2) {
        if ((p & 3) == 0) _mm_prefetch(reinterpret_cast<const char*>(wb + p * 16 + A8_PREFETCH),
                                       _MM_HINT_T0);
        // pair rows p, p + 1 rearranged so that each 32-bit lane is one output's 4 nibbles,
        // inputs 2p..2p+3 in order: the row's activations then need only a broadcast
        const __m256i v = _mm256_shuffle_epi8(
            _mm256_permute4x64_epi64(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + p * 16)), 0xD8),
            weave);
        const __m256i lo = _mm256_and_si256(v, nibble);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
        const __m256i u0 = _mm256_unpacklo_epi8(lo, hi);  // outputs 0-3, 8-11
        const __m256i u1 = _mm256_unpackhi_epi8(lo, hi);  // outputs 4-7, 12-15
        for (int m = 0; m < M; ++m) {
          int32_t four;
          std::memcpy(&four, xq + m * k + 2 * p, 4);
          const __m256i a = _mm256_set1_epi32(four);
#ifdef HERMES_A8_VNNI  // int32 sums
          sum[m][0] = _mm256_dpbusd_epi32(sum[m][0], u0, a);
          sum[m][1] = _mm256_dpbusd_epi32(sum[m][1], u1, a);
#else  // int16 sums, widened once a block
          sum[m][0] = _mm256_add_epi16(sum[m][0], _mm256_maddubs_epi16(u0, a));
          sum[m][1] = _mm256_add_epi16(sum[m][1], _mm256_maddubs_epi16(u1, a));
#endif
        }
      }
      const int64_t b = (2 * p0) / A8_BLOCK;
      for (int m = 0; m < M; ++m) {
        const __m256 d = _mm256_set1_ps(xd[m * blocks + b]);
#ifdef HERMES_A8_VNNI
        const __m256i w0 = sum[m][0], w1 = sum[m][1];
#else
        const __m256i w0 = _mm256_madd_epi16(sum[m][0], ones);
        const __m256i w1 = _mm256_madd_epi16(sum[m][1], ones);
#endif
        acc[m][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(w0), _mm256_mul_ps(d, s0), acc[m][0]);
        acc[m][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(w1), _mm256_mul_ps(d, s1), acc[m][1]);
      }
    }
    const __m256 za = load8_ps(mins + at), zb = load8_ps(mins + at + 8);
    const __m256 z0 = _mm256_permute2f128_ps(za, zb, 0x20);
    const __m256 z1 = _mm256_permute2f128_ps(za, zb, 0x31);
    for (int m = 0; m < M; ++m) {
      const __m256 t = _mm256_set1_ps(xs[m * groups + g]);
      acc[m][0] = _mm256_fmadd_ps(t, z0, acc[m][0]);
      acc[m][1] = _mm256_fmadd_ps(t, z1, acc[m][1]);
    }
  }
  for (int m = 0; m < M; ++m) {
    a8_store(out + m * n + nb * 16, _mm256_permute2f128_ps(acc[m][0], acc[m][1], 0x20));
    a8_store(out + m * n + nb * 16 + 8, _mm256_permute2f128_ps(acc[m][0], acc[m][1], 0x31));
  }
}

#ifdef HERMES_A8_WIDE
// vpermb's index for four pair rows: byte 4 j + r of the result (output j, pair row r) is byte
// 16 r + j of the rows
struct PairRowsToLanes {
  alignas(64) uint8_t index[64];
  constexpr PairRowsToLanes() : index() {
    for (int i = 0; i < 64; ++i) index[i] = static_cast<uint8_t>(16 * (i % 4) + i / 4);
  }
};
inline constexpr PairRowsToLanes PAIR_ROWS_TO_LANES{};

inline __m512 load16_ps(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16_ps(const at::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// int4_a8_block, 512 bits wide: xq in quantize_a8's evens-first order
template <int M, typename S, typename O>
inline void int4_a8_block_wide(const uint8_t* w, const S* scales, const S* mins,
                               const int8_t* xq, const float* xd, const float* xs, int64_t k,
                               int64_t groups, int64_t gp, O* out, int64_t n, int64_t nb) {
  const int64_t k2 = k / 2, blocks = k / A8_BLOCK;
  const uint8_t* wb = w + nb * k2 * 16;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const __m512i to_lanes = _mm512_load_si512(PAIR_ROWS_TO_LANES.index);
  __m512 acc[M];  // lane j: output j
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t at = (nb * groups + g) * 16;
    const __m512 s = load16_ps(scales + at);
    for (int64_t p0 = g * gp; p0 < (g + 1) * gp; p0 += A8_BLOCK / 2) {  // one x block
      // even and odd inputs summed apart: two dependency chains of 4 vpdpbusd a block
      __m512i even[M], odd[M];
      for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm512_setzero_si512();
      for (int64_t p = p0; p < p0 + A8_BLOCK / 2; p += 4) {
        _mm_prefetch(reinterpret_cast<const char*>(wb + p * 16 + A8_PREFETCH), _MM_HINT_T0);
        const __m512i v = _mm512_permutexvar_epi8(
            to_lanes, _mm512_loadu_si512(reinterpret_cast<const void*>(wb + p * 16)));
        const __m512i lo = _mm512_and_si512(v, nibble);  // inputs 2p, 2p + 2, 2p + 4, 2p + 6
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);  // the odd ones
        for (int m = 0; m < M; ++m) {
          int32_t evens, odds;
          std::memcpy(&evens, xq + m * k + 2 * p, 4);
          std::memcpy(&odds, xq + m * k + 2 * p + 4, 4);
          even[m] = _mm512_dpbusd_epi32(even[m], lo, _mm512_set1_epi32(evens));
          odd[m] = _mm512_dpbusd_epi32(odd[m], hi, _mm512_set1_epi32(odds));
        }
      }
      const int64_t b = (2 * p0) / A8_BLOCK;
      for (int m = 0; m < M; ++m) {
        const __m512 d = _mm512_set1_ps(xd[m * blocks + b]);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(even[m], odd[m])),
                                 _mm512_mul_ps(d, s), acc[m]);
      }
    }
    const __m512 z = load16_ps(mins + at);
    for (int m = 0; m < M; ++m) acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(xs[m * groups + g]), z, acc[m]);
  }
  for (int m = 0; m < M; ++m) a8_store(out + m * n + nb * 16, acc[m]);
}
#endif

// The passes of both byte kernels: rows in tiles of A8_TILE_ROWS (their int8 activations
// stay in L2), each tile's blocks of 16 outputs split over the threads four at a time, and each
// block run over the tile's rows in passes of A8_PASS_ROWS while its weights stay in L1 / L2, so
// the weight streams from memory once per tile, not once per pass. run(rows, r0, nb) with rows
// a compile-time constant (std::integral_constant) for the kernel's template.
constexpr int64_t A8_TILE_ROWS = 64;

// fn(std::integral_constant<int, rows>) for 1 <= rows <= PASS
template <int PASS, typename Fn>
inline void a8_pass_rows(int64_t rows, const Fn& fn) {
  if constexpr (PASS > 1) {
    if (rows < PASS) return a8_pass_rows<PASS - 1>(rows, fn);
  }
  fn(std::integral_constant<int, PASS>{});
}

// PASS: the most rows a pass takes (the kernel's registers: A8_PASS_ROWS, or 8 for the
// per-channel int8 kernel)
template <int PASS = A8_PASS_ROWS, typename Run>
void a8_passes(int64_t m, int64_t nblocks, const Run& run) {
  for (int64_t t0 = 0; t0 < m; t0 += A8_TILE_ROWS) {
    const int64_t t1 = std::min(m, t0 + A8_TILE_ROWS);
    at::parallel_for(0, nblocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t nb = begin; nb < end; ++nb)
        for (int64_t r0 = t0; r0 < t1; r0 += PASS)
          a8_pass_rows<PASS>(std::min<int64_t>(PASS, t1 - r0), [&](auto rows) {
            run(rows, r0, nb);
          });
    });
  }
}
#endif

// M of x [M, K] and out [M, N], contiguous, both float32 or both bfloat16, checked
inline int64_t a8_rows(const at::Tensor& out, const at::Tensor& x, int64_t n, int64_t k) {
  const bool dtype = x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && dtype && x.size(1) == k,
              "x must be a contiguous float32 or bfloat16 [M, ", k, "]");
  const int64_t m = x.size(0);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == x.scalar_type() && out.dim() == 2 &&
                  out.size(0) == m && out.size(1) == n,
              "out must be a contiguous [", m, ", ", n, "] of x's dtype");
  return m;
}

// fn(x, out) with x's and out's data as float or bf16 pointers (a8_rows checked them alike)
template <typename Fn>
void a8_dispatch(at::Tensor& out, const at::Tensor& x, const Fn& fn) {
  if (x.scalar_type() == at::kBFloat16)
    fn(x.data_ptr<bf16>(), out.data_ptr<bf16>());
  else
    fn(x.data_ptr<float>(), out.data_ptr<float>());
}

inline void int4_a8_gemv(at::Tensor out, const at::Tensor& x, const at::Tensor& packed,
                         const at::Tensor& scales, const at::Tensor& mins) {
  TORCH_CHECK(a8_supported(), "int4_a8_gemv needs AVX2 and FMA");
  const auto [n, k, gp] = int4_shape(packed, scales, mins);
  TORCH_CHECK(k % A8_BLOCK == 0 && (2 * gp) % A8_BLOCK == 0, "int4_a8_gemv takes K and the "
              "group in multiples of ", A8_BLOCK, " (K = ", k, ", group ", 2 * gp, ")");
  const int64_t m = a8_rows(out, x, n, k);
#if defined(__AVX2__) && defined(__FMA__)
  const int64_t groups = k / (2 * gp), blocks = k / A8_BLOCK, nblocks = n / 16;
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  a8_dispatch(out, x, [&](const auto* xp, auto* op) {
    const A8Activations a = quantize_a8(xp, m, k, 2 * gp, a8_wide());
    const auto run = [&](const auto* sp, const auto* zp) {
      a8_passes(m, nblocks, [&](auto rows, int64_t r0, int64_t nb) {
#ifdef HERMES_A8_WIDE
        int4_a8_block_wide<decltype(rows)::value>(
#else
        int4_a8_block<decltype(rows)::value>(
#endif
            wp, sp, zp, a.q.data() + r0 * k, a.d.data() + r0 * blocks,
            a.sums.data() + r0 * groups, k, groups, gp, op + r0 * n, n, nb);
      });
    };
    if (scales.scalar_type() == at::kHalf)  // 20 bytes a group of 32 in place of 24
      run(scales.data_ptr<at::Half>(), mins.data_ptr<at::Half>());
    else
      run(scales.data_ptr<float>(), mins.data_ptr<float>());
  });
#endif
}

}  // namespace hermes_native
