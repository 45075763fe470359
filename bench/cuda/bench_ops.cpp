// Transformer-op benchmarks (kernels/cuda/cuda_ops.h): the cuBLASLt bf16 linear layer against PyTorch's bf16 GEMV /
// matmul rows of tools/gpu/peers.py, and the sampler's top-k against its byte floor. Inputs: fresh random values of a
// realistic spread (random sign, exponents of ~N(0, 1) values, random
// mantissas: the same bit activity as randn), copies rotated where one copy would sit in the 60 MB L2.
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda/bench_cuda.h"
#include "core/dtype.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/cuda_ops.h"

namespace cider::bench {
namespace {

// n float32 values: random sign, magnitude in [2⁻⁸, 2) with random mantissa bits.
std::vector<float> random_floats(std::mt19937_64& rng, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    const auto sign = static_cast<uint32_t>(r & 1u) << 31;
    const auto exponent = static_cast<uint32_t>(119u + (r >> 1) % 9u) << 23;
    const auto mantissa = static_cast<uint32_t>(r >> 20) & 0x7fffffu;
    v[i] = bits_f32(sign | exponent | mantissa);
  }
  return v;
}

cuda::DeviceBuffer device_floats(std::mt19937_64& rng, size_t n) {
  const std::vector<float> v = random_floats(rng, n);
  return cuda::to_device(v.data(), n * sizeof(float));
}

cuda::DeviceBuffer device_bf16(std::mt19937_64& rng, size_t n) {
  const std::vector<float> v = random_floats(rng, n);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = f32_to_bf16(v[i]);
  return cuda::to_device(h.data(), n * sizeof(uint16_t));
}

// Copies needed so that `bytes_per_copy` × copies is ≥ 2.5 × the 60 MB L2 (and at least `min_copies`).
size_t copies_for(size_t bytes_per_copy, size_t min_copies) {
  return std::max<size_t>(min_copies, (size_t{150} << 20) / std::max<size_t>(bytes_per_copy, 1) + 1);
}

BenchResult bench_dense(int64_t M, int64_t K, int64_t N, const char* peer) {
  std::mt19937_64 rng(0xd15e0000u + static_cast<uint64_t>(M * 7 + K + N));
  const size_t w_bytes = static_cast<size_t>(N * K) * 2;
  const size_t copies = copies_for(w_bytes, 4);  // 4 × 117 MB, as the peer rotates 4 weight copies
  std::vector<cuda::DeviceBuffer> weights;
  for (size_t c = 0; c < copies; ++c) weights.push_back(device_bf16(rng, static_cast<size_t>(N * K)));
  cuda::DeviceBuffer x = device_floats(rng, static_cast<size_t>(M * K));
  cuda::DeviceBuffer out(static_cast<size_t>(M * N) * sizeof(float));
  cuda::DeviceBuffer ws(cuda::dense_bf16_workspace_bytes(M, K));
  cuda::dense_bf16_prepare(M, N, K);
  cuda::Stream stream;
  size_t next = 0;
  auto run = [&](void* s) {
    const cuda::Exec exec{s, ws.data(), ws.bytes()};
    cuda::dense_bf16(x.as<float>(), weights[next++ % copies].data(), nullptr, out.as<float>(), M, N, K, exec);
  };
  BenchResult r;
  r.seconds = bench_graph(run, stream.handle(), 20, 15);
  // Minimum traffic: the bf16 weights, x read as float32, out written as float32 (the bf16 copy of x is extra).
  r.bytes = static_cast<double>(w_bytes) + 4.0 * static_cast<double>(M * K + M * N);
  r.flops = 2.0 * static_cast<double>(M) * static_cast<double>(K) * static_cast<double>(N);
  r.peer = peer;
  r.note = std::to_string(copies) + " weight copies; x→bf16 conversion included";
  return r;
}




// Device sampling's ranking (cuda::topk_logits) on one row left in L2 by the LM head, with `excluded` penalised
// tokens; the copy it replaces is the row's 4·vocab bytes to the host (plus the host's own sampling).
BenchResult bench_topk(int64_t vocab, int64_t k, int64_t excluded) {
  std::mt19937_64 rng(0x70700000u + static_cast<uint64_t>(vocab + k));
  cuda::DeviceBuffer logits = device_floats(rng, static_cast<size_t>(vocab));
  std::vector<int32_t> ex;
  for (int64_t i = 0; i < excluded; ++i) ex.push_back(static_cast<int32_t>(i * (vocab / std::max<int64_t>(excluded, 1))));
  cuda::DeviceBuffer d_ex(std::max<size_t>(ex.size(), 1) * 4), ids(static_cast<size_t>(k) * 4),
      vals(static_cast<size_t>(k) * 4), exvals(std::max<size_t>(ex.size(), 1) * 4), status(4),
      ws(std::max<size_t>(cuda::topk_workspace_bytes(vocab, k), 256));
  if (!ex.empty()) d_ex.upload(ex.data(), ex.size() * 4);
  cuda::Stream stream;
  auto run = [&](void* s) {
    const cuda::Exec exec{s, ws.data(), ws.bytes()};
    cuda::topk_logits(logits.as<float>(), vocab, d_ex.as<int32_t>(), excluded, k, ids.as<int32_t>(), vals.as<float>(),
                      exvals.as<float>(), status.as<int32_t>(), exec);
  };
  BenchResult r;
  r.seconds = bench_graph(run, stream.handle(), 20, 15);
  r.bytes = 4.0 * static_cast<double>(vocab);
  r.note = "one row (L2-hot, as right after the LM head), " + std::to_string(excluded) + " excluded";
  return r;
}

}  // namespace

CIDER_CUDA_BENCH("topk_logits V128256 k1", "ops") { return bench_topk(128256, 1, 0); }
CIDER_CUDA_BENCH("topk_logits V128256 k40", "ops") { return bench_topk(128256, 40, 0); }
CIDER_CUDA_BENCH("topk_logits V128256 k40 excluded64", "ops") { return bench_topk(128256, 40, 64); }
CIDER_CUDA_BENCH("topk_logits V128256 k256", "ops") { return bench_topk(128256, 256, 0); }
CIDER_CUDA_BENCH("topk_logits V262144 k40", "ops") { return bench_topk(262144, 40, 0); }
CIDER_CUDA_BENCH("dense_bf16 M1 K4096 N14336", "ops") { return bench_dense(1, 4096, 14336, "bf16 GEMV K4096 N14336"); }
CIDER_CUDA_BENCH("dense_bf16 M2048 K4096 N14336", "ops") {
  return bench_dense(2048, 4096, 14336, "bf16 matmul M2048 K4096 N14336");
}

}  // namespace cider::bench
