// Reference affine (MLX-format) quantized matmul. See AffineQmmArgs in kernels/kernel_table.h.
//
// transpose = true  (w [N, K·bits/32], scales/biases [N, K/gs]): each output is a sum over groups of
//   scale·(Σ_{k∈g} x_k·q_k) + bias·(Σ_{k∈g} x_k)  — the codes are never turned into a float matrix.
// transpose = false (w [K, N·bits/32], scales/biases [K, N/gs]): out[m, :] += x[m,k]·(q[k, :]·scale + bias),
//   one packed row of w at a time, the scale and bias read once per group of N.
#include <vector>

#include "kernels/ref/ref_kernels.h"
#include "quant/affine.h"

namespace cider::kernels::ref {

void affine_qmm(const AffineQmmArgs& a) {
  const int64_t M = a.M, N = a.N, K = a.K;
  const int gs = a.group_size, bits = a.bits;
  std::vector<float> xrow(static_cast<size_t>(K));
  std::vector<float> acc(static_cast<size_t>(N));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) xrow[static_cast<size_t>(k)] = load_float(a.x, a.x_dtype, m * K + k);
    if (a.transpose) {
      const int64_t words = quant::packed_words(K, bits);
      const int64_t groups = K / gs;
      for (int64_t n = 0; n < N; ++n) {
        const uint32_t* wrow = a.w + n * words;
        float total = 0.0f;
        for (int64_t g = 0; g < groups; ++g) {
          float dot = 0.0f, xsum = 0.0f;
          for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
            const float xk = xrow[static_cast<size_t>(k)];
            dot += xk * static_cast<float>(quant::unpack_code(wrow, k, bits));
            xsum += xk;
          }
          const float s = load_float(a.scales, a.scale_dtype, n * groups + g);
          const float b = load_float(a.biases, a.scale_dtype, n * groups + g);
          total += s * dot + b * xsum;
        }
        acc[static_cast<size_t>(n)] = total;
      }
    } else {
      const int64_t words = quant::packed_words(N, bits);
      const int64_t groups = N / gs;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < K; ++k) {
        const float xk = xrow[static_cast<size_t>(k)];
        const uint32_t* wrow = a.w + k * words;
        for (int64_t g = 0; g < groups; ++g) {
          const float s = load_float(a.scales, a.scale_dtype, k * groups + g);
          const float b = load_float(a.biases, a.scale_dtype, k * groups + g);
          for (int64_t n = g * gs; n < (g + 1) * gs; ++n) {
            acc[static_cast<size_t>(n)] += xk * (static_cast<float>(quant::unpack_code(wrow, n, bits)) * s + b);
          }
        }
      }
    }
    for (int64_t n = 0; n < N; ++n) store_float(a.out, a.out_dtype, m * N + n, acc[static_cast<size_t>(n)]);
  }
}

}  // namespace cider::kernels::ref
