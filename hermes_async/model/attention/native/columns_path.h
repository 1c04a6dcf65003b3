// The columns path (float32, AVX-512): scores [key][row], 16 rows per vector.
#pragma once

#include "common.h"

namespace hermes_native {

#if defined(__AVX512F__)

// Online-softmax update down the columns of st [nvalid][rp] (16 rows per vector).
// Keys before a row's window (window > 0) are masked too; a row with no visible key yet keeps
// its empty accumulator.
void softmax_columns(float* st, int rp, int g, int rows, int64_t first_pos, int64_t key0,
                     int nvalid, int64_t window, Scratch& w) {
  for (int b = 0; b < rp; b += 16) {
    vi16 lim, lo;  // keys [lo, lim) of this chunk are visible to the row; padding rows: all
    for (int i = 0; i < 16; ++i) {
      const int64_t pos = first_pos + (b + i) / g;
      lim[i] = b + i < rows ? static_cast<int32_t>(pos + 1 - key0) : nvalid;
      lo[i] = b + i < rows && window > 0
                  ? static_cast<int32_t>(std::max<int64_t>(pos - window + 1 - key0, -1))
                  : -1;
    }
    const int mask_from =
        window > 0 ? 0
                   : std::max(0, std::min(nvalid, static_cast<int>(first_pos + 1 - key0)));
    vf16 mx = splat<vf16>(NEG_INF);
    for (int j = 0; j < nvalid; ++j) {
      vf16 x;
      std::memcpy(&x, st + j * rp + b, sizeof x);
      if (j >= mask_from) {
        const vi16 key = {};
        x = ((key + j) >= lim) | ((key + j) < lo) ? splat<vf16>(NEG_INF) : x;
        std::memcpy(st + j * rp + b, &x, sizeof x);
      }
      mx = x > mx ? x : mx;
    }
    vf16 m_old, l;
    std::memcpy(&m_old, &w.m[b], sizeof m_old);
    std::memcpy(&l, &w.l[b], sizeof l);
    const vf16 m_new = mx > m_old ? mx : m_old;
    // rows with nothing visible yet: subtract 0, so that their -inf scores give 0, not NaN
    const vf16 ref = m_new == splat<vf16>(NEG_INF) ? splat<vf16>(0.f) : m_new;
    vf16 sum = {};
    for (int j = 0; j < nvalid; ++j) {
      vf16 x;
      std::memcpy(&x, st + j * rp + b, sizeof x);
      x = exp_neg<vf16, vi16>(x - ref);
      std::memcpy(st + j * rp + b, &x, sizeof x);
      sum += x;
    }
    const vf16 a = exp_neg<vf16, vi16>(m_old - ref);  // 0 at first (m_old = -inf)
    l = l * a + sum;
    std::memcpy(&w.alpha[b], &a, sizeof a);
    std::memcpy(&w.l[b], &l, sizeof l);
    std::memcpy(&w.m[b], &m_new, sizeof m_new);
  }
}

// st[j][row] = scale * k[j] . q[row] for J keys and RB vectors of 16 rows: qt is Q^T
// [d][rp], k the keys' rows [J][d].
template <int RB, int J>
void qk_columns(const float* qt, int rp, const float* k, int d, float* st, float scale) {
  vf16 acc[J][RB] = {};
  for (int c = 0; c < d; ++c) {
    vf16 qv[RB];
    for (int b = 0; b < RB; ++b) qv[b] = load16(qt + c * rp + b * 16);
    for (int j = 0; j < J; ++j) {
      const vf16 kv = splat<vf16>(k[j * d + c]);
      for (int b = 0; b < RB; ++b) acc[j][b] += kv * qv[b];
    }
  }
  for (int j = 0; j < J; ++j)
    for (int b = 0; b < RB; ++b) store16(st + j * rp + b * 16, acc[j][b] * scale);
}

template <int RB>
void qk_columns_keys(const float* qt, int rp, const float* k, int nkeys, int d, float* st,
                     float scale) {
  int j = 0;
  for (; j + 8 <= nkeys; j += 8) qk_columns<RB, 8>(qt, rp, k + j * d, d, st + j * rp, scale);
  for (; j < nkeys; ++j) qk_columns<RB, 1>(qt, rp, k + j * d, d, st + j * rp, scale);
}

// o[r] = alpha[r] * o[r] + sum_j P^T[j][r] v[j] over C chunks of 16 columns (v: [keys][d]).
template <int R, int C>
void pv_columns(const float* pt, int rp, const float* v, int d, int nkeys, const float* alpha,
                float* o) {
  vf16 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = load16(o + r * d + c * 16) * alpha[r];
  for (int j = 0; j < nkeys; ++j) {
    vf16 vv[C];
    for (int c = 0; c < C; ++c) vv[c] = load16(v + static_cast<int64_t>(j) * d + c * 16);
    for (int r = 0; r < R; ++r) {
      const vf16 pr = splat<vf16>(pt[j * rp + r]);
      for (int c = 0; c < C; ++c) acc[r][c] += pr * vv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) store16(o + r * d + c * 16, acc[r][c]);
}

template <int R>
void pv_columns_cols(const float* pt, int rp, const float* v, int d, int nkeys,
                     const float* alpha, float* o) {
  int c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) pv_columns<R, 4>(pt, rp, v + c0, d, nkeys, alpha, o + c0);
  switch ((d - c0) / 16) {
    case 3: pv_columns<R, 3>(pt, rp, v + c0, d, nkeys, alpha, o + c0); break;
    case 2: pv_columns<R, 2>(pt, rp, v + c0, d, nkeys, alpha, o + c0); break;
    case 1: pv_columns<R, 1>(pt, rp, v + c0, d, nkeys, alpha, o + c0); break;
    default: break;
  }
}

// float32 tiles of 16+ rows: scores [key][row] as the packed path keeps them, FMA products.
void attend_columns(const Item& it, const Shapes& sh, const View<float>& v, Scratch& w) {
  const Geometry<float> geo(it, sh, v);
  const int d = static_cast<int>(sh.d), bs = static_cast<int>(sh.block_size);
  const int rows = geo.rows, rp = (rows + 15) / 16 * 16, rb = rp / 16;
  const int g = static_cast<int>(sh.group), chunk = static_cast<int>(sh.chunk);
  for (int r = 0; r < rp; ++r) {
    const float* src = r < rows ? geo.q_row(v, it, sh, r) : nullptr;
    for (int c = 0; c < d; ++c) w.qt[c * rp + r] = src ? src[c] : 0.f;
  }
  std::fill(w.o.begin(), w.o.begin() + rows * d, 0.f);
  std::fill(w.m.begin(), w.m.begin() + rp, NEG_INF);
  std::fill(w.l.begin(), w.l.begin() + rp, 0.f);
  const int64_t head_off = it.kv_head * sh.cache_head_stride;
  float* st = w.s.data();
  for (int64_t key0 = geo.key_begin; key0 < geo.key_end; key0 += chunk) {
    const int nvalid = static_cast<int>(std::min<int64_t>(chunk, geo.key_end - key0));
    for (int j = 0; j < nvalid; j += bs) {
      const float* k = v.kc + geo.table[(key0 + j) / bs] * sh.cache_block_stride + head_off;
      const int n = std::min(bs, nvalid - j);
      float* sj = st + j * rp;
      switch (rb) {
        case 1: qk_columns_keys<1>(w.qt.data(), rp, k, n, d, sj, v.scale); break;
        case 2: qk_columns_keys<2>(w.qt.data(), rp, k, n, d, sj, v.scale); break;
        default: qk_columns_keys<3>(w.qt.data(), rp, k, n, d, sj, v.scale); break;
      }
    }
    softmax_columns(st, rp, g, rows, geo.first_pos, key0, nvalid, sh.window, w);
    for (int j = 0; j < nvalid; j += bs) {
      const float* vb = v.vc + geo.table[(key0 + j) / bs] * sh.cache_block_stride + head_off;
      const int n = std::min(bs, nvalid - j);
      const float* alpha = j == 0 ? w.alpha.data() : w.ones.data();
      int r = 0;
      for (; r + 4 <= rows; r += 4)
        pv_columns_cols<4>(st + j * rp + r, rp, vb, d, n, alpha + r, w.o.data() + r * d);
      for (; r < rows; ++r)
        pv_columns_cols<1>(st + j * rp + r, rp, vb, d, n, alpha + r, w.o.data() + r * d);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const float inv = 1.f / w.l[r];
    float* dst = geo.out_row(v, it, sh, r);
    for (int i = 0; i < d; ++i) dst[i] = w.o[r * d + i] * inv;
  }
}
#endif  // __AVX512F__

}  // namespace hermes_native
