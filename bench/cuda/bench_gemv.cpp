// Decode GEMV benchmarks: cuda::w8a8_gemv / cuda::w4a8_gemv and the native GGUF cuda::ggml_linear ("ggml-gemv",
// "ggml-prefill") against PyTorch's bf16 GEMV (and int8 _int_mm at M32), rows of tools/gpu/peers.py. x float32 (the
// engine's activations), out float32.
// Weights: fresh random bytes, rotated over enough distinct copies that a replay never finds them in the 60 MB L2.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda/bench_cuda.h"
#include "tests/support/scoped_env.h"
#include "core/dtype.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/kernel_table.h"
#include "quant/ggml_blocks.h"

namespace cider::cuda::gemv_bench {  // linear_gemv.cu: launch knobs and the load-only roof (benchmarks, tests only)
void set_gemv_tuning(int warps, int blocks_per_sm, int quantize, int ring, int epilogue_prefetch, int split);
void set_gemv_kernel(int kernel);  // 0 automatic, 1 the tile kernel, 2 the row kernel (M = 1)
void set_gemv_rows_per_task(int rows);  // row kernel: 0 automatic, 1 or 2 weight rows per warp task
void set_gemv_row_loads(int loads);  // row kernel: 0 automatic, 1 registers, 2 / 3 bulk-copy slots per warp
void stream_read(const void* p, size_t bytes, void* sink, void* stream);
}  // namespace cider::cuda::gemv_bench
namespace cider::cuda::ggml_bench {  // linear_ggml.cu: the native decode kernel (0 automatic, 1 warp per row, 2 rows)
void set_ggml_gemv_kernel(int kernel);
int last_ggml_gemv_kernel();
}  // namespace cider::cuda::ggml_bench

namespace cider::bench {
namespace {

// A launch variant: warps per block (8 / 16), blocks per SM cap, quantize (1 fused in every block, 2 once into the
// workspace), workspace (false: the caller passes none, as the tests' plain Exec{}); 0 = the launcher's choice.
struct Variant {
  int warps = 0, blocks_per_sm = 0, quantize = 0;
  bool workspace = true;
  int ring = 0;      // 1: the register ring (plain loads), else the cp.async ring
  int prefetch = 0;  // 2: the epilogue's scale/bias loaded after the barrier (the default prefetches them)
  int split = 0;     // warps per tile (16-warp blocks, cp.async ring): 1, 2, 4 or 16
  int kernel = 0;    // 1: the tile kernel for M = 1 (the default there is the row kernel)
  int rows_per_task = 0;  // row kernel: 1 or 2 weight rows per warp task (0: its rule)
  int row_loads = 0;  // row kernel: 1 registers, 2 bulk 24 warps × 2 slots, 3 bulk 16 × 3 (0: automatic)
  std::string describe() const {
    std::string s;
    if (warps) s += " warps " + std::to_string(warps);
    if (blocks_per_sm) s += " blocks/SM " + std::to_string(blocks_per_sm);
    if (quantize) s += quantize == 1 ? " quantize fused" : " quantize once";
    if (!workspace) s += " no workspace";
    if (ring == 1) s += " register ring";
    if (prefetch == 2) s += " no epilogue prefetch";
    if (split) s += " warps/tile " + std::to_string(split);
    if (kernel == 1) s += " tile kernel";
    if (rows_per_task) s += " rows/task " + std::to_string(rows_per_task);
    if (row_loads) s += row_loads == 1 ? " register loads" : " bulk " + std::to_string(row_loads) + " slots";
    return s;
  }
};

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng();
    for (int b = 0; b < 8; ++b) v[i + static_cast<size_t>(b)] = static_cast<uint8_t>(r >> (8 * b));
  }
  for (; i < n; ++i) v[i] = static_cast<uint8_t>(rng());
  return v;
}

BenchResult bench_int_gemv(bool int4, int64_t M, int64_t K, int64_t N, int group_size, const char* peer,
                           const Variant& variant = {}) {
  std::mt19937_64 rng(0x5eed0000u + static_cast<uint64_t>(M * 131 + K * 7 + N + group_size));
  const size_t w_bytes = static_cast<size_t>(int4 ? N * K / 2 : N * K);
  const int64_t groups = group_size == 0 ? 1 : K / group_size;
  const size_t scale_bytes = static_cast<size_t>(groups * N) * sizeof(float);
  // ≥ 4 copies and ≥ 2.5 × the 60 MB L2 in all.
  const size_t copies = std::max<size_t>(4, (150u << 20) / (w_bytes + scale_bytes) + 1);

  std::vector<cuda::DeviceBuffer> weights, scales;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale_dist(1e-3f, 2e-2f);
  for (size_t c = 0; c < copies; ++c) {
    std::vector<uint8_t> w = random_bytes(rng, w_bytes);
    weights.push_back(cuda::to_device(w.data(), w.size()));
    std::vector<float> s(static_cast<size_t>(groups * N));
    for (auto& v : s) v = scale_dist(rng);
    scales.push_back(cuda::to_device(s.data(), scale_bytes));
  }
  std::vector<float> x(static_cast<size_t>(M * K)), bias(static_cast<size_t>(N));
  for (auto& v : x) v = normal(rng);
  for (auto& v : bias) v = normal(rng);
  cuda::DeviceBuffer d_x = cuda::to_device(x.data(), x.size() * sizeof(float));
  cuda::DeviceBuffer d_bias = cuda::to_device(bias.data(), bias.size() * sizeof(float));
  cuda::DeviceBuffer d_out(static_cast<size_t>(M * N) * sizeof(float));
  // The engine passes a workspace (int_linear_workspace_bytes of its largest layer) to every linear layer.
  cuda::DeviceBuffer d_ws(cuda::int_linear_workspace_bytes(M, K));

  cuda::Stream stream;
  size_t next = 0;
  auto run = [&](void* s) {
    const size_t c = next++ % copies;
    kernels::IntLinearArgs a{d_x.data(), DType::kF32, weights[c].data(), scales[c].as<float>(), d_bias.as<float>(),
                             d_out.data(), DType::kF32, M, N, K, group_size};
    cuda::Exec exec;
    exec.stream = s;
    if (variant.workspace) {
      exec.workspace = d_ws.data();
      exec.workspace_bytes = d_ws.bytes();
    }
    int4 ? cuda::w4a8_gemv(a, exec) : cuda::w8a8_gemv(a, exec);
  };
  cuda::gemv_bench::set_gemv_tuning(variant.warps, variant.blocks_per_sm, variant.quantize, variant.ring,
                                    variant.prefetch, variant.split);
  cuda::gemv_bench::set_gemv_kernel(variant.kernel);
  cuda::gemv_bench::set_gemv_rows_per_task(variant.rows_per_task);
  cuda::gemv_bench::set_gemv_row_loads(variant.row_loads);
  BenchResult r;
  r.seconds = bench_graph(run, stream.handle(), 20, 15);
  cuda::gemv_bench::set_gemv_tuning(0, 0, 0, 0, 0, 0);
  cuda::gemv_bench::set_gemv_kernel(0);
  cuda::gemv_bench::set_gemv_rows_per_task(0);
  cuda::gemv_bench::set_gemv_row_loads(0);
  r.bytes = static_cast<double>(w_bytes + scale_bytes) + 4.0 * static_cast<double>(M * K + N + M * N);
  r.flops = 2.0 * static_cast<double>(M * K * N);
  r.peer = peer;
  r.note = std::to_string(copies) + " weight copies" + variant.describe();
  return r;
}

// The achievable read roof for `bytes` of weights: the GEMV's streaming loads and nothing else (rotated copies).
BenchResult bench_read_roof(size_t bytes) {
  const size_t copies = std::max<size_t>(4, (150u << 20) / bytes + 1);
  std::mt19937_64 rng(0x700f + bytes);
  std::vector<cuda::DeviceBuffer> bufs;
  for (size_t c = 0; c < copies; ++c) {
    std::vector<uint8_t> b = random_bytes(rng, bytes);
    bufs.push_back(cuda::to_device(b.data(), b.size()));
  }
  cuda::DeviceBuffer sink(256);
  cuda::Stream stream;
  size_t next = 0;
  auto run = [&](void* s) { cuda::gemv_bench::stream_read(bufs[next++ % copies].data(), bytes, sink.data(), s); };
  BenchResult r;
  r.seconds = bench_graph(run, stream.handle(), 20, 15);
  r.bytes = static_cast<double>(bytes);
  r.note = std::to_string(copies) + " copies; 16-byte loads only, 4 x 512 threads per SM";
  return r;
}

}  // namespace

// M = 1, Llama-3-8B-like MLP up/gate (K4096 N14336), attention-sized (K4096 N4096), 70B-like (K8192 N28672).
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N14336", "linear") {
  return bench_int_gemv(false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336");
}
CIDER_CUDA_BENCH("w8a8 gemv g128 M1 K4096 N14336", "linear") {
  return bench_int_gemv(false, 1, 4096, 14336, 128, "bf16 GEMV K4096 N14336");
}
CIDER_CUDA_BENCH("w4a8 gemv M1 K4096 N14336", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336");
}
CIDER_CUDA_BENCH("w4a8 gemv g128 M1 K4096 N14336", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 128, "bf16 GEMV K4096 N14336");
}
CIDER_CUDA_BENCH("w4a8 gemv g32 M1 K4096 N14336", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 32, "bf16 GEMV K4096 N14336");
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N4096", "linear") {
  return bench_int_gemv(false, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096");
}
CIDER_CUDA_BENCH("w4a8 gemv M1 K4096 N4096", "linear") {
  return bench_int_gemv(true, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096");
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K8192 N28672", "linear") {
  return bench_int_gemv(false, 1, 8192, 28672, 0, "bf16 GEMV K8192 N28672");
}
CIDER_CUDA_BENCH("w4a8 gemv M1 K8192 N28672", "linear") {
  return bench_int_gemv(true, 1, 8192, 28672, 0, "bf16 GEMV K8192 N28672");
}
// The model's other decode shapes: the down projection (K14336 N4096) and W4A8 with the engine's g64 scales.
CIDER_CUDA_BENCH("w8a8 gemv M1 K14336 N4096", "linear") {
  return bench_int_gemv(false, 1, 14336, 4096, 0, "bf16 GEMV K14336 N4096");
}
CIDER_CUDA_BENCH("w4a8 gemv g64 M1 K4096 N14336", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 64, "bf16 GEMV K4096 N14336");
}
CIDER_CUDA_BENCH("w4a8 gemv g64 M1 K14336 N4096", "linear") {
  return bench_int_gemv(true, 1, 14336, 4096, 64, "bf16 GEMV K14336 N4096");
}
// A decode batch of 16 tokens: the weights are streamed once for all 16 rows.
CIDER_CUDA_BENCH("w8a8 gemv M16 K4096 N14336", "linear") {
  return bench_int_gemv(false, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336");
}
CIDER_CUDA_BENCH("w4a8 gemv M16 K4096 N14336", "linear") {
  return bench_int_gemv(true, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336");
}
// The engine's W4A8 (g64) and the down projection in decode batches of 4, 8 and 16 (a serving step).
CIDER_CUDA_BENCH("w4a8 gemv g64 M4 K4096 N14336", "linear") { return bench_int_gemv(true, 4, 4096, 14336, 64, ""); }
CIDER_CUDA_BENCH("w4a8 gemv g64 M8 K4096 N14336", "linear") { return bench_int_gemv(true, 8, 4096, 14336, 64, ""); }
CIDER_CUDA_BENCH("w4a8 gemv g64 M16 K4096 N14336", "linear") { return bench_int_gemv(true, 16, 4096, 14336, 64, ""); }
CIDER_CUDA_BENCH("w4a8 gemv g64 M8 K14336 N4096", "linear") { return bench_int_gemv(true, 8, 14336, 4096, 64, ""); }
CIDER_CUDA_BENCH("w4a8 gemv g64 M16 K14336 N4096", "linear") { return bench_int_gemv(true, 16, 14336, 4096, 64, ""); }
CIDER_CUDA_BENCH("w8a8 gemv M16 K14336 N4096", "linear") { return bench_int_gemv(false, 16, 14336, 4096, 0, ""); }
CIDER_CUDA_BENCH("w8a8 gemv M16 K4096 N128256", "linear") { return bench_int_gemv(false, 16, 4096, 128256, 0, ""); }
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N128256", "linear") { return bench_int_gemv(false, 1, 4096, 128256, 0, ""); }


// ---- variants (what limits each case): load-only roofs, warps per block, blocks per SM, where x is quantized ----
CIDER_CUDA_BENCH("gemv roof read 58.7 MB (w8 K4096 N14336)", "linear") { return bench_read_roof(4096u * 14336u); }
CIDER_CUDA_BENCH("gemv roof read 29.4 MB (w4 K4096 N14336)", "linear") { return bench_read_roof(2048u * 14336u); }
CIDER_CUDA_BENCH("gemv roof read 16.8 MB (w8 K4096 N4096)", "linear") { return bench_read_roof(4096u * 4096u); }
CIDER_CUDA_BENCH("gemv roof read 235 MB (w8 K8192 N28672)", "linear") { return bench_read_roof(8192u * 28672u); }
// The W4 sizes of the other two shapes, so the w4a8 rows have a roof at three sizes (fixed cost vs streaming rate).
CIDER_CUDA_BENCH("gemv roof read 8.4 MB (w4 K4096 N4096)", "linear") { return bench_read_roof(2048u * 4096u); }
CIDER_CUDA_BENCH("gemv roof read 117 MB (w4 K8192 N28672)", "linear") { return bench_read_roof(4096u * 28672u); }
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N14336 v:8warps 2/SM", "linear") {
  return bench_int_gemv(false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {8, 2, 0, true});
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N14336 v:8warps 1/SM", "linear") {
  return bench_int_gemv(false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {8, 1, 0, true});
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N14336 v:register ring", "linear") {
  return bench_int_gemv(false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {0, 0, 0, true, 1});
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N14336 v:register ring 8warps 2/SM", "linear") {
  return bench_int_gemv(false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {8, 2, 0, true, 1});
}
CIDER_CUDA_BENCH("w4a8 gemv M1 K4096 N14336 v:register ring", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {0, 0, 0, true, 1});
}
CIDER_CUDA_BENCH("w8a8 gemv M16 K4096 N14336 v:register ring", "linear") {
  return bench_int_gemv(false, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", {0, 0, 0, true, 1});
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K8192 N28672 v:8warps 2/SM", "linear") {
  return bench_int_gemv(false, 1, 8192, 28672, 0, "bf16 GEMV K8192 N28672", {8, 2, 0, true});
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N14336 v:quantize once", "linear") {
  return bench_int_gemv(false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {0, 0, 2, true});
}
CIDER_CUDA_BENCH("w4a8 gemv M1 K4096 N14336 v:8warps 2/SM", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {8, 2, 0, true});
}
CIDER_CUDA_BENCH("w4a8 gemv M1 K4096 N14336 v:quantize once", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {0, 0, 2, true});
}
CIDER_CUDA_BENCH("w8a8 gemv M16 K4096 N14336 v:quantize fused", "linear") {
  return bench_int_gemv(false, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", {0, 0, 1, true});
}
CIDER_CUDA_BENCH("w8a8 gemv M16 K4096 N14336 v:8warps 2/SM", "linear") {
  return bench_int_gemv(false, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", {8, 2, 0, true});
}
CIDER_CUDA_BENCH("w4a8 gemv M16 K4096 N14336 v:quantize fused", "linear") {
  return bench_int_gemv(true, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", {0, 0, 1, true});
}
CIDER_CUDA_BENCH("w8a8 gemv M4 K4096 N14336", "linear") {
  return bench_int_gemv(false, 4, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336");
}
CIDER_CUDA_BENCH("w8a8 gemv M4 K4096 N14336 v:quantize once", "linear") {
  return bench_int_gemv(false, 4, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", {0, 0, 2, true});
}
CIDER_CUDA_BENCH("w8a8 gemv M8 K4096 N14336", "linear") {
  return bench_int_gemv(false, 8, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336");
}
CIDER_CUDA_BENCH("w8a8 gemv M8 K4096 N14336 v:quantize fused", "linear") {
  return bench_int_gemv(false, 8, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", {0, 0, 1, true});
}

// Without the epilogue prefetch (w_scales[n] / bias[n] loaded after the barrier, the old default): the A/B.
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N14336 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w8a8 gemv g128 M1 K4096 N14336 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(false, 1, 4096, 14336, 128, "bf16 GEMV K4096 N14336", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w4a8 gemv M1 K4096 N14336 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w4a8 gemv g128 M1 K4096 N14336 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 128, "bf16 GEMV K4096 N14336", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w4a8 gemv g32 M1 K4096 N14336 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(true, 1, 4096, 14336, 32, "bf16 GEMV K4096 N14336", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N4096 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(false, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w4a8 gemv M1 K4096 N4096 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(true, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K8192 N28672 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(false, 1, 8192, 28672, 0, "bf16 GEMV K8192 N28672", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w4a8 gemv M1 K8192 N28672 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(true, 1, 8192, 28672, 0, "bf16 GEMV K8192 N28672", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w8a8 gemv M16 K4096 N14336 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(false, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", {0, 0, 0, true, 0, 2});
}
CIDER_CUDA_BENCH("w4a8 gemv M16 K4096 N14336 v:no epilogue prefetch", "linear") {
  return bench_int_gemv(true, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", {0, 0, 0, true, 0, 2});
}

}  // namespace cider::bench

// Programmatic dependent launch off (kernels/cuda/pdl.cuh): back-to-back GEMVs in the timing graph then do not
// overlap one's weight prologue with the previous one's tail. The A/B of the default.
namespace cider::bench {
namespace {
BenchResult gemv_without_pdl(bool int4) {
  const test::ScopedEnv off("CIDER_PDL", "0");
  return bench_int_gemv(int4, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336");
}
}  // namespace
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N14336 v:no pdl", "linear") { return gemv_without_pdl(false); }
CIDER_CUDA_BENCH("w4a8 gemv M1 K4096 N14336 v:no pdl", "linear") { return gemv_without_pdl(true); }
}  // namespace cider::bench

// ---- tile groups: 1, 2 or 4 warps per tile instead of the whole block (fewer, smaller barriers per byte) ----------
namespace cider::bench {
#define CIDER_GEMV_SPLIT_CASE(name, int4, M, K, N, gs, peer, split)                                     \
  CIDER_CUDA_BENCH(name " v:split " #split, "linear") {                                                 \
    return bench_int_gemv(int4, M, K, N, gs, peer, {0, 0, 0, true, 0, 0, split});                        \
  }
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M1 K4096 N14336", false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 1)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M1 K4096 N14336", false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 2)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M1 K4096 N14336", false, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 4)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M1 K4096 N14336", true, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 1)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M1 K4096 N14336", true, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 2)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M1 K4096 N14336", true, 1, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 4)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv g128 M1 K4096 N14336", false, 1, 4096, 14336, 128, "bf16 GEMV K4096 N14336", 1)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv g128 M1 K4096 N14336", false, 1, 4096, 14336, 128, "bf16 GEMV K4096 N14336", 4)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv g128 M1 K4096 N14336", true, 1, 4096, 14336, 128, "bf16 GEMV K4096 N14336", 1)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv g128 M1 K4096 N14336", true, 1, 4096, 14336, 128, "bf16 GEMV K4096 N14336", 4)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv g32 M1 K4096 N14336", true, 1, 4096, 14336, 32, "bf16 GEMV K4096 N14336", 1)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv g32 M1 K4096 N14336", true, 1, 4096, 14336, 32, "bf16 GEMV K4096 N14336", 4)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M1 K4096 N4096", false, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096", 1)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M1 K4096 N4096", false, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096", 2)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M1 K4096 N4096", false, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096", 4)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M1 K4096 N4096", true, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096", 1)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M1 K4096 N4096", true, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096", 2)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M1 K4096 N4096", true, 1, 4096, 4096, 0, "bf16 GEMV K4096 N4096", 4)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M1 K8192 N28672", false, 1, 8192, 28672, 0, "bf16 GEMV K8192 N28672", 1)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M1 K8192 N28672", false, 1, 8192, 28672, 0, "bf16 GEMV K8192 N28672", 4)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M1 K8192 N28672", true, 1, 8192, 28672, 0, "bf16 GEMV K8192 N28672", 1)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M1 K8192 N28672", true, 1, 8192, 28672, 0, "bf16 GEMV K8192 N28672", 4)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M16 K4096 N14336", false, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", 1)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M16 K4096 N14336", false, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", 4)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M16 K4096 N14336", true, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", 1)
CIDER_GEMV_SPLIT_CASE("w4a8 gemv M16 K4096 N14336", true, 16, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", 4)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M4 K4096 N14336", false, 4, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", 1)
CIDER_GEMV_SPLIT_CASE("w8a8 gemv M4 K4096 N14336", false, 4, 4096, 14336, 0, "int8 _int_mm M32 K4096 N14336", 4)
#undef CIDER_GEMV_SPLIT_CASE
}  // namespace cider::bench

// ---- the tile kernel at M = 1 (the default there is the row kernel, linear_gemv_rows.cu): the A/B of round 6 ------
namespace cider::bench {
#define CIDER_GEMV_TILE_CASE(name, int4, K, N, gs, peer)                                               \
  CIDER_CUDA_BENCH(name " v:tile kernel", "linear") {                                                 \
    Variant v;                                                                                          \
    v.kernel = 1;                                                                                       \
    return bench_int_gemv(int4, 1, K, N, gs, peer, v);                                                  \
  }
CIDER_GEMV_TILE_CASE("w8a8 gemv M1 K4096 N14336", false, 4096, 14336, 0, "bf16 GEMV K4096 N14336")
CIDER_GEMV_TILE_CASE("w4a8 gemv M1 K4096 N14336", true, 4096, 14336, 0, "bf16 GEMV K4096 N14336")
CIDER_GEMV_TILE_CASE("w8a8 gemv g128 M1 K4096 N14336", false, 4096, 14336, 128, "bf16 GEMV K4096 N14336")
CIDER_GEMV_TILE_CASE("w4a8 gemv g64 M1 K4096 N14336", true, 4096, 14336, 64, "bf16 GEMV K4096 N14336")
CIDER_GEMV_TILE_CASE("w8a8 gemv M1 K4096 N4096", false, 4096, 4096, 0, "bf16 GEMV K4096 N4096")
CIDER_GEMV_TILE_CASE("w8a8 gemv M1 K14336 N4096", false, 14336, 4096, 0, "bf16 GEMV K14336 N4096")
CIDER_GEMV_TILE_CASE("w4a8 gemv g64 M1 K14336 N4096", true, 14336, 4096, 64, "bf16 GEMV K14336 N4096")
CIDER_GEMV_TILE_CASE("w8a8 gemv M1 K8192 N28672", false, 8192, 28672, 0, "bf16 GEMV K8192 N28672")
#undef CIDER_GEMV_TILE_CASE
}  // namespace cider::bench
// The fused q/k/v (K4096 N6144) and gate/up (K4096 N28672) projections of the model's decode step.
namespace cider::bench {
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N6144", "linear") {
  return bench_int_gemv(false, 1, 4096, 6144, 0, "bf16 GEMV K4096 N6144");
}
CIDER_CUDA_BENCH("w8a8 gemv M1 K4096 N28672", "linear") {
  return bench_int_gemv(false, 1, 4096, 28672, 0, "bf16 GEMV K4096 N28672");
}
}  // namespace cider::bench

// Row kernel, rows per warp task forced (W4 K4096 defaults to 2: 4 chunk steps per lane and row; 1 halves the bytes a
// warp keeps in flight but gives 108.6 one-row tasks per block instead of 54.3 two-row tasks over 24 warps).
namespace cider::bench {
#define CIDER_GEMV_ROWS_CASE(name, int4, K, N, gs, peer, rows)                                         \
  CIDER_CUDA_BENCH(name " v:rows/task " #rows, "linear") {                                            \
    Variant v;                                                                                          \
    v.rows_per_task = rows;                                                                             \
    return bench_int_gemv(int4, 1, K, N, gs, peer, v);                                                  \
  }
CIDER_GEMV_ROWS_CASE("w4a8 gemv M1 K4096 N14336", true, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 1)
CIDER_GEMV_ROWS_CASE("w4a8 gemv g64 M1 K4096 N14336", true, 4096, 14336, 64, "bf16 GEMV K4096 N14336", 1)
CIDER_GEMV_ROWS_CASE("w4a8 gemv M1 K4096 N4096", true, 4096, 4096, 0, "bf16 GEMV K4096 N4096", 1)
CIDER_GEMV_ROWS_CASE("w8a8 gemv M1 K4096 N14336", false, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 2)
#undef CIDER_GEMV_ROWS_CASE
}  // namespace cider::bench

// Row kernel weight loads (session 4): registers (one 4 KB batch per warp in flight, 24 warps: 96 KB per SM, the
// kernel of session 3; the default per group and below 28 MB) against bulk copies into shared-memory slots (192 KB per
// SM: 24 warps × 2 slots, or 16 warps × 3 slots — the default for per-channel matrices of ≥ 28 MB).
namespace cider::bench {
#define CIDER_GEMV_LOADS_CASE(name, int4, K, N, gs, peer, loads, tag)                                  \
  CIDER_CUDA_BENCH(name " v:" tag, "linear") {                                                          \
    Variant v;                                                                                          \
    v.row_loads = loads;                                                                                \
    return bench_int_gemv(int4, 1, K, N, gs, peer, v);                                                  \
  }
CIDER_GEMV_LOADS_CASE("w8a8 gemv M1 K4096 N14336", false, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 1, "register loads")
CIDER_GEMV_LOADS_CASE("w8a8 gemv M1 K4096 N14336", false, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 2, "bulk 2 slots")
CIDER_GEMV_LOADS_CASE("w4a8 gemv M1 K4096 N14336", true, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 1, "register loads")
CIDER_GEMV_LOADS_CASE("w4a8 gemv M1 K4096 N14336", true, 4096, 14336, 0, "bf16 GEMV K4096 N14336", 3, "bulk 3 slots")
CIDER_GEMV_LOADS_CASE("w4a8 gemv M1 K4096 N4096", true, 4096, 4096, 0, "bf16 GEMV K4096 N4096", 3, "bulk 3 slots")
CIDER_GEMV_LOADS_CASE("w4a8 gemv g64 M1 K4096 N14336", true, 4096, 14336, 64, "bf16 GEMV K4096 N14336", 3, "bulk 3 slots")
CIDER_GEMV_LOADS_CASE("w8a8 gemv g128 M1 K4096 N14336", false, 4096, 14336, 128, "bf16 GEMV K4096 N14336", 3, "bulk 3 slots")
CIDER_GEMV_LOADS_CASE("w8a8 gemv M1 K4096 N4096", false, 4096, 4096, 0, "bf16 GEMV K4096 N4096", 3, "bulk 3 slots")
CIDER_GEMV_LOADS_CASE("w8a8 gemv M1 K4096 N6144", false, 4096, 6144, 0, "bf16 GEMV K4096 N6144", 3, "bulk 3 slots")
CIDER_GEMV_LOADS_CASE("w8a8 gemv M1 K4096 N28672", false, 4096, 28672, 0, "bf16 GEMV K4096 N28672", 1, "register loads")
CIDER_GEMV_LOADS_CASE("w8a8 gemv M1 K14336 N4096", false, 14336, 4096, 0, "bf16 GEMV K14336 N4096", 1, "register loads")
CIDER_GEMV_LOADS_CASE("w8a8 gemv M1 K14336 N4096", false, 14336, 4096, 0, "bf16 GEMV K14336 N4096", 2, "bulk 2 slots")
CIDER_GEMV_LOADS_CASE("w4a8 gemv g64 M1 K14336 N4096", true, 14336, 4096, 64, "bf16 GEMV K14336 N4096", 3, "bulk 3 slots")
CIDER_GEMV_LOADS_CASE("w8a8 gemv M1 K8192 N28672", false, 8192, 28672, 0, "bf16 GEMV K8192 N28672", 1, "register loads")
CIDER_GEMV_LOADS_CASE("w4a8 gemv M1 K8192 N28672", true, 8192, 28672, 0, "bf16 GEMV K8192 N28672", 1, "register loads")
#undef CIDER_GEMV_LOADS_CASE
}  // namespace cider::bench

// ---- native GGUF weights (cuda::ggml_linear, kernels/cuda/linear_ggml.cu) ----------------------------------------
// Decode (M ≤ kGgmlGemvRows): int8 activations per 32, the blocks' integer form, the weights streamed once for all
// M rows: TB/s is the weight bytes (plus x, bias, out) per second, beside the bf16 GEMV peer and the "gemv roof read"
// rows. Prefill (M > kGgmlGemvRows): the weights decoded to bf16 in the workspace, then cuBLASLt: TOP/s.
// Blocks: fresh random bytes with finite float16 scales of realistic size (random bytes would hold infinities and
// NaNs, which real files do not), as tests/support/ggml_cases.h makes them (not included: no test headers here).
namespace cider::bench {
namespace {

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

std::vector<uint8_t> ggml_random_blocks(std::mt19937_64& rng, quant::GgmlType t, int64_t blocks) {
  using quant::GgmlType;
  const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(t));
  std::vector<uint8_t> out = random_bytes(rng, static_cast<size_t>(blocks * f.block_bytes));
  std::uniform_real_distribution<float> d(0.001f, 0.05f), m(-0.05f, 0.05f);
  for (int64_t i = 0; i < blocks; ++i) {
    uint8_t* b = out.data() + i * f.block_bytes;
    switch (t) {
      case GgmlType::kQ8_0: case GgmlType::kQ4_0: case GgmlType::kQ5_0: put_f16(b, d(rng)); break;
      case GgmlType::kQ4_1: case GgmlType::kQ5_1: put_f16(b, d(rng)); put_f16(b + 2, m(rng)); break;
      case GgmlType::kQ4_K: case GgmlType::kQ5_K: put_f16(b, d(rng) / 16); put_f16(b + 2, d(rng) / 16); break;
      case GgmlType::kQ6_K: put_f16(b + 208, d(rng) / 64); break;
      default: break;
    }
  }
  return out;
}

// out[M, N] f32 = x[M, K] f32 · Wᵀ + bias, W [N, K] in ggml format t. Decode shapes rotate ≥ 4 weight copies of
// ≥ 150 MB in all (as bench_int_gemv); prefill rotates 4 copies of everything when it fits twice the 60 MB L2, else 1.
BenchResult bench_ggml_linear(quant::GgmlType t, int64_t M, int64_t K, int64_t N, const char* peer, int kernel = 0) {
  const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(t));
  std::mt19937_64 rng(0x66a1u + static_cast<uint64_t>(M * 131 + K * 7 + N) + static_cast<uint64_t>(t) * 1000003u);
  const int64_t row_bytes = quant::ggml_row_bytes(f, K);
  const size_t w_bytes = static_cast<size_t>(N * row_bytes);
  const bool gemv = M <= cuda::kGgmlGemvRows;
  const size_t act_bytes = 4 * static_cast<size_t>(M * K + N + M * N);
  const size_t copies = gemv ? std::max<size_t>(4, (150u << 20) / w_bytes + 1)
                             : (static_cast<double>(w_bytes + act_bytes) < 2 * 60e6 ? 4 : 1);
  std::vector<cuda::DeviceBuffer> weights;
  for (size_t c = 0; c < copies; ++c) {
    const std::vector<uint8_t> w = ggml_random_blocks(rng, t, N * K / f.block_size);
    weights.push_back(cuda::to_device(w.data(), w.size()));
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K)), bias(static_cast<size_t>(N));
  for (auto& v : x) v = normal(rng);
  for (auto& v : bias) v = normal(rng);
  cuda::DeviceBuffer d_x = cuda::to_device(x.data(), x.size() * sizeof(float));
  cuda::DeviceBuffer d_bias = cuda::to_device(bias.data(), bias.size() * sizeof(float));
  cuda::DeviceBuffer d_out(static_cast<size_t>(M * N) * sizeof(float));
  cuda::DeviceBuffer d_ws(cuda::ggml_linear_workspace_bytes(M, N, K));

  cuda::Stream stream;
  size_t next = 0;
  auto run = [&](void* s) {
    kernels::GgmlLinearArgs a{};
    a.x = d_x.as<float>();
    a.w = weights[next++ % copies].data();
    a.ggml_type = static_cast<uint32_t>(t);
    a.row_bytes = row_bytes;
    a.bias = d_bias.as<float>();
    a.out = d_out.as<float>();
    a.M = M;
    a.N = N;
    a.K = K;
    cuda::ggml_linear(a, cuda::Exec{s, d_ws.data(), d_ws.bytes()});
  };
  BenchResult r;
  cuda::ggml_bench::set_ggml_gemv_kernel(kernel);
  r.seconds = bench_graph(run, stream.handle(), 20, 15);  // the warm-up calls plan cuBLASLt outside the capture
  const int ran = cuda::ggml_bench::last_ggml_gemv_kernel();
  cuda::ggml_bench::set_ggml_gemv_kernel(0);
  r.bytes = static_cast<double>(w_bytes + act_bytes);
  r.flops = 2.0 * static_cast<double>(M * K * N);
  r.peer = peer;
  char note[160];
  std::snprintf(note, sizeof note, "%zu weight cop%s of %.1f MB (%s)%s", copies, copies == 1 ? "y" : "ies",
                static_cast<double>(w_bytes) / 1e6, f.name,
                gemv ? (ran == 2 ? ", int8 x per 32, row kernel" : ", int8 x per 32, warp per row")
                     : ", W decoded to bf16 in the workspace, then cuBLASLt");
  r.note = note;
  return r;
}

}  // namespace

#define CIDER_GGML_GEMV_CASE(type, M, K, N, peer)                                                         \
  CIDER_CUDA_BENCH("ggml-gemv " #type " M" #M " K" #K " N" #N, "linear") {                               \
    return bench_ggml_linear(quant::GgmlType::k##type, M, K, N, peer, 2);                                \
  }
// Llama-3-8B's gate/up (K4096 N14336) and down (K14336 N4096) projections, one token and a decode batch of 8.
CIDER_GGML_GEMV_CASE(Q4_K, 1, 4096, 14336, "bf16 GEMV K4096 N14336")
CIDER_GGML_GEMV_CASE(Q4_K, 1, 14336, 4096, "bf16 GEMV K14336 N4096")
CIDER_GGML_GEMV_CASE(Q4_K, 8, 4096, 14336, "int8 _int_mm M32 K4096 N14336")
CIDER_GGML_GEMV_CASE(Q4_K, 8, 14336, 4096, "")
CIDER_GGML_GEMV_CASE(Q6_K, 1, 4096, 14336, "bf16 GEMV K4096 N14336")
CIDER_GGML_GEMV_CASE(Q6_K, 1, 14336, 4096, "bf16 GEMV K14336 N4096")
CIDER_GGML_GEMV_CASE(Q6_K, 8, 4096, 14336, "int8 _int_mm M32 K4096 N14336")
CIDER_GGML_GEMV_CASE(Q6_K, 8, 14336, 4096, "")
CIDER_GGML_GEMV_CASE(Q8_0, 1, 4096, 14336, "bf16 GEMV K4096 N14336")
CIDER_GGML_GEMV_CASE(Q8_0, 1, 14336, 4096, "bf16 GEMV K14336 N4096")
CIDER_GGML_GEMV_CASE(Q8_0, 8, 4096, 14336, "int8 _int_mm M32 K4096 N14336")
CIDER_GGML_GEMV_CASE(Q8_0, 8, 14336, 4096, "")
CIDER_GGML_GEMV_CASE(Q5_0, 1, 4096, 14336, "bf16 GEMV K4096 N14336")
CIDER_GGML_GEMV_CASE(Q5_0, 1, 14336, 4096, "bf16 GEMV K14336 N4096")
CIDER_GGML_GEMV_CASE(Q5_0, 8, 4096, 14336, "int8 _int_mm M32 K4096 N14336")
CIDER_GGML_GEMV_CASE(Q5_0, 8, 14336, 4096, "")
#undef CIDER_GGML_GEMV_CASE
// The rows above ask for the row kernel (linear_ggml_rows.cu; the note says which kernel ran); these the warp-per-row
// kernel on the same shapes (the A/B, same job), then the read roof at these sizes.
#define CIDER_GGML_WARP_CASE(type, M, K, N)                                                              \
  CIDER_CUDA_BENCH("ggml-gemv " #type " M" #M " K" #K " N" #N " warp per row", "linear") {               \
    return bench_ggml_linear(quant::GgmlType::k##type, M, K, N, "", 1);                                \
  }
CIDER_GGML_WARP_CASE(Q4_K, 1, 4096, 14336)
CIDER_GGML_WARP_CASE(Q6_K, 1, 4096, 14336)
CIDER_GGML_WARP_CASE(Q8_0, 1, 4096, 14336)
CIDER_GGML_WARP_CASE(Q4_K, 8, 4096, 14336)
#undef CIDER_GGML_WARP_CASE
CIDER_CUDA_BENCH("gemv roof read 33.0 MB (Q4_K K4096 N14336)", "linear") { return bench_read_roof(14336u * 2304u); }
CIDER_CUDA_BENCH("gemv roof read 40.4 MB (Q5_0 K4096 N14336)", "linear") { return bench_read_roof(14336u * 2816u); }
CIDER_CUDA_BENCH("gemv roof read 48.2 MB (Q6_K K4096 N14336)", "linear") { return bench_read_roof(14336u * 3360u); }
CIDER_CUDA_BENCH("gemv roof read 62.4 MB (Q8_0 K4096 N14336)", "linear") { return bench_read_roof(14336u * 4352u); }

// Prefill through the bf16 path: the weights decoded to bf16 (33 MB of Q4_K → 117 MB) once per call, then cuBLASLt.
// M2048 is the peers' "bf16 matmul" shape (which multiplies bf16 weights that are already decoded).
CIDER_CUDA_BENCH("ggml-prefill Q4_K M512 K4096 N14336", "linear") {
  return bench_ggml_linear(quant::GgmlType::kQ4_K, 512, 4096, 14336, "");
}
CIDER_CUDA_BENCH("ggml-prefill Q4_K M2048 K4096 N14336", "linear") {
  return bench_ggml_linear(quant::GgmlType::kQ4_K, 2048, 4096, 14336, "bf16 matmul M2048 K4096 N14336");
}

}  // namespace cider::bench
