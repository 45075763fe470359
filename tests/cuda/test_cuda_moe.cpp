// Device-side mixture-of-experts routing and expert GEMVs (kernels/cuda/moe.h) against references on the host, and
// the MoE models' decode steps on the GPU with it: graphs equal direct launches, device routing equals host routing
// within the bf16 tolerance.
//
// Bounds (u = 2⁻²⁴, float32 rounding):
//   moe_route: the logits are float32 dot products in a different order than the host's (bound in the test), so a
//     choice may differ only where two probabilities are that close; the weights match within it.
//   moe_gemv, int weights (the decode GEMV's row kernel): the activation codes are quant::quantize_int8_row's, each
//     group's int32 dot is exact; per group the float part is sx·Σ_g fl(sw_g·acc_g), summed by each lane over its
//     groups then a 5-level butterfly: at most (groups + 8) roundings of partial sums bounded by
//     S = |sx|·Σ_g |sw_g·acc_g|, so |Δ| ≤ (groups + 8)·u·S (per channel: exact int32, two products: 3·u·S).
//     bf16 weights: each lane's fma chain over K/32 values plus the butterfly: |Δ| ≤ (K/32 + 8)·u·Σ|x·w|.
//   moe_combine: the same unfused products and adds in the same order as the host loop: bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file_io.h"
#include "cuda/cuda_test_support.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/cuda/moe.h"
#include "model/backend.h"
#include "model/cuda/cuda_backend.h"
#include "model/model.h"
#include "model/transformer.h"
#include "quant/int8.h"
#include "support/scoped_env.h"
#include "support/test_support.h"

namespace cu = cider::cuda;
namespace cm = cider::model;

namespace {

constexpr double kU = 5.9604644775390625e-08;  // 2^-24

template <typename T>
cu::DeviceBuffer dev(const std::vector<T>& v) {
  return cu::to_device(v.data(), v.size() * sizeof(T));
}
template <typename T>
std::vector<T> host(const cu::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  b.download(v.data(), n * sizeof(T));
  return v;
}

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST(CudaMoe, RouteChoosesTheHostsExpertsSortedByIndex) {
  CIDER_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (int64_t E : {8, 64, 128, 512}) {
    for (int64_t K : {1, 2, 8}) {
      for (bool normalize : {false, true}) {
        SCOPED_TRACE("E " + std::to_string(E) + " K " + std::to_string(K) + (normalize ? " norm" : ""));
        const int64_t n = 5, H = 200;
        std::vector<float> h = randn(n * H, rng), router = randn(E * H, rng, 0.1f), sg = randn(H, rng, 0.1f);
        // Rows 3 and 5 of the router equal and the largest for row 0's h: ties go to the lower index.
        for (int64_t i = 0; i < H; ++i) router[3 * H + i] = router[5 * H + i] = h[i];
        auto dh = dev(h), dr = dev(router), dsg = dev(sg);
        cu::DeviceBuffer sel(n * K * 4), w(n * K * 4), ws(n * 4);
        sel.fill(0xff);
        w.fill(0xff);
        cu::moe_route(dh.as<float>(), n, H, dr.as<float>(), E, K, normalize, dsg.as<float>(), sel.as<int32_t>(),
                      w.as<float>(), ws.as<float>(), nullptr);
        const auto gs = host<int32_t>(sel, n * K);
        const auto gw = host<float>(w, n * K);
        const auto gsh = host<float>(ws, n);
        // Host: float32 logits (double products rounded once), route_experts, then sort by index.
        std::vector<float> logits(n * E);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t e = 0; e < E; ++e) {
            double acc = 0;
            for (int64_t i = 0; i < H; ++i) acc += static_cast<double>(h[r * H + i]) * router[e * H + i];
            logits[r * E + e] = static_cast<float>(acc);
          }
        std::vector<int32_t> ch(n * K);
        std::vector<float> wt(n * K);
        cm::route_experts(logits.data(), n, E, K, normalize, ch.data(), wt.data());
        for (int64_t r = 0; r < n; ++r) {
          // The device's logits are float32 sums (each lane's fma chain over H/32 terms, a 5-level butterfly): each
          // is off by at most (H/32 + 6)·u·Σ|h·w|, and a probability (exp of a logit difference, over a sum) by
          // about twice that, relatively: eps below. Choices may differ only within it (near ties).
          double worst_abs = 0;
          for (int64_t e = 0; e < E; ++e) {
            double a = 0;
            for (int64_t i = 0; i < H; ++i) a += std::fabs(static_cast<double>(h[r * H + i]) * router[e * H + i]);
            worst_abs = std::max(worst_abs, a);
          }
          const double eps = 4.0 * (static_cast<double>(H) / 32.0 + 6.0) * kU * worst_abs + 1e-6;
          // probabilities for the near-tie rule
          std::vector<double> p(E);
          double zmax = -1e30, sum = 0;
          for (int64_t e = 0; e < E; ++e) zmax = std::max<double>(zmax, logits[r * E + e]);
          for (int64_t e = 0; e < E; ++e) sum += p[e] = std::exp(logits[r * E + e] - zmax);
          std::vector<double> sorted(p);
          std::sort(sorted.rbegin(), sorted.rend());
          const bool near_tie = K < E && sorted[K - 1] - sorted[K] <= 2.0 * eps * sorted[K - 1] && r != 0;
          std::vector<std::pair<int32_t, float>> want;
          for (int64_t k = 0; k < K; ++k) want.push_back({ch[r * K + k], wt[r * K + k]});
          std::sort(want.begin(), want.end());
          for (int64_t k = 0; k < K; ++k) {
            if (k > 0) {
              EXPECT_LT(gs[r * K + k - 1], gs[r * K + k]) << "row " << r << ": not sorted by index";
            }
            if (near_tie) continue;
            EXPECT_EQ(gs[r * K + k], want[k].first) << "row " << r << " k " << k;
            EXPECT_TRUE(std::fabs(gw[r * K + k] - want[k].second) <= eps * std::fabs(want[k].second) + 1e-30)
                << "row " << r << " k " << k << ": " << gw[r * K + k] << " vs " << want[k].second;
          }
          if (r == 0 && K == 1) {
            EXPECT_EQ(gs[0], 3) << "a tie must keep the lower index";
          }
          double g = 0;
          for (int64_t i = 0; i < H; ++i) g += static_cast<double>(h[r * H + i]) * sg[i];
          const double sig = 1.0 / (1.0 + std::exp(-g));
          double ga = 0;
          for (int64_t i = 0; i < H; ++i) ga += std::fabs(static_cast<double>(h[r * H + i]) * sg[i]);
          // sigmoid' <= 1/4: the gate's logit error (as above) over 4, plus the float32 sigmoid's own rounding
          EXPECT_TRUE(std::fabs(gsh[r] - sig) <= (static_cast<double>(H) / 32.0 + 6.0) * kU * ga / 4.0 + 4.0 * kU)
              << gsh[r] << " vs " << sig;
        }
      }
    }
  }
}

TEST(CudaMoe, GemvThroughTheExpertTableMatchesTheReference) {
  CIDER_REQUIRE_GPU();
  std::mt19937 rng(13);
  struct Case {
    cu::MoeWeightKind kind;
    int group;
  };
  const std::vector<Case> cases = {{cu::MoeWeightKind::kBF16, 0}, {cu::MoeWeightKind::kInt8, 0},
                                   {cu::MoeWeightKind::kInt8, 64}, {cu::MoeWeightKind::kInt8, 128},
                                   {cu::MoeWeightKind::kInt8, 256}, {cu::MoeWeightKind::kInt4, 0},
                                   {cu::MoeWeightKind::kInt4, 32}, {cu::MoeWeightKind::kInt4, 128}};
  // Shapes: N with a tail of rows, K with partial lane steps (768), a slot count above the SMs' (one block per slot
  // then), and per-channel matrices of ≥ 28 MB, which the row kernel streams by bulk copies (linear_gemv_rows.cu).
  struct Shape {
    int64_t N, K, rows, x_div;
  };
  for (const Case& cs : cases) {
    std::vector<Shape> shapes = {{77, 256, 3, 2}, {77, 768, 3, 2}, {77, 4096, 3, 2}, {9, 256, 100, 2}};
    if (cs.kind == cu::MoeWeightKind::kInt8 && cs.group == 0) shapes.push_back({7200, 4096, 2, 2});
    if (cs.kind == cu::MoeWeightKind::kInt4 && cs.group == 0) shapes.push_back({14400, 4096, 1, 3});
    for (const Shape& sh : shapes) {
      const int64_t K = sh.K;
      if (cs.group > 0 && K % cs.group != 0) continue;
      SCOPED_TRACE("kind " + std::to_string(static_cast<int>(cs.kind)) + " group " + std::to_string(cs.group) +
                   " N " + std::to_string(sh.N) + " K " + std::to_string(K) + " slots " +
                   std::to_string(sh.rows * sh.x_div));
      const int64_t E = sh.N > 1000 ? 2 : 5, N = sh.N, rows = sh.rows, x_div = sh.x_div, slots = rows * x_div;
      const bool int4 = cs.kind == cu::MoeWeightKind::kInt4, bf16 = cs.kind == cu::MoeWeightKind::kBF16;
      const int64_t groups = cs.group == 0 ? 1 : K / cs.group;
      std::vector<std::vector<uint8_t>> w(E);
      std::vector<std::vector<float>> sc(E);
      std::vector<cu::DeviceBuffer> dw, ds;
      std::vector<cu::MoeExpertWeights> table;
      std::uniform_int_distribution<int> code(int4 ? 0 : -127, int4 ? 15 : 127);
      for (int64_t e = 0; e < E; ++e) {
        if (bf16) {
          std::vector<float> f = randn(N * K, rng, 0.05f);
          w[e].resize(N * K * 2);
          for (int64_t i = 0; i < N * K; ++i) cider::store_float(w[e].data(), cider::DType::kBF16, i, f[i]);
        } else {
          w[e].resize(int4 ? N * K / 2 : N * K);
          for (auto& b : w[e]) b = int4 ? static_cast<uint8_t>(code(rng) | (code(rng) << 4)) : static_cast<uint8_t>(code(rng));
          sc[e] = randn(groups * N, rng, 0.01f);
        }
        dw.push_back(dev(w[e]));
        ds.push_back(sc[e].empty() ? cu::DeviceBuffer() : dev(sc[e]));
        table.push_back({dw.back().data(), ds.back().bytes() ? ds.back().as<float>() : nullptr});
      }
      std::vector<int32_t> sel(slots);
      std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(E - 1));
      for (auto& e : sel) e = pick(rng);
      std::vector<float> x = randn(rows * K, rng);
      auto dtable = dev(table), dsel = dev(sel), dx = dev(x);
      cu::DeviceBuffer out(slots * N * 4);
      out.fill(0xff);
      cu::MoeGemvArgs a;
      a.table = dtable.as<cu::MoeExpertWeights>();
      a.kind = cs.kind;
      a.N = N;
      a.K = K;
      a.group_size = cs.group;
      a.x = dx.as<float>();
      a.x_div = x_div;
      a.sel = dsel.as<int32_t>();
      a.slots = slots;
      a.out = out.as<float>();
      cu::moe_gemv(a, nullptr);
      const auto got = host<float>(out, slots * N);
      for (int64_t s = 0; s < slots; ++s) {
        const int64_t r = s / x_div, e = sel[s];
        std::vector<int8_t> q(K);
        const float sxr = bf16 ? 0.0f : cider::quant::quantize_int8_row(x.data() + r * K, cider::DType::kF32, K, q.data());
        for (int64_t n = 0; n < N; ++n) {
          double ref = 0, S = 0;
          if (bf16) {
            for (int64_t k = 0; k < K; ++k) {
              const double t = static_cast<double>(x[r * K + k]) * cider::load_float(w[e].data(), cider::DType::kBF16, n * K + k);
              ref += t;
              S += std::fabs(t);
            }
          } else {
            for (int64_t g = 0; g < groups; ++g) {
              int64_t acc = 0;
              const int64_t span = K / groups;
              for (int64_t k = g * span; k < (g + 1) * span; ++k) {
                const int64_t idx = n * K + k;
                const int wq = int4 ? ((w[e][idx / 2] >> (4 * (idx % 2))) & 0xf) - 8 : static_cast<int8_t>(w[e][idx]);
                acc += static_cast<int64_t>(q[k]) * wq;
              }
              const double sw = cs.group == 0 ? sc[e][n] : sc[e][g * N + n];
              ref += sw * static_cast<double>(acc) * sxr;
              S += std::fabs(sw * static_cast<double>(acc) * sxr);
            }
          }
          const double ops = bf16 ? static_cast<double>(K) / 32.0 + 8.0
                                  : (cs.group == 0 ? 3.0 : static_cast<double>(groups) + 8.0);
          const double bound = ops * kU * S + 1e-30;
          const double v = got[s * N + n];
          ASSERT_TRUE(std::fabs(v - ref) <= bound) << "slot " << s << " n " << n << ": " << v << " vs " << ref
                                                   << " (bound " << bound << ")";
        }
      }
    }
  }
}

TEST(CudaMoe, CombineIsTheHostsSumBitForBit) {
  CIDER_REQUIRE_GPU();
  std::mt19937 rng(17);
  const int64_t n = 4, K = 3, H = 300;
  std::vector<float> y = randn(n * K * H, rng), w = randn(n * K, rng), ys = randn(n * H, rng), wsh = randn(n, rng);
  auto dy = dev(y), dw = dev(w), dys = dev(ys), dwsh = dev(wsh);
  cu::DeviceBuffer out(n * H * 4);
  for (bool shared : {false, true}) {
    out.fill(0xff);
    cu::moe_combine(dy.as<float>(), dw.as<float>(), n, K, H, shared ? dys.as<float>() : nullptr,
                    shared ? dwsh.as<float>() : nullptr, out.as<float>(), nullptr);
    const auto got = host<float>(out, n * H);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t d = 0; d < H; ++d) {
        volatile float t = 0.0f;  // each product and add rounded, as the kernel
        for (int64_t k = 0; k < K; ++k) {
          volatile float p = y[(r * K + k) * H + d] * w[r * K + k];
          t = t + p;
        }
        if (shared) {
          volatile float p = ys[r * H + d] * wsh[r];
          t = t + p;
        }
        const float want = t;
        ASSERT_EQ(std::memcmp(&got[r * H + d], &want, 4), 0) << "row " << r << " d " << d << ": " << got[r * H + d]
                                                              << " vs " << want;
      }
  }
}

TEST(CudaMoe, ArgumentErrorsNameTheOp) {
  CIDER_REQUIRE_GPU();
  auto expect = [](auto&& f, const char* what) {
    try {
      f();
      ADD_FAILURE() << "no error: " << what;
    } catch (const cider::Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  cu::MoeGemvArgs a;
  a.N = 8;
  a.K = 48;  // not a multiple of 32
  expect([&] { cu::moe_gemv(a, nullptr); }, "cuda.moe_gemv");
  a.K = 256;
  a.kind = cu::MoeWeightKind::kInt8;
  a.group_size = 32;  // int8 groups are 64, 128 or 256
  expect([&] { cu::moe_gemv(a, nullptr); }, "group size 32");
  EXPECT_FALSE(cu::moe_gemv_supports(cu::MoeWeightKind::kInt8, 256, 32));
  EXPECT_TRUE(cu::moe_gemv_supports(cu::MoeWeightKind::kInt4, 256, 32));
  EXPECT_FALSE(cu::moe_gemv_supports(cu::MoeWeightKind::kInt4, 320, 128));  // groups must divide K
  EXPECT_FALSE(cu::moe_gemv_supports(cu::MoeWeightKind::kBF16, 256, 64));
  expect([&] { cu::moe_route(nullptr, 1, 8, nullptr, 4, 5, false, nullptr, nullptr, nullptr, nullptr, nullptr); },
         "cuda.moe_route");
  expect([&] { cu::moe_combine(nullptr, nullptr, 1, 0, 8, nullptr, nullptr, nullptr, nullptr); }, "cuda.moe_combine");
}

// ---- the MoE fixtures' decode steps with device routing ----

namespace {

std::vector<float> all_logits(const cm::Model& model, const std::vector<int32_t>& tokens, size_t prefill, bool graphs) {
  const auto V = static_cast<size_t>(model.config().vocab_size);
  std::vector<float> out(tokens.size() * V, std::nanf(""));
  auto s = model.new_session();
  if (auto* g = cm::gpu::gpu_session(*s)) g->use_graphs = graphs;
  model.forward(*s, tokens.data(), static_cast<int64_t>(prefill), out.data(), true);
  for (size_t i = prefill; i < tokens.size(); ++i) model.forward(*s, &tokens[i], 1, out.data() + i * V, true);
  if (graphs) {
    EXPECT_GT(cm::gpu::gpu_session(*s)->graphs_captured(), 0) << "MoE decode steps ran without graphs";
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, double* max_ref) {
  double m = 0;
  *max_ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;  // NaN never passes
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
    *max_ref = std::max(*max_ref, std::fabs(static_cast<double>(b[i])));
  }
  return m;
}

}  // namespace

// Decode graphs hold the device routing: replaying them gives the direct launches' logits bit for bit. Against the
// host routing (CIDER_CUDA_MOE_ROUTING=host) the experts' dense layers differ in one way — the device GEMV multiplies
// float32 activations, the host path's GEMM rounds them to bf16 first — so the two agree within the bf16 tolerance of
// test_cuda_model.cpp: 8·δ_kv + 1e-4·max|logit|, δ_kv the CPU's bf16-vs-f32 KV difference on the same tokens.
TEST(CudaMoe, FixturesDecodeThroughGraphsWithDeviceRouting) {
  CIDER_REQUIRE_GPU();
  for (const char* name : {"mixtral", "qwen3_moe", "olmoe"}) {  // olmoe: experts' weights not renormalised
    for (const char* weights : {"bf16", "w8a8", "w4a8"}) {
      SCOPED_TRACE(std::string(name) + " " + weights);
      const std::string dir = cider::test::repo_file(std::string("tests/data/hf_fixtures/") + name);
      const auto ref = nlohmann::json::parse(cider::read_text_input(dir + "/reference.json", "test"));
      std::vector<int32_t> tokens = ref.at("prompt").get<std::vector<int32_t>>();
      tokens.resize(std::min<size_t>(tokens.size(), 64));
      const size_t prefill = tokens.size() - 24;
      auto opts = [&](const char* kv, cm::Device d) {
        cm::ModelOptions o;
        o.weights = cm::parse_weight_format(weights);
        o.kv = cm::parse_kv_format(kv);
        o.device = d;
        return o;
      };
      std::unique_ptr<cm::Model> gpu;
      {
        cider::test::ScopedEnv env("CIDER_CUDA_MOE_ROUTING", "device");  // the default, said explicitly
        gpu = cm::Model::load(dir, opts("bf16", cm::Device::kCUDA));
      }
      ASSERT_TRUE(cm::gpu::gpu_session(*gpu->new_session()) != nullptr);
      const std::vector<float> with_graphs = all_logits(*gpu, tokens, prefill, true);
      const std::vector<float> direct = all_logits(*gpu, tokens, prefill, false);
      double mr = 0;
      EXPECT_EQ(max_abs_diff(with_graphs, direct, &mr), 0.0);
      std::unique_ptr<cm::Model> host_routed;
      {
        cider::test::ScopedEnv env("CIDER_CUDA_MOE_ROUTING", "host");
        host_routed = cm::Model::load(dir, opts("bf16", cm::Device::kCUDA));
      }
      auto s = host_routed->new_session();
      std::vector<float> hr(tokens.size() * static_cast<size_t>(host_routed->config().vocab_size), std::nanf(""));
      const size_t V = static_cast<size_t>(host_routed->config().vocab_size);
      host_routed->forward(*s, tokens.data(), static_cast<int64_t>(prefill), hr.data(), true);
      for (size_t i = prefill; i < tokens.size(); ++i) host_routed->forward(*s, &tokens[i], 1, hr.data() + i * V, true);
      auto cpu16 = cm::Model::load(dir, opts("bf16", cm::Device::kCPU));
      auto cpu32 = cm::Model::load(dir, opts("f32", cm::Device::kCPU));
      auto cpu_logits = [&](const cm::Model& m) {
        std::vector<float> out(tokens.size() * V);
        auto cs = m.new_session();
        m.forward(*cs, tokens.data(), static_cast<int64_t>(tokens.size()), out.data(), true);
        return out;
      };
      double ref_max = 0;
      const double dkv = max_abs_diff(cpu_logits(*cpu16), cpu_logits(*cpu32), &ref_max);
      const double tol = 8.0 * dkv + 1e-4 * ref_max;
      const double d = max_abs_diff(direct, hr, &mr);
      RecordProperty(std::string(name) + "_" + weights, "device vs host routing max|Δ| " + std::to_string(d) +
                                                            ", tolerance " + std::to_string(tol));
      EXPECT_LE(d, tol) << "device vs host routing; max|logit| " << mr;
    }
  }
}
