// The bfloat16 dot-product paths (AVX512-BF16): dot (decodes) and packed (prefill tiles).
#pragma once

#include "columns_path.h"
#include "rows_path.h"

namespace hermes_native {

#if defined(HERMES_PACKED)

inline __m512 dp(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

inline uint32_t bf16_bits(float x) {  // round to nearest even; x finite
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// st[j][row] = scale * k[j] . q[row] for J keys and RB vectors of 16 rows: qp is Q as bf16
// pairs [d/2][rp], k the keys' rows as bf16 pairs [J][d/2].
template <int RB, int J>
void qk_packed(const uint32_t* qp, int rp, const uint32_t* k, int dp2, float* st,
               float scale) {
  __m512 acc[J][RB];
  for (int j = 0; j < J; ++j)
    for (int b = 0; b < RB; ++b) acc[j][b] = _mm512_setzero_ps();
  for (int p = 0; p < dp2; ++p) {
    __m512i qv[RB];
    for (int b = 0; b < RB; ++b) qv[b] = _mm512_loadu_si512(qp + p * rp + b * 16);
    for (int j = 0; j < J; ++j) {
      const __m512i kv = _mm512_set1_epi32(static_cast<int>(k[j * dp2 + p]));
      for (int b = 0; b < RB; ++b) acc[j][b] = dp(acc[j][b], kv, qv[b]);
    }
  }
  const __m512 sv = _mm512_set1_ps(scale);
  for (int j = 0; j < J; ++j)
    for (int b = 0; b < RB; ++b) _mm512_storeu_ps(st + j * rp + b * 16, acc[j][b] * sv);
}

template <int RB>
void qk_packed_keys(const uint32_t* qp, int rp, const uint32_t* k, int nkeys, int dp2,
                    float* st, float scale) {
  int j = 0;
  for (; j + 8 <= nkeys; j += 8)
    qk_packed<RB, 8>(qp, rp, k + j * dp2, dp2, st + j * rp, scale);
  for (; j < nkeys; ++j) qk_packed<RB, 1>(qp, rp, k + j * dp2, dp2, st + j * rp, scale);
}

// o[r] = alpha[r] * o[r] + sum_p P pair p of row r . V pair p, C chunks of 16 columns; pp is
// P as bf16 pairs, pair p of row r at pp[p * ps + r * rs]; vp V as bf16 pairs of keys
// [npairs][d].
template <int R, int C>
void pv_packed(const uint32_t* pp, int ps, int rs, const uint32_t* vp, int d, int npairs,
               const float* alpha, float* o) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      acc[r][c] = _mm512_loadu_ps(o + r * d + c * 16) * _mm512_set1_ps(alpha[r]);
  for (int p = 0; p < npairs; ++p) {
    __m512i vv[C];
    for (int c = 0; c < C; ++c) vv[c] = _mm512_loadu_si512(vp + p * d + c * 16);
    for (int r = 0; r < R; ++r) {
      const __m512i pv = _mm512_set1_epi32(static_cast<int>(pp[p * ps + r * rs]));
      for (int c = 0; c < C; ++c) acc[r][c] = dp(acc[r][c], pv, vv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + r * d + c * 16, acc[r][c]);
}

template <int R>
void pv_packed_cols(const uint32_t* pp, int ps, int rs, const uint32_t* vp, int d,
                    int npairs, const float* alpha, float* o) {
  int c0 = 0;
  for (; c0 + 64 <= d; c0 += 64)
    pv_packed<R, 4>(pp, ps, rs, vp + c0, d, npairs, alpha, o + c0);
  switch ((d - c0) / 16) {
    case 3: pv_packed<R, 3>(pp, ps, rs, vp + c0, d, npairs, alpha, o + c0); break;
    case 2: pv_packed<R, 2>(pp, ps, rs, vp + c0, d, npairs, alpha, o + c0); break;
    case 1: pv_packed<R, 1>(pp, ps, rs, vp + c0, d, npairs, alpha, o + c0); break;
    default: break;
  }
}

// Rows [0, n) of a V block as bf16 pairs of keys [ceil(n / 2)][d] (an odd last key pairs
// with zero).
void pack_value_pairs(const bf16* src, int n, int d, uint32_t* dst) {
  const uint16_t* vr = reinterpret_cast<const uint16_t*>(src);
  for (int i = 0; i < n; i += 2, dst += d) {
    const uint16_t* a = vr + static_cast<int64_t>(i) * d;
    if (i + 1 < n) {
      const uint16_t* b = a + d;
      for (int c = 0; c < d; ++c) dst[c] = a[c] | static_cast<uint32_t>(b[c]) << 16;
    } else {
      for (int c = 0; c < d; ++c) dst[c] = a[c];
    }
  }
}

template <int R>
void pv_packed_rows(const uint32_t* pp, int ps, int rs, const uint32_t* vp, int d, int rows,
                    int npairs, const float* alpha, float* o) {
  int r = 0;
  for (; r + R <= rows; r += R)
    pv_packed_cols<R>(pp + r * rs, ps, rs, vp, d, npairs, alpha + r, o + r * d);
  const uint32_t* pr = pp + r * rs;
  switch (rows - r) {  // fewer than R left: one pass, so V is read once more at most
    case 3: pv_packed_cols<3>(pr, ps, rs, vp, d, npairs, alpha + r, o + r * d); break;
    case 2: pv_packed_cols<2>(pr, ps, rs, vp, d, npairs, alpha + r, o + r * d); break;
    case 1: pv_packed_cols<1>(pr, ps, rs, vp, d, npairs, alpha + r, o + r * d); break;
    default: break;
  }
}

// s[r][j] = scale * q[r] . k[j] for R rows (bf16 [R][d]) and keys [0, nkeys8) in steps of 8
// (bf16 [keys][d]), d a multiple of 16: dot products along head_dim, 8 pairs per instruction
// (256-bit: no 512-bit fold before the reduction; as fast on a double-pumped Zen 4).
template <int R>
void qk_dot_bf16(const bf16* q, const bf16* k, int d, int nkeys8, float* s, int lds,
                 float scale) {
  for (int j0 = 0; j0 < nkeys8; j0 += VL) {
    __m256 acc[R][VL];
    for (int r = 0; r < R; ++r)
      for (int jj = 0; jj < VL; ++jj) acc[r][jj] = _mm256_setzero_ps();
    const bf16* kj = k + static_cast<int64_t>(j0) * d;
    for (int c = 0; c < d; c += 16) {
      __m256i qv[R];
      for (int r = 0; r < R; ++r)
        qv[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + r * d + c));
      for (int jj = 0; jj < VL; ++jj) {
        const __m256i kv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kj + jj * d + c));
        for (int r = 0; r < R; ++r)
          acc[r][jj] = _mm256_dpbf16_ps(acc[r][jj], (__m256bh)qv[r], (__m256bh)kv);
      }
    }
    for (int r = 0; r < R; ++r) {
      vf part[VL];
      for (int jj = 0; jj < VL; ++jj) part[jj] = (vf)acc[r][jj];
      store(s + r * lds + j0, reduce8(part) * scale);
    }
  }
}

void qk_dot_block(const bf16* q, int rows, const bf16* k, int d, int nkeys8, float* s,
                  int lds, float scale) {
  int r = 0;
  for (; r + 3 <= rows; r += 3) qk_dot_bf16<3>(q + r * d, k, d, nkeys8, s + r * lds, lds, scale);
  if (rows - r == 2) {
    qk_dot_bf16<2>(q + r * d, k, d, nkeys8, s + r * lds, lds, scale);
  } else if (rows - r == 1) {
    qk_dot_bf16<1>(q + r * d, k, d, nkeys8, s + r * lds, lds, scale);
  }
}

// A few rows (decodes): the rows path's layout (scores [row][key]) on bf16 dot products.
void attend_dot(const Item& it, const Shapes& sh, const View<bf16>& v, Scratch& w) {
  const Geometry<bf16> geo(it, sh, v);
  const int d = static_cast<int>(sh.d), bs = static_cast<int>(sh.block_size);
  const int rows = geo.rows, chunk = static_cast<int>(sh.rows_chunk);
  bf16* qb = reinterpret_cast<bf16*>(w.qp.data());
  for (int r = 0; r < rows; ++r) std::memcpy(qb + r * d, geo.q_row(v, it, sh, r), 2 * d);
  std::fill(w.o.begin(), w.o.begin() + rows * d, 0.f);
  std::fill(w.m.begin(), w.m.begin() + rows, NEG_INF);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.f);
  const int64_t head_off = it.kv_head * sh.cache_head_stride;
  const int64_t block_bytes = static_cast<int64_t>(bs) * d * sizeof(bf16);
  float* s = w.s.data();
  for (int64_t key0 = geo.key_begin; key0 < geo.key_end; key0 += chunk) {
    const int nvalid = static_cast<int>(std::min<int64_t>(chunk, geo.key_end - key0));
    for (int j = 0; j < nvalid; j += bs) {
      const int64_t kb = (key0 + j) / bs;
      const int n = std::min(bs, nvalid - j), n8 = (n + VL - 1) / VL * VL;
      const int64_t off = geo.table[kb] * sh.cache_block_stride + head_off;
      if ((kb + 1) * bs < geo.key_end) {
        const int64_t next = geo.table[kb + 1] * sh.cache_block_stride + head_off;
        prefetch_block(v.kc + next, block_bytes);
        prefetch_block(v.vc + next, block_bytes);
      }
      qk_dot_block(qb, rows, v.kc + off, d, n8, s + j, chunk, v.scale);
      pack_value_pairs(v.vc + off, n, d, w.vp.data() + static_cast<int64_t>(j / 2) * d);
    }
    softmax_rows(s, rows, chunk, static_cast<int>(sh.group), geo.first_pos, key0, nvalid,
                 sh.window, w);
    const int npairs = (nvalid + 1) / 2, n2 = 2 * npairs, ps = chunk / 2;
    uint16_t* p16 = reinterpret_cast<uint16_t*>(w.pp.data());
    for (int r = 0; r < rows; ++r) {  // P as bfloat16 [row][key]: pairs of keys in a uint32
      float* sr = s + r * chunk;
      if (n2 > nvalid) sr[nvalid] = 0.f;  // the odd last key pairs with zero
      uint16_t* dst = p16 + static_cast<int64_t>(r) * chunk;
      for (int j = 0; j < n2; ++j) dst[j] = static_cast<uint16_t>(bf16_bits(sr[j]));
    }
    pv_packed_rows<4>(w.pp.data(), 1, ps, w.vp.data(), d, rows, npairs, w.alpha.data(),
                      w.o.data());
  }
  finish_rows(it, sh, v, geo, w);
}

void attend_packed(const Item& it, const Shapes& sh, const View<bf16>& v, Scratch& w) {
  const Geometry<bf16> geo(it, sh, v);
  const int d = static_cast<int>(sh.d), bs = static_cast<int>(sh.block_size);
  const int rows = geo.rows, rp = (rows + 15) / 16 * 16, rb = rp / 16, dp2 = d / 2;
  const int g = static_cast<int>(sh.group), chunk = static_cast<int>(sh.chunk);
  for (int r = 0; r < rp; ++r) {
    const uint32_t* src =
        r < rows ? reinterpret_cast<const uint32_t*>(geo.q_row(v, it, sh, r)) : nullptr;
    for (int p = 0; p < dp2; ++p) w.qp[p * rp + r] = src ? src[p] : 0u;
  }
  std::fill(w.o.begin(), w.o.begin() + rows * d, 0.f);
  std::fill(w.m.begin(), w.m.begin() + rp, NEG_INF);
  std::fill(w.l.begin(), w.l.begin() + rp, 0.f);
  const int64_t head_off = it.kv_head * sh.cache_head_stride;
  float* st = w.s.data();
  for (int64_t key0 = geo.key_begin; key0 < geo.key_end; key0 += chunk) {
    const int nvalid = static_cast<int>(std::min<int64_t>(chunk, geo.key_end - key0));
    const int npairs = (nvalid + 1) / 2;
    for (int j = 0; j < nvalid; j += bs) {  // one pool block at a time
      const int64_t off = geo.table[(key0 + j) / bs] * sh.cache_block_stride + head_off;
      const int n = std::min(bs, nvalid - j);
      const uint32_t* k = reinterpret_cast<const uint32_t*>(v.kc + off);
      float* sj = st + j * rp;
      switch (rb) {
        case 1: qk_packed_keys<1>(w.qp.data(), rp, k, n, dp2, sj, v.scale); break;
        case 2: qk_packed_keys<2>(w.qp.data(), rp, k, n, dp2, sj, v.scale); break;
        default: qk_packed_keys<3>(w.qp.data(), rp, k, n, dp2, sj, v.scale); break;
      }
      pack_value_pairs(v.vc + off, n, d, w.vp.data() + static_cast<int64_t>(j / 2) * d);
    }
    softmax_columns(st, rp, g, rows, geo.first_pos, key0, nvalid, sh.window, w);
    for (int p = 0; p < npairs; ++p) {  // P as pairs of keys, bfloat16
      const float* s0 = st + 2 * p * rp;
      const bool odd = 2 * p + 1 == nvalid;
      for (int r = 0; r < rp; ++r)
        w.pp[p * rp + r] = bf16_bits(s0[r]) | (odd ? 0u : bf16_bits(s0[rp + r]) << 16);
    }
    pv_packed_rows<4>(w.pp.data(), rp, 1, w.vp.data(), d, rows, npairs, w.alpha.data(),
                      w.o.data());
  }
  for (int r = 0; r < rows; ++r) {
    const float inv = 1.f / w.l[r];
    bf16* dst = geo.out_row(v, it, sh, r);
    for (int i = 0; i < d; ++i) dst[i] = static_cast<bf16>(w.o[r * d + i] * inv);
  }
}
#endif  // HERMES_PACKED

}  // namespace hermes_native
