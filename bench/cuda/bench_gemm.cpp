// Prefill INT8 linear layers on the GPU (cuda::w8a8_gemm / w4a8_gemm, kernels/cuda/linear_gemm.cu) against
// torch._int_mm (cuBLASLt int8 → int32) rows of tools/gpu/peers.py. Our figures include what _int_mm
// leaves out (per-token quantization of bf16 x, scales, bf16 output) unless the name says "gemm only".
// The fp8 "_scaled_mm" row of the same shapes is the stretch goal (docs/cuda/gemm.md).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda/bench_cuda.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cuda_api.h"

namespace cider::cuda::gemm_bench {
void int8_gemm_prequantized(const kernels::IntLinearArgs& args, bool int4, const Exec& exec);  // linear_gemm.cu
void set_gemm_kernel(int choice);  // 0 auto (wgmma where supported), 1 mma.sync, 2 wgmma
int gemm_kernel_choice();
int last_gemm_kernel();            // 1 mma.sync, 2 wgmma
int last_gemm_grid();              // CTAs of the last wgmma launch
}

namespace cider::bench {
namespace {

using cuda::DeviceBuffer;

constexpr double kL2Bytes = 60e6;

DeviceBuffer random_device_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<uint8_t> h(n);
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uint64_t r = rng();
    std::memcpy(&h[i], &r, 8);
  }
  for (size_t i = n / 8 * 8; i < n; ++i) h[i] = static_cast<uint8_t>(rng());
  return cuda::to_device(h.data(), n);
}

DeviceBuffer random_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint16_t> h(n);
  for (auto& v : h) v = f32_to_bf16(d(rng));
  return cuda::to_device(h.data(), n * 2);
}

DeviceBuffer random_scales(size_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> d(0.001f, 0.02f);
  std::vector<float> h(n);
  for (auto& v : h) v = d(rng);
  return cuda::to_device(h.data(), n * 4);
}

enum class What { kFull, kGemmOnly, kQuantizeOnly };

// bf16 x [M, K] → bf16 out [M, N], int8 (or packed int4) weights, per-channel (group_size 0) or per-group scales.
// kernel: 0 = the launcher's default choice, 1 = force the mma.sync kernel, 2 = force wgmma (comparison cases).
BenchResult run_linear(int64_t M, int64_t K, int64_t N, bool int4, int group_size, What what, const char* peer,
                       int kernel = 0) {
  struct Restore {
    int saved = cuda::gemm_bench::gemm_kernel_choice();
    ~Restore() { cuda::gemm_bench::set_gemm_kernel(saved); }
  } restore;
  if (kernel != 0) cuda::gemm_bench::set_gemm_kernel(kernel);
  std::mt19937_64 rng(0x9e3779b97f4a7c15ull ^ static_cast<uint64_t>(M * 31 + N * 7 + K));
  const size_t w_bytes = static_cast<size_t>(N * (int4 ? K / 2 : K));
  const size_t x_bytes = static_cast<size_t>(M * K) * 2, out_bytes = static_cast<size_t>(M * N) * 2;
  const size_t scale_count = static_cast<size_t>(group_size == 0 ? N : K / group_size * N);
  const double working_set = static_cast<double>(w_bytes + x_bytes + out_bytes);
  const int copies = working_set < 2 * kL2Bytes ? 4 : 1;  // rotate copies so that the L2 does not hold them

  struct Copy {
    DeviceBuffer x, w, sw, out, ws;
  };
  std::vector<Copy> set;
  for (int i = 0; i < copies; ++i) {
    Copy c;
    c.x = random_bf16(static_cast<size_t>(M * K), rng);
    c.w = random_device_bytes(w_bytes, rng);
    c.sw = random_scales(scale_count, rng);
    c.out = DeviceBuffer(out_bytes);
    c.ws = DeviceBuffer(cuda::int_linear_workspace_bytes(M, K));
    set.push_back(std::move(c));
  }
  auto args_of = [&](const Copy& c) {
    kernels::IntLinearArgs a{};
    a.x = c.x.data();
    a.x_dtype = DType::kBF16;
    a.w = c.w.data();
    a.w_scales = c.sw.as<float>();
    a.bias = nullptr;
    a.out = c.out.data();
    a.out_dtype = DType::kBF16;
    a.M = M;
    a.N = N;
    a.K = K;
    a.group_size = group_size;
    return a;
  };
  cuda::Stream stream;
  // The GEMM-only case reads activations quantized once beforehand.
  for (const Copy& c : set)
    cuda::quantize_rows_int8(c.x.data(), DType::kBF16, M, K, c.ws.as<int8_t>(),
                             reinterpret_cast<float*>(c.ws.as<uint8_t>() + (static_cast<size_t>(M * K) + 255) / 256 * 256),
                             cuda::Exec{stream.handle(), nullptr, 0});
  stream.synchronize();

  int next = 0;
  auto fn = [&](void* s) {
    const Copy& c = set[static_cast<size_t>(next)];
    next = (next + 1) % copies;
    cuda::Exec exec{s, c.ws.data(), c.ws.bytes()};
    const kernels::IntLinearArgs a = args_of(c);
    switch (what) {
      case What::kFull:
        if (int4) cuda::w4a8_gemm(a, exec);
        else cuda::w8a8_gemm(a, exec);
        break;
      case What::kGemmOnly: cuda::gemm_bench::int8_gemm_prequantized(a, int4, exec); break;
      case What::kQuantizeOnly:
        cuda::quantize_rows_int8(a.x, DType::kBF16, M, K, c.ws.as<int8_t>(),
                                 reinterpret_cast<float*>(c.ws.as<uint8_t>() + (static_cast<size_t>(M * K) + 255) / 256 * 256),
                                 cuda::Exec{s, nullptr, 0});
        break;
    }
  };
  BenchResult r;
  r.seconds = bench_graph(fn, stream.handle());
  const double quant_bytes = static_cast<double>(x_bytes) + static_cast<double>(M * K) + 4.0 * static_cast<double>(M);
  switch (what) {
    case What::kFull:
      r.bytes = static_cast<double>(x_bytes + w_bytes + out_bytes + scale_count * 4);
      r.flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
      break;
    case What::kGemmOnly:
      r.bytes = static_cast<double>(static_cast<size_t>(M * K) + w_bytes + out_bytes + scale_count * 4);
      r.flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
      break;
    case What::kQuantizeOnly: r.bytes = quant_bytes; break;
  }
  r.peer = peer;
  r.note = std::string(int4 ? "int4" : "int8") + " weights, " +
           (group_size == 0 ? std::string("per channel") : "group " + std::to_string(group_size)) +
           ", bf16 x and out, " +
           (what == What::kQuantizeOnly ? std::string("quantize only")
            : cuda::gemm_bench::last_gemm_kernel() == 2
                ? "wgmma m64nNk32 + TMA, grid " + std::to_string(cuda::gemm_bench::last_gemm_grid())
                : std::string("mma.sync m16n8k32")) +
           (what != What::kFull ? std::string() : std::string(", quantization kernel in front")) +
           (copies > 1 ? ", 4 rotated copies" : "");
  return r;
}

constexpr const char* kPeerBig = "int8 _int_mm M2048 K4096 N14336";
constexpr const char* kPeerSmall = "int8 _int_mm M512 K4096 N4096";

CIDER_CUDA_BENCH("w8a8 gemm M2048 K4096 N14336", "gemm") {
  return run_linear(2048, 4096, 14336, false, 0, What::kFull, kPeerBig);
}
CIDER_CUDA_BENCH("w8a8 gemm only M2048 K4096 N14336", "gemm") {
  return run_linear(2048, 4096, 14336, false, 0, What::kGemmOnly, kPeerBig);
}
CIDER_CUDA_BENCH("w8a8 gemm g128 M2048 K4096 N14336", "gemm") {
  return run_linear(2048, 4096, 14336, false, 128, What::kFull, kPeerBig);
}
CIDER_CUDA_BENCH("w4a8 gemm M2048 K4096 N14336", "gemm") {
  return run_linear(2048, 4096, 14336, true, 0, What::kFull, kPeerBig);
}
CIDER_CUDA_BENCH("w4a8 gemm g128 M2048 K4096 N14336", "gemm") {
  return run_linear(2048, 4096, 14336, true, 128, What::kFull, kPeerBig);
}
CIDER_CUDA_BENCH("w8a8 gemm M512 K4096 N4096", "gemm") {
  return run_linear(512, 4096, 4096, false, 0, What::kFull, kPeerSmall);
}
CIDER_CUDA_BENCH("w8a8 gemm only M512 K4096 N4096", "gemm") {
  return run_linear(512, 4096, 4096, false, 0, What::kGemmOnly, kPeerSmall);
}
CIDER_CUDA_BENCH("w4a8 gemm M512 K4096 N4096", "gemm") {
  return run_linear(512, 4096, 4096, true, 0, What::kFull, kPeerSmall);
}
// W4A8 in groups of 64 (the served models' format) and 128, and the mma.sync kernel on the W4A8 shapes.
CIDER_CUDA_BENCH("w4a8 gemm g64 M2048 K4096 N14336", "gemm") {
  return run_linear(2048, 4096, 14336, true, 64, What::kFull, kPeerBig);
}
CIDER_CUDA_BENCH("w4a8 gemm g64 M512 K4096 N4096", "gemm") {
  return run_linear(512, 4096, 4096, true, 64, What::kFull, kPeerSmall);
}
CIDER_CUDA_BENCH("w4a8 gemm M2048 K4096 N14336 mma.sync", "gemm") {
  return run_linear(2048, 4096, 14336, true, 0, What::kFull, kPeerBig, 1);
}
CIDER_CUDA_BENCH("w4a8 gemm g64 M2048 K4096 N14336 mma.sync", "gemm") {
  return run_linear(2048, 4096, 14336, true, 64, What::kFull, kPeerBig, 1);
}
CIDER_CUDA_BENCH("w4a8 gemm g128 M2048 K4096 N14336 mma.sync", "gemm") {
  return run_linear(2048, 4096, 14336, true, 128, What::kFull, kPeerBig, 1);
}
CIDER_CUDA_BENCH("w4a8 gemm g64 M512 K4096 N4096 mma.sync", "gemm") {
  return run_linear(512, 4096, 4096, true, 64, What::kFull, kPeerSmall, 1);
}
// The mma.sync kernel on the same shapes (the fallback and comparison point of the default wgmma kernel).
CIDER_CUDA_BENCH("w8a8 gemm M2048 K4096 N14336 mma.sync", "gemm") {
  return run_linear(2048, 4096, 14336, false, 0, What::kFull, kPeerBig, 1);
}
CIDER_CUDA_BENCH("w8a8 gemm only M2048 K4096 N14336 mma.sync", "gemm") {
  return run_linear(2048, 4096, 14336, false, 0, What::kGemmOnly, kPeerBig, 1);
}
CIDER_CUDA_BENCH("w8a8 gemm g128 M2048 K4096 N14336 mma.sync", "gemm") {
  return run_linear(2048, 4096, 14336, false, 128, What::kFull, kPeerBig, 1);
}
CIDER_CUDA_BENCH("w8a8 gemm M512 K4096 N4096 mma.sync", "gemm") {
  return run_linear(512, 4096, 4096, false, 0, What::kFull, kPeerSmall, 1);
}
CIDER_CUDA_BENCH("w8a8 gemm g64 M2048 K4096 N14336", "gemm") {
  return run_linear(2048, 4096, 14336, false, 64, What::kFull, kPeerBig);
}
// A down projection's prefill shape.
CIDER_CUDA_BENCH("w8a8 gemm M512 K14336 N4096", "gemm") {
  return run_linear(512, 14336, 4096, false, 0, What::kFull, "");
}
// A server step carrying prompt chunks: about 128 rows (runtime/engine.cpp, 256 at most) through each of the
// Llama-3-8B-shaped layer's W4A8 g64 projections, the weights streamed once for few rows.
CIDER_CUDA_BENCH("w4a8 gemm g64 M128 K4096 N6144 (qkv)", "gemm") {
  return run_linear(128, 4096, 6144, true, 64, What::kFull, "");
}
CIDER_CUDA_BENCH("w4a8 gemm g64 M128 K4096 N4096 (o)", "gemm") {
  return run_linear(128, 4096, 4096, true, 64, What::kFull, "");
}
CIDER_CUDA_BENCH("w4a8 gemm g64 M128 K4096 N28672 (gate|up)", "gemm") {
  return run_linear(128, 4096, 28672, true, 64, What::kFull, "");
}
CIDER_CUDA_BENCH("w4a8 gemm g64 M128 K14336 N4096 (down)", "gemm") {
  return run_linear(128, 14336, 4096, true, 64, What::kFull, "");
}
// Mixture of experts: a Mixtral-8x7B expert's fused gate|up (K4096 N28672) over its share of a 512-token prefill
// (top 2 of 8 experts: 128 rows), against the same GEMM over all 512 rows (a dense layer of that shape). Issue 24's
// target: the expert GEMM at >= 60 % of the dense one's throughput.
CIDER_CUDA_BENCH("w4a8 gemm moe-expert M128 K4096 N28672", "gemm") {
  return run_linear(128, 4096, 28672, true, 0, What::kFull, "");
}
CIDER_CUDA_BENCH("w4a8 gemm moe-dense M512 K4096 N28672", "gemm") {
  return run_linear(512, 4096, 28672, true, 0, What::kFull, "");
}

CIDER_CUDA_BENCH("quantize_rows_int8 bf16 M2048 K4096", "gemm") {
  return run_linear(2048, 4096, 256, false, 0, What::kQuantizeOnly, "");
}

}  // namespace
}  // namespace cider::bench
