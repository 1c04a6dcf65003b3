// silu_and_mul: the gated MLP's activation, out = silu(gate) * up, in one pass.
//
// input [T, 2 * n]: gate is columns [0, n), up [n, 2n) (the fused gate-up projection's
// output); out [T, n]. Computed in float32 (bfloat16 widened on load) and rounded once to
// the output's dtype, as vLLM's fused kernel does (torch rounds silu(gate) to bfloat16 before
// the product: results may differ by one bfloat16 ulp). Rows are split across threads; each
// row runs in 16-float vectors (AVX-512; 8 elsewhere).
#pragma once

#include "common.h"

namespace hermes_native {

// Vectors of W floats: 16 (AVX-512) or 8; bfloat16 widened on load, rounded to nearest even
// on store (inputs finite).
#if defined(__AVX512F__)
constexpr int W = 16;
using wf = vf16;
using wi = vi16;
inline wf loadw(const float* p) { return load16(p); }
inline wf loadw(const bf16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return (wf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
}
inline void storew(float* p, wf v) { store16(p, v); }
#else
constexpr int W = VL;
using wf = vf;
using wi = vi;
inline wf loadw(const float* p) { return load(p); }
inline wf loadw(const bf16* p) { return load(p); }
inline void storew(float* p, wf v) { store(p, v); }
#endif

inline void storew(bf16* p, wf v) { store_bf16(p, v); }

// x * sigmoid(x), sigmoid from e = exp(-|x|) <= 1 so that nothing overflows.
inline wf silu(wf x) {
  const wf zero = splat<wf>(0.f);
  const wf e = exp_neg<wf, wi>(x < zero ? x : -x);
  return x * ((x < zero ? e : splat<wf>(1.f)) / (e + 1.f));
}

inline float silu(float x) { return x / (1.f + std::exp(-x)); }

template <typename T>
void silu_and_mul_rows(const T* in, T* out, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* gate = in + r * 2 * n;
    const T* up = gate + n;
    T* o = out + r * n;
    int64_t c = 0;
    for (; c + W <= n; c += W) storew(o + c, silu(loadw(gate + c)) * loadw(up + c));
    for (; c < n; ++c)
      o[c] = static_cast<T>(silu(static_cast<float>(gate[c])) * static_cast<float>(up[c]));
  }
}

inline void silu_and_mul(at::Tensor out, const at::Tensor& input) {
  TORCH_CHECK(input.is_contiguous() && input.device().is_cpu() && input.dim() >= 1 &&
                  input.size(-1) % 2 == 0,
              "input must be a contiguous CPU tensor [..., 2 * n]");
  const int64_t n = input.size(-1) / 2, rows = n ? input.numel() / (2 * n) : 0;
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == input.scalar_type() &&
                  out.numel() == rows * n && (out.dim() == 0 || out.size(-1) == n),
              "out must be contiguous, typed like input, shaped [..., n]");
  TORCH_CHECK(input.scalar_type() == at::kFloat || input.scalar_type() == at::kBFloat16,
              "silu_and_mul runs float32 or bfloat16, not ", input.scalar_type());
  if (rows == 0) return;
  const int64_t grain = std::max<int64_t>(1, 8192 / n);  // rows per task: about 8k outputs
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    if (input.scalar_type() == at::kFloat) {
      silu_and_mul_rows(input.data_ptr<float>() + begin * 2 * n,
                        out.data_ptr<float>() + begin * n, end - begin, n);
    } else {
      silu_and_mul_rows(input.data_ptr<bf16>() + begin * 2 * n,
                        out.data_ptr<bf16>() + begin * n, end - begin, n);
    }
  });
}

}  // namespace hermes_native
