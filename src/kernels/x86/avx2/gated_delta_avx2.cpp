// The gated delta rule, AVX2 + FMA (kernel_table.h GatedDeltaKernelArgs; the reference is kernels/ref/
// gated_delta_ref.cpp). Per head and token, two passes over the state S (Dk × Dv), each over blocks of up to 64
// columns whose sums stay in registers while i runs down the rows:
//   pass 1  S[i] ← S[i]·e^g and kv += S[i]·k[i]          (the decay folded into the Sᵀk pass)
//           δ = (v − kv)·β
//   pass 2  S[i] ← S[i] + k[i]·δ and o += S[i]·q[i]      (FMA)
// The sums over i run in ascending order as in the reference; FMA rounds once where the reference rounds twice.
// Columns past the last multiple of 8 take a scalar loop of the same operations.
#include <immintrin.h>

#include <cmath>

#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86::avx2 {

namespace {

// Pass 1 over columns [j0, j0 + 8·NV): S *= decay, kv[j] = Σ_i S[i][j]·k[i].
template <int NV>
void decay_and_dot(float* S, int64_t Dk, int64_t Dv, int64_t j0, float decay, const float* k, float* kv) {
  __m256 acc[NV];
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_ps();
  const __m256 d = _mm256_set1_ps(decay);
  for (int64_t i = 0; i < Dk; ++i) {
    float* Si = S + i * Dv + j0;
    const __m256 ki = _mm256_set1_ps(k[i]);
    for (int v = 0; v < NV; ++v) {
      const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(Si + 8 * v), d);
      _mm256_storeu_ps(Si + 8 * v, s);
      acc[v] = _mm256_fmadd_ps(s, ki, acc[v]);
    }
  }
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(kv + j0 + 8 * v, acc[v]);
}

// Pass 2 over columns [j0, j0 + 8·NV): S[i][j] += k[i]·δ[j], o[j] = Σ_i S[i][j]·q[i].
template <int NV>
void update_and_read(float* S, int64_t Dk, int64_t Dv, int64_t j0, const float* k, const float* q,
                     const float* delta, float* o) {
  __m256 acc[NV], dl[NV];
  for (int v = 0; v < NV; ++v) {
    acc[v] = _mm256_setzero_ps();
    dl[v] = _mm256_loadu_ps(delta + j0 + 8 * v);
  }
  for (int64_t i = 0; i < Dk; ++i) {
    float* Si = S + i * Dv + j0;
    const __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
    for (int v = 0; v < NV; ++v) {
      const __m256 s = _mm256_fmadd_ps(ki, dl[v], _mm256_loadu_ps(Si + 8 * v));
      _mm256_storeu_ps(Si + 8 * v, s);
      acc[v] = _mm256_fmadd_ps(s, qi, acc[v]);
    }
  }
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(o + j0 + 8 * v, acc[v]);
}

template <int NV>
void block(bool first_pass, float* S, int64_t Dk, int64_t Dv, int64_t j0, float decay, const float* k, const float* q,
           float* kv, const float* delta, float* o) {
  if (first_pass) {
    decay_and_dot<NV>(S, Dk, Dv, j0, decay, k, kv);
  } else {
    update_and_read<NV>(S, Dk, Dv, j0, k, q, delta, o);
  }
}

// Every column of one pass: blocks of 64, then one block of the remaining multiple of 8, then scalar columns.
void pass(bool first, float* S, int64_t Dk, int64_t Dv, float decay, const float* k, const float* q, float* kv,
          const float* delta, float* o) {
  int64_t j = 0;
  for (; j + 64 <= Dv; j += 64) block<8>(first, S, Dk, Dv, j, decay, k, q, kv, delta, o);
  switch ((Dv - j) / 8) {
    case 7: block<7>(first, S, Dk, Dv, j, decay, k, q, kv, delta, o); break;
    case 6: block<6>(first, S, Dk, Dv, j, decay, k, q, kv, delta, o); break;
    case 5: block<5>(first, S, Dk, Dv, j, decay, k, q, kv, delta, o); break;
    case 4: block<4>(first, S, Dk, Dv, j, decay, k, q, kv, delta, o); break;
    case 3: block<3>(first, S, Dk, Dv, j, decay, k, q, kv, delta, o); break;
    case 2: block<2>(first, S, Dk, Dv, j, decay, k, q, kv, delta, o); break;
    case 1: block<1>(first, S, Dk, Dv, j, decay, k, q, kv, delta, o); break;
    default: break;
  }
  j += (Dv - j) / 8 * 8;
  for (; j < Dv; ++j) {  // scalar columns
    float acc = 0.0f;
    for (int64_t i = 0; i < Dk; ++i) {
      float& s = S[i * Dv + j];
      if (first) {
        s *= decay;
        acc = std::fma(s, k[i], acc);
      } else {
        s = std::fma(k[i], delta[j], s);
        acc = std::fma(s, q[i], acc);
      }
    }
    (first ? kv : o)[j] = acc;
  }
}

}  // namespace

void gated_delta(const GatedDeltaKernelArgs& a) {
  const int64_t Dk = a.Dk, Dv = a.Dv, r = a.Hv / a.Hk;
  constexpr int64_t kMaxDv = 4096;  // limits::kMaxHeadDim: the stack rows below
  alignas(32) float kv[kMaxDv], delta[kMaxDv];
  for (int64_t h = a.h0; h < a.h1; ++h) {
    float* S = a.state + h * Dk * Dv;
    const int64_t kh = a.v_tiled ? h % a.Hk : h / r;
    for (int64_t t = 0; t < a.n; ++t) {
      const float* q = a.q + (t * a.Hk + kh) * Dk;
      const float* k = a.k + (t * a.Hk + kh) * Dk;
      const float* v = a.v + t * a.v_stride + h * Dv;
      float* o = a.out + t * a.Hv * Dv + h * Dv;
      const float decay = std::exp(a.g[t * a.Hv + h]);
      const float beta = a.beta[t * a.Hv + h];
      pass(true, S, Dk, Dv, decay, k, q, kv, delta, o);
      for (int64_t j = 0; j < Dv; ++j) delta[j] = (v[j] - kv[j]) * beta;
      pass(false, S, Dk, Dv, decay, k, q, kv, delta, o);
    }
  }
}

}  // namespace cider::kernels::x86::avx2
