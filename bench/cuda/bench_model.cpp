// Whole-model decode on the GPU (model/cuda): one token of a Llama-3-8B-shaped model (hidden 4096, 32 layers, 32 query
// / 8 KV heads of 128, intermediate 14336, vocab 128256) with random weights built directly in device memory, at KV
// lengths 1k and 32k (the cache filled with random rows through kv_append, not by a prefill). One decode step = what
// the session's CUDA graph holds (16-byte step input copy in, every layer, head, logits copy out), timed by
// bench_graph's replay. docs/cuda/model.md has the byte floors and the predictions.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/cuda/bench_cuda.h"
#include "tests/support/scoped_env.h"
#include "model/cuda/cuda_backend.h"
#include "model/sampler.h"
#include "nn/rotation.h"

namespace cm = cider::model;

namespace {

cm::ModelConfig llama3_8b() {
  cm::ModelConfig c;
  c.arch = cm::Architecture::kLlama;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position = 131072;
  c.rms_norm_eps = 1e-5;
  c.attn_scale = 0.08838834764831845f;  // 128^-1/2
  c.rope.theta = 500000.0;
  c.rope_local = c.rope;
  c.layer_sliding.assign(32, 0);
  return c;
}

constexpr int64_t kCtx = 32768;

// The model of the last case, kept while the next case uses the same weights and cache format (building 16 GB of
// random weights is quick, but not free); released before a different one is built.
// kv: "bf16" or k<b>v<b>, "-kchan" appended for per-channel keys, then "-o<N>" for N outlier key channels; rotation:
// the quantized cache's rotation, named (never KVOptions' default).
std::shared_ptr<const cm::gpu::GpuModel> model_for(const std::string& weights, const std::string& kv,
                                                   const std::string& rotation) {
  static std::shared_ptr<const cm::gpu::GpuModel> model;
  static std::string key;
  const std::string want = weights + "/" + kv + "/" + rotation;
  if (model && key == want) return model;
  model.reset();
  std::string fmt = kv;
  int outliers = 0;
  if (const size_t o = fmt.rfind("-kchan-o"); o != std::string::npos) {
    outliers = std::stoi(fmt.substr(o + 8));
    fmt = fmt.substr(0, o + 6);
  }
  const bool kchan = fmt.size() > 6 && fmt.substr(fmt.size() - 6) == "-kchan";
  cm::KVOptions kvo = cm::parse_kv_format(kchan ? fmt.substr(0, fmt.size() - 6) : fmt);
  if (kvo.quantized) kvo.rotation = cm::parse_kv_rotation(rotation);
  if (kchan) kvo.key_layout = cider::nn::KeyLayout::kChannel;
  kvo.key_outliers = outliers;
  model = cm::gpu::random_model(llama3_8b(), cm::parse_weight_format(weights), kvo, kCtx, 8);
  key = want;
  return model;
}

// skip: GpuSession::bench_skip — the same graph without its linear layers and/or attention, to split the step's time
// into GEMVs, attention and the rest (small kernels + launch gaps + the two copies).
cider::bench::BenchResult decode(const std::string& weights, const std::string& kv, int64_t length,
                                 const std::string& rotation = "hadamard", int skip = 0) {
  auto model = model_for(weights, kv, rotation);
  const cm::ModelConfig& c = model->config;
  cm::gpu::GpuSession session(model);
  session.fill_cache_random(length - 1, 99);
  session.set_decode_input(17, length - 1);  // the token at position length − 1 sees `length` keys
  session.bench_skip = skip;
  const double s = cider::bench::bench_graph([&](void* stream) { session.enqueue_decode(stream); }, session.stream(),
                                              /*reps=*/4, /*samples=*/10);
  // Minimum traffic: every weight once except the embedding (one row), the KV rows [0, length) of every layer.
  const double kv_row = static_cast<double>(session.kv_bytes()) / static_cast<double>(c.num_layers * kCtx);
  const double weight_bytes = static_cast<double>(model->weight_bytes - model->embed.bytes()) +
                              static_cast<double>(c.hidden_size) * 2;
  cider::bench::BenchResult r;
  r.seconds = s;
  r.bytes = weight_bytes + kv_row * static_cast<double>(c.num_layers * length);
  const int64_t H = c.hidden_size, D = c.head_dim;
  const double params = static_cast<double>(
      c.num_layers * (H * (c.num_heads + 2 * c.num_kv_heads) * D + c.num_heads * D * H + 3 * H * c.intermediate_size) +
      c.vocab_size * H);
  r.flops = 2.0 * params + 4.0 * static_cast<double>(c.num_layers * c.num_heads * D * length);  // + q·k and p·v
  r.peer = "";
  r.note = std::to_string(static_cast<int>(1.0 / s)) + " tokens/s; byte floor at 4.3 TB/s " +
           std::to_string(r.bytes / 4.3e12 * 1e3).substr(0, 5) + " ms; graphs of " + std::to_string(c.num_layers) +
           " layers" + (model->kv.quantized ? std::string("; ") + cider::nn::rotation_kind_name(model->kv.rotation) : "") +
           (model->kv.key_layout == cider::nn::KeyLayout::kChannel ? "; per-channel keys" : "") +
           (skip & cm::gpu::GpuSession::kSkipLinear ? "; WITHOUT linear layers" : "") +
           (skip & cm::gpu::GpuSession::kSkipAttention ? "; WITHOUT attention" : "") +
           (skip & cm::gpu::GpuSession::kSkipAppend ? "; WITHOUT kv_append" : "") +
           (skip & cm::gpu::GpuSession::kSkipSmall ? "; WITHOUT the model's small kernels" : "");
  if (skip) r.bytes = r.flops = 0;  // a partial step: no floor
  return r;
}

}  // namespace

CIDER_CUDA_BENCH("model decode llama3-8b bf16 kv-bf16 L1024", "model") { return decode("bf16", "bf16", 1024); }
CIDER_CUDA_BENCH("model decode llama3-8b bf16 kv-bf16 L32768", "model") { return decode("bf16", "bf16", 32768); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 L1024", "model") { return decode("w8a8", "k4v3", 1024); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 L32768", "model") { return decode("w8a8", "k4v3", 32768); }
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L1024", "model") { return decode("w4a8", "k4v3", 1024); }
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L32768", "model") { return decode("w4a8", "k4v3", 32768); }
// The CLI's default cache (k8v4/hadamard), and k4v3 with the SO(4) rotation of run 1.
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L1024", "model") { return decode("w8a8", "k8v4", 1024); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L32768", "model") { return decode("w8a8", "k8v4", 32768); }
// Between two buckets: the decode graph for 20000 keys is captured for a bound of 32768 (kv_bound), so attention
// reads the real length on the device; compare with L32768 (the same grid, all of it busy).
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L20000", "model") { return decode("w8a8", "k8v4", 20000); }
// Per-channel keys: k4v4, k5v4 and k5v5 (the tensor-core decode and f16 prefill kernels).
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v5-kchan L1024", "model") { return decode("w8a8", "k5v5-kchan", 1024); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v5-kchan L32768", "model") {
  return decode("w8a8", "k5v5-kchan", 32768);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v4-kchan L32768", "model") {
  return decode("w8a8", "k4v4-kchan", 32768);
}
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L20000", "model") { return decode("w4a8", "k4v3", 20000); }
CIDER_CUDA_BENCH("model decode llama3-8b bf16 kv-bf16 L20000", "model") { return decode("bf16", "bf16", 20000); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 so4-full L1024", "model") {
  return decode("w8a8", "k4v3", 1024, "so4-full");
}
// Where the time goes: the same graphs with parts left out.
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 L1024 no-linear", "model") {
  return decode("w8a8", "k4v3", 1024, "hadamard", cm::gpu::GpuSession::kSkipLinear);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 L1024 no-attention", "model") {
  return decode("w8a8", "k4v3", 1024, "hadamard", cm::gpu::GpuSession::kSkipAttention);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 L1024 no-linear no-attention", "model") {
  return decode("w8a8", "k4v3", 1024, "hadamard",
                cm::gpu::GpuSession::kSkipLinear | cm::gpu::GpuSession::kSkipAttention);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 L1024 no-append", "model") {
  return decode("w8a8", "k4v3", 1024, "hadamard", cm::gpu::GpuSession::kSkipAppend);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 L1024 no-small", "model") {
  return decode("w8a8", "k4v3", 1024, "hadamard", cm::gpu::GpuSession::kSkipSmall);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 L1024 linear only", "model") {
  return decode("w8a8", "k4v3", 1024, "hadamard",
                cm::gpu::GpuSession::kSkipAttention | cm::gpu::GpuSession::kSkipAppend |
                    cm::gpu::GpuSession::kSkipSmall);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v3 L32768 no-linear", "model") {
  return decode("w8a8", "k4v3", 32768, "hadamard", cm::gpu::GpuSession::kSkipLinear);
}
CIDER_CUDA_BENCH("model decode llama3-8b bf16 kv-bf16 L1024 no-linear", "model") {
  return decode("bf16", "bf16", 1024, "hadamard", cm::gpu::GpuSession::kSkipLinear);
}

// Programmatic dependent launch (kernels/cuda/pdl.cuh) off: the A/B of the default (on). The graph is captured
// inside decode(), so the variable set around it decides every launch in it.
namespace {
cider::bench::BenchResult without_pdl(const std::string& weights, const std::string& kv, int64_t length) {
  const cider::test::ScopedEnv off("CIDER_PDL", "0");
  cider::bench::BenchResult r = decode(weights, kv, length);
  r.note += "; PDL off";
  return r;
}
}  // namespace
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L1024 v:no pdl", "model") { return without_pdl("w8a8", "k8v4", 1024); }
CIDER_CUDA_BENCH("model decode llama3-8b bf16 kv-bf16 L1024 v:no pdl", "model") {
  return without_pdl("bf16", "bf16", 1024);
}

// Prefill (prompt processing): one forward of n prompt tokens at positions [0, n) — the GEMM paths, attention in
// tiles (CUDA cores), the cache append — timed on the host around forward() (it synchronizes: logits of the last
// token come back), best of 3 after one warm-up. No peer in this run (llama-bench's pp is not run by the peer job).
namespace {
cider::bench::BenchResult prefill(const std::string& weights, const std::string& kv, int64_t n) {
  auto model = model_for(weights, kv, "hadamard");
  const cm::ModelConfig& c = model->config;
  cm::gpu::GpuSession session(model);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % c.vocab_size);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    session.forward(tokens.data(), n, 0, logits.data(), false);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);
  }
  cider::bench::BenchResult r;
  r.seconds = best;
  const int64_t H = c.hidden_size, D = c.head_dim;
  const double params = static_cast<double>(
      c.num_layers * (H * (c.num_heads + 2 * c.num_kv_heads) * D + c.num_heads * D * H + 3 * H * c.intermediate_size));
  r.flops = 2.0 * params * static_cast<double>(n) +
            2.0 * static_cast<double>(c.num_layers * c.num_heads * D) * static_cast<double>(n * n);  // causal q·k, p·v
  r.bytes = 0;
  r.peer = "";
  r.note = std::to_string(static_cast<int>(static_cast<double>(n) / best)) + " prompt tokens/s";
  return r;
}
}  // namespace
// Generation with sampling, host-timed per token (what `cider generate --device cuda` does each step): the decode
// step through GpuSession::forward, then the sampler (model/sampler.h, default settings: T 0.8, top-k 40, top-p 0.95,
// min-p 0.05) either on the whole row of logits copied to the host, or on the device's top-40 candidates
// (GpuSession::candidates: cuda::topk_logits, 40 tokens back). Same weights, cache and tokens; 64 steps from position
// L, best of 3 runs (a run restarts at L: the cache rows past L are simply overwritten).
namespace {
cider::bench::BenchResult generate_steps(const std::string& weights, const std::string& kv, int64_t length,
                                         bool on_device) {
  auto model = model_for(weights, kv, "hadamard");
  const cm::ModelConfig& c = model->config;
  cm::gpu::GpuSession session(model);
  session.fill_cache_random(length, 99);
  cm::SamplerParams sp;
  sp.seed = 1;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  constexpr int kSteps = 64;
  double best = 1e30;
  for (int run = 0; run < 4; ++run) {
    cm::Sampler sampler(sp);
    std::vector<int32_t> history = {17};
    int32_t token = 17;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kSteps; ++i) {
      const int64_t pos = length + i;
      if (on_device) {
        const cm::CandidateRequest req = sampler.candidate_request(c.vocab_size, history);
        cm::Candidates cand;
        session.forward(&token, 1, pos, nullptr, false);
        session.candidates(req, cand);
        token = sampler.sample_candidates(req, cand, c.vocab_size);
      } else {
        session.forward(&token, 1, pos, logits.data(), false);
        token = sampler.sample(logits.data(), c.vocab_size, history);
      }
      history.push_back(token);
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kSteps;
    if (run > 0) best = std::min(best, s);  // run 0 captures the graphs
  }
  cider::bench::BenchResult r;
  r.seconds = best;
  r.peer = "";
  r.note = std::to_string(static_cast<int>(1.0 / best)) + " tokens/s with sampling " +
           (on_device ? "on the device (top-40 candidates)" : "on the host (the whole row copied)");
  return r;
}
}  // namespace

namespace {
// The Llama-3-8B-shaped model as the server's benchmarks load it (random weights, a Hadamard-rotated quantized cache,
// 1024 positions), kept between the cases that ask for the same formats.
std::shared_ptr<const cm::gpu::GpuModel> served_model(const std::string& weights, const std::string& kv) {
  static std::shared_ptr<const cm::gpu::GpuModel> model;
  static std::string key;
  if (!model || key != weights + "/" + kv) {
    model.reset();
    cm::KVOptions kvo = cm::parse_kv_format(kv);
    if (kvo.quantized) kvo.rotation = cm::parse_kv_rotation("hadamard");
    model = cm::gpu::random_model(llama3_8b(), cm::parse_weight_format(weights), kvo, 1024, 8);
    key = weights + "/" + kv;
  }
  return model;
}
}  // namespace

// A decode batch as `cider serve` runs it: B sessions of a 1024-position model (prefill chunk 64, as a server's
// sessions are sized), each with `length` − 1 random cache rows, one token each per GpuSession::forward_batch call —
// a graph replay when the batch repeats (graphs), else the same launches enqueued directly — the logits of every row
// copied to the host. Wall time per call (host side included), best of 3 runs of 10 calls.
namespace {
cider::bench::BenchResult batch_decode(const std::string& weights, const std::string& kv, int64_t B, int64_t length,
                                       bool graphs, int skip = 0) {
  const std::shared_ptr<const cm::gpu::GpuModel> model = served_model(weights, kv);
  const cider::test::ScopedEnv chunk("CIDER_PREFILL_CHUNK", "64");
  const auto V = static_cast<size_t>(model->head_rows());
  std::vector<std::unique_ptr<cm::gpu::GpuSession>> owned;
  std::vector<cm::gpu::GpuSession*> ss;
  std::vector<std::vector<float>> logits(static_cast<size_t>(B), std::vector<float>(V));
  std::vector<int32_t> tokens(static_cast<size_t>(B));
  std::vector<cm::SequenceStep> steps;
  for (int64_t b = 0; b < B; ++b) {
    owned.push_back(std::make_unique<cm::gpu::GpuSession>(model));
    owned.back()->fill_cache_random(length - 1, 99 + static_cast<uint64_t>(b));
    owned.back()->use_graphs = graphs;
    owned.back()->bench_skip = skip;
    ss.push_back(owned.back().get());
    tokens[static_cast<size_t>(b)] = static_cast<int32_t>(17 + b);
    steps.push_back(cm::SequenceStep{&tokens[static_cast<size_t>(b)], 1, length - 1,
                                     logits[static_cast<size_t>(b)].data(), false});
  }
  constexpr int kCalls = 10;
  double best = 1e30;
  for (int run = 0; run < 4; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) cm::gpu::GpuSession::forward_batch(ss, steps);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kCalls;
    if (run > 0) best = std::min(best, s);  // run 0 captures the graph
  }
  cider::bench::BenchResult r;
  r.seconds = best;
  r.peer = "";
  r.note = std::to_string(static_cast<int>(static_cast<double>(B) / best)) + " tokens/s aggregate, " +
           std::to_string(B) + " sequences at " + std::to_string(length) + " positions" +
           (graphs ? "; batch graph replay" : "; launched directly") + "; " +
           std::to_string(ss[0]->batch_graphs_captured()) + " batch graphs captured" +
           (skip & cm::gpu::GpuSession::kSkipLinear ? "; WITHOUT linear layers" : "") +
           (skip & cm::gpu::GpuSession::kSkipAttention ? "; WITHOUT attention" : "") +
           (skip & cm::gpu::GpuSession::kSkipAppend ? "; WITHOUT kv_append" : "") +
           (skip & cm::gpu::GpuSession::kSkipSmall ? "; WITHOUT the model's small kernels" : "");
  return r;
}
}  // namespace
// A server step that carries prompt chunks (runtime/engine.cpp: decode rows first, then chunks): B sessions decoding
// at `length` beside P sessions whose prompts of `prompt` tokens go in whole (each truncated back to 0 before the
// call), one GpuSession::forward_batch call — a pass at host positions, launched directly. Sessions as a server
// makes them (a 1024-position model: prefill chunk 1024); the last row of every sequence copied to the host.
namespace {
cider::bench::BenchResult mixed_step(const std::string& weights, const std::string& kv, int64_t B, int64_t P,
                                     int64_t prompt, int64_t length) {
  const std::shared_ptr<const cm::gpu::GpuModel> model = served_model(weights, kv);
  const auto V = static_cast<size_t>(model->head_rows());
  std::vector<std::unique_ptr<cm::gpu::GpuSession>> owned;
  std::vector<cm::gpu::GpuSession*> ss;
  std::vector<std::vector<float>> logits(static_cast<size_t>(B + P), std::vector<float>(V));
  std::vector<int32_t> tokens(static_cast<size_t>(B));
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(P));
  std::vector<cm::SequenceStep> steps;
  for (int64_t b = 0; b < B + P; ++b) {
    owned.push_back(std::make_unique<cm::gpu::GpuSession>(model));
    ss.push_back(owned.back().get());
    if (b < B) {
      owned.back()->fill_cache_random(length - 1, 99 + static_cast<uint64_t>(b));
      tokens[static_cast<size_t>(b)] = static_cast<int32_t>(17 + b);
      steps.push_back(cm::SequenceStep{&tokens[static_cast<size_t>(b)], 1, length - 1,
                                       logits[static_cast<size_t>(b)].data(), false});
    } else {
      std::vector<int32_t>& p = prompts[static_cast<size_t>(b - B)];
      for (int64_t t = 0; t < prompt; ++t) p.push_back(static_cast<int32_t>((b * 7919 + t * 104729) % 128000));
      steps.push_back(cm::SequenceStep{p.data(), prompt, 0, logits[static_cast<size_t>(b)].data(), false});
    }
  }
  constexpr int kCalls = 10;
  double best = 1e30, cold = 0;
  for (int run = 0; run < 4; ++run) {
    double s = 0;
    for (int i = 0; i < kCalls; ++i) {
      for (int64_t b = B; b < B + P; ++b) ss[static_cast<size_t>(b)]->truncate(0);
      const auto t0 = std::chrono::steady_clock::now();
      cm::gpu::GpuSession::forward_batch(ss, steps);
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (run == 0 && i == 0) cold = t;
      s += t / kCalls;
    }
    if (run > 0) best = std::min(best, s);
  }
  cider::bench::BenchResult r;
  r.seconds = best;
  r.peer = "";
  r.note = std::to_string(B) + " decode rows at " + std::to_string(length) + " positions + " + std::to_string(P) +
           " prompts of " + std::to_string(prompt) + " tokens in one call; the sessions' first call " +
           std::to_string(static_cast<int>(cold * 1e6)) + " us";
  return r;
}
}  // namespace
CIDER_CUDA_BENCH("model mixed step llama3-8b w4a8 k8v4 B15 + 1x75", "model") {
  return mixed_step("w4a8", "k8v4", 15, 1, 75, 512);
}
CIDER_CUDA_BENCH("model mixed step llama3-8b w4a8 k8v4 B13 + 3x75", "model") {
  return mixed_step("w4a8", "k8v4", 13, 3, 75, 512);
}
CIDER_CUDA_BENCH("model mixed step llama3-8b w4a8 k8v4 B0 + 3x75", "model") {
  return mixed_step("w4a8", "k8v4", 0, 3, 75, 512);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B1", "model") {
  return batch_decode("w4a8", "k8v4", 1, 512, true);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B4", "model") {
  return batch_decode("w4a8", "k8v4", 4, 512, true);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B16", "model") {
  return batch_decode("w4a8", "k8v4", 16, 512, true);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B64", "model") {
  return batch_decode("w4a8", "k8v4", 64, 512, true);
}
// Where a batch's time goes (the same graphs with parts left out; results garbage), and the int8 weights.
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B16 no-linear", "model") {
  return batch_decode("w4a8", "k8v4", 16, 512, true, cm::gpu::GpuSession::kSkipLinear);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B16 no-attention", "model") {
  return batch_decode("w4a8", "k8v4", 16, 512, true, cm::gpu::GpuSession::kSkipAttention);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B16 linear only", "model") {
  return batch_decode("w4a8", "k8v4", 16, 512, true,
                      cm::gpu::GpuSession::kSkipAttention | cm::gpu::GpuSession::kSkipAppend |
                          cm::gpu::GpuSession::kSkipSmall);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B16 nothing", "model") {
  return batch_decode("w4a8", "k8v4", 16, 512, true,
                      cm::gpu::GpuSession::kSkipAttention | cm::gpu::GpuSession::kSkipAppend |
                          cm::gpu::GpuSession::kSkipSmall | cm::gpu::GpuSession::kSkipLinear);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B1 linear only", "model") {
  return batch_decode("w4a8", "k8v4", 1, 512, true,
                      cm::gpu::GpuSession::kSkipAttention | cm::gpu::GpuSession::kSkipAppend |
                          cm::gpu::GpuSession::kSkipSmall);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w8a8 k8v4 L512 B16", "model") {
  return batch_decode("w8a8", "k8v4", 16, 512, true);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w8a8 k8v4 L512 B1", "model") {
  return batch_decode("w8a8", "k8v4", 1, 512, true);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B8", "model") {
  return batch_decode("w4a8", "k8v4", 8, 512, true);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B16 v:no graphs", "model") {
  return batch_decode("w4a8", "k8v4", 16, 512, false);
}
CIDER_CUDA_BENCH("model batch decode llama3-8b w4a8 k8v4 L512 B64 v:no graphs", "model") {
  return batch_decode("w4a8", "k8v4", 64, 512, false);
}
CIDER_CUDA_BENCH("model generate llama3-8b w8a8 k8v4 L1024 sampling on device", "model") {
  return generate_steps("w8a8", "k8v4", 1024, true);
}
CIDER_CUDA_BENCH("model generate llama3-8b w8a8 k8v4 L1024 sampling on host", "model") {
  return generate_steps("w8a8", "k8v4", 1024, false);
}

// Native GGUF weights (random Q4_K blocks, GpuModel random_linear) against W4A8 with the same cache: decode streams
// the blocks through the dp4a GEMV, prefill decodes them to bf16 for cuBLASLt (kernels/cuda/linear_ggml.cu).
CIDER_CUDA_BENCH("model decode llama3-8b native k8v4 L1024", "model") { return decode("native", "k8v4", 1024); }
CIDER_CUDA_BENCH("model decode llama3-8b native k8v4 L32768", "model") { return decode("native", "k8v4", 32768); }
CIDER_CUDA_BENCH("model decode llama3-8b native-vs w4a8 k8v4 L1024", "model") { return decode("w4a8", "k8v4", 1024); }
CIDER_CUDA_BENCH("model prefill llama3-8b native k8v4 n512", "model") { return prefill("native", "k8v4", 512); }
CIDER_CUDA_BENCH("model prefill llama3-8b native k8v4 n4096", "model") { return prefill("native", "k8v4", 4096); }
CIDER_CUDA_BENCH("model prefill llama3-8b native-vs w4a8 k8v4 n4096", "model") { return prefill("w4a8", "k8v4", 4096); }
CIDER_CUDA_BENCH("model prefill llama3-8b w4a8 k8v4 n512", "model") { return prefill("w4a8", "k8v4", 512); }
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k8v4 n512", "model") { return prefill("w8a8", "k8v4", 512); }
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k8v4 n4096", "model") { return prefill("w8a8", "k8v4", 4096); }
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k5v5-kchan n4096", "model") { return prefill("w8a8", "k5v5-kchan", 4096); }
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k4v4-kchan n4096", "model") { return prefill("w8a8", "k4v4-kchan", 4096); }
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k4v4-kchan n512", "model") { return prefill("w8a8", "k4v4-kchan", 512); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v4-kchan L1024", "model") { return decode("w8a8", "k4v4-kchan", 1024); }
// A step at length 1024 (position 1023) completes a block of 64 keys, so it also quantizes that block; 63 of 64 steps
// only write the bf16 window: positions 999 and 32 699.
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v4-kchan L1000", "model") { return decode("w8a8", "k4v4-kchan", 1000); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k4v4-kchan L32700", "model") {
  return decode("w8a8", "k4v4-kchan", 32700);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v4-kchan L1000", "model") { return decode("w8a8", "k5v4-kchan", 1000); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v4-kchan L32700", "model") {
  return decode("w8a8", "k5v4-kchan", 32700);
}
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k5v4-kchan n4096", "model") { return prefill("w8a8", "k5v4-kchan", 4096); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v5-kchan L1000", "model") { return decode("w8a8", "k5v5-kchan", 1000); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v5-kchan L32700", "model") {
  return decode("w8a8", "k5v5-kchan", 32700);
}
// The default cache (k5v4, per-channel keys, head_dim/32 outlier key channels): steps that only write the window
// (L1000, L32700) and steps that also fill a block and choose its channels (L1024, L32768).
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v4-kchan-o4 L1000", "model") { return decode("w8a8", "k5v4-kchan-o4", 1000); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v4-kchan-o4 L32700", "model") {
  return decode("w8a8", "k5v4-kchan-o4", 32700);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v4-kchan-o4 L1024", "model") { return decode("w8a8", "k5v4-kchan-o4", 1024); }
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k5v4-kchan-o4 L32768", "model") {
  return decode("w8a8", "k5v4-kchan-o4", 32768);
}
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k5v4-kchan-o4 n4096", "model") {
  return prefill("w8a8", "k5v4-kchan-o4", 4096);
}
CIDER_CUDA_BENCH("model prefill llama3-8b bf16 kv-bf16 n512", "model") { return prefill("bf16", "bf16", 512); }

// A/B rows of this session's defaults: the GEMV's warps per tile back at the whole block ($CIDER_GEMV_SPLIT=16, the
// round-3 kernel) and prefill attention on the CUDA cores ($CIDER_ATTN_PREFILL_TC=0). Graphs and sessions are built
// inside decode() / prefill(), so the variable set around them decides every launch.
namespace {
cider::bench::BenchResult with_env(const char* name, const char* value, bool is_prefill, const std::string& weights,
                                   const std::string& kv, int64_t n) {
  const cider::test::ScopedEnv env(name, value);
  cider::bench::BenchResult r = is_prefill ? prefill(weights, kv, n) : decode(weights, kv, n);
  r.note += std::string("; ") + name + "=" + value;
  return r;
}
}  // namespace
// A/B of the decode attention's early tile copies ($CIDER_ATTN_TC_EARLY=0: fetched after the PDL wait).
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L32768 v:late attention copies", "model") {
  return with_env("CIDER_ATTN_TC_EARLY", "0", false, "w4a8", "k4v3", 32768);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L32768 v:late attention copies", "model") {
  return with_env("CIDER_ATTN_TC_EARLY", "0", false, "w8a8", "k8v4", 32768);
}
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L1024 v:late attention copies", "model") {
  return with_env("CIDER_ATTN_TC_EARLY", "0", false, "w4a8", "k4v3", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L1024 v:gemv split 16", "model") {
  return with_env("CIDER_GEMV_SPLIT", "16", false, "w8a8", "k8v4", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L32768 v:gemv split 16", "model") {
  return with_env("CIDER_GEMV_SPLIT", "16", false, "w8a8", "k8v4", 32768);
}
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L1024 v:gemv split 16", "model") {
  return with_env("CIDER_GEMV_SPLIT", "16", false, "w4a8", "k4v3", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L1024 v:gemv split 2", "model") {
  return with_env("CIDER_GEMV_SPLIT", "2", false, "w8a8", "k8v4", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L1024 v:gemv split 4", "model") {
  return with_env("CIDER_GEMV_SPLIT", "4", false, "w8a8", "k8v4", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L1024 v:gemv tile", "model") {
  return with_env("CIDER_GEMV_KERNEL", "tile", false, "w8a8", "k8v4", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L1024 v:gemv tile", "model") {
  return with_env("CIDER_GEMV_KERNEL", "tile", false, "w4a8", "k4v3", 1024);
}
// The decode attention's three-chain layout instead of the packed one (rep 4, one token: R = 4 rows per KV head).
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L32768 v:attn three-chain", "model") {
  return with_env("CIDER_ATTN_TC_PACKED", "0", false, "w8a8", "k8v4", 32768);
}
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L32768 v:attn three-chain", "model") {
  return with_env("CIDER_ATTN_TC_PACKED", "0", false, "w4a8", "k4v3", 32768);
}
// The row GEMV kernel with its weights in registers (session 3's kernel) instead of bulk copies into shared memory.
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L1024 v:gemv register loads", "model") {
  return with_env("CIDER_GEMV_ROW_LOADS", "registers", false, "w8a8", "k8v4", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L1024 v:gemv register loads", "model") {
  return with_env("CIDER_GEMV_ROW_LOADS", "registers", false, "w4a8", "k4v3", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L32768 v:gemv register loads", "model") {
  return with_env("CIDER_GEMV_ROW_LOADS", "registers", false, "w8a8", "k8v4", 32768);
}
// The decode attention's split partials merged inside the kernel by each head's last CTA instead of by a separate
// merge launch (slower at 32k in the kernel benchmark; at 1k a head has only 8 splits).
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L1024 v:attn fold", "model") {
  return with_env("CIDER_ATTN_TC_FOLD", "1", false, "w8a8", "k8v4", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w4a8 k4v3 L1024 v:attn fold", "model") {
  return with_env("CIDER_ATTN_TC_FOLD", "1", false, "w4a8", "k4v3", 1024);
}
CIDER_CUDA_BENCH("model decode llama3-8b w8a8 k8v4 L32768 v:attn fold", "model") {
  return with_env("CIDER_ATTN_TC_FOLD", "1", false, "w8a8", "k8v4", 32768);
}
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k4v3 n4096", "model") { return prefill("w8a8", "k4v3", 4096); }
CIDER_CUDA_BENCH("model prefill llama3-8b bf16 kv-bf16 n4096", "model") { return prefill("bf16", "bf16", 4096); }
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k8v4 n4096 v:cuda-core attention", "model") {
  return with_env("CIDER_ATTN_PREFILL_TC", "0", true, "w8a8", "k8v4", 4096);
}
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k8v4 n512 v:cuda-core attention", "model") {
  return with_env("CIDER_ATTN_PREFILL_TC", "0", true, "w8a8", "k8v4", 512);
}
// Prefill in 512-row chunks (CIDER_PREFILL_CHUNK; the default is 2048: larger GEMMs per pass), and a 16k prompt.
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k4v3 n4096 v:chunk 512", "model") {
  return with_env("CIDER_PREFILL_CHUNK", "512", true, "w8a8", "k4v3", 4096);
}
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k8v4 n16384", "model") { return prefill("w8a8", "k8v4", 16384); }
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k8v4 n16384 v:chunk 512", "model") {
  return with_env("CIDER_PREFILL_CHUNK", "512", true, "w8a8", "k8v4", 16384);
}
// The prefill attention's exact-score kernel instead of the default f16-tile kernel (attention_prefill_tc.h).
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k8v4 n4096 v:exact attention", "model") {
  return with_env("CIDER_ATTN_PREFILL_MATH", "exact", true, "w8a8", "k8v4", 4096);
}
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k4v3 n4096 v:exact attention", "model") {
  return with_env("CIDER_ATTN_PREFILL_MATH", "exact", true, "w8a8", "k4v3", 4096);
}
CIDER_CUDA_BENCH("model prefill llama3-8b w8a8 k8v4 n512 v:exact attention", "model") {
  return with_env("CIDER_ATTN_PREFILL_MATH", "exact", true, "w8a8", "k8v4", 512);
}
