// Shared by the attention paths: vector helpers, work items, per-thread scratch.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX__)
#include <immintrin.h>
#endif
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define HERMES_PACKED 1
#endif

namespace hermes_native {

using bf16 = c10::BFloat16;
constexpr int VL = 8;  // floats per vector of the rows path
typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(32)));
typedef uint16_t vh __attribute__((vector_size(16)));

#if defined(__AVX512F__)
constexpr int QK_ROWS = 3;  // rows of the Q.K^T micro-kernel: 3 x 8 accumulators
constexpr int PV_ROWS = 4;  // rows of the P.V micro-kernel: 4 x 4 accumulators
#else
constexpr int QK_ROWS = 1;
constexpr int PV_ROWS = 2;
#endif
constexpr int PV_CHUNKS = 4;   // head_dim chunks of 8 per P.V pass
constexpr int TILE_ROWS = 48;  // query rows (tokens x heads of a group) per prefill tile
constexpr int CHUNK = 64;      // keys per softmax step of the packed path (whole blocks)
constexpr int ROWS_CHUNK = 128;  // keys per softmax step of the rows and dot paths
constexpr int DIRECT_ROWS = 8;   // rows path: up to this many rows read bf16 K/V in place,
                                 // more widen each block once; the dot path takes this many
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

template <typename V>
inline V splat(float x) {  // a broadcast (a plain loop of inserts for 512-bit vectors)
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) return (V)_mm512_set1_ps(x);
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) return (V)_mm256_set1_ps(x);
#endif
  V v;
  for (unsigned i = 0; i < sizeof(V) / sizeof(float); ++i) v[i] = x;
  return v;
}

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline vf load(const bf16* p) {  // 8 bfloat16 widened: the upper half of a float
  vh h;
  std::memcpy(&h, p, sizeof h);
  return (vf)(__builtin_convertvector(h, vu) << 16);
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof v); }

#if defined(__AVX512F__)
typedef float vf16 __attribute__((vector_size(64)));  // 16 floats: the AVX-512 paths
typedef int32_t vi16 __attribute__((vector_size(64)));

inline vf16 load16(const float* p) {
  vf16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store16(float* p, vf16 v) { std::memcpy(p, &v, sizeof v); }
#endif

// Stores 8 or 16 floats as bfloat16 rounded to nearest even, torch's rounding (inputs
// finite): by integer lanes, or 16 at once by vcvtneps2bf16 where AVX512-BF16 is.
inline void store_bf16(bf16* p, vf v) {
  const vu u = (vu)v;
  const vh h = __builtin_convertvector((u + 0x7fffu + ((u >> 16) & 1u)) >> 16, vh);
  std::memcpy(p, &h, sizeof h);
}

#if defined(__AVX512F__)
inline void store_bf16(bf16* p, vf16 v) {
#if defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh((__m512)v));
#else
  vf half[2];
  std::memcpy(half, &v, sizeof v);
  store_bf16(p, half[0]);
  store_bf16(p + VL, half[1]);
#endif
}
#endif

inline float hmax(vf v) {
  float m = v[0];
  for (int i = 1; i < VL; ++i) m = std::max(m, v[i]);
  return m;
}

inline float hsum(vf v) {
  float s = 0.f;
  for (int i = 0; i < VL; ++i) s += v[i];
  return s;
}

// exp(x) for x <= 0 (softmax arguments): 2^n * 2^f with n = round(x log2 e), |f| <= 1/2,
// 2^f = e^t (t = x - n ln 2) by its Taylor series to degree 6 (relative error about 2e-7);
// 0 below -86.
template <typename V, typename VI>
inline V exp_neg(V x) {
  const V lo = splat<V>(-86.f);
  V xc = x < lo ? lo : x;
  V y = xc * 1.44269504088896341f;
  V yr = y + (y >= splat<V>(0.f) ? splat<V>(0.5f) : splat<V>(-0.5f));
  VI n = __builtin_convertvector(yr, VI);  // truncates: round half away from zero
  const V nf = __builtin_convertvector(n, V);
  V t = xc - nf * 0.693145751953125f;  // Cody-Waite: ln 2 in two parts, t exact to 1 ulp
  t = t - nf * 1.42860682030941723212e-6f;
  V p = splat<V>(1.f / 720);
  p = p * t + 1.f / 120;
  p = p * t + 1.f / 24;
  p = p * t + 1.f / 6;
  p = p * t + 0.5f;
  p = p * t + 1.f;
  p = p * t + 1.f;
  V r = (V)((VI)p + (n << 23));
  return x < lo ? splat<V>(0.f) : r;
}

inline void prefetch_block(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i);
}

struct Item {
  int32_t seq, kv_head, tile_start, tile_len;
  int64_t cost;  // rows x keys: the order items are handed out in
  // a part of a split decode (split.h): keys [key_begin, key_end) only, the unnormalised
  // result left in partial slot `part` for the merge; part -1: the whole context, normalised
  int64_t key_begin = 0, key_end = std::numeric_limits<int64_t>::max();
  int32_t part = -1;
};

struct Shapes {
  int64_t heads, kv_heads, group, d, block_size, chunk, rows_chunk, table_width;
  int64_t q_tok_stride, cache_block_stride, cache_head_stride;
  int64_t window;  // sliding window: a query at p sees keys (p - window, p]; 0: all
};

// The first key any row from first_pos on can see, rounded down to its pool block (keys are
// walked block by block; the softmax masks the rest of that block).
inline int64_t window_start(int64_t first_pos, const Shapes& sh) {
  if (sh.window <= 0) return 0;
  const int64_t lo = std::max<int64_t>(0, first_pos - sh.window + 1);
  return lo / sh.block_size * sh.block_size;
}

// Per-thread buffers, sized for the largest item.
struct Scratch {
  std::vector<float> q, o, s, kbuf, vbuf, m, l, alpha, ones;
  std::vector<float> qt;              // columns path: Q^T
  std::vector<uint32_t> qp, pp, vp;  // packed and dot paths: Q, P and V as bf16 pairs
  Scratch(int64_t rows, const Shapes& sh, bool packed, bool columns)
      : q(rows * sh.d), o(rows * sh.d),
        s(std::max(rows * sh.rows_chunk,
                   packed || columns ? sh.chunk * ((rows + 15) / 16 * 16) : 0)),
        kbuf(sh.block_size * sh.d), vbuf(sh.block_size * sh.d), m(rows + 16), l(rows + 16),
        alpha(rows + 16), ones(rows + 16, 1.f) {
    if (columns) qt.resize(sh.d * ((rows + 15) / 16 * 16));
    if (packed) {
      const int64_t rp = (rows + 15) / 16 * 16, keys = std::max(sh.chunk, sh.rows_chunk);
      qp.resize(sh.d / 2 * rp);
      pp.resize((keys + 1) / 2 * rp);
      vp.resize((keys + 1) / 2 * sh.d);
    }
  }
};

// Where an item reads and writes.
template <typename T>
struct View {
  const T *query, *kc, *vc;
  T* out;
  const int32_t *qsl, *lens, *tables;
  float scale;
  float* part_o = nullptr;   // split decodes: [part][group][d] unnormalised outputs
  float* part_ml = nullptr;  // and [part][group][2] running max and sum of each row
};

template <typename T>
struct Geometry {  // one item's rows and keys
  int rows;
  int64_t first_tok, first_pos, nkeys;
  int64_t key_begin, key_end;  // the keys this item walks: [window start, nkeys) unless split
  const int32_t* table;
  Geometry(const Item& it, const Shapes& sh, const View<T>& v)
      : rows(it.tile_len * static_cast<int>(sh.group)),
        first_tok(v.qsl[it.seq] + it.tile_start),
        first_pos(v.lens[it.seq] - (v.qsl[it.seq + 1] - v.qsl[it.seq]) + it.tile_start),
        nkeys(first_pos + it.tile_len),
        key_begin(std::max(it.key_begin, window_start(first_pos, sh))),
        key_end(std::min(nkeys, it.key_end)),
        table(v.tables + static_cast<int64_t>(it.seq) * sh.table_width) {}
  const T* q_row(const View<T>& v, const Item& it, const Shapes& sh, int r) const {
    return v.query + (first_tok + r / sh.group) * sh.q_tok_stride +
           (it.kv_head * sh.group + r % sh.group) * sh.d;
  }
  T* out_row(const View<T>& v, const Item& it, const Shapes& sh, int r) const {
    return v.out + (first_tok + r / sh.group) * sh.q_tok_stride +
           (it.kv_head * sh.group + r % sh.group) * sh.d;
  }
};

// The end of an item: each row's accumulator divided by its sum into the output, or, for a
// part of a split decode, accumulator, max and sum into its partial slot.
template <typename T>
void finish_rows(const Item& it, const Shapes& sh, const View<T>& v, const Geometry<T>& geo,
                 const Scratch& w) {
  const int64_t d = sh.d;
  if (it.part >= 0) {
    float* o = v.part_o + static_cast<int64_t>(it.part) * sh.group * d;
    float* ml = v.part_ml + static_cast<int64_t>(it.part) * sh.group * 2;
    std::memcpy(o, w.o.data(), sizeof(float) * geo.rows * d);
    for (int r = 0; r < geo.rows; ++r) {
      ml[2 * r] = w.m[r];
      ml[2 * r + 1] = w.l[r];
    }
    return;
  }
  for (int r = 0; r < geo.rows; ++r) {
    const float inv = 1.f / w.l[r];
    T* dst = geo.out_row(v, it, sh, r);
    for (int64_t i = 0; i < d; ++i) dst[i] = static_cast<T>(w.o[r * d + i] * inv);
  }
}

// Online-softmax update of row-major scores s [rows][lds] for keys key0.. (nvalid valid):

}  // namespace hermes_native
