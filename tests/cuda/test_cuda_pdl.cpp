// Programmatic dependent launch (kernels/cuda/pdl.cuh) and the paired K/V append (cuda::kv_append_pair).
//
// PDL lets a kernel start before its predecessor has finished; each kernel waits (griddepcontrol.wait) before its
// first dependent access. A misplaced wait is a race, so these tests run chains where every kernel consumes the
// previous one's output, captured in a CUDA graph and replayed many times with PDL on, and require the results to
// be bit-identical to the same chain launched without PDL (CIDER_PDL=0) — the kernels are deterministic.
// kv_append_pair must store exactly the bytes of kv_append(keys) followed by kv_append(values) (kv_append itself is
// checked against the CPU reference in test_cuda_attention).
#include <gtest/gtest.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cuda/cuda_test_support.h"
#include "kernels/cuda/cuda_api.h"
#include "kernels/kernel_table.h"
#include "support/scoped_env.h"
#include "support/test_support.h"

namespace cider::cuda {
namespace {

constexpr uint8_t kPoison = 0xFF;

using test::ScopedEnv;  // $CIDER_PDL is read at every launch

std::vector<uint8_t> download(const DeviceBuffer& b) {
  std::vector<uint8_t> v(b.bytes());
  b.download(v.data(), v.size());
  return v;
}

int64_t first_diff(const std::vector<uint8_t>& x, const std::vector<uint8_t>& y) {
  if (x.size() != y.size()) return 0;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != y[i]) return static_cast<int64_t>(i);
  return -1;
}

// One layer's cache planes for a k<kb>v<vb> append: [H, capacity, ·].
struct Planes {
  DeviceBuffer k, v, ks, kb, vs, vb;
  Planes(int64_t H, int64_t cap, int64_t dim_k, int64_t dim_v, int kbits, int vbits, int gs) {
    auto sized = [&](int64_t dim, int bits) {
      return static_cast<size_t>(H * cap * (bits ? dim * bits / 8 : dim * 2));
    };
    const size_t sk = static_cast<size_t>(H * cap * (dim_k / gs) * 2), sv = static_cast<size_t>(H * cap * (dim_v / gs) * 2);
    k = DeviceBuffer(sized(dim_k, kbits));
    v = DeviceBuffer(sized(dim_v, vbits));
    ks = DeviceBuffer(sk);
    kb = DeviceBuffer(sk);
    vs = DeviceBuffer(sv);
    vb = DeviceBuffer(sv);
    for (DeviceBuffer* b : {&k, &v, &ks, &kb, &vs, &vb}) b->fill(kPoison);
  }
  std::vector<std::vector<uint8_t>> bytes() const {
    return {download(k), download(v), download(ks), download(kb), download(vs), download(vb)};
  }
};

KVAppendBatchArgs append_args(const float* src, int64_t H, int64_t n, int64_t dim, int64_t stride_t, void* dst,
                              void* scales, void* biases, int bits, int gs, int64_t cap, int64_t offset) {
  KVAppendBatchArgs a{};
  a.src = src;
  a.src_dtype = DType::kF32;
  a.B = 1;
  a.H = H;
  a.n = n;
  a.dim = dim;
  a.src_stride_b = H * dim;
  a.src_stride_h = dim;
  a.src_stride_t = stride_t;
  a.rotation = 0;
  a.dst = dst;
  a.scales = bits ? scales : nullptr;
  a.biases = bits ? biases : nullptr;
  a.dst_dtype = DType::kF16;
  a.bits = bits;
  a.group_size = gs;
  a.capacity = cap;
  a.offset = offset;
  return a;
}

TEST(CudaPdl, KvAppendPairEqualsTwoAppends) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(901);
  struct Case {
    int kbits, vbits, gs;
    int64_t H, n, dk, dv;
  };
  for (const Case& c : {Case{8, 4, 64, 8, 1, 128, 128}, Case{4, 3, 64, 3, 7, 128, 128}, Case{8, 4, 32, 2, 33, 64, 256},
                        Case{4, 0, 64, 1, 5, 128, 64}, Case{0, 0, 64, 4, 1, 256, 256}}) {
    SCOPED_TRACE(::testing::Message() << "k" << c.kbits << "v" << c.vbits << " gs " << c.gs << " H " << c.H << " n "
                                      << c.n << " dk " << c.dk << " dv " << c.dv);
    const int64_t offset = 3, cap = offset + c.n + 2;  // guard rows after the written positions
    const int64_t row = c.H * (c.dk + c.dv) + 5;       // a token's row: keys of every head, then values, then junk
    std::vector<float> src = test::randn(rng, static_cast<size_t>(c.n * row), 1.5f);
    DeviceBuffer d_src = to_device(src.data(), src.size() * sizeof(float));
    const int32_t off32 = static_cast<int32_t>(offset);
    DeviceBuffer d_off = to_device(&off32, sizeof(off32));
    const float* k_src = d_src.as<float>();
    const float* v_src = d_src.as<float>() + c.H * c.dk;
    Stream stream;
    Exec exec{stream.handle(), nullptr, 0};
    for (bool dev_offset : {false, true}) {
      Planes two(c.H, cap, c.dk, c.dv, c.kbits, c.vbits, c.gs), pair(c.H, cap, c.dk, c.dv, c.kbits, c.vbits, c.gs);
      auto args = [&](Planes& p, bool keys) {
        KVAppendBatchArgs a = keys ? append_args(k_src, c.H, c.n, c.dk, row, p.k.data(), p.ks.data(), p.kb.data(),
                                                 c.kbits, c.gs, cap, dev_offset ? 999999 : offset)
                                   : append_args(v_src, c.H, c.n, c.dv, row, p.v.data(), p.vs.data(), p.vb.data(),
                                                 c.vbits, c.gs, cap, dev_offset ? 999999 : offset);
        a.src_stride_b = 0;  // B = 1
        return a;
      };
      const int32_t* d = dev_offset ? d_off.as<int32_t>() : nullptr;
      kv_append(args(two, true), d, exec);
      kv_append(args(two, false), d, exec);
      kv_append_pair(args(pair, true), args(pair, false), d, exec);
      stream.synchronize();
      const auto a = two.bytes(), b = pair.bytes();
      const char* names[] = {"k codes", "v codes", "k scales", "k biases", "v scales", "v biases"};
      for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(first_diff(a[i], b[i]), -1) << names[i] << " differ at this byte";
      // The appends wrote something (the poison is gone from the first written row).
      EXPECT_NE(first_diff(a[0], std::vector<uint8_t>(a[0].size(), kPoison)), -1);
    }
  }
}

TEST(CudaPdl, KvAppendPairRejectsBadArgumentsNamingTheOp) {
  CIDER_REQUIRE_GPU();
  DeviceBuffer src(4096 * sizeof(float)), k(4096), v(4096), s(4096), b(4096);
  KVAppendBatchArgs keys = append_args(src.as<float>(), 1, 1, 128, 256, k.data(), s.data(), b.data(), 8, 64, 4, 0);
  KVAppendBatchArgs values = append_args(src.as<float>(), 1, 1, 128, 256, v.data(), s.data(), b.data(), 7, 64, 4, 0);
  Exec exec{};
  try {
    kv_append_pair(keys, values, nullptr, exec);
    FAIL() << "bits 7 must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda.kv_append_pair"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bits"), std::string::npos) << e.what();
  }
  values.bits = 4;
  values.offset = 4;  // past the capacity
  EXPECT_THROW(kv_append_pair(keys, values, nullptr, exec), Error);
}

// A chain where every kernel reads what the previous one wrote: x → W8A8 GEMV (K 4096 → N 4096) → W4A8 GEMV
// (→ N 2·128·3 + 8: a token's k|v row for 3 heads) → kv_append_pair of that row into k8v4 planes → the next GEMV
// of the next step reads that row ... `steps` steps in one graph, each appending at its own position.
std::vector<std::vector<uint8_t>> run_chain(bool pdl, bool graph, int steps, int replays) {
  const ScopedEnv scope("CIDER_PDL", pdl ? "1" : "0");
  auto rng = test::make_rng(902);
  const int64_t K = 4096, N1 = 4096, H = 3, D = 128, N2 = H * 2 * D + 8;
  std::vector<float> x = test::randn(rng, static_cast<size_t>(K), 1.0f);
  std::vector<int8_t> w1(static_cast<size_t>(N1 * K));
  std::vector<uint8_t> w2(static_cast<size_t>(N2 * K / 2));
  std::uniform_int_distribution<int> i8(-127, 127), u8(0, 255);
  for (auto& v : w1) v = static_cast<int8_t>(i8(rng));
  for (auto& v : w2) v = static_cast<uint8_t>(u8(rng));
  std::vector<float> s1(static_cast<size_t>(N1)), s2(static_cast<size_t>(N2));
  for (auto& v : s1) v = 1.0f / 4096.0f;
  for (auto& v : s2) v = 1.0f / 2048.0f;
  DeviceBuffer d_x = to_device(x.data(), x.size() * 4), d_w1 = to_device(w1.data(), w1.size()),
               d_w2 = to_device(w2.data(), w2.size()), d_s1 = to_device(s1.data(), s1.size() * 4),
               d_s2 = to_device(s2.data(), s2.size() * 4);
  DeviceBuffer d_h(static_cast<size_t>(N1) * 4), d_kv(static_cast<size_t>(N2) * 4);
  const int64_t cap = steps + 1;
  Planes planes(H, cap, D, D, 8, 4, 64);
  Stream stream;
  Exec exec{stream.handle(), nullptr, 0};
  auto enqueue = [&]() {
    for (int s = 0; s < steps; ++s) {
      // Even steps read x; odd steps read the previous step's k|v row (its first 2·H·D values, K = 768; the same
      // weight buffer read as [N1, 768]), so the first GEMV also depends on the kernel before it.
      kernels::IntLinearArgs a1{d_x.data(), DType::kF32, d_w1.data(), d_s1.as<float>(), nullptr,
                                d_h.data(), DType::kF32, 1, N1, K, 0};
      if (s % 2) a1.x = d_kv.data(), a1.K = 2 * D * H;
      w8a8_gemv(a1, exec);
      kernels::IntLinearArgs a2{d_h.data(), DType::kF32, d_w2.data(), d_s2.as<float>(), nullptr, d_kv.data(),
                                DType::kF32, 1, N2, K, 0};
      w4a8_gemv(a2, exec);
      const float* row = d_kv.as<float>();
      KVAppendBatchArgs k = append_args(row, H, 1, D, N2, planes.k.data(), planes.ks.data(), planes.kb.data(), 8, 64,
                                        cap, s);
      KVAppendBatchArgs v = append_args(row + H * D, H, 1, D, N2, planes.v.data(), planes.vs.data(), planes.vb.data(),
                                        4, 64, cap, s);
      kv_append_pair(k, v, nullptr, exec);
    }
  };
  if (graph) {
    cudaStream_t st = static_cast<cudaStream_t>(stream.handle());
    cudaGraph_t g = nullptr;
    cudaGraphExec_t ge = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    enqueue();
    EXPECT_EQ(cudaStreamEndCapture(st, &g), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    for (int r = 0; r < replays; ++r) EXPECT_EQ(cudaGraphLaunch(ge, st), cudaSuccess);
    stream.synchronize();
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
  } else {
    for (int r = 0; r < replays; ++r) enqueue();
    stream.synchronize();
  }
  auto out = planes.bytes();
  out.push_back(download(d_h));
  out.push_back(download(d_kv));
  return out;
}

TEST(CudaPdl, DependentChainInGraphBitIdenticalWithAndWithoutPdl) {
  CIDER_REQUIRE_GPU();
  const auto plain = run_chain(false, false, 12, 3);
  const auto plain_graph = run_chain(false, true, 12, 3);
  const auto pdl_graph = run_chain(true, true, 12, 3);
  const auto pdl_direct = run_chain(true, false, 12, 3);
  ASSERT_EQ(plain.size(), pdl_graph.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "buffer " << i);
    EXPECT_EQ(first_diff(plain[i], plain_graph[i]), -1);
    EXPECT_EQ(first_diff(plain[i], pdl_graph[i]), -1);
    EXPECT_EQ(first_diff(plain[i], pdl_direct[i]), -1);
  }
  // The chain did work: the k|v row holds finite, non-constant values.
  std::vector<float> kv(plain.back().size() / 4);
  std::memcpy(kv.data(), plain.back().data(), plain.back().size());
  bool varied = false;
  for (size_t i = 0; i < kv.size(); ++i) {
    ASSERT_TRUE(std::isfinite(kv[i])) << "element " << i;
    varied = varied || kv[i] != kv[0];
  }
  EXPECT_TRUE(varied);
}

}  // namespace
}  // namespace cider::cuda
