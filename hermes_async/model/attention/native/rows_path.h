// The rows path: scores [row][key], dot products along head_dim, 8-float vectors.
#pragma once

#include "common.h"

namespace hermes_native {

// r[i] = sum of the lanes of a[i], i < 8.
inline vf reduce8(const vf* a) {
#if defined(__AVX__)
  __m256 t0 = _mm256_hadd_ps((__m256)a[0], (__m256)a[1]);
  __m256 t1 = _mm256_hadd_ps((__m256)a[2], (__m256)a[3]);
  __m256 t2 = _mm256_hadd_ps((__m256)a[4], (__m256)a[5]);
  __m256 t3 = _mm256_hadd_ps((__m256)a[6], (__m256)a[7]);
  __m256 u0 = _mm256_hadd_ps(t0, t1);
  __m256 u1 = _mm256_hadd_ps(t2, t3);
  return (vf)_mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20),
                           _mm256_permute2f128_ps(u0, u1, 0x31));
#else
  vf r;
  for (int i = 0; i < VL; ++i) r[i] = hsum(a[i]);
  return r;
#endif
}

// s[r][j] = q[r] . k[j] for R rows and keys [0, nkeys8) in steps of 8 (k: [keys, d]).
template <int R, typename K>
void qk_rows(const float* q, const K* k, int d, int nkeys8, float* s, int lds) {
  for (int j0 = 0; j0 < nkeys8; j0 += VL) {
    vf acc[R][VL] = {};
    const K* kj = k + static_cast<int64_t>(j0) * d;
    for (int c = 0; c < d; c += VL) {
      vf qv[R];
      for (int r = 0; r < R; ++r) qv[r] = load(q + r * d + c);
      for (int jj = 0; jj < VL; ++jj) {
        vf kv = load(kj + jj * d + c);
        for (int r = 0; r < R; ++r) acc[r][jj] += qv[r] * kv;
      }
    }
    for (int r = 0; r < R; ++r) store(s + r * lds + j0, reduce8(acc[r]));
  }
}

template <typename K>
void qk_block(const float* q, int rows, const K* k, int d, int nkeys8, float* s, int lds) {
  int r = 0;
  for (; r + QK_ROWS <= rows; r += QK_ROWS)
    qk_rows<QK_ROWS>(q + r * d, k, d, nkeys8, s + r * lds, lds);
  if (rows - r == 2) {
    qk_rows<2>(q + r * d, k, d, nkeys8, s + r * lds, lds);
  } else if (rows - r == 1) {
    qk_rows<1>(q + r * d, k, d, nkeys8, s + r * lds, lds);
  }
}

// o[r] = alpha[r] * o[r] + sum_j p[r][j] v[j] over C chunks of 8 columns (v: [keys, d]).
template <int R, int C, typename V>
void pv_rows(const float* p, int ldp, const V* v, int d, int nkeys, const float* alpha,
             float* o) {
  vf acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = load(o + r * d + c * VL) * alpha[r];
  for (int j = 0; j < nkeys; ++j) {
    vf vv[C];
    for (int c = 0; c < C; ++c) vv[c] = load(v + static_cast<int64_t>(j) * d + c * VL);
    for (int r = 0; r < R; ++r) {
      const vf pr = splat<vf>(p[r * ldp + j]);
      for (int c = 0; c < C; ++c) acc[r][c] += pr * vv[c];
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) store(o + r * d + c * VL, acc[r][c]);
}

template <int R, typename V>
void pv_cols(const float* p, int ldp, const V* v, int d, int nkeys, const float* alpha,
             float* o) {
  int c0 = 0;
  for (; c0 + PV_CHUNKS * VL <= d; c0 += PV_CHUNKS * VL)
    pv_rows<R, PV_CHUNKS>(p, ldp, v + c0, d, nkeys, alpha, o + c0);
  switch ((d - c0) / VL) {
    case 3: pv_rows<R, 3>(p, ldp, v + c0, d, nkeys, alpha, o + c0); break;
    case 2: pv_rows<R, 2>(p, ldp, v + c0, d, nkeys, alpha, o + c0); break;
    case 1: pv_rows<R, 1>(p, ldp, v + c0, d, nkeys, alpha, o + c0); break;
    default: break;
  }
}

template <typename V>
void pv_block(const float* p, int rows, int ldp, const V* v, int d, int nkeys,
              const float* alpha, float* o) {
  int r = 0;
  for (; r + PV_ROWS <= rows; r += PV_ROWS)
    pv_cols<PV_ROWS>(p + r * ldp, ldp, v, d, nkeys, alpha + r, o + r * d);
  const int left = rows - r;  // fewer than PV_ROWS: one pass, so V is read once
  if (left >= 3) {
    pv_cols<3>(p + r * ldp, ldp, v, d, nkeys, alpha + r, o + r * d);
  } else if (left == 2) {
    pv_cols<2>(p + r * ldp, ldp, v, d, nkeys, alpha + r, o + r * d);
  } else if (left == 1) {
    pv_cols<1>(p + r * ldp, ldp, v, d, nkeys, alpha + r, o + r * d);
  }
}

// rows [0, n) of a cache block as float32 into buf
template <typename T>
void widen(const T* src, int n, int d, float* buf) {
  const int64_t count = static_cast<int64_t>(n) * d;
  if constexpr (std::is_same_v<T, float>) {
    std::memcpy(buf, src, sizeof(float) * count);
  } else {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
    uint32_t* b = reinterpret_cast<uint32_t*>(buf);
    for (int64_t i = 0; i < count; ++i) b[i] = static_cast<uint32_t>(s[i]) << 16;
  }
}

// s becomes the probabilities, alpha the rescale of each row's accumulator.
// Keys before a row's window (window > 0) are masked too; a row with no visible key yet keeps
// its empty accumulator (probabilities 0, rescale 1).
void softmax_rows(float* s, int rows, int lds, int g, int64_t first_pos, int64_t key0,
                  int nvalid, int64_t window, Scratch& w) {
  const int n8 = (nvalid + VL - 1) / VL * VL;
  for (int r = 0; r < rows; ++r) {
    float* sr = s + r * lds;
    const int64_t pos = first_pos + r / g;
    const int lim = static_cast<int>(std::clamp<int64_t>(pos + 1 - key0, 0, nvalid));
    for (int j = lim; j < n8; ++j) sr[j] = NEG_INF;
    if (window > 0) {
      const int lo = static_cast<int>(std::clamp<int64_t>(pos - window + 1 - key0, 0, lim));
      for (int j = 0; j < lo; ++j) sr[j] = NEG_INF;
    }
    vf mx = splat<vf>(NEG_INF);
    for (int j = 0; j < n8; j += VL) {
      const vf x = load(sr + j);
      mx = x > mx ? x : mx;
    }
    const float m_old = w.m[r], m_new = std::max(m_old, hmax(mx));
    if (m_new == NEG_INF) {  // nothing visible to this row so far
      for (int j = 0; j < n8; ++j) sr[j] = 0.f;
      w.alpha[r] = 1.f;
      continue;
    }
    const vf mv = splat<vf>(m_new);
    vf sum = {};
    for (int j = 0; j < n8; j += VL) {
      const vf e = exp_neg<vf, vi>(load(sr + j) - mv);
      store(sr + j, e);
      sum += e;
    }
    const float a = m_new == m_old ? 1.f : std::exp(m_old - m_new);  // 0 at first (-inf)
    w.alpha[r] = a;
    w.l[r] = w.l[r] * a + hsum(sum);
    w.m[r] = m_new;
  }
}

template <typename T>
void attend_rows(const Item& it, const Shapes& sh, const View<T>& v, Scratch& w) {
  const Geometry<T> geo(it, sh, v);
  const int d = static_cast<int>(sh.d), bs = static_cast<int>(sh.block_size);
  const int rows = geo.rows;
  for (int r = 0; r < rows; ++r) {
    const T* src = geo.q_row(v, it, sh, r);
    for (int i = 0; i < d; ++i) w.q[r * d + i] = static_cast<float>(src[i]) * v.scale;
  }
  std::fill(w.o.begin(), w.o.begin() + rows * d, 0.f);
  std::fill(w.m.begin(), w.m.begin() + rows, NEG_INF);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.f);
  const int64_t head_off = it.kv_head * sh.cache_head_stride;
  const int64_t block_bytes = static_cast<int64_t>(bs) * d * sizeof(T);
  const bool widened = !std::is_same_v<T, float> && rows > DIRECT_ROWS;
  const int chunk = static_cast<int>(sh.rows_chunk);
  float* s = w.s.data();
  for (int64_t key0 = geo.key_begin; key0 < geo.key_end; key0 += chunk) {
    const int nvalid = static_cast<int>(std::min<int64_t>(chunk, geo.key_end - key0));
    for (int j = 0; j < nvalid; j += bs) {  // scores, one pool block at a time
      const int64_t kb = (key0 + j) / bs;
      const int n8 = (std::min(bs, nvalid - j) + VL - 1) / VL * VL;  // whole rows of the block
      const T* kp = v.kc + geo.table[kb] * sh.cache_block_stride + head_off;
      if ((kb + 1) * bs < geo.key_end) {
        const int64_t next = geo.table[kb + 1] * sh.cache_block_stride + head_off;
        prefetch_block(v.kc + next, block_bytes);
        prefetch_block(v.vc + next, block_bytes);
      }
      if (widened) {
        widen(kp, n8, d, w.kbuf.data());
        qk_block(w.q.data(), rows, w.kbuf.data(), d, n8, s + j, chunk);
      } else {
        qk_block(w.q.data(), rows, kp, d, n8, s + j, chunk);
      }
    }
    softmax_rows(s, rows, chunk, static_cast<int>(sh.group), geo.first_pos, key0, nvalid,
                 sh.window, w);
    for (int j = 0; j < nvalid; j += bs) {  // values, rescaling the accumulators once
      const int n = std::min(bs, nvalid - j);
      const T* vp = v.vc + geo.table[(key0 + j) / bs] * sh.cache_block_stride + head_off;
      const float* alpha = j == 0 ? w.alpha.data() : w.ones.data();
      if (widened) {
        widen(vp, n, d, w.vbuf.data());
        pv_block(s + j, rows, chunk, w.vbuf.data(), d, n, alpha, w.o.data());
      } else {
        pv_block(s + j, rows, chunk, vp, d, n, alpha, w.o.data());
      }
    }
  }
  finish_rows(it, sh, v, geo, w);
}

}  // namespace hermes_native
