// cuda_bench cases of the attention area: decode over the K4/V3 and K8/V4 g64 (f16 scales) caches and the plain bf16
// cache, each against PyTorch's bf16 SDPA decode row of tools/gpu/peers.py; causal prefill over K4V3 /
// K8V4 against PyTorch's bf16 SDPA causal prefill (tools/gpu/peers.py); kv_append of one decode step.
// Caches hold fresh random bytes (codes) and valid random f16/bf16 numbers (scales, biases, plain values); copies are
// rotated so the working set of one launch is not served from the 60 MB L2 by the previous one.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench/cuda/bench_cuda.h"
#include "tests/support/scoped_env.h"
#include "core/dtype.h"
#include "kernels/cuda/attention_prefill_tc.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/cuda/cuda_api.h"

namespace cider::bench {
namespace {

using cuda::DeviceBuffer;

std::vector<uint8_t> random_bytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    for (size_t k = 0; k < 8 && i + k < n; ++k) v[i + k] = static_cast<uint8_t>(r >> (8 * k));
  }
  return v;
}
// n 16-bit floats (f16 or bf16) ~ U(-amp, amp).
std::vector<uint8_t> random_half(std::mt19937_64& rng, size_t n, DType t, float amp) {
  std::uniform_real_distribution<float> u(-amp, amp);
  std::vector<uint8_t> v(n * 2);
  for (size_t i = 0; i < n; ++i) {
    const float x = u(rng);
    const uint16_t h = t == DType::kBF16 ? f32_to_bf16(x) : f32_to_f16(x);
    v[2 * i] = static_cast<uint8_t>(h);
    v[2 * i + 1] = static_cast<uint8_t>(h >> 8);
  }
  return v;
}

using cider::test::ScopedEnv;

struct CacheCopy {
  DeviceBuffer k, ks, kb, v, vs, vb;
};


// Decode attention: B, Hq, Hkv, D, L keys; quantized g64 f16 with kbits/vbits (K4V3, K8V4) or plain bf16 (0/0).
// k8v4_tc: the value $CIDER_ATTN_TC_K8V4 is set to during the case (nullptr: left as it is).
// fold: the value $CIDER_ATTN_TC_FOLD is set to ("0": the split partials go to the separate merge kernel, as before
// the in-kernel merge; nullptr: left as it is, default on).
// packed: $CIDER_ATTN_TC_PACKED ("0": the three-chain layout for R ≤ 4 rows too; nullptr: left as it is, default on).
// bound > L: the cache and the plan are sized for `bound` keys and the real length L is read on the device
// (d_length), as in the model's decode graphs (a power-of-two bucket of the length, up to twice it).
BenchResult decode_case(int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t L, int kbits, int vbits,
                        const char* k8v4_tc = nullptr, const char* fold = nullptr, const char* packed = nullptr,
                        int64_t bound = 0) {
  const ScopedEnv env("CIDER_ATTN_TC_K8V4", k8v4_tc);
  const ScopedEnv env_fold("CIDER_ATTN_TC_FOLD", fold);
  const ScopedEnv env_packed("CIDER_ATTN_TC_PACKED", packed);
  const bool quant = kbits > 0;
  std::mt19937_64 rng(1234);
  const int64_t kL = std::max(bound, L);  // keys the cache holds and the plan is made for
  const int64_t rows = B * Hkv * kL;
  const size_t k_bytes = quant ? static_cast<size_t>(rows * D * kbits / 8) : static_cast<size_t>(rows * D * 2);
  const size_t v_bytes = quant ? static_cast<size_t>(rows * D * vbits / 8) : k_bytes;
  const size_t sb_n = static_cast<size_t>(rows * D / 64);
  const size_t per_copy = k_bytes + v_bytes + (quant ? 4 * sb_n * 2 : 0);
  const int copies = static_cast<int>(std::max<size_t>(1, std::min<size_t>(8, (240u << 20) / per_copy + 1)));
  std::vector<CacheCopy> cache(static_cast<size_t>(copies));
  for (CacheCopy& c : cache) {
    if (quant) {
      auto kb = random_bytes(rng, k_bytes), vb = random_bytes(rng, v_bytes);
      c.k = cuda::to_device(kb.data(), kb.size());
      c.v = cuda::to_device(vb.data(), vb.size());
      auto s1 = random_half(rng, sb_n, DType::kF16, 0.05f), s2 = random_half(rng, sb_n, DType::kF16, 1.0f);
      auto s3 = random_half(rng, sb_n, DType::kF16, 0.05f), s4 = random_half(rng, sb_n, DType::kF16, 1.0f);
      c.ks = cuda::to_device(s1.data(), s1.size());
      c.kb = cuda::to_device(s2.data(), s2.size());
      c.vs = cuda::to_device(s3.data(), s3.size());
      c.vb = cuda::to_device(s4.data(), s4.size());
    } else {
      auto kb = random_half(rng, static_cast<size_t>(rows * D), DType::kBF16, 1.0f);
      auto vb = random_half(rng, static_cast<size_t>(rows * D), DType::kBF16, 1.0f);
      c.k = cuda::to_device(kb.data(), kb.size());
      c.v = cuda::to_device(vb.data(), vb.size());
    }
  }
  std::vector<float> qh(static_cast<size_t>(B * Hq * D));
  std::normal_distribution<float> n01;
  for (float& x : qh) x = n01(rng);
  DeviceBuffer q = cuda::to_device(qh.data(), qh.size() * sizeof(float));
  DeviceBuffer out(static_cast<size_t>(B * Hq * D) * sizeof(float));

  auto args_for = [&](const CacheCopy& c) {
    kernels::AttentionArgs a{};
    a.q = q.as<float>();
    a.out = out.as<float>();
    a.B = B;
    a.Hq = Hq;
    a.L = 1;
    kernels::KVTensorView kv{};
    kv.B = B;
    kv.H = Hkv;
    kv.length = kL;
    kv.capacity = kL;
    kv.dim = D;
    if (quant) {
      kv.dtype = DType::kU32;
      kv.scale_dtype = DType::kF16;
      kv.group_size = 64;
      a.keys = kv;
      a.values = kv;
      a.keys.bits = kbits;
      a.values.bits = vbits;
      a.keys.data = c.k.data();
      a.keys.scales = c.ks.data();
      a.keys.biases = c.kb.data();
      a.values.data = c.v.data();
      a.values.scales = c.vs.data();
      a.values.biases = c.vb.data();
    } else {
      kv.dtype = DType::kBF16;
      kv.bits = 0;
      a.keys = kv;
      a.values = kv;
      a.keys.data = c.k.data();
      a.values.data = c.v.data();
    }
    a.scale = 1.0f / 11.3137f;
    a.mask_kind = kernels::MaskKind::kCausal;
    return a;
  };
  const size_t ws_bytes = cuda::attention_workspace_bytes(args_for(cache[0]));
  DeviceBuffer ws(std::max<size_t>(ws_bytes, 256));
  const int32_t len32 = static_cast<int32_t>(L);
  DeviceBuffer d_len = cuda::to_device(&len32, sizeof(len32));
  const int32_t* d_length = kL > L ? d_len.as<int32_t>() : nullptr;
  cuda::Stream stream;
  int next = 0;
  auto fn = [&](void* s) {
    const kernels::AttentionArgs a = args_for(cache[static_cast<size_t>(next)]);
    next = (next + 1) % copies;
    cuda::attention(a, d_length, cuda::Exec{s, ws.data(), ws_bytes});
  };
  BenchResult r;
  r.seconds = bench_graph(fn, stream.handle());
  r.bytes = static_cast<double>(per_copy) * static_cast<double>(L) / static_cast<double>(kL);  // the L keys read
  r.flops = 4.0 * static_cast<double>(B * Hq * L * D);  // q·k and p·v
  r.peer = "sdpa decode bf16 B" + std::to_string(B) + " Hq" + std::to_string(Hq) + " Hkv" + std::to_string(Hkv) +
           " D" + std::to_string(D) + " L" + std::to_string(L);
  const char* tc = std::getenv("CIDER_ATTN_TC");
  const char* k8 = std::getenv("CIDER_ATTN_TC_K8V4");
  const bool tc_on = !(tc && tc[0] == '0') && (kbits == 4 || !(k8 && k8[0] == '0'));  // K8V4: default on
  std::string kind = "K";  // appended piecewise: GCC 12's -Wrestrict misfires on "literal" + std::string&& here
  kind += std::to_string(kbits);
  kind += "V";
  kind += std::to_string(vbits);
  kind += " g64 f16 scales";
  const char* plain = std::getenv("CIDER_ATTN_TC_PLAIN");
  const bool plain_on = !(tc && tc[0] == '0') && !(plain && plain[0] == '0');  // default on
  r.note = quant ? kind + (tc_on ? ", tensor-core path" : ", CUDA-core kernel")
                 : std::string(plain_on ? "plain bf16 cache, tensor-core path" : "plain bf16 cache, CUDA-core kernel");
  if (fold && fold[0] == '1') r.note += ", merge folded into the kernel";
  if (packed && packed[0] == '0') r.note += ", three-chain layout";
  if (kL > L) {
    r.note += ", device length in a plan for ";
    r.note += std::to_string(kL);
    r.note += " keys";
    r.peer.clear();  // SDPA has no such row
  }
  return r;
}

// Per-channel keys (layout 1, docs/kv_cache.md §2b): key codes per position, key scales/biases per block of 64
// positions [blocks, D] f16, the last L % 64 positions in the bf16 residual window; values per token g64 f16.
// L queries rows (1: decode; > 1: causal prefill over the last L of kL keys). kchan_tc: $CIDER_ATTN_TC_KCHAN during
// the case ("0": the CUDA-core kernel for K4V4 decode too; nullptr: left as it is, default on). kL not a multiple of
// 64 leaves kL % 64 keys in the window. outliers: outlier key channels per block (random distinct channels in
// ascending order, random refinement codes).
BenchResult channel_case(int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t kL, int64_t L, int kbits, int vbits,
                         const char* kchan_tc = nullptr, int outliers = 0) {
  const ScopedEnv env("CIDER_ATTN_TC_KCHAN", kchan_tc);
  std::mt19937_64 rng(2468);
  const int64_t rows = B * Hkv * kL, blocks = (kL + 63) / 64;
  const size_t k_bytes = static_cast<size_t>(rows * D * kbits / 8), v_bytes = static_cast<size_t>(rows * D * vbits / 8);
  const size_t ksb_n = static_cast<size_t>(B * Hkv * blocks * D), vsb_n = static_cast<size_t>(rows * D / 64);
  const size_t res_n = static_cast<size_t>(B * Hkv * 64 * D);
  const size_t oc_n = static_cast<size_t>(B * Hkv * blocks * outliers);  // outlier channels over all blocks
  const size_t per_copy = k_bytes + v_bytes + 4 * ksb_n + 4 * vsb_n + 2 * res_n + oc_n * (32 + 2);
  const int copies = L > 1 ? 1 : static_cast<int>(std::max<size_t>(1, std::min<size_t>(8, (240u << 20) / per_copy + 1)));
  std::vector<CacheCopy> cache(static_cast<size_t>(copies));
  std::vector<DeviceBuffer> residual(static_cast<size_t>(copies)), ocodes(static_cast<size_t>(copies)),
      oindex(static_cast<size_t>(copies));
  for (int i = 0; i < copies; ++i) {
    CacheCopy& c = cache[static_cast<size_t>(i)];
    auto kb = random_bytes(rng, k_bytes), vb = random_bytes(rng, v_bytes);
    c.k = cuda::to_device(kb.data(), kb.size());
    c.v = cuda::to_device(vb.data(), vb.size());
    auto s1 = random_half(rng, ksb_n, DType::kF16, 0.05f), s2 = random_half(rng, ksb_n, DType::kF16, 1.0f);
    auto s3 = random_half(rng, vsb_n, DType::kF16, 0.05f), s4 = random_half(rng, vsb_n, DType::kF16, 1.0f);
    c.ks = cuda::to_device(s1.data(), s1.size());
    c.kb = cuda::to_device(s2.data(), s2.size());
    c.vs = cuda::to_device(s3.data(), s3.size());
    c.vb = cuda::to_device(s4.data(), s4.size());
    auto r = random_half(rng, res_n, DType::kBF16, 1.0f);
    residual[static_cast<size_t>(i)] = cuda::to_device(r.data(), r.size());
    if (outliers > 0) {
      auto oc = random_bytes(rng, oc_n * 32);
      std::vector<uint16_t> oi;
      std::vector<uint16_t> ch(static_cast<size_t>(D));
      for (size_t blk = 0; blk < oc_n / static_cast<size_t>(outliers); ++blk) {
        for (int64_t d = 0; d < D; ++d) ch[static_cast<size_t>(d)] = static_cast<uint16_t>(d);
        std::shuffle(ch.begin(), ch.end(), rng);
        std::sort(ch.begin(), ch.begin() + outliers);
        oi.insert(oi.end(), ch.begin(), ch.begin() + outliers);
      }
      ocodes[static_cast<size_t>(i)] = cuda::to_device(oc.data(), oc.size());
      oindex[static_cast<size_t>(i)] = cuda::to_device(oi.data(), oi.size() * sizeof(uint16_t));
    }
  }
  std::vector<float> qh(static_cast<size_t>(B * Hq * L * D));
  std::normal_distribution<float> n01;
  for (float& x : qh) x = n01(rng);
  DeviceBuffer q = cuda::to_device(qh.data(), qh.size() * sizeof(float));
  DeviceBuffer out(qh.size() * sizeof(float));
  auto args_for = [&](int i) {
    const CacheCopy& c = cache[static_cast<size_t>(i)];
    kernels::AttentionArgs a{};
    a.q = q.as<float>();
    a.out = out.as<float>();
    a.B = B;
    a.Hq = Hq;
    a.L = L;
    kernels::KVTensorView kv{};
    kv.B = B;
    kv.H = Hkv;
    kv.length = kL;
    kv.capacity = kL;
    kv.dim = D;
    kv.dtype = DType::kU32;
    kv.scale_dtype = DType::kF16;
    kv.group_size = 64;
    a.keys = kv;
    a.values = kv;
    a.keys.bits = kbits;
    a.values.bits = vbits;
    a.keys.data = c.k.data();
    a.keys.scales = c.ks.data();
    a.keys.biases = c.kb.data();
    a.keys.layout = 1;
    a.keys.blocks = blocks;
    a.keys.residual = residual[static_cast<size_t>(i)].data();
    if (outliers > 0) {
      a.keys.outliers = outliers;
      a.keys.outlier_codes = ocodes[static_cast<size_t>(i)].data();
      a.keys.outlier_index = oindex[static_cast<size_t>(i)].data();
    }
    a.values.data = c.v.data();
    a.values.scales = c.vs.data();
    a.values.biases = c.vb.data();
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    a.mask_kind = kernels::MaskKind::kCausal;
    return a;
  };
  const size_t ws_bytes = cuda::attention_workspace_bytes(args_for(0));
  DeviceBuffer ws(std::max<size_t>(ws_bytes, 256));
  cuda::Stream stream;
  int next = 0;
  auto fn = [&](void* st) {
    const kernels::AttentionArgs a = args_for(next);
    next = (next + 1) % copies;
    cuda::attention(a, nullptr, cuda::Exec{st, ws.data(), ws_bytes});
  };
  BenchResult r;
  r.seconds = L > 1 ? bench_graph(fn, stream.handle(), 20, 15) : bench_graph(fn, stream.handle());
  r.bytes = static_cast<double>(per_copy);
  const double pairs = L == 1 ? static_cast<double>(kL)
                              : static_cast<double>(L) * static_cast<double>(L + 1) / 2.0 +
                                    static_cast<double>(L) * static_cast<double>(kL - L);
  r.flops = 4.0 * static_cast<double>(B * Hq * D) * pairs;
  std::string kind = "K";
  kind += std::to_string(kbits);
  kind += "V";
  kind += std::to_string(vbits);
  kind += " per-channel keys (blocks of 64, bf16 window) g64 f16 scales";
  if (outliers > 0) kind += ", " + std::to_string(outliers) + " outlier channels per block";
  const bool tc = cuda::detail::tc_eligible(args_for(0));
  kind += tc ? ", tensor-core path" : ", CUDA-core kernel";
  r.note = kind;
  return r;
}

CIDER_CUDA_BENCH("attention decode K4V4-kchan B1 Hq32 Hkv8 D128 L32768", "attention") {
  return channel_case(1, 32, 8, 128, 32768, 1, 4, 4);
}
CIDER_CUDA_BENCH("attention decode K5V5-kchan B1 Hq32 Hkv8 D128 L32768", "attention") {
  return channel_case(1, 32, 8, 128, 32768, 1, 5, 5);
}
CIDER_CUDA_BENCH("attention decode K4V4-kchan B8 Hq32 Hkv8 D128 L32768", "attention") {
  return channel_case(8, 32, 8, 128, 32768, 1, 4, 4);
}
CIDER_CUDA_BENCH("attention decode K4V4-kchan B1 Hq16 Hkv2 D256 L65536", "attention") {
  return channel_case(1, 16, 2, 256, 65536, 1, 4, 4);
}
CIDER_CUDA_BENCH("attention prefill K4V4-kchan B1 Hq32 Hkv8 D128 L4096", "attention") {
  return channel_case(1, 32, 8, 128, 4096, 4096, 4, 4);
}
CIDER_CUDA_BENCH("attention prefill K4V4-kchan B1 Hq32 Hkv8 D128 L512", "attention") {
  return channel_case(1, 32, 8, 128, 512, 512, 4, 4);
}
CIDER_CUDA_BENCH("attention prefill K4V4-kchan B1 Hq16 Hkv2 D256 L4096", "attention") {
  return channel_case(1, 16, 2, 256, 4096, 4096, 4, 4);
}
CIDER_CUDA_BENCH("attention prefill K4V4-kchan B1 Hq32 Hkv8 D128 L4096 v:CUDA-core kernel", "attention") {
  return channel_case(1, 32, 8, 128, 4096, 4096, 4, 4, "0");
}
CIDER_CUDA_BENCH("attention decode K4V4-kchan B1 Hq32 Hkv8 D128 L32800", "attention") {  // 32 keys in the window
  return channel_case(1, 32, 8, 128, 32800, 1, 4, 4);
}
CIDER_CUDA_BENCH("attention decode K4V4-kchan B1 Hq32 Hkv8 D128 L1024", "attention") {
  return channel_case(1, 32, 8, 128, 1024, 1, 4, 4);
}
// 5-bit keys (the CPU default's width) with 4-bit values on the tensor cores.
CIDER_CUDA_BENCH("attention decode K5V4-kchan B1 Hq32 Hkv8 D128 L32768", "attention") {
  return channel_case(1, 32, 8, 128, 32768, 1, 5, 4);
}
CIDER_CUDA_BENCH("attention decode K5V4-kchan B8 Hq32 Hkv8 D128 L32768", "attention") {
  return channel_case(8, 32, 8, 128, 32768, 1, 5, 4);
}
CIDER_CUDA_BENCH("attention decode K5V4-kchan B1 Hq16 Hkv2 D256 L65536", "attention") {
  return channel_case(1, 16, 2, 256, 65536, 1, 5, 4);
}
CIDER_CUDA_BENCH("attention prefill K5V4-kchan B1 Hq32 Hkv8 D128 L4096", "attention") {
  return channel_case(1, 32, 8, 128, 4096, 4096, 5, 4);
}
CIDER_CUDA_BENCH("attention prefill K5V5-kchan B1 Hq32 Hkv8 D128 L4096", "attention") {
  return channel_case(1, 32, 8, 128, 4096, 4096, 5, 5);
}
CIDER_CUDA_BENCH("attention decode K5V5-kchan B8 Hq32 Hkv8 D128 L32768", "attention") {
  return channel_case(8, 32, 8, 128, 32768, 1, 5, 5);
}
// The default cache: K5V4 with Dk/32 outlier key channels (the refinement term per block on top of K5V4).
CIDER_CUDA_BENCH("attention decode K5V4-kchan-o4 B1 Hq32 Hkv8 D128 L32768", "attention") {
  return channel_case(1, 32, 8, 128, 32768, 1, 5, 4, nullptr, 4);
}
CIDER_CUDA_BENCH("attention decode K5V4-kchan-o4 B8 Hq32 Hkv8 D128 L32768", "attention") {
  return channel_case(8, 32, 8, 128, 32768, 1, 5, 4, nullptr, 4);
}
CIDER_CUDA_BENCH("attention decode K5V4-kchan-o8 B1 Hq16 Hkv2 D256 L65536", "attention") {
  return channel_case(1, 16, 2, 256, 65536, 1, 5, 4, nullptr, 8);
}
CIDER_CUDA_BENCH("attention decode K5V4-kchan-o4 B1 Hq32 Hkv8 D128 L1024", "attention") {
  return channel_case(1, 32, 8, 128, 1024, 1, 5, 4, nullptr, 4);
}
CIDER_CUDA_BENCH("attention prefill K5V4-kchan-o4 B1 Hq32 Hkv8 D128 L4096", "attention") {
  return channel_case(1, 32, 8, 128, 4096, 4096, 5, 4, nullptr, 4);
}
CIDER_CUDA_BENCH("attention prefill K5V4-kchan-o8 B1 Hq16 Hkv2 D256 L4096", "attention") {
  return channel_case(1, 16, 2, 256, 4096, 4096, 5, 4, nullptr, 8);
}
// A/B: the same decode cases on the CUDA-core kernel.
CIDER_CUDA_BENCH("attention decode K4V4-kchan B1 Hq32 Hkv8 D128 L32768 v:CUDA-core kernel", "attention") {
  return channel_case(1, 32, 8, 128, 32768, 1, 4, 4, "0");
}
CIDER_CUDA_BENCH("attention decode K4V4-kchan B8 Hq32 Hkv8 D128 L32768 v:CUDA-core kernel", "attention") {
  return channel_case(8, 32, 8, 128, 32768, 1, 4, 4, "0");
}
CIDER_CUDA_BENCH("attention decode K4V4-kchan B1 Hq16 Hkv2 D256 L65536 v:CUDA-core kernel", "attention") {
  return channel_case(1, 16, 2, 256, 65536, 1, 4, 4, "0");
}

CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L32768", "attention") {
  return decode_case(1, 32, 8, 128, 32768, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B8 Hq32 Hkv8 D128 L32768", "attention") {
  return decode_case(8, 32, 8, 128, 32768, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L131072", "attention") {
  return decode_case(1, 32, 8, 128, 131072, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq16 Hkv2 D256 L65536", "attention") {
  return decode_case(1, 16, 2, 256, 65536, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq64 Hkv8 D128 L8192", "attention") {
  return decode_case(1, 64, 8, 128, 8192, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B8 Hq16 Hkv2 D256 L65536", "attention") {
  return decode_case(8, 16, 2, 256, 65536, 4, 3);
}
// The length sweep (fixed cost and streaming rate: time = fixed + L / rate), beside tools/gpu/peers.py's
// SDPA rows at the same lengths.
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L1024", "attention") {
  return decode_case(1, 32, 8, 128, 1024, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L4096", "attention") {
  return decode_case(1, 32, 8, 128, 4096, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L8192", "attention") {
  return decode_case(1, 32, 8, 128, 8192, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L16384", "attention") {
  return decode_case(1, 32, 8, 128, 16384, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L65536", "attention") {
  return decode_case(1, 32, 8, 128, 65536, 4, 3);
}
// A decode graph's bucket: 32769 keys read from a device length in a grid planned for 65536 (the model's bound is
// the next power of two), K4V3 and K8V4; compare with the L32768 rows.
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L32769 in a 65536 plan", "attention") {
  return decode_case(1, 32, 8, 128, 32769, 4, 3, nullptr, nullptr, nullptr, 65536);
}
CIDER_CUDA_BENCH("attention decode K8V4 B1 Hq32 Hkv8 D128 L32769 in a 65536 plan", "attention") {
  return decode_case(1, 32, 8, 128, 32769, 8, 4, "1", nullptr, nullptr, 65536);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L1025 in a 2048 plan", "attention") {
  return decode_case(1, 32, 8, 128, 1025, 4, 3, nullptr, nullptr, nullptr, 2048);
}
// A/B of the early tile copies ($CIDER_ATTN_TC_EARLY=0: the first tiles fetched after the PDL wait, as before).
BenchResult late_copies_case(int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t L, int kbits, int vbits) {
  const ScopedEnv env("CIDER_ATTN_TC_EARLY", "0");
  BenchResult r = decode_case(B, Hq, Hkv, D, L, kbits, vbits, kbits == 8 ? "1" : nullptr);
  r.note += ", first tiles after the PDL wait";
  return r;
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L32768 v:late copies", "attention") {
  return late_copies_case(1, 32, 8, 128, 32768, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L8192 v:late copies", "attention") {
  return late_copies_case(1, 32, 8, 128, 8192, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L131072 v:late copies", "attention") {
  return late_copies_case(1, 32, 8, 128, 131072, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B8 Hq32 Hkv8 D128 L32768 v:late copies", "attention") {
  return late_copies_case(8, 32, 8, 128, 32768, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq16 Hkv2 D256 L65536 v:late copies", "attention") {
  return late_copies_case(1, 16, 2, 256, 65536, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K8V4 B1 Hq32 Hkv8 D128 L32768 v:late copies", "attention") {
  return late_copies_case(1, 32, 8, 128, 32768, 8, 4);
}
// A/B of the in-kernel merge (opt-in, measured slower): the same two cases with the partials merged in the kernel.
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L32768 v:folded merge", "attention") {
  return decode_case(1, 32, 8, 128, 32768, 4, 3, nullptr, "1");
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq64 Hkv8 D128 L8192 v:folded merge", "attention") {
  return decode_case(1, 64, 8, 128, 8192, 4, 3, nullptr, "1");
}
// A/B of the packed layout (R = rep·L ≤ 4, the default for those rows): the same cases in the three-chain layout.
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L32768 v:three-chain layout", "attention") {
  return decode_case(1, 32, 8, 128, 32768, 4, 3, nullptr, nullptr, "0");
}
CIDER_CUDA_BENCH("attention decode K4V3 B8 Hq32 Hkv8 D128 L32768 v:three-chain layout", "attention") {
  return decode_case(8, 32, 8, 128, 32768, 4, 3, nullptr, nullptr, "0");
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq32 Hkv8 D128 L131072 v:three-chain layout", "attention") {
  return decode_case(1, 32, 8, 128, 131072, 4, 3, nullptr, nullptr, "0");
}
CIDER_CUDA_BENCH("attention decode K8V4 B1 Hq32 Hkv8 D128 L32768 v:three-chain layout", "attention") {
  return decode_case(1, 32, 8, 128, 32768, 8, 4, "1", nullptr, "0");
}
// D256 with rep 4 (Hq8 Hkv2): the packed layout at D256 (the brief's D256 case has rep 8: three chains).
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq8 Hkv2 D256 L65536", "attention") {
  return decode_case(1, 8, 2, 256, 65536, 4, 3);
}
CIDER_CUDA_BENCH("attention decode K4V3 B1 Hq8 Hkv2 D256 L65536 v:three-chain layout", "attention") {
  return decode_case(1, 8, 2, 256, 65536, 4, 3, nullptr, nullptr, "0");
}
// K8V4 g64 (the CLI default cache) on the tensor-core path ($CIDER_ATTN_TC_K8V4=1 during the case); the
// "CUDA-core" case is the same cache on the general kernel (switch 0) for the A/B.
CIDER_CUDA_BENCH("attention decode K8V4 B1 Hq32 Hkv8 D128 L32768", "attention") {
  return decode_case(1, 32, 8, 128, 32768, 8, 4, "1");
}
CIDER_CUDA_BENCH("attention decode K8V4 B1 Hq32 Hkv8 D128 L131072", "attention") {
  return decode_case(1, 32, 8, 128, 131072, 8, 4, "1");
}
CIDER_CUDA_BENCH("attention decode K8V4 B1 Hq16 Hkv2 D256 L65536", "attention") {
  return decode_case(1, 16, 2, 256, 65536, 8, 4, "1");
}
CIDER_CUDA_BENCH("attention decode K8V4 CUDA-core B1 Hq32 Hkv8 D128 L32768", "attention") {
  return decode_case(1, 32, 8, 128, 32768, 8, 4, "0");
}
// Plain bf16 caches: the tensor-core decode kernel (attention_decode_plain_tc.cu, default), and the general CUDA-core
// kernel for the A/B ($CIDER_ATTN_TC_PLAIN=0, "v:CUDA-core kernel").
BenchResult plain_case(int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t L, const char* plain_tc) {
  const ScopedEnv env("CIDER_ATTN_TC_PLAIN", plain_tc);
  return decode_case(B, Hq, Hkv, D, L, 0, 0);
}
CIDER_CUDA_BENCH("attention decode plain-bf16 B1 Hq32 Hkv8 D128 L32768", "attention") {
  return plain_case(1, 32, 8, 128, 32768, nullptr);
}
CIDER_CUDA_BENCH("attention decode plain-bf16 B8 Hq32 Hkv8 D128 L32768", "attention") {
  return plain_case(8, 32, 8, 128, 32768, nullptr);
}
CIDER_CUDA_BENCH("attention decode plain-bf16 B1 Hq16 Hkv2 D256 L65536", "attention") {
  return plain_case(1, 16, 2, 256, 65536, nullptr);
}
CIDER_CUDA_BENCH("attention decode plain-bf16 B1 Hq32 Hkv8 D128 L32768 v:CUDA-core kernel", "attention") {
  return plain_case(1, 32, 8, 128, 32768, "0");
}
CIDER_CUDA_BENCH("attention decode plain-bf16 B8 Hq32 Hkv8 D128 L32768 v:CUDA-core kernel", "attention") {
  return plain_case(8, 32, 8, 128, 32768, "0");
}
CIDER_CUDA_BENCH("attention decode plain-bf16 B1 Hq16 Hkv2 D256 L65536 v:CUDA-core kernel", "attention") {
  return plain_case(1, 16, 2, 256, 65536, "0");
}

// Prefill attention: L new query rows against kL = past + L keys (causal), B1; quantized g64 f16 K4V3 / K8V4.
// prefill_tc: the value $CIDER_ATTN_PREFILL_TC is set to ("0": the general CUDA-core kernel for the A/B; nullptr:
// left as it is, default on); math: $CIDER_ATTN_PREFILL_MATH (nullptr: as set, default auto = f16 tiles above 64
// rows per KV head; "exact": the exact-score kernel).
// flops: 2·2·Hq·D per visible (query, key) pair: L·(L+1)/2 + L·past pairs per head.
BenchResult prefill_case(int64_t Hq, int64_t Hkv, int64_t D, int64_t L, int64_t past, int kbits, int vbits,
                         const char* prefill_tc = nullptr, int reps = 20,
                         int samples = 15, const char* math = nullptr) {
  const ScopedEnv env("CIDER_ATTN_PREFILL_TC", prefill_tc);
  const ScopedEnv env_m("CIDER_ATTN_PREFILL_MATH", math);
  const int64_t B = 1, kL = past + L;
  std::mt19937_64 rng(4321);
  const int64_t rows = B * Hkv * kL;
  const size_t k_bytes = static_cast<size_t>(rows * D * kbits / 8), v_bytes = static_cast<size_t>(rows * D * vbits / 8);
  const size_t sb_n = static_cast<size_t>(rows * D / 64);
  CacheCopy c;
  {
    auto kb = random_bytes(rng, k_bytes), vb = random_bytes(rng, v_bytes);
    c.k = cuda::to_device(kb.data(), kb.size());
    c.v = cuda::to_device(vb.data(), vb.size());
    auto s1 = random_half(rng, sb_n, DType::kF16, 0.05f), s2 = random_half(rng, sb_n, DType::kF16, 1.0f);
    auto s3 = random_half(rng, sb_n, DType::kF16, 0.05f), s4 = random_half(rng, sb_n, DType::kF16, 1.0f);
    c.ks = cuda::to_device(s1.data(), s1.size());
    c.kb = cuda::to_device(s2.data(), s2.size());
    c.vs = cuda::to_device(s3.data(), s3.size());
    c.vb = cuda::to_device(s4.data(), s4.size());
  }
  std::vector<float> qh(static_cast<size_t>(B * Hq * L * D));
  std::normal_distribution<float> n01;
  for (float& x : qh) x = n01(rng);
  DeviceBuffer q = cuda::to_device(qh.data(), qh.size() * sizeof(float));
  DeviceBuffer out(qh.size() * sizeof(float));
  kernels::AttentionArgs a{};
  a.q = q.as<float>();
  a.out = out.as<float>();
  a.B = B;
  a.Hq = Hq;
  a.L = L;
  kernels::KVTensorView kv{};
  kv.B = B;
  kv.H = Hkv;
  kv.length = kL;
  kv.capacity = kL;
  kv.dim = D;
  kv.dtype = DType::kU32;
  kv.scale_dtype = DType::kF16;
  kv.group_size = 64;
  a.keys = kv;
  a.values = kv;
  a.keys.bits = kbits;
  a.values.bits = vbits;
  a.keys.data = c.k.data();
  a.keys.scales = c.ks.data();
  a.keys.biases = c.kb.data();
  a.values.data = c.v.data();
  a.values.scales = c.vs.data();
  a.values.biases = c.vb.data();
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.mask_kind = kernels::MaskKind::kCausal;
  const size_t ws_bytes = cuda::attention_workspace_bytes(a);
  DeviceBuffer ws(std::max<size_t>(ws_bytes, 256));
  cuda::Stream stream;
  BenchResult r;
  r.seconds = bench_graph([&](void* st) { cuda::attention(a, nullptr, cuda::Exec{st, ws.data(), ws_bytes}); },
                          stream.handle(), reps, samples);
  r.bytes = static_cast<double>(k_bytes + v_bytes + 4 * sb_n * 2) + 2.0 * static_cast<double>(qh.size() * 4);
  const double pairs = static_cast<double>(L) * static_cast<double>(L + 1) / 2.0 +
                       static_cast<double>(L) * static_cast<double>(past);
  r.flops = 4.0 * static_cast<double>(Hq * D) * pairs;
  if (past == 0) {
    r.peer = "sdpa prefill bf16 causal B1 Hq";
    r.peer += std::to_string(Hq);
    r.peer += " Hkv";
    r.peer += std::to_string(Hkv);
    r.peer += " D";
    r.peer += std::to_string(D);
    r.peer += " L";
    r.peer += std::to_string(L);
  }
  const bool tc_on = cuda::detail::prefill_tc_eligible(a);
  r.note = kbits == 4 ? "K4V3" : "K8V4";
  r.note += " g64 f16 scales, ";
  r.note += tc_on ? (cuda::detail::prefill_math_f16(a) ? "tensor-core prefill path, f16 tiles"
                                                     : "tensor-core prefill path, exact scores")
                  : "CUDA-core kernel";
  r.note += ", workspace ";
  r.note += std::to_string(ws_bytes);
  r.note += " B";
  return r;
}

CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq32 Hkv8 D128 L512", "attention") {
  return prefill_case(32, 8, 128, 512, 0, 4, 3);
}
CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq32 Hkv8 D128 L4096", "attention") {
  return prefill_case(32, 8, 128, 4096, 0, 4, 3);
}
CIDER_CUDA_BENCH("attention prefill K8V4 B1 Hq32 Hkv8 D128 L512", "attention") {
  return prefill_case(32, 8, 128, 512, 0, 8, 4);
}
CIDER_CUDA_BENCH("attention prefill K8V4 B1 Hq32 Hkv8 D128 L4096", "attention") {
  return prefill_case(32, 8, 128, 4096, 0, 8, 4);
}
CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq16 Hkv2 D256 L4096", "attention") {
  return prefill_case(16, 2, 256, 4096, 0, 4, 3);
}
// 16 new tokens against a 32k cache: one query block per KV head, so the keys are split (merge kernel).
CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq32 Hkv8 D128 L16 past32768", "attention") {
  return prefill_case(32, 8, 128, 16, 32768, 4, 3);
}
// The A/B of the tensor-core path's two kernels: the exact-score kernel ($CIDER_ATTN_PREFILL_MATH=exact).
CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq32 Hkv8 D128 L512 v:exact", "attention") {
  return prefill_case(32, 8, 128, 512, 0, 4, 3, nullptr, 20, 15, "exact");
}
CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq32 Hkv8 D128 L4096 v:exact", "attention") {
  return prefill_case(32, 8, 128, 4096, 0, 4, 3, nullptr, 20, 15, "exact");
}
CIDER_CUDA_BENCH("attention prefill K8V4 B1 Hq32 Hkv8 D128 L4096 v:exact", "attention") {
  return prefill_case(32, 8, 128, 4096, 0, 8, 4, nullptr, 20, 15, "exact");
}
CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq16 Hkv2 D256 L4096 v:exact", "attention") {
  return prefill_case(16, 2, 256, 4096, 0, 4, 3, nullptr, 20, 15, "exact");
}
CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq32 Hkv8 D128 L16 past32768 v:exact", "attention") {
  return prefill_case(32, 8, 128, 16, 32768, 4, 3, nullptr, 20, 15, "exact");
}
// The f16 kernel's CTA size forced (CIDER_ATTN_PREFILL_F16_WARPS; auto picks 12 warps when the CTAs make two waves).
CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq32 Hkv8 D128 L512 v:f16 w12", "attention") {
  const ScopedEnv w("CIDER_ATTN_PREFILL_F16_WARPS", "12");
  return prefill_case(32, 8, 128, 512, 0, 4, 3);
}
CIDER_CUDA_BENCH("attention prefill K4V3 B1 Hq32 Hkv8 D128 L4096 v:f16 w8", "attention") {
  const ScopedEnv w("CIDER_ATTN_PREFILL_F16_WARPS", "8");
  return prefill_case(32, 8, 128, 4096, 0, 4, 3);
}
CIDER_CUDA_BENCH("attention prefill K8V4 B1 Hq32 Hkv8 D128 L4096 v:f16 w8", "attention") {
  const ScopedEnv w("CIDER_ATTN_PREFILL_F16_WARPS", "8");
  return prefill_case(32, 8, 128, 4096, 0, 8, 4);
}
CIDER_CUDA_BENCH("attention prefill K8V4 B1 Hq16 Hkv2 D256 L4096", "attention") {
  return prefill_case(16, 2, 256, 4096, 0, 8, 4);
}
// The A/B: the same caches on the general CUDA-core kernel (fewer launches per sample: tens of ms each).
CIDER_CUDA_BENCH("attention prefill K4V3 CUDA-core B1 Hq32 Hkv8 D128 L4096", "attention") {
  return prefill_case(32, 8, 128, 4096, 0, 4, 3, "0", 2, 5);
}
CIDER_CUDA_BENCH("attention prefill K8V4 CUDA-core B1 Hq32 Hkv8 D128 L4096", "attention") {
  return prefill_case(32, 8, 128, 4096, 0, 8, 4, "0", 2, 5);
}

// One decode step of kv_append: B1 H8 D128, K4 g64 f16, so4 full (keys); minimum traffic = f32 src + the new row.
CIDER_CUDA_BENCH("kv_append decode K4 g64 B1 H8 D128", "attention") {
  const int64_t B = 1, H = 8, D = 128, cap = 4096;
  std::vector<float> src(static_cast<size_t>(B * H * D), 0.5f);
  std::vector<float> quat(static_cast<size_t>(D), 0.5f);  // (0.5, 0.5, 0.5, 0.5): a unit quaternion
  DeviceBuffer d_src = cuda::to_device(src.data(), src.size() * sizeof(float));
  DeviceBuffer d_q = cuda::to_device(quat.data(), quat.size() * sizeof(float));
  DeviceBuffer dst(static_cast<size_t>(B * H * cap * D / 2)), sc(static_cast<size_t>(B * H * cap * D / 64 * 2)),
      bi(static_cast<size_t>(B * H * cap * D / 64 * 2));
  cuda::KVAppendBatchArgs a{};
  a.src = d_src.data();
  a.src_dtype = DType::kF32;
  a.B = B;
  a.H = H;
  a.n = 1;
  a.dim = D;
  a.src_stride_b = H * D;
  a.src_stride_h = D;
  a.src_stride_t = D;
  a.rotation = 2;
  a.qL = d_q.as<float>();
  a.qR = d_q.as<float>();
  a.dst = dst.data();
  a.scales = sc.data();
  a.biases = bi.data();
  a.dst_dtype = DType::kF16;
  a.bits = 4;
  a.group_size = 64;
  a.capacity = cap;
  a.offset = 100;
  cuda::Stream stream;
  BenchResult r;
  r.seconds = bench_graph([&](void* s) { cuda::kv_append(a, nullptr, cuda::Exec{s, nullptr, 0}); }, stream.handle());
  r.bytes = static_cast<double>(B * H * D * 4 + B * H * (D / 2 + 8));
  r.note = "one CTA per row, a warp per group";
  return r;
}

}  // namespace
}  // namespace cider::bench
