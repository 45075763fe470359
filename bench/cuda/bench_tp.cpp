// Tensor-parallel decode (model/tensor_parallel.h, --tp): one token of a Llama-3-8B- or Llama-3-70B-shaped model with
// random weights, each rank's share built on its own GPU (random_model with the rank's Collective), the KV cache
// filled with random rows, every rank replaying its decode graph (which holds the NCCL all-reduces) from a thread of
// its own, timed by bench_graph on every rank; the slowest rank's time is the step's. Beside each: the all-reduces
// alone (2 per layer of hidden float32 values, M = 1), i.e. the communication share of a token.
// "tp1 plain" is the one-GPU model without a Collective; "tp1 nccl" the same through a one-rank NCCL communicator
// (the TP code path's own cost). Cases needing more GPUs than the host has report "not run".
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/cuda/bench_cuda.h"
#include "core/error.h"
#include "model/cuda/collective.h"
#include "model/cuda/cuda_backend.h"
#include "nn/rotation.h"

namespace cm = cider::model;

namespace {

cm::ModelConfig llama3(bool big) {
  cm::ModelConfig c;
  c.arch = cm::Architecture::kLlama;
  c.vocab_size = 128256;
  c.hidden_size = big ? 8192 : 4096;
  c.intermediate_size = big ? 28672 : 14336;
  c.num_layers = big ? 80 : 32;
  c.num_heads = big ? 64 : 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position = 131072;
  c.rms_norm_eps = 1e-5;
  c.attn_scale = 0.08838834764831845f;
  c.rope.theta = 500000.0;
  c.rope_local = c.rope;
  c.layer_sliding.assign(static_cast<size_t>(c.num_layers), 0);
  return c;
}

constexpr int64_t kCtx = 8192;

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// tp ranks (tp == 0: one GPU without a Collective); part: "decode" or "allreduce".
cider::bench::BenchResult tp_case(bool big, const std::string& weights, const std::string& kv, int64_t length, int tp,
                                  bool allreduce_only) {
  cider::bench::BenchResult r;
  const int ranks = tp == 0 ? 1 : tp, have = device_count();
  if (ranks > have) {
    r.note = "not run: needs " + std::to_string(ranks) + " GPUs; this host has " + std::to_string(have);
    return r;
  }
  const cm::ModelConfig c = llama3(big);
  std::vector<int> devices;
  for (int d = 0; d < ranks; ++d) devices.push_back(d);
  std::vector<std::shared_ptr<cm::gpu::Collective>> comms(static_cast<size_t>(ranks));
  if (tp > 0) comms = cm::gpu::nccl_collectives(devices);
  cm::KVOptions kvo = cm::parse_kv_format(kv);
  if (kvo.quantized) kvo.rotation = cm::parse_kv_rotation("hadamard");
  std::vector<double> secs(static_cast<size_t>(ranks), 0.0);
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank)
    threads.emplace_back([&, rank] {
      try {
        cudaSetDevice(rank);
        const auto comm = comms[static_cast<size_t>(rank)];
        if (allreduce_only) {
          cider::cuda::DeviceBuffer buf(static_cast<size_t>(c.hidden_size) * sizeof(float));
          buf.fill(0);
          cider::cuda::Stream stream;
          secs[static_cast<size_t>(rank)] = cider::bench::bench_graph(
              [&](void* s) {
                for (int64_t i = 0; i < 2 * c.num_layers; ++i) comm->all_reduce_sum(buf.as<float>(), c.hidden_size, s);
              },
              stream.handle(), /*reps=*/4, /*samples=*/10);
          return;
        }
        auto model = cm::gpu::random_model(c, cm::parse_weight_format(weights), kvo, kCtx, 8, comm);
        cm::gpu::GpuSession session(model);
        session.fill_cache_random(length - 1, 99);
        session.set_decode_input(17, length - 1);
        secs[static_cast<size_t>(rank)] = cider::bench::bench_graph(
            [&](void* stream) { session.enqueue_decode(stream); }, session.stream(), /*reps=*/4, /*samples=*/10);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(rank)] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) cider::check(e.empty(), cider::ErrorCode::kInternal, "bench_tp", e);
  double worst = 0;
  for (double s : secs) worst = std::max(worst, s);
  r.seconds = worst;
  r.note = std::to_string(static_cast<int>(1.0 / worst)) + (allreduce_only ? " all-reduce sets/s (" : " tokens/s (") +
           (tp == 0 ? std::string("one GPU, no collective") : std::to_string(tp) + " rank(s), NCCL " + cm::gpu::nccl_version()) +
           ")";
  return r;
}

}  // namespace

CIDER_CUDA_BENCH("tp decode llama3-8b w4a8 k4v4 L4096 tp1 plain", "tp") { return tp_case(false, "w4a8", "k4v4", 4096, 0, false); }
CIDER_CUDA_BENCH("tp decode llama3-8b w4a8 k4v4 L4096 tp1 nccl", "tp") { return tp_case(false, "w4a8", "k4v4", 4096, 1, false); }
CIDER_CUDA_BENCH("tp decode llama3-8b w4a8 k4v4 L4096 tp2", "tp") { return tp_case(false, "w4a8", "k4v4", 4096, 2, false); }
CIDER_CUDA_BENCH("tp decode llama3-8b w4a8 k4v4 L4096 tp4", "tp") { return tp_case(false, "w4a8", "k4v4", 4096, 4, false); }
CIDER_CUDA_BENCH("tp decode llama3-8b w4a8 k4v4 L4096 tp8", "tp") { return tp_case(false, "w4a8", "k4v4", 4096, 8, false); }
CIDER_CUDA_BENCH("tp allreduce llama3-8b w4a8 k4v4 L4096 tp1", "tp") { return tp_case(false, "w4a8", "k4v4", 4096, 1, true); }
CIDER_CUDA_BENCH("tp allreduce llama3-8b w4a8 k4v4 L4096 tp2", "tp") { return tp_case(false, "w4a8", "k4v4", 4096, 2, true); }
CIDER_CUDA_BENCH("tp allreduce llama3-8b w4a8 k4v4 L4096 tp4", "tp") { return tp_case(false, "w4a8", "k4v4", 4096, 4, true); }
CIDER_CUDA_BENCH("tp decode llama3-70b w8a8 k4v4 L4096 tp1 plain", "tp") { return tp_case(true, "w8a8", "k4v4", 4096, 0, false); }
CIDER_CUDA_BENCH("tp decode llama3-70b w8a8 k4v4 L4096 tp1 nccl", "tp") { return tp_case(true, "w8a8", "k4v4", 4096, 1, false); }
CIDER_CUDA_BENCH("tp decode llama3-70b w8a8 k4v4 L4096 tp2", "tp") { return tp_case(true, "w8a8", "k4v4", 4096, 2, false); }
CIDER_CUDA_BENCH("tp decode llama3-70b w8a8 k4v4 L4096 tp4", "tp") { return tp_case(true, "w8a8", "k4v4", 4096, 4, false); }
CIDER_CUDA_BENCH("tp decode llama3-70b w8a8 k4v4 L4096 tp8", "tp") { return tp_case(true, "w8a8", "k4v4", 4096, 8, false); }
CIDER_CUDA_BENCH("tp allreduce llama3-70b w8a8 k4v4 L4096 tp1", "tp") { return tp_case(true, "w8a8", "k4v4", 4096, 1, true); }
CIDER_CUDA_BENCH("tp allreduce llama3-70b w8a8 k4v4 L4096 tp2", "tp") { return tp_case(true, "w8a8", "k4v4", 4096, 2, true); }
CIDER_CUDA_BENCH("tp allreduce llama3-70b w8a8 k4v4 L4096 tp4", "tp") { return tp_case(true, "w8a8", "k4v4", 4096, 4, true); }
