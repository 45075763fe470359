#include "apps/bench.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include <time.h>

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/kernel_table.h"
#include "nn/linear_weights.h"
#include "quant/ggml_blocks.h"
#include "quant/ggml_interleave.h"

// `cider bench attention …` runs bench/attention_bench.cpp's program (same options, table, --json): the file is
// compiled into this one without its main(), so the two stay one implementation.
#define CIDER_ATTENTION_BENCH_NO_MAIN
#include "bench/attention_bench.cpp"
#undef CIDER_ATTENTION_BENCH_NO_MAIN

namespace cider::apps {

namespace {

using Clock = std::chrono::steady_clock;

// Fills n bytes with xorshift64* output (distinct per seed); fast enough for a GiB per second.
void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const uint64_t v = s * 0x2545F4914F6CDD1Dull;
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(i * 131 + seed);
}

// A pool of `count` distinct copies of `bytes` random bytes each (count chosen so the pool holds pool_mb).
struct Pool {
  std::vector<Buffer> copies;
  static Pool make(size_t bytes, int64_t pool_mb, uint64_t seed, bool int8_codes) {
    Pool p;
    const size_t want = static_cast<size_t>(pool_mb) << 20;
    const size_t count = std::max<size_t>(1, (want + bytes - 1) / bytes);
    for (size_t c = 0; c < count; ++c) {
      Buffer b(bytes);
      fill_random(b.as<uint8_t>(), bytes, seed + c);
      if (int8_codes) {  // the INT8 format never stores -128
        int8_t* q = b.as<int8_t>();
        for (size_t i = 0; i < bytes; ++i) q[i] = q[i] == -128 ? int8_t{-127} : q[i];
      }
      p.copies.push_back(std::move(b));
    }
    return p;
  }
  size_t bytes() const { return copies.size() * copies[0].nbytes(); }
};

std::vector<float> random_floats(size_t n, float lo, float hi, uint64_t seed) {
  std::vector<uint32_t> bits(n);
  fill_random(reinterpret_cast<uint8_t*>(bits.data()), n * 4, seed);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * static_cast<float>(bits[i] >> 8) * 0x1p-24f;
  return v;
}

struct Result {
  std::string name, kernel, note;
  int64_t M = 0, N = 0, K = 0;
  std::vector<double> ms;  // per call
  double bytes = 0;        // weight (or stream) bytes per call
  double ops = 0;          // 2·M·N·K
};

struct Case {
  std::string name;
  std::function<Result(const BenchOptions&, const kernels::KernelTable&)> run;
};

// --cputime: time with the process CPU clock instead of the wall clock (a loaded machine; meaningful with
// --threads 1, where it counts the one thread's time, memory stalls included, and not the time it waited).
bool g_cputime = false;

double now_ms() {
  if (g_cputime) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(Clock::now().time_since_epoch()).count();
}

// Times `call(i)` once to warm up, then `reps` times (i = 1..reps).
std::vector<double> time_calls(int reps, const std::function<void(int)>& call) {
  call(0);
  std::vector<double> ms;
  for (int i = 1; i <= reps; ++i) {
    const double t0 = now_ms();
    call(i);
    ms.push_back(now_ms() - t0);
  }
  return ms;
}

// ---- cases ----

// Read bandwidth as the GEMV cases see it: each call reads one buffer of `bytes` (the size of one weight copy) with
// every thread, cycling over a pool of distinct copies as large as the GEMV pools, best of the same number of calls.
// Each thread reads its contiguous part as `streams` interleaved sequential streams (1 = plain STREAM; 16 = as many
// concurrent streams as the GEMV kernels' 16-row blocks, which on this VM's memory reads faster).
Result stream_read(const BenchOptions& o, size_t bytes, int streams) {
  const Pool pool = Pool::make(bytes, o.pool_mb, 7, false);
  const int64_t n = static_cast<int64_t>(bytes / 8);
  std::vector<uint64_t> part(static_cast<size_t>(num_threads()));
  Result r;
  r.kernel = "read-only sum (STREAM-style), " + std::to_string(streams) + " stream(s) per thread";
  r.bytes = static_cast<double>(bytes);
  r.note = std::to_string(pool.copies.size()) + " copies, " + std::to_string(pool.bytes() >> 20) + " MiB";
  r.ms = time_calls(o.reps, [&](int i) {
    const uint64_t* p = pool.copies[static_cast<size_t>(i) % pool.copies.size()].as<uint64_t>();
    default_thread_pool().parallel_for(n / 8, [&](int64_t b0, int64_t b1, int t) {
      // Words [8·b0, 8·b1): `streams` sub-ranges of whole 64-byte lines, read line by line in turn.
      const int64_t lines = b1 - b0, per = lines / streams;
      uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int64_t l = 0; l < per; ++l)
        for (int s = 0; s < streams; ++s) {
          const uint64_t* q = p + (b0 + s * per + l) * 8;
          for (int j = 0; j < 8; ++j) acc[j] += q[j];
        }
      for (int64_t l = b0 + per * streams; l < b1; ++l)
        for (int j = 0; j < 8; ++j) acc[j] += p[l * 8 + j];
      uint64_t sum = 0;
      for (uint64_t v : acc) sum += v;
      part[static_cast<size_t>(t)] = sum;
    });
  });
  uint64_t sink = 0;
  for (uint64_t v : part) sink += v;
  if (sink == 42) std::printf(" ");  // keeps the reads
  return r;
}

// W8A8 / W4A8 GEMV (M = 1, weights streamed) or GEMM (weights reused by M rows: one copy).
Result int_linear(const BenchOptions& o, const kernels::KernelTable& t, bool int4, int64_t M, int64_t N, int64_t K,
                  int gs) {
  const size_t wbytes = static_cast<size_t>(int4 ? N * K / 2 : N * K);
  const Pool pool = Pool::make(wbytes, M == 1 ? o.pool_mb : 0, 11, !int4);
  const std::vector<float> scales = random_floats(static_cast<size_t>(gs == 0 ? N : K / gs * N), 1e-3f, 2e-3f, 12);
  const std::vector<float> bias = random_floats(static_cast<size_t>(N), -1.0f, 1.0f, 13);
  const std::vector<float> x = random_floats(static_cast<size_t>(M * K), -2.0f, 2.0f, 14);
  std::vector<float> out(static_cast<size_t>(M * N));
  kernels::IntLinearArgs a{};
  a.x = x.data();
  a.x_dtype = DType::kF32;
  a.w_scales = scales.data();
  a.bias = bias.data();
  a.out = out.data();
  a.out_dtype = DType::kF32;
  a.M = M;
  a.N = N;
  a.K = K;
  a.group_size = gs;
  auto fn = M == 1 ? (int4 ? t.w4a8_gemv : t.w8a8_gemv) : (int4 ? t.w4a8_gemm : t.w8a8_gemm);
  Result r;
  r.kernel = std::string(int4 ? "w4a8_" : "w8a8_") + (M == 1 ? "gemv" : "gemm") +
             (gs == 0 ? " per-channel" : " group " + std::to_string(gs));
  r.M = M;
  r.N = N;
  r.K = K;
  r.bytes = static_cast<double>(wbytes + scales.size() * 4);
  r.ops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  r.note = std::to_string(pool.copies.size()) + " weight copies, " + std::to_string(pool.bytes() >> 20) + " MiB";
  const int reps = M == 1 ? o.reps : std::max(3, o.reps / 4);
  r.ms = time_calls(reps, [&](int i) {
    a.w = pool.copies[static_cast<size_t>(i) % pool.copies.size()].data();
    fn(a);
  });
  return r;
}

Result dense(const BenchOptions& o, const kernels::KernelTable& t, DType wt, int64_t M, int64_t N, int64_t K) {
  const size_t wbytes = static_cast<size_t>(N * K * dtype_size(wt));
  Pool pool;
  {
    const size_t count = M == 1 ? std::max<size_t>(1, ((static_cast<size_t>(o.pool_mb) << 20) + wbytes - 1) / wbytes) : 1;
    const std::vector<float> src = random_floats(static_cast<size_t>(N * K), -1.0f, 1.0f, 21);
    for (size_t c = 0; c < count; ++c) {
      Buffer b(wbytes);
      for (int64_t i = 0; i < N * K; ++i) {
        // distinct copies: perturb by the copy index
        const float v = src[static_cast<size_t>(i)] + static_cast<float>(c) * 0x1p-10f;
        store_float(b.data(), wt, i, v);
      }
      pool.copies.push_back(std::move(b));
    }
  }
  const std::vector<float> x = random_floats(static_cast<size_t>(M * K), -1.0f, 1.0f, 22);
  std::vector<float> out(static_cast<size_t>(M * N));
  kernels::DenseGemmArgs a{x.data(), nullptr, wt, nullptr, out.data(), M, N, K};
  Result r;
  r.kernel = std::string("dense_gemm ") + dtype_name(wt) + (M == 1 ? " (gemv)" : "");
  r.M = M;
  r.N = N;
  r.K = K;
  r.bytes = static_cast<double>(wbytes);
  r.ops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  r.note = std::to_string(pool.copies.size()) + " weight copies, " + std::to_string(pool.bytes() >> 20) + " MiB";
  r.ms = time_calls(M == 1 ? o.reps : std::max(3, o.reps / 4), [&](int i) {
    a.w = pool.copies[static_cast<size_t>(i) % pool.copies.size()].data();
    t.dense_gemm(a);
  });
  return r;
}

Result affine(const BenchOptions& o, const kernels::KernelTable& t, int bits, int gs, int64_t M, int64_t N,
              int64_t K) {
  const size_t wbytes = static_cast<size_t>(N * K * bits / 8);
  const Pool pool = Pool::make(wbytes, M == 1 ? o.pool_mb : 0, 31, false);
  const size_t groups = static_cast<size_t>(N * (K / gs));
  std::vector<uint16_t> scales(groups), biases(groups);  // bf16
  const std::vector<float> s = random_floats(groups, 1e-3f, 2e-3f, 32), b = random_floats(groups, -0.1f, 0.1f, 33);
  for (size_t i = 0; i < groups; ++i) {
    scales[i] = f32_to_bf16(s[i]);
    biases[i] = f32_to_bf16(b[i]);
  }
  const std::vector<float> x = random_floats(static_cast<size_t>(M * K), -1.0f, 1.0f, 34);
  std::vector<float> out(static_cast<size_t>(M * N));
  kernels::AffineQmmArgs a{x.data(), DType::kF32, nullptr, scales.data(), biases.data(), DType::kBF16,
                           out.data(), DType::kF32, M, N, K, gs, bits, true};
  Result r;
  r.kernel = "affine_qmm " + std::to_string(bits) + "-bit group " + std::to_string(gs) + (M == 1 ? " (gemv)" : "");
  r.M = M;
  r.N = N;
  r.K = K;
  r.bytes = static_cast<double>(wbytes + 4 * groups);
  r.ops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  r.note = std::to_string(pool.copies.size()) + " weight copies, " + std::to_string(pool.bytes() >> 20) + " MiB";
  r.ms = time_calls(M == 1 ? o.reps : std::max(3, o.reps / 4), [&](int i) {
    a.w = static_cast<const uint32_t*>(pool.copies[static_cast<size_t>(i) % pool.copies.size()].data());
    t.affine_qmm(a);
  });
  return r;
}

// Native GGUF weights: random blocks (the kernels' speed does not depend on the values), int8 activations per 32.
// interleaved: the rows 8 at a time (quant/ggml_interleave.h), as levels with KernelTable::ggml_interleave load them.
Result ggml(const BenchOptions& o, const kernels::KernelTable& t, quant::GgmlType type, int64_t M, int64_t N,
            int64_t K, bool interleaved = false) {
  const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(type));
  const int64_t rb = quant::ggml_row_bytes(f, K);
  const size_t wbytes = static_cast<size_t>(N * rb);
  const Pool pool = Pool::make(wbytes, M == 1 ? o.pool_mb : 0, 41, false);
  const std::vector<float> x = random_floats(static_cast<size_t>(M * K), -1.0f, 1.0f, 42);
  std::vector<float> out(static_cast<size_t>(M * N));
  kernels::GgmlLinearArgs a{x.data(), nullptr, static_cast<uint32_t>(type), rb, nullptr, out.data(), M, N, K};
  a.interleaved = interleaved;
  Result r;
  r.kernel = std::string("ggml_linear ") + f.name + (interleaved ? " rows interleaved by 8" : "") + (M == 1 ? " (gemv)" : "");
  r.M = M;
  r.N = N;
  r.K = K;
  r.bytes = static_cast<double>(wbytes);
  r.ops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  r.note = std::to_string(pool.copies.size()) + " weight copies, " + std::to_string(pool.bytes() >> 20) + " MiB";
  r.ms = time_calls(M == 1 ? o.reps : std::max(3, o.reps / 4), [&](int i) {
    a.w = pool.copies[static_cast<size_t>(i) % pool.copies.size()].data();
    t.ggml_linear(a);
  });
  return r;
}

std::vector<Case> all_cases() {
  std::vector<Case> c;
  auto add = [&](std::string name, std::function<Result(const BenchOptions&, const kernels::KernelTable&)> fn) {
    c.push_back({name, [name, fn](const BenchOptions& o, const kernels::KernelTable& t) {
                   Result r = fn(o, t);
                   r.name = name;
                   return r;
                 }});
  };
  for (int streams : {1, 16})  // per call: one INT8 weight copy of the decode case
    add(streams == 1 ? "stream_read" : "stream_read_16", [streams](const BenchOptions& o, const kernels::KernelTable&) {
      return stream_read(o, size_t{4096} * 14336, streams);
    });
  // Decode: the shape, per channel and group 128, then a sweep of shapes for the bandwidth plot.
  for (bool int4 : {false, true})
    for (int gs : {0, 128}) {
      const std::string n = std::string(int4 ? "w4a8" : "w8a8") + "_gemv_k4096_n14336_" + (gs ? "g128" : "pc");
      add(n, [int4, gs](const BenchOptions& o, const kernels::KernelTable& t) {
        return int_linear(o, t, int4, 1, 14336, 4096, gs);
      });
    }
  for (auto [K, N] : {std::pair<int64_t, int64_t>{2048, 2048}, {4096, 4096}, {14336, 4096}, {8192, 8192}, {8192, 28672}})
    for (bool int4 : {false, true}) {
      const std::string n = std::string(int4 ? "w4a8" : "w8a8") + "_gemv_k" + std::to_string(K) + "_n" +
                            std::to_string(N) + "_pc";
      add(n, [int4, K, N](const BenchOptions& o, const kernels::KernelTable& t) {
        return int_linear(o, t, int4, 1, N, K, 0);
      });
    }
  // Prefill.
  for (int64_t N : {4096, 14336})
    add("w8a8_gemm_m512_k4096_n" + std::to_string(N) + "_pc", [N](const BenchOptions& o, const kernels::KernelTable& t) {
      return int_linear(o, t, false, 512, N, 4096, 0);
    });
  add("w8a8_gemm_m512_k4096_n4096_g128", [](const BenchOptions& o, const kernels::KernelTable& t) {
    return int_linear(o, t, false, 512, 4096, 4096, 128);
  });
  add("w4a8_gemm_m512_k4096_n4096_pc", [](const BenchOptions& o, const kernels::KernelTable& t) {
    return int_linear(o, t, true, 512, 4096, 4096, 0);
  });
  // Native GGUF weights: the decode shape for the formats of Q4_K_M / Q8_0 / Q2_K files, and a prefill.
  for (auto [type, name] : {std::pair<quant::GgmlType, const char*>{quant::GgmlType::kQ8_0, "q8_0"},
                            {quant::GgmlType::kQ4_K, "q4_k"}, {quant::GgmlType::kQ6_K, "q6_k"},
                            {quant::GgmlType::kQ5_0, "q5_0"}, {quant::GgmlType::kQ4_0, "q4_0"},
                            {quant::GgmlType::kQ4_1, "q4_1"}, {quant::GgmlType::kQ5_1, "q5_1"},
                            {quant::GgmlType::kQ2_K, "q2_k"}, {quant::GgmlType::kQ5_K, "q5_k"}}) {
    const quant::GgmlType ty = type;
    add(std::string("ggml_") + name + "_gemv_k4096_n14336", [ty](const BenchOptions& o, const kernels::KernelTable& t) {
      return ggml(o, t, ty, 1, 14336, 4096);
    });
    if (quant::ggml_interleavable(static_cast<uint32_t>(ty)))
      add(std::string("ggml_") + name + "_x8_gemv_k4096_n14336", [ty](const BenchOptions& o, const kernels::KernelTable& t) {
        return ggml(o, t, ty, 1, 14336, 4096, true);
      });
  }
  // Batched decode and prefill on native weights (the server's step, M = active sequences): the layer as the model runs it
  // (nn::LinearWeights::forward: the level's int8 block kernel, or from kDenseFromM rows on levels without a GEMM-shaped
  // one the decode-to-float32 + dense GEMM path), against the int8 block kernel alone; Gemma 3's output layer (Q8_0)
  // and a Q4_K layer of a 7B.
  for (int64_t M : {4, 16, 64, 256})
    for (auto [type, tn, N, K] : {std::tuple<quant::GgmlType, const char*, int64_t, int64_t>{quant::GgmlType::kQ8_0, "q8_0", 262144, 640},
                                  {quant::GgmlType::kQ4_K, "q4_k", 14336, 4096}}) {
      const quant::GgmlType ty = type;
      const int64_t n = N, k = K, m = M;
      const std::string shape = std::string("_m") + std::to_string(M) + "_k" + std::to_string(K) + "_n" + std::to_string(N);
      add(std::string("ggml_") + tn + "_kernel" + shape, [ty, m, n, k](const BenchOptions& o, const kernels::KernelTable& t) {
        return ggml(o, t, ty, m, n, k);
      });
      if (quant::ggml_interleavable(static_cast<uint32_t>(ty)))
        add(std::string("ggml_") + tn + "_x8_kernel" + shape, [ty, m, n, k](const BenchOptions& o, const kernels::KernelTable& t) {
          return ggml(o, t, ty, m, n, k, true);
        });
      add(std::string("ggml_") + tn + "_layer" + shape, [ty, m, n, k](const BenchOptions& o, const kernels::KernelTable&) {
        const quant::GgmlBlockFormat& f = *quant::ggml_block_format(static_cast<uint32_t>(ty));
        const int64_t rb = quant::ggml_row_bytes(f, k);
        const Pool pool = Pool::make(static_cast<size_t>(n * rb), 0, 41, false);
        const std::vector<float> x = random_floats(static_cast<size_t>(m * k), -1.0f, 1.0f, 42);
        std::vector<float> out(static_cast<size_t>(m * n));
        nn::LinearWeights L;
        L.kind = nn::WeightKind::kGgml;
        L.N = n;
        L.K = k;
        L.w = pool.copies[0].data();
        L.w_dtype = DType::kU8;
        L.ggml_type = static_cast<uint32_t>(ty);
        Result r;
        r.kernel = std::string("nn::LinearWeights::forward ") + f.name;
        r.M = m;
        r.N = n;
        r.K = k;
        r.bytes = static_cast<double>(n * rb);
        r.ops = 2.0 * static_cast<double>(m * n * k);
        r.ms = time_calls(std::max(3, o.reps / 4), [&](int) { L.forward(x.data(), m, out.data()); });
        return r;
      });
    }
  // A vocabulary row's log-sum-exp (the logprobs of one served token, runtime/engine.cpp): Gemma 3's 262 144 logits.
  add("log_sum_exp_n262144", [](const BenchOptions& o, const kernels::KernelTable& t) {
    constexpr int64_t n = 262144;
    std::vector<float> z(static_cast<size_t>(n));
    uint64_t x = 88172645463325252ull;
    for (float& v : z) {  // xorshift: logits spread over about ±16
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      v = static_cast<float>(static_cast<int64_t>(x >> 40) - (int64_t{1} << 23)) * (16.0f / 8388608.0f);
    }
    double mx = 0.0, lse = 0.0;
    Result r;
    r.kernel = "max, then Σ exp(z − max)";
    r.N = n;
    r.bytes = static_cast<double>(n) * 4.0;
    r.ms = time_calls(o.reps, [&](int) { t.log_sum_exp({z.data(), n, &mx, &lse}); });
    r.note = "lse " + std::to_string(lse);
    return r;
  });
  // The MLP's gated activation g ← act(g)·u (model/cpu_backend.cpp glu_rows) over a prefill chunk: 2048 rows × 512
  // (one thread: the model splits larger counts over the pool). g is restored from a copy before each call, untimed.
  for (const auto act : {kernels::GluActivation::kGeluTanh, kernels::GluActivation::kSiLU}) {
    const bool gelu = act == kernels::GluActivation::kGeluTanh;
    add(gelu ? "glu_gelu_n1048576" : "glu_silu_n1048576", [act, gelu](const BenchOptions& o, const kernels::KernelTable& t) {
      constexpr int64_t n = 2048 * 512;
      std::vector<float> g0(static_cast<size_t>(n)), u(static_cast<size_t>(n)), g;
      uint64_t x = 88172645463325252ull;
      auto next = [&x] {  // xorshift: values over ±8
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        return static_cast<float>(static_cast<int64_t>(x >> 40) - (int64_t{1} << 23)) * (8.0f / 8388608.0f);
      };
      for (float& v : g0) v = next();
      for (float& v : u) v = next() * 0.25f;
      Result r;
      r.kernel = gelu ? "0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))·u" : "x·σ(x)·u";
      r.N = n;
      r.bytes = static_cast<double>(n) * 12.0;  // g read and written, u read
      for (int i = 0; i <= o.reps; ++i) {  // the first call warms up
        g = g0;
        const double t0 = now_ms();
        t.glu({g.data(), u.data(), n, act});
        if (i > 0) r.ms.push_back(now_ms() - t0);
      }
      double s = 0.0;
      for (float v : g) s += v;
      r.note = "Σ " + std::to_string(s);
      return r;
    });
  }
  // Gemma 3 270M's output layer (Q8_0 in its file; a requantized head in the smaller types, --head-weights).
  for (auto [type, name] : {std::pair<quant::GgmlType, const char*>{quant::GgmlType::kQ8_0, "q8_0"},
                            {quant::GgmlType::kQ5_1, "q5_1"}, {quant::GgmlType::kQ5_0, "q5_0"},
                            {quant::GgmlType::kQ4_1, "q4_1"}, {quant::GgmlType::kQ4_0, "q4_0"}}) {
    const quant::GgmlType ty = type;
    add(std::string("ggml_") + name + "_gemv_k640_n262144", [ty](const BenchOptions& o, const kernels::KernelTable& t) {
      return ggml(o, t, ty, 1, 262144, 640);
    });
    if (quant::ggml_interleavable(static_cast<uint32_t>(ty)))
      add(std::string("ggml_") + name + "_x8_gemv_k640_n262144", [ty](const BenchOptions& o, const kernels::KernelTable& t) {
        return ggml(o, t, ty, 1, 262144, 640, true);
      });
  }
  // Gemma 3 270M's layer GEMVs (Q4_K_M: Q5_0 where K = 640 is not a multiple of 256); with a small --pool-mb they
  // stay in the caches and time the kernels' arithmetic.
  for (auto [type, name, N, K] : {std::tuple<quant::GgmlType, const char*, int64_t, int64_t>{quant::GgmlType::kQ5_0, "q5_0", 2048, 640},
                                  {quant::GgmlType::kQ8_0, "q8_0", 256, 640}, {quant::GgmlType::kQ4_K, "q4_k", 640, 1024},
                                  {quant::GgmlType::kQ6_K, "q6_k", 640, 2048}}) {
    const quant::GgmlType ty = type;
    const int64_t n = N, k = K;
    add(std::string("ggml_") + name + "_gemv_k" + std::to_string(K) + "_n" + std::to_string(N),
        [ty, n, k](const BenchOptions& o, const kernels::KernelTable& t) { return ggml(o, t, ty, 1, n, k); });
    if (quant::ggml_interleavable(static_cast<uint32_t>(ty)))
      add(std::string("ggml_") + name + "_x8_gemv_k" + std::to_string(K) + "_n" + std::to_string(N),
          [ty, n, k](const BenchOptions& o, const kernels::KernelTable& t) { return ggml(o, t, ty, 1, n, k, true); });
  }
  // Prefill: 512 rows through a 4096 × 4096 layer in the formats of a Q4_K_M file, and Gemma 3 270M's MLP input
  // (Q5_0, K 640).
  for (auto [type, name, N, K] : {std::tuple<quant::GgmlType, const char*, int64_t, int64_t>{quant::GgmlType::kQ4_K, "q4_k", 4096, 4096},
                                  {quant::GgmlType::kQ6_K, "q6_k", 4096, 4096}, {quant::GgmlType::kQ8_0, "q8_0", 4096, 4096},
                                  {quant::GgmlType::kQ5_0, "q5_0", 2048, 640}}) {
    const quant::GgmlType ty = type;
    const int64_t n = N, k = K;
    add(std::string("ggml_") + name + "_gemm_m512_k" + std::to_string(K) + "_n" + std::to_string(N),
        [ty, n, k](const BenchOptions& o, const kernels::KernelTable& t) { return ggml(o, t, ty, 512, n, k); });
    if (quant::ggml_interleavable(static_cast<uint32_t>(ty)))
      add(std::string("ggml_") + name + "_x8_gemm_m512_k" + std::to_string(K) + "_n" + std::to_string(N),
          [ty, n, k](const BenchOptions& o, const kernels::KernelTable& t) { return ggml(o, t, ty, 512, n, k, true); });
  }
  // Dense and MLX-format weights.
  for (DType wt : {DType::kBF16, DType::kF32}) {
    const std::string d = dtype_name(wt);
    add("dense_" + d + "_gemv_k4096_n14336", [wt](const BenchOptions& o, const kernels::KernelTable& t) {
      return dense(o, t, wt, 1, 14336, 4096);
    });
    add("dense_" + d + "_gemm_m512_k4096_n4096", [wt](const BenchOptions& o, const kernels::KernelTable& t) {
      return dense(o, t, wt, 512, 4096, 4096);
    });
  }
  for (int bits : {4, 8})
    add("affine_q" + std::to_string(bits) + "_g64_gemv_k4096_n14336",
        [bits](const BenchOptions& o, const kernels::KernelTable& t) { return affine(o, t, bits, 64, 1, 14336, 4096); });
  add("affine_q4_g64_gemm_m512_k4096_n4096",
      [](const BenchOptions& o, const kernels::KernelTable& t) { return affine(o, t, 4, 64, 512, 4096, 4096); });
  return c;
}

// True when `name` contains one of the comma-separated parts of `filter` (or the filter is empty).
bool wanted(const std::string& name, const std::string& filter) {
  if (filter.empty()) return true;
  size_t start = 0;
  while (start <= filter.size()) {
    const size_t end = std::min(filter.find(',', start), filter.size());
    const std::string part = filter.substr(start, end - start);
    if (!part.empty() && name.find(part) != std::string::npos) return true;
    start = end + 1;
  }
  return false;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `cider bench attention [options]`: every word after `attention` goes to the attention benchmark's own parser
// (bench/attention_bench.cpp), --help included.
CLI::App* g_attention_cmd = nullptr;

}  // namespace

CLI::App* add_bench_command(CLI::App& app, BenchOptions& o) {
  CLI::App* c = app.add_subcommand("bench", "time each kernel (x86 W8A8/W4A8 GEMV/GEMM, dense, MLX affine) and "
                                            "print a table; weights stream from DRAM for GEMV");
  c->add_option("--isa", o.isa, "kernel level: ref, avx2, avx512 (default: the active one)");
  c->add_option("--threads", o.threads, "worker threads (default: $CIDER_NUM_THREADS or all cores)")
      ->check(CLI::Range(1, 1024));
  c->add_option("--reps", o.reps, "timed calls per case (best, median and max are printed)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  c->add_option("--pool-mb", o.pool_mb, "MiB of distinct weight copies each GEMV cycles through (keep it well above "
                                        "the last-level cache)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--filter", o.filter, "run only the cases whose name contains this text (several: a,b,c)");
  c->add_flag("--json", o.json, "one JSON object per case and line");
  c->add_flag("--list", o.list, "list the case names and exit");
  c->add_flag("--cputime", g_cputime, "time with the process CPU clock (a loaded machine; use with --threads 1)");
  g_attention_cmd = c->add_subcommand(
      "attention", "decode attention over a packed K/V cache per ISA level (the options of bench/attention_bench: "
                   "--ctx, --dims, --hq, --hkv, --kbits, --vbits, --mode, --json, …; `cider bench attention --help`)");
  g_attention_cmd->set_help_flag();  // --help goes to the attention benchmark's usage
  g_attention_cmd->prefix_command();  // everything after `attention` is its own arguments
  return c;
}

int run_bench(const BenchOptions& o) {
  if (g_attention_cmd && g_attention_cmd->parsed()) {
    std::vector<std::string> words = g_attention_cmd->remaining();
    std::vector<char*> argv;
    std::string prog = "cider bench attention";
    argv.push_back(prog.data());
    for (std::string& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    return cider::bench_attention::main_with_args(static_cast<int>(argv.size() - 1), argv.data());
  }
  const std::vector<Case> cases = all_cases();
  if (o.list) {
    for (const Case& c : cases) std::printf("%s\n", c.name.c_str());
    return 0;
  }
  if (o.threads > 0) set_num_threads(o.threads);
  const kernels::KernelTable& table =
      o.isa.empty() ? kernels::active_kernels() : kernels::kernels_for_isa(parse_isa(o.isa, "bench"));
  if (!o.json) {
    std::printf("cider bench: kernels %s, %d threads, best/median/max of %d calls (GEMM: of max(3, reps/4))%s\n",
                table.name, num_threads(), o.reps, g_cputime ? ", process CPU time" : "");
    std::printf("%-36s %10s %10s %10s %10s %10s  %s\n", "case", "best ms", "median ms", "max ms", "GB/s", "GOP/s",
                "note");
  }
  double stream_gbps = 0.0;
  int ran = 0;
  for (const Case& c : cases) {
    if (!wanted(c.name, o.filter)) continue;
    ++ran;
    const Result r = c.run(o, table);
    const double best = *std::min_element(r.ms.begin(), r.ms.end());
    const double med = median(r.ms), worst = *std::max_element(r.ms.begin(), r.ms.end());
    const double gbps = r.bytes / (best * 1e-3) / 1e9, gops = r.ops / (best * 1e-3) / 1e9;
    if (r.name.rfind("stream_read", 0) == 0) stream_gbps = std::max(stream_gbps, gbps);
    std::string note = r.note;
    if (r.M == 1 && stream_gbps > 0) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%.0f%% of the best stream_read", note.empty() ? "" : "; ", 100.0 * gbps / stream_gbps);
      note += buf;
    }
    if (o.json) {
      std::printf("{\"engine\": \"cider\", \"case\": \"%s\", \"kernel\": \"%s\", \"isa\": \"%s\", \"threads\": %d, "
                  "\"M\": %lld, \"N\": %lld, \"K\": %lld, \"best_ms\": %.4f, \"median_ms\": %.4f, \"max_ms\": %.4f, "
                  "\"calls\": %zu, \"gbps\": %.2f, \"gops\": %.1f, \"clock\": \"%s\", \"note\": \"%s\"}\n",
                  r.name.c_str(), r.kernel.c_str(), table.name, num_threads(), static_cast<long long>(r.M),
                  static_cast<long long>(r.N), static_cast<long long>(r.K), best, med, worst, r.ms.size(), gbps, gops,
                  g_cputime ? "process-cpu" : "wall", note.c_str());
    } else {
      std::printf("%-36s %10.3f %10.3f %10.3f %10.1f %10.1f  %s\n", r.name.c_str(), best, med, worst, gbps,
                  r.ops > 0 ? gops : 0.0, note.c_str());
    }
    std::fflush(stdout);
  }
  check(ran > 0, ErrorCode::kInvalidArgument, "bench", "--filter matches no case; got '", o.filter, "'");
  return 0;
}

}  // namespace cider::apps
