// CUDA kv_append, rotate_rows and attention against the CPU reference kernels (kernels::ref_kernels()).
//   kv_append: bytes identical (every plane, guard rows before/after the written positions untouched).
//   rotate_rows: forward equal to nn::SO4Rotation::apply bit for bit; inverse∘forward = identity.
//   attention: same cache bytes on both sides; outputs within float32-accumulation tolerance; guards untouched.
//   The f16 prefill kernel (attention_prefill_f16.cu) against a CPU emulation of its numeric contract (q, k, v
//   rounded to f16 as the kernel rounds them, the rest in double) within the f32-sum and f16-p bound, and against the
//   exact reference within the bound of the f16 roundings.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_test_support.h"
#include "kernels/cuda/attention_decode_plain_tc.h"
#include "kernels/cuda/attention_prefill_tc.h"
#include "kernels/cuda/attention_tc.h"
#include "kernels/kernel_table.h"
#include "nn/kv_cache.h"
#include "nn/rotation.h"
#include "quant/affine.h"
#include "support/scoped_env.h"
#include "support/test_support.h"

namespace cider::cuda {
namespace {

using kernels::AttentionArgs;
using kernels::KVTensorView;
using kernels::MaskKind;

constexpr uint8_t kPoison = 0x5A;

template <typename F>
void expect_error(F&& f, const char* op) {
  try {
    f();
    ADD_FAILURE() << "expected cider::Error from " << op;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(op), std::string::npos) << e.what();
  }
}

// ---- kv_append ----------------------------------------------------------------------------------------------------

struct AppendCase {
  int bits, gs, rotation;
  DType src, dst;
  int64_t n, dim;
};

void run_append_case(const AppendCase& c, uint64_t salt, bool use_d_offset) {
  SCOPED_TRACE(::testing::Message() << "bits " << c.bits << " gs " << c.gs << " rot " << c.rotation << " src "
                                    << dtype_name(c.src) << " dst " << dtype_name(c.dst) << " n " << c.n << " dim "
                                    << c.dim << (use_d_offset ? " d_offset" : ""));
  auto rng = test::make_rng(salt);
  const int64_t B = 2, H = 3, offset = 5, capacity = offset + c.n + 4;  // guard rows before and after
  const int64_t stride_t = c.dim + 8, stride_h = c.n * stride_t + 3, stride_b = H * stride_h + 5;
  const int64_t src_elems = B * stride_b;
  std::vector<float> srcf = test::randn(rng, static_cast<size_t>(src_elems), 2.0f);
  for (size_t i = 0; i < srcf.size(); i += 97) srcf[i] *= 12.0f;  // some outliers
  std::vector<uint8_t> src = test::to_dtype_bytes(srcf, c.src);
  const nn::SO4Rotation rot(c.dim, static_cast<nn::RotationKind>(c.rotation), salt);

  const int ss = dtype_size(c.dst);
  const int64_t rows = B * H * capacity;
  const size_t dst_bytes = c.bits ? static_cast<size_t>(rows * c.dim * c.bits / 8)
                                  : static_cast<size_t>(rows * c.dim * ss);
  const size_t sb_bytes = c.bits ? static_cast<size_t>(rows * (c.dim / c.gs) * ss) : 4;
  std::vector<uint8_t> ref_dst(dst_bytes, kPoison), ref_s(sb_bytes, kPoison), ref_b(sb_bytes, kPoison);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      kernels::KVAppendArgs a{};
      a.src = src.data() + (b * stride_b + h * stride_h) * dtype_size(c.src);
      a.src_dtype = c.src;
      a.src_row_stride = stride_t;
      a.src_elem_stride = 1;
      a.n = c.n;
      a.dim = c.dim;
      a.rotation = c.rotation;
      a.qL = c.rotation ? rot.left().data() : nullptr;
      a.qR = c.rotation ? rot.right().data() : nullptr;
      const int64_t row0 = (b * H + h) * capacity + offset;
      if (c.bits) {
        a.dst = ref_dst.data() + row0 * c.dim * c.bits / 8;
        a.scales = ref_s.data() + row0 * (c.dim / c.gs) * ss;
        a.biases = ref_b.data() + row0 * (c.dim / c.gs) * ss;
      } else {
        a.dst = ref_dst.data() + row0 * c.dim * ss;
      }
      a.dst_dtype = c.dst;
      a.bits = c.bits;
      a.group_size = c.gs;
      kernels::ref_kernels().kv_append(a);
    }

  DeviceBuffer d_src = to_device(src.data(), src.size());
  DeviceBuffer d_dst(dst_bytes), d_s(sb_bytes), d_b(sb_bytes);
  d_dst.fill(kPoison);
  d_s.fill(kPoison);
  d_b.fill(kPoison);
  DeviceBuffer d_qL, d_qR;
  if (c.rotation) {
    d_qL = to_device(rot.left().data(), rot.left().size() * sizeof(float));
    d_qR = to_device(rot.right().data(), rot.right().size() * sizeof(float));
  }
  const int32_t off32 = static_cast<int32_t>(offset);
  DeviceBuffer d_off = to_device(&off32, sizeof(off32));
  KVAppendBatchArgs a{};
  a.src = d_src.data();
  a.src_dtype = c.src;
  a.B = B;
  a.H = H;
  a.n = c.n;
  a.dim = c.dim;
  a.src_stride_b = stride_b;
  a.src_stride_h = stride_h;
  a.src_stride_t = stride_t;
  a.rotation = c.rotation;
  a.qL = c.rotation ? d_qL.as<float>() : nullptr;
  a.qR = c.rotation ? d_qR.as<float>() : nullptr;
  a.dst = d_dst.data();
  a.scales = c.bits ? d_s.data() : nullptr;
  a.biases = c.bits ? d_b.data() : nullptr;
  a.dst_dtype = c.dst;
  a.bits = c.bits;
  a.group_size = c.gs;
  a.capacity = capacity;
  a.offset = use_d_offset ? 999999 : offset;  // the device offset must win
  Stream stream;
  Exec exec{stream.handle(), nullptr, 0};
  kv_append(a, use_d_offset ? d_off.as<int32_t>() : nullptr, exec);
  stream.synchronize();
  std::vector<uint8_t> got(dst_bytes), got_s(sb_bytes), got_b(sb_bytes);
  d_dst.download(got.data(), got.size());
  d_s.download(got_s.data(), got_s.size());
  d_b.download(got_b.data(), got_b.size());
  auto first_diff = [](const std::vector<uint8_t>& x, const std::vector<uint8_t>& y) {
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != y[i]) return static_cast<int64_t>(i);
    return int64_t{-1};
  };
  EXPECT_EQ(first_diff(got, ref_dst), -1) << "codes / plain values differ at this byte";
  if (c.bits) {
    EXPECT_EQ(first_diff(got_s, ref_s), -1) << "scales differ at this byte";
    EXPECT_EQ(first_diff(got_b, ref_b), -1) << "biases differ at this byte";
  }
}

TEST(CudaKvAppend, BytesIdenticalToReference) {
  CIDER_REQUIRE_GPU();
  const int bits_list[] = {0, 2, 3, 4, 5, 6, 8};
  const int gs_list[] = {32, 64, 128};
  const DType dts[] = {DType::kF32, DType::kF16, DType::kBF16};
  const int64_t ns[] = {1, 7, 67};
  uint64_t salt = 100;
  int k = 0;
  for (int bits : bits_list)
    for (int gs : gs_list) {
      if (bits == 0 && gs != 64) continue;  // plain storage has no groups
      for (int rotation = 0; rotation < 3; ++rotation)
        for (int si = 0; si < 3; ++si) {
          AppendCase c{bits, gs, rotation, dts[si], dts[(si + k) % 3], ns[k % 3], (k % 4 == 3) ? 256 : 128};
          run_append_case(c, ++salt, false);
          ++k;
        }
    }
}

TEST(CudaKvAppend, DeviceOffsetAndSmallDims) {
  CIDER_REQUIRE_GPU();
  run_append_case({4, 64, 2, DType::kF32, DType::kF16, 1, 128}, 7, true);
  run_append_case({3, 64, 2, DType::kBF16, DType::kF16, 7, 128}, 8, true);
  run_append_case({3, 32, 1, DType::kF16, DType::kBF16, 67, 64}, 9, false);
  run_append_case({0, 64, 2, DType::kF32, DType::kBF16, 7, 64}, 10, true);
  run_append_case({2, 32, 0, DType::kF32, DType::kF32, 7, 32}, 11, false);
}

TEST(CudaKvAppend, RejectsBadArguments) {
  CIDER_REQUIRE_GPU();
  DeviceBuffer buf(1 << 20);
  KVAppendBatchArgs good{};
  good.src = buf.data();
  good.src_dtype = DType::kF32;
  good.B = 1;
  good.H = 1;
  good.n = 1;
  good.dim = 128;
  good.src_stride_b = 128;
  good.src_stride_h = 128;
  good.src_stride_t = 128;
  good.rotation = 0;
  good.dst = buf.data();
  good.scales = buf.data();
  good.biases = buf.data();
  good.dst_dtype = DType::kF16;
  good.bits = 4;
  good.group_size = 64;
  good.capacity = 16;
  good.offset = 0;
  Exec exec{};
  auto bad = [&](auto mutate) {
    KVAppendBatchArgs a = good;
    mutate(a);
    expect_error([&] { kv_append(a, nullptr, exec); }, "cuda.kv_append");
  };
  bad([](KVAppendBatchArgs& a) { a.bits = 7; });
  bad([](KVAppendBatchArgs& a) { a.group_size = 48; });
  bad([](KVAppendBatchArgs& a) { a.rotation = 3; });
  bad([](KVAppendBatchArgs& a) { a.rotation = 1; });  // no qL
  bad([](KVAppendBatchArgs& a) { a.src_dtype = DType::kI8; });
  bad([](KVAppendBatchArgs& a) { a.dst_dtype = DType::kU32; });
  bad([](KVAppendBatchArgs& a) { a.offset = 16; });
  bad([](KVAppendBatchArgs& a) { a.dim = 96; });  // not a multiple of 64
  try {
    KVAppendBatchArgs a = good;
    a.rotation = 3;
    kv_append(a, nullptr, exec);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  kv_append(good, nullptr, exec);  // the good arguments launch
  device_synchronize("test");
}

// ---- rotate_rows --------------------------------------------------------------------------------------------------

TEST(CudaRotateRows, MatchesCpuRotationAndInverts) {
  CIDER_REQUIRE_GPU();
  for (int kind = 1; kind <= 2; ++kind)
    for (int64_t dim : {64, 128, 256}) {
      auto rng = test::make_rng(static_cast<uint64_t>(kind * 1000 + dim));
      const int64_t rows = 67;
      const nn::SO4Rotation rot(dim, static_cast<nn::RotationKind>(kind), 42);
      std::vector<float> x = test::randn(rng, static_cast<size_t>(rows * dim));
      std::vector<float> want = x;
      rot.apply(want.data(), rows);
      DeviceBuffer d_x = to_device(x.data(), x.size() * sizeof(float));
      DeviceBuffer d_qL = to_device(rot.left().data(), rot.left().size() * sizeof(float));
      DeviceBuffer d_qR = to_device(rot.right().data(), rot.right().size() * sizeof(float));
      Exec exec{};
      rotate_rows(d_x.as<float>(), rows, dim, kind, d_qL.as<float>(), d_qR.as<float>(), false, exec);
      std::vector<float> got(x.size());
      d_x.download(got.data(), got.size() * sizeof(float));
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << "kind " << kind << " dim " << dim;
      rotate_rows(d_x.as<float>(), rows, dim, kind, d_qL.as<float>(), d_qR.as<float>(), true, exec);
      d_x.download(got.data(), got.size() * sizeof(float));
      EXPECT_TRUE(test::all_close(got.data(), x.data(), x.size(), 1e-5, 1e-5));
      std::vector<float> inv = want;
      rot.apply_inverse(inv.data(), rows);
      EXPECT_EQ(0, std::memcmp(got.data(), inv.data(), got.size() * sizeof(float)));
    }
  Exec exec{};
  expect_error([&] { rotate_rows(nullptr, 1, 128, 3, nullptr, nullptr, false, exec); }, "cuda.rotate_rows");
  expect_error([&] { rotate_rows(nullptr, 1, 130, 1, nullptr, nullptr, false, exec); }, "cuda.rotate_rows");
}

// ---- attention ----------------------------------------------------------------------------------------------------

// A cache in host memory built with the reference kv_append, plus its device copy.
struct Side {
  int bits = 4, gs = 64;
  DType dtype = DType::kF16;  // scale dtype (quantized) or element dtype (plain)
  std::vector<uint8_t> data, scales, biases;
  DeviceBuffer d_data, d_scales, d_biases;
  float vmax = 0;  // max |value| written (bounds the dequantized values up to a step)

  void build(std::mt19937_64& rng, int64_t B, int64_t H, int64_t kL, int64_t cap, int64_t D, uint64_t seed) {
    const int64_t rows = B * H * cap;
    const int ss = dtype_size(dtype);
    data.assign(bits ? static_cast<size_t>(rows * D * bits / 8) : static_cast<size_t>(rows * D * ss), 0);
    scales.assign(bits ? static_cast<size_t>(rows * (D / gs) * ss) : 4, 0);
    biases = scales;
    const nn::SO4Rotation rot(D, nn::RotationKind::kSO4Full, seed);
    std::vector<float> src = test::randn(rng, static_cast<size_t>(B * H * kL * D));
    for (float v : src) vmax = std::max(vmax, std::fabs(v));
    for (int64_t bh = 0; bh < B * H; ++bh) {
      kernels::KVAppendArgs a{};
      a.src = src.data() + bh * kL * D;
      a.src_dtype = DType::kF32;
      a.src_row_stride = D;
      a.src_elem_stride = 1;
      a.n = kL;
      a.dim = D;
      a.rotation = 2;
      a.qL = rot.left().data();
      a.qR = rot.right().data();
      const int64_t row0 = bh * cap;
      a.dst = data.data() + (bits ? row0 * D * bits / 8 : row0 * D * ss);
      a.scales = bits ? scales.data() + row0 * (D / gs) * ss : nullptr;
      a.biases = bits ? biases.data() + row0 * (D / gs) * ss : nullptr;
      a.dst_dtype = dtype;
      a.bits = bits;
      a.group_size = gs;
      kernels::ref_kernels().kv_append(a);
    }
    d_data = to_device(data.data(), data.size());
    d_scales = to_device(scales.data(), scales.size());
    d_biases = to_device(biases.data(), biases.size());
  }
  KVTensorView view(bool device, int64_t B, int64_t H, int64_t kL, int64_t cap, int64_t D) const {
    KVTensorView v{};
    v.data = device ? d_data.data() : data.data();
    v.scales = bits ? (device ? d_scales.data() : scales.data()) : nullptr;
    v.biases = bits ? (device ? d_biases.data() : biases.data()) : nullptr;
    v.dtype = bits ? DType::kU32 : dtype;
    v.scale_dtype = bits ? dtype : DType::kF32;
    v.bits = bits;
    v.group_size = bits ? gs : 0;
    v.B = B;
    v.H = H;
    v.length = kL;
    v.capacity = cap;
    v.dim = D;
    return v;
  }
};

// One long-lived stream for the attention cases: the tensor-core path's in-kernel merge keeps its arrival counters
// per stream (a slab per (device, stream), 8 per device, then the merge kernel takes over: attention_tc.cu), so the
// cases share a stream instead of each bringing a new one that might use up the slabs. Never destroyed (it would
// outlive the CUDA runtime at exit).
using test::ScopedEnv;

Stream& attention_stream() {
  static Stream* s = new Stream();
  return *s;
}


// The `guard` floats before and after the n outputs in got (poisoned with 0xFF bytes before the launch) untouched.
void expect_guards_untouched(const std::vector<float>& got, size_t n, size_t guard) {
  for (size_t i = 0; i < guard; ++i) {
    uint32_t lo, hi;
    std::memcpy(&lo, &got[i], 4);
    std::memcpy(&hi, &got[guard + n + i], 4);
    ASSERT_EQ(lo, 0xFFFFFFFFu) << "guard before out written at " << i;
    ASSERT_EQ(hi, 0xFFFFFFFFu) << "guard after out written at " << i;
  }
}

// x rounded to the nearest f16 value (ties to even, subnormals, ±inf past 65504): one rounding from double.
double round_to_f16(double x) {
  if (!std::isfinite(x) || x == 0.0) return x;
  int e = 0;
  (void)std::frexp(x, &e);                 // |x| = f·2^e, f ∈ [0.5, 1): 11 significant bits → ulp 2^(e − 11)
  const int ulp_exp = std::max(e - 11, -24);  // below 2^-14 the subnormal spacing 2^-24
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -ulp_exp)), ulp_exp);
  return std::fabs(r) > 65504.0 ? std::copysign(INFINITY, x) : r;
}

// Row j of plane (b, h) of a quantized Side dequantized as the f16 prefill kernel does: fl16(s·c + b).
void dequant_row_f16(const Side& sd, int64_t row, int64_t D, std::vector<double>& out) {
  const auto* words = reinterpret_cast<const uint32_t*>(sd.data.data() + row * D * sd.bits / 8);
  const auto* sc = reinterpret_cast<const uint16_t*>(sd.scales.data()) + row * (D / sd.gs);
  const auto* bi = reinterpret_cast<const uint16_t*>(sd.biases.data()) + row * (D / sd.gs);
  out.resize(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    const double s = f16_to_f32(sc[d / sd.gs]), b = f16_to_f32(bi[d / sd.gs]);
    out[static_cast<size_t>(d)] = round_to_f16(s * quant::unpack_code(words, d, sd.bits) + b);
  }
}

// The f16 prefill kernel's contract computed in double (q̃ = fl16(q·2^Eq) with max|q̃| ∈ [2^14, 2^15), k̃, ṽ =
// fl16(s·c + b); softmax and sums exact), with a per-element bound for each of two comparisons:
//   tight (kernel vs this emulation): the f32 score sums (≤ (D + 8)·2^-22 of Σ|q̃k̃| per score, both signs → e^(2Δ) on
//   the weights), p rounded to f16 for P·V (2^-11 of max|ṽ|), the f32 P·V and l sums over kL keys and ex2.approx;
//   loose (kernel vs the exact reference): in addition the f16 rounding of q and k (2^-11 each, so 3·2^-11·Σ|qk| per
//   score with the products' own slack) and of v (2^-11 of max|v|).
struct F16Emulation {
  std::vector<float> out;
  std::vector<double> tight, loose;  // per output row
};
// softcap > 0: the scores are capped, cap·tanh(s/cap), before the softmax (1-Lipschitz: the score bounds carry over;
// the kernel's tanhf in log2 units adds at most (3|s| + 16·cap)·2^-24 per score).
// key_row / value_row (head bh = b·Hkv + g, position j): the row as the kernel dequantizes it.
using RowFn = std::function<void(int64_t bh, int64_t j, std::vector<double>& out)>;
F16Emulation emulate_f16_prefill_rows(const std::vector<float>& q, const RowFn& key_row, const RowFn& value_row,
                                      int64_t B, int64_t Hq, int64_t Hkv, int64_t L, int64_t kLr, int64_t D,
                                      float scale, MaskKind mask, int64_t window, double softcap) {
  F16Emulation em;
  em.out.assign(static_cast<size_t>(B * Hq * L * D), 0.0f);
  em.tight.assign(static_cast<size_t>(B * Hq * L), 0.0);
  em.loose = em.tight;
  const int64_t rep = Hq / Hkv;
  std::vector<std::vector<double>> kd(static_cast<size_t>(kLr)), vd(static_cast<size_t>(kLr));
  std::vector<double> qt(static_cast<size_t>(D)), s(static_cast<size_t>(kLr)), sabs(static_cast<size_t>(kLr));
  const double u = std::ldexp(1.0, -11);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < Hkv; ++g) {
      double vmax = 0.0;
      for (int64_t j = 0; j < kLr; ++j) {
        key_row(b * Hkv + g, j, kd[static_cast<size_t>(j)]);
        value_row(b * Hkv + g, j, vd[static_cast<size_t>(j)]);
        for (double x : vd[static_cast<size_t>(j)]) vmax = std::max(vmax, std::fabs(x));
      }
      for (int64_t rr = 0; rr < rep; ++rr)
        for (int64_t i = 0; i < L; ++i) {
          const int64_t hq = g * rep + rr, orow = (b * Hq + hq) * L + i;
          const float* qr = q.data() + orow * D;
          float mx = 0.0f;
          for (int64_t d = 0; d < D; ++d) mx = std::max(mx, std::fabs(qr[d]));
          int k = 0;
          (void)std::frexp(mx, &k);
          const int Eq = mx > 0.0f ? 15 - k : 0;
          for (int64_t d = 0; d < D; ++d) qt[static_cast<size_t>(d)] = round_to_f16(std::ldexp(static_cast<double>(qr[d]), Eq));
          int64_t lo = 0, hi = kLr;
          if (mask == MaskKind::kCausal) {
            const int64_t pos = kLr - L + i;
            hi = std::min(kLr, pos + 1);
            if (window > 0) lo = std::max<int64_t>(0, pos - window + 1);
          }
          if (hi <= lo) continue;  // sees nothing: zeros (bound 0)
          double smax = -INFINITY, sabs_max = 0.0;
          for (int64_t j = lo; j < hi; ++j) {
            double acc = 0.0, aabs = 0.0;
            for (int64_t d = 0; d < D; ++d) {
              const double t = qt[static_cast<size_t>(d)] * kd[static_cast<size_t>(j)][static_cast<size_t>(d)];
              acc += t;
              aabs += std::fabs(t);
            }
            s[static_cast<size_t>(j)] = std::ldexp(acc, -Eq) * scale;
            if (softcap > 0) s[static_cast<size_t>(j)] = softcap * std::tanh(s[static_cast<size_t>(j)] / softcap);
            sabs_max = std::max(sabs_max, std::ldexp(aabs, -Eq) * scale);
            smax = std::max(smax, s[static_cast<size_t>(j)]);
          }
          double l = 0.0;
          std::vector<double> o(static_cast<size_t>(D), 0.0);
          for (int64_t j = lo; j < hi; ++j) {
            const double pj = std::exp(s[static_cast<size_t>(j)] - smax);
            l += pj;
            for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(d)] += pj * vd[static_cast<size_t>(j)][static_cast<size_t>(d)];
          }
          for (int64_t d = 0; d < D; ++d) em.out[static_cast<size_t>(orow * D + d)] = static_cast<float>(o[static_cast<size_t>(d)] / l);
          const double n = static_cast<double>(hi - lo);
          const double dt = sabs_max * static_cast<double>(D + 8) * std::ldexp(1.0, -22) +
                            (softcap > 0 ? (3.0 * sabs_max + 16.0 * softcap) * std::ldexp(1.0, -24) : 0.0);
          const double sums = (2.0 * n + 64.0) * std::ldexp(1.0, -22) + std::ldexp(1.0, -20);
          em.tight[static_cast<size_t>(orow)] = vmax * (std::expm1(2.0 * dt) + u + sums) + 1e-6;
          const double dl = dt + 3.0 * u * sabs_max;
          em.loose[static_cast<size_t>(orow)] = (vmax + u * vmax) * (std::expm1(2.0 * dl) + 2.0 * u + sums) + 1e-6;
        }
    }
  return em;
}
F16Emulation emulate_f16_prefill(const std::vector<float>& q, const Side& K, const Side& V, int64_t B, int64_t Hq,
                                 int64_t Hkv, int64_t L, int64_t kLr, int64_t cap, int64_t D, float scale,
                                 MaskKind mask, int64_t window, double softcap) {
  return emulate_f16_prefill_rows(
      q, [&](int64_t bh, int64_t j, std::vector<double>& out) { dequant_row_f16(K, bh * cap + j, D, out); },
      [&](int64_t bh, int64_t j, std::vector<double>& out) { dequant_row_f16(V, bh * cap + j, D, out); }, B, Hq, Hkv,
      L, kLr, D, scale, mask, window, softcap);
}

// Elements of got within the per-row bound of want (rows of D); NaN never passes. Reports the first few misses.
::testing::AssertionResult within_row_bounds(const float* got, const float* want, const std::vector<double>& bound,
                                             int64_t D) {
  int64_t bad = 0;
  ::testing::AssertionResult r = ::testing::AssertionSuccess();
  std::string first;
  for (size_t row = 0; row < bound.size(); ++row)
    for (int64_t d = 0; d < D; ++d) {
      const size_t i = row * static_cast<size_t>(D) + static_cast<size_t>(d);
      const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
      if (!(e <= bound[row])) {
        if (bad < 5)
          first += " [row " + std::to_string(row) + " dim " + std::to_string(d) + ": " + std::to_string(got[i]) +
                   " vs " + std::to_string(want[i]) + ", bound " + std::to_string(bound[row]) + "]";
        ++bad;
      }
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " elements outside the bound:" << first;
}

struct AttnCase {
  int64_t D, rep, kL, L;
  MaskKind mask;
  int64_t window;
  int kbits, vbits, gs;
  DType dt;
  int kv_splits = 0;
  int64_t d_length = 0;  // > 0: the device length (≤ kL, the bound)
  bool misalign = false;  // q and out 4 bytes past a 16-byte boundary
  // Run the prefill kernels in turn: $CIDER_ATTN_PREFILL_TC=1 with $CIDER_ATTN_PREFILL_MATH=f16 (the f16 kernel,
  // against its emulation) and =exact (the exact-score kernel), each asserting that the tensor-core prefill path takes
  // it unless misaligned, then $CIDER_ATTN_PREFILL_TC=0 (the general kernel must). with_f16 = false skips the f16 run.
  bool both_prefill_paths = false;
  bool with_f16 = true;
  float softcap = 0.0f;  // > 0: attention logit softcapping (Gemma 2)
};

void run_attention_case(const AttnCase& c, uint64_t salt) {
  SCOPED_TRACE(::testing::Message() << "D " << c.D << " rep " << c.rep << " kL " << c.kL << " L " << c.L << " mask "
                                    << static_cast<int>(c.mask) << " window " << c.window << " K" << c.kbits << "V"
                                    << c.vbits << " g" << c.gs << " " << dtype_name(c.dt) << " splits "
                                    << c.kv_splits << " d_length " << c.d_length
                                    << (c.misalign ? " misaligned q/out" : "")
                                    << (c.both_prefill_paths ? " both prefill paths" : "") << " softcap "
                                    << c.softcap);
  auto rng = test::make_rng(salt);
  const int64_t B = 2, Hkv = 2, Hq = Hkv * c.rep, cap = c.kL + 3;
  const int64_t kLr = c.d_length > 0 ? c.d_length : c.kL;  // the real length
  Side K, V;
  K.bits = c.kbits;
  V.bits = c.vbits;
  K.gs = V.gs = c.gs;
  K.dtype = V.dtype = c.dt;
  K.build(rng, B, Hkv, c.kL, cap, c.D, salt);
  V.build(rng, B, Hkv, c.kL, cap, c.D, salt);
  std::vector<float> q = test::randn(rng, static_cast<size_t>(B * Hq * c.L * c.D));

  AttentionArgs ref{};
  ref.q = q.data();
  std::vector<float> want(static_cast<size_t>(B * Hq * c.L * c.D));
  ref.out = want.data();
  ref.B = B;
  ref.Hq = Hq;
  ref.L = c.L;
  ref.keys = K.view(false, B, Hkv, kLr, cap, c.D);
  ref.values = V.view(false, B, Hkv, kLr, cap, c.D);
  ref.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  ref.softcap = c.softcap;
  ref.mask_kind = c.mask;
  ref.window = c.window;
  ref.mask_dtype = DType::kBool;
  kernels::ref_kernels().attention(ref);

  const size_t out_n = want.size(), shift = c.misalign ? 1 : 0, guard = 64 + shift;
  DeviceBuffer d_q((q.size() + shift) * sizeof(float));
  d_q.upload(q.data(), q.size() * sizeof(float), shift * sizeof(float));
  const int32_t len32 = static_cast<int32_t>(kLr);
  DeviceBuffer d_len = to_device(&len32, sizeof(len32));
  // Modes: (CIDER_ATTN_PREFILL_TC, CIDER_ATTN_PREFILL_MATH); nullptr leaves the variable as it is.
  struct Mode {
    const char* tc;
    const char* math;
  };
  std::vector<Mode> modes;
  if (c.both_prefill_paths) {
    if (c.with_f16) modes.push_back({"1", "f16"});
    modes.push_back({"1", "exact"});
    modes.push_back({"0", nullptr});
  } else {
    modes.push_back({nullptr, nullptr});
  }
  F16Emulation em;
  for (size_t mode = 0; mode < modes.size(); ++mode) {
    const char* env = modes[mode].tc;
    SCOPED_TRACE(::testing::Message() << "CIDER_ATTN_PREFILL_TC=" << (env ? env : "(as set)")
                                      << " CIDER_ATTN_PREFILL_MATH=" << (modes[mode].math ? modes[mode].math : "(as set)"));
    const ScopedEnv prefill_env("CIDER_ATTN_PREFILL_TC", env);
    const ScopedEnv math_env("CIDER_ATTN_PREFILL_MATH", modes[mode].math);
    // Plain caches: the general kernel's float32 bound here; the tensor-core decode path that would take rep·L ≤ 8
    // rows of them (q and p rounded to the cache's type) has its own test and bound (PlainTensorCoreDecode).
    const ScopedEnv plain_env("CIDER_ATTN_TC_PLAIN", "0");
    DeviceBuffer d_out((out_n + 2 * guard) * sizeof(float));
    d_out.fill(0xFF);
    AttentionArgs a = ref;
    a.q = d_q.as<float>() + shift;
    a.out = d_out.as<float>() + guard;
    a.keys = K.view(true, B, Hkv, c.kL, cap, c.D);
    a.values = V.view(true, B, Hkv, c.kL, cap, c.D);
    a.kv_splits = c.kv_splits;
    if (c.both_prefill_paths) {
      EXPECT_EQ(detail::prefill_tc_eligible(a), env[0] == '1' && !c.misalign) << "the path taken";
    }
    const bool f16_path = detail::prefill_tc_eligible(a) && detail::prefill_math_f16(a);
    const size_t ws = attention_workspace_bytes(a);
    DeviceBuffer d_ws(std::max<size_t>(ws, 256));
    d_ws.fill(0xFF);
    Stream& stream = attention_stream();
    Exec exec{stream.handle(), d_ws.data(), ws};
    attention(a, c.d_length > 0 ? d_len.as<int32_t>() : nullptr, exec);
    stream.synchronize();
    std::vector<float> got(out_n + 2 * guard);
    d_out.download(got.data(), got.size() * sizeof(float));
    ASSERT_NO_FATAL_FAILURE(expect_guards_untouched(got, out_n, guard));
    if (f16_path) {
      if (em.out.empty())
        em = emulate_f16_prefill(q, K, V, B, Hq, Hkv, c.L, kLr, cap, c.D, ref.scale, c.mask, c.window, c.softcap);
      EXPECT_TRUE(within_row_bounds(got.data() + guard, em.out.data(), em.tight, c.D)) << "f16 kernel vs its emulation";
      EXPECT_TRUE(within_row_bounds(got.data() + guard, want.data(), em.loose, c.D)) << "f16 kernel vs the exact reference";
      continue;
    }
    // Float32 accumulation over kL keys (scores and value sums): ≈ 1e-5 relative × sqrt(kL) of the value scale.
    const double tol = 1e-5 * std::sqrt(static_cast<double>(kLr) + 1.0) * (V.vmax + 1.0);
    EXPECT_TRUE(test::all_close(got.data() + guard, want.data(), out_n, tol, 1e-5));
  }
}

TEST(CudaAttention, MatchesReferenceDecodeAndPrefill) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 5000;
  struct Cache {
    int kbits, vbits, gs;
    DType dt;
  };
  const Cache caches[] = {{4, 3, 64, DType::kF16}, {4, 3, 64, DType::kBF16}, {8, 2, 32, DType::kF32},
                          {3, 5, 32, DType::kF16}, {6, 4, 64, DType::kF16},  {0, 0, 0, DType::kBF16},
                          {0, 0, 0, DType::kF16},  {0, 0, 0, DType::kF32}};
  const int64_t kLs[] = {1, 7, 129, 1000, 4097};
  const int64_t Ls[] = {1, 3, 16, 17, 67};
  int k = 0;
  for (int64_t D : {64, 128, 256})
    for (const Cache& cc : caches)
      for (int64_t rep : {1, 4, 8}) {
        // A rotating selection of lengths and masks keeps the CPU reference affordable while every value of each
        // axis meets every cache kind.
        const int64_t kL = kLs[k % 5];
        const int64_t L = std::min(Ls[(k / 5 + k) % 5], kL);
        const MaskKind mask = (k % 3 == 0) ? MaskKind::kNone : MaskKind::kCausal;
        const int64_t window = (k % 3 == 2) ? std::max<int64_t>(1, kL / 3) : 0;
        ++k;
        run_attention_case({D, rep, kL, L, mask, window, cc.kbits, cc.vbits, cc.gs, cc.dt}, ++salt);
      }
}

// Attention logit softcapping (Gemma 2: s -> cap·tanh(s/cap) before the mask) on every kernel of cuda::attention,
// against the reference kernel with the same softcap: the general CUDA-core kernel (plain bf16 / f16 / f32, the
// run-time quantized instantiation, the staged K4V3 g64 kernel with bf16 scales), the tensor-core decode path (K4V3
// and K8V4, D128 / D256, packed rows R ≤ 4 and three-chain rows 5..8), the tensor-core prefill path's f16 and exact
// kernels and the general kernel on the same shapes (both_prefill_paths), with windows, forced splits and device
// lengths. Caps 0.5 (most scores squeezed) and 5 (the tails).
TEST(CudaAttention, SoftcapMatchesReferenceOnEveryPath) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 17000;
  const MaskKind C = MaskKind::kCausal, N = MaskKind::kNone;
  for (float cap : {0.5f, 5.0f}) {
    std::vector<AttnCase> cases = {
        // general kernel
        {128, 4, 1000, 1, C, 0, 0, 0, 0, DType::kBF16},
        {128, 2, 129, 17, C, 40, 0, 0, 0, DType::kF16, 3},
        {64, 1, 300, 7, N, 0, 0, 0, 0, DType::kF32},
        {64, 4, 777, 3, C, 0, 3, 5, 32, DType::kF16, 0, 700},
        {128, 4, 2000, 1, C, 0, 4, 3, 64, DType::kBF16, 5},
        {256, 2, 500, 16, C, 100, 4, 3, 64, DType::kBF16},
        // tensor-core decode (f16 scales, R = rep·L ≤ 8): packed (R ≤ 4) and three-chain layouts
        {128, 4, 4097, 1, C, 0, 4, 3, 64, DType::kF16},
        {256, 2, 3000, 2, C, 700, 4, 3, 64, DType::kF16, 17},
        {128, 8, 2000, 1, C, 0, 8, 4, 64, DType::kF16, 0, 1500},
        {256, 3, 129, 2, N, 0, 8, 4, 64, DType::kF16},
    };
    for (AttnCase c : cases) {
      c.softcap = cap;
      run_attention_case(c, ++salt);
    }
    // tensor-core prefill (rep·L > 8): f16 kernel, exact kernel, then the general kernel
    const AttnCase prefill[] = {
        {128, 4, 16 + 5, 16, C, 0, 4, 3, 64, DType::kF16},
        {128, 1, 300 + 1000, 300, C, 37, 4, 3, 64, DType::kF16},
        {256, 8, 33, 33, C, 0, 8, 4, 64, DType::kF16, 3},
        {128, 4, 129 + 5, 129, N, 0, 8, 4, 64, DType::kF16, 0, 100},
        {256, 1, 1030, 1030, C, 300, 4, 3, 64, DType::kF16},
    };
    for (AttnCase c : prefill) {
      c.softcap = cap;
      c.both_prefill_paths = true;
      run_attention_case(c, ++salt);
    }
  }
}

// split_range (attention_tc.h, host and device): the pieces of [lo, hi) are disjoint, in order, cover it exactly,
// start on a quantum boundary from lo, and are never longer than one quantum-rounded share; no GPU needed.
TEST(CudaAttentionSplits, SplitRangeCoversTheVisibleInterval) {
  for (int64_t lo : {0, 1, 37, 4096})
    for (int64_t span : {0, 1, 31, 32, 33, 127, 128, 129, 1000, 4097, 32769})
      for (int splits : {1, 2, 3, 7, 64, 66, 4096})
        for (int quantum : {1, 32, 64, 128}) {
          SCOPED_TRACE(::testing::Message() << "lo " << lo << " span " << span << " splits " << splits << " quantum "
                                            << quantum);
          const int64_t hi = lo + span;
          const int64_t share = ((span + splits - 1) / splits + quantum - 1) / quantum * quantum;
          int64_t next = lo, covered = 0;
          for (int s = 0; s < splits; ++s) {
            const detail::SplitRange r = detail::split_range(lo, hi, s, splits, quantum);
            ASSERT_LE(r.c0, r.c1);
            if (r.c1 == r.c0) continue;  // empty: past the interval
            ASSERT_EQ(r.c0, next) << "split " << s;
            ASSERT_EQ((r.c0 - lo) % quantum, 0) << "split " << s;
            ASSERT_LE(r.c1 - r.c0, share) << "split " << s;
            ASSERT_LE(r.c1, hi);
            covered += r.c1 - r.c0;
            next = r.c1;
          }
          EXPECT_EQ(covered, span);
          EXPECT_EQ(next, hi);
        }
}

// visible_keys (attention_tc.h, host and device): the union over rows rf … rl of each row's own visible keys — row r at
// position kL − L + r / rep sees [max(0, pos − window + 1), pos + 1) causally (window 0: from 0), all of [0, kL)
// otherwise; no GPU needed.
TEST(CudaAttentionSplits, VisibleKeysAreTheUnionOfTheRowsRanges) {
  for (int64_t kL : {1, 2, 9, 64, 300})
    for (int64_t L : {1, 2, 5})
      for (int rep : {1, 2, 4})
        for (int64_t window : {0, 1, 3, 100})
          for (bool causal : {false, true}) {
            if (L > kL) continue;
            const int R = static_cast<int>(L) * rep;
            for (int rf = 0; rf < R; ++rf)
              for (int rl = rf; rl < R; ++rl) {
                SCOPED_TRACE(::testing::Message() << "kL " << kL << " L " << L << " rep " << rep << " window " << window
                                                  << " causal " << causal << " rows " << rf << ".." << rl);
                int64_t lo = kL, hi = 0;
                for (int r = rf; r <= rl; ++r) {
                  const int64_t pos = kL - L + r / rep;
                  const int64_t a = causal && window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
                  const int64_t b = causal ? pos + 1 : kL;
                  lo = std::min(lo, a);
                  hi = std::max(hi, b);
                }
                const detail::KeyInterval v = detail::visible_keys(kL, L, rep, rf, rl, causal, window);
                EXPECT_EQ(v.lo, lo);
                EXPECT_EQ(v.hi, hi);
              }
          }
}

TEST(CudaAttention, SplitsMergeAndDeviceLength) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 7000;
  for (int64_t D : {64, 128, 256})
    for (int splits : {1, 3, 17}) {
      run_attention_case({D, 4, 1000, 1, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16, splits}, ++salt);
      run_attention_case({D, 8, 4097, 3, MaskKind::kCausal, 100, 4, 3, 64, DType::kF16, splits}, ++salt);
      run_attention_case({D, 1, 129, 17, MaskKind::kNone, 0, 0, 0, 0, DType::kBF16, splits}, ++salt);
    }
  // d_length: the grid is sized from keys.length (the bound), the kernel reads the real length on the device.
  for (int64_t D : {128, 256}) {
    run_attention_case({D, 4, 4097, 1, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16, 0, 3000}, ++salt);
    run_attention_case({D, 8, 1000, 1, MaskKind::kNone, 0, 4, 3, 64, DType::kF16, 0, 1}, ++salt);
    run_attention_case({D, 4, 1000, 3, MaskKind::kCausal, 50, 0, 0, 0, DType::kBF16, 5, 777}, ++salt);
    run_attention_case({D, 1, 129, 16, MaskKind::kCausal, 0, 8, 2, 32, DType::kF32, 0, 100}, ++salt);
  }
  // A device length far below the planned bound (a decode graph's bucket) and windows on the tensor-core path: the
  // visible keys are spread over every split of the grid (split_range), so no split's range is the plan's.
  run_attention_case({128, 4, 8192, 1, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16, 0, 4097}, ++salt);
  run_attention_case({256, 8, 8192, 1, MaskKind::kCausal, 300, 8, 4, 64, DType::kF16, 0, 5000}, ++salt);
  run_attention_case({128, 4, 8192, 2, MaskKind::kCausal, 1000, 4, 3, 64, DType::kF16, 64, 3001}, ++salt);
  run_attention_case({128, 1, 8192, 1, MaskKind::kCausal, 0, 8, 4, 64, DType::kF16, 0, 1}, ++salt);
  run_attention_case({128, 4, 8192, 1, MaskKind::kCausal, 0, 0, 0, 0, DType::kBF16, 0, 4097}, ++salt);
  {  // the tensor-core kernel with its first tiles fetched after the PDL wait ($CIDER_ATTN_TC_EARLY=0, the A/B)
    const ScopedEnv early("CIDER_ATTN_TC_EARLY", "0");
    run_attention_case({128, 4, 8192, 1, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16, 0, 4097}, ++salt);
    run_attention_case({256, 8, 4097, 2, MaskKind::kCausal, 300, 8, 4, 64, DType::kF16}, ++salt);
  }
  // Long prefill with the causal skip and many query blocks.
  run_attention_case({128, 4, 300, 300, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16}, ++salt);
  run_attention_case({128, 2, 300, 300, MaskKind::kCausal, 64, 0, 0, 0, DType::kBF16}, ++salt);
}

// The tensor-core decode path (attention_tc.cu: K4/V3 g64 f16 scales, D 128/256, rep·L ≤ 8): every row count 1..8
// (rep × L), key lengths with tails (a partial last tile, partial splits), causal windows, forced and automatic
// splits, d_length, long caches (accumulation over 20 000 keys). The same cases with bf16 scales run the general
// kernel, so both paths meet the same reference.
TEST(CudaAttention, TensorCoreDecodePath) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 9000;
  struct RL {
    int64_t rep, L;
  };
  const RL rls[] = {{1, 1}, {2, 3}, {4, 1}, {4, 2}, {8, 1}, {3, 2}, {1, 8}, {7, 1}};
  const int64_t kLs[] = {1, 7, 33, 67, 129, 4097, 20000};
  int k = 0;
  for (int64_t D : {128, 256})
    for (const RL& rl : rls) {
      const int64_t kL = kLs[k % 7];
      const MaskKind mask = (k % 3 == 0) ? MaskKind::kNone : MaskKind::kCausal;
      const int64_t window = (k % 4 == 2) ? std::max<int64_t>(1, kL / 3) : 0;
      const int splits = (k % 5 == 1) ? 3 : (k % 5 == 3 ? 1 : 0);
      const int64_t d_len = (k % 6 == 5 && kL > 2) ? kL - kL / 3 : 0;
      ++k;
      if (rl.L > kL) continue;
      run_attention_case({D, rl.rep, kL, rl.L, mask, window, 4, 3, 64, DType::kF16, splits, d_len}, ++salt);
      if (k % 4 == 0)
        run_attention_case({D, rl.rep, kL, rl.L, mask, window, 4, 3, 64, DType::kBF16, splits, d_len}, ++salt);
    }
  for (int64_t D : {128, 256}) {
    run_attention_case({D, 4, 33000, 1, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16}, ++salt);
    run_attention_case({D, 8, 20000, 1, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16, 0, 12345}, ++salt);
    run_attention_case({D, 4, 5000, 2, MaskKind::kCausal, 700, 4, 3, 64, DType::kF16, 64}, ++salt);
  }
}

// The same path for the K8V4 g64 cache (the CLI default: 8-bit keys fed to the integer mma as they are, 4-bit values
// converted to f16), on by default; $CIDER_ATTN_TC_K8V4=0 turns it off (attention_tc.cu reads it at every call).
// Rows 1..8, tails up to 33 000 keys, masks/windows, forced splits, d_length; a few cases also with the switch off
// (the general CUDA-core kernel) and with bf16 scales (never the tensor-core path), against the same reference.
TEST(CudaAttention, TensorCoreDecodePathK8V4) {
  CIDER_REQUIRE_GPU();
  const ScopedEnv on("CIDER_ATTN_TC_K8V4", "1");
  uint64_t salt = 11000;
  struct RL {
    int64_t rep, L;
  };
  const RL rls[] = {{1, 1}, {2, 3}, {4, 1}, {4, 2}, {8, 1}, {3, 2}, {1, 8}, {7, 1}, {2, 4}, {5, 1}};
  const int64_t kLs[] = {1, 7, 33, 67, 129, 4097, 20000, 2, 65, 1000};
  int k = 0;
  for (int64_t D : {128, 256})
    for (const RL& rl : rls) {
      const int64_t kL = kLs[k % 10];
      const MaskKind mask = (k % 3 == 0) ? MaskKind::kNone : MaskKind::kCausal;
      const int64_t window = (k % 4 == 2) ? std::max<int64_t>(1, kL / 3) : 0;
      const int splits = (k % 5 == 1) ? 3 : (k % 5 == 3 ? 1 : (k % 7 == 4 ? 17 : 0));
      const int64_t d_len = (k % 6 == 5 && kL > 2) ? kL - kL / 3 : 0;
      ++k;
      if (rl.L > kL) continue;
      run_attention_case({D, rl.rep, kL, rl.L, mask, window, 8, 4, 64, DType::kF16, splits, d_len}, ++salt);
      if (k % 4 == 0)
        run_attention_case({D, rl.rep, kL, rl.L, mask, window, 8, 4, 64, DType::kBF16, splits, d_len}, ++salt);
    }
  for (int64_t D : {128, 256}) {
    run_attention_case({D, 4, 33000, 1, MaskKind::kCausal, 0, 8, 4, 64, DType::kF16}, ++salt);
    run_attention_case({D, 8, 20000, 1, MaskKind::kCausal, 0, 8, 4, 64, DType::kF16, 0, 12345}, ++salt);
    run_attention_case({D, 4, 5000, 2, MaskKind::kCausal, 700, 8, 4, 64, DType::kF16, 64}, ++salt);
    run_attention_case({D, 1, 32769, 1, MaskKind::kNone, 0, 8, 4, 64, DType::kF16, 5, 32001}, ++salt);
  }
  // Switch off: the general kernel takes the same shapes.
  const ScopedEnv off("CIDER_ATTN_TC_K8V4", "0");
  run_attention_case({128, 4, 4097, 1, MaskKind::kCausal, 0, 8, 4, 64, DType::kF16}, ++salt);
  run_attention_case({256, 8, 129, 1, MaskKind::kCausal, 40, 8, 4, 64, DType::kF16, 3}, ++salt);
}


// The packed layout of the tensor-core decode path (R = rep·L ≤ 4 query rows: 4 rows × (hi, lo) in the mma
// columns, two score chains instead of three, one value mma instead of two) is the default for those rows;
// $CIDER_ATTN_TC_PACKED=0 (read at every call) runs the three-chain layout. Both meet the same reference over rows
// 1..8 (rep × L), K4V3 and K8V4, D128/D256, tails, masks/windows, forced splits and d_length; each run checks which
// layout ran (rows > 4 always take the three-chain layout).
TEST(CudaAttention, TensorCoreDecodePackedAndUnpackedLayouts) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 15000;
  struct RL {
    int64_t rep, L;
  };
  const RL rls[] = {{1, 1}, {2, 1}, {3, 1}, {4, 1}, {2, 2}, {1, 3}, {1, 4}, {5, 1}, {4, 2}};
  const int64_t kLs[] = {1, 7, 33, 67, 129, 4097, 20000, 300, 2};
  for (const char* packed : {"1", "0"}) {
    const ScopedEnv env("CIDER_ATTN_TC_PACKED", packed);
    int k = 0;
    for (int64_t D : {128, 256})
      for (int kbits : {4, 8})
        for (const RL& rl : rls) {
          const int64_t kL = kLs[k % 9];
          const MaskKind mask = (k % 3 == 0) ? MaskKind::kNone : MaskKind::kCausal;
          const int64_t window = (k % 4 == 2) ? std::max<int64_t>(1, kL / 3) : 0;
          const int splits = (k % 5 == 1) ? 3 : (k % 5 == 3 ? 1 : (k % 7 == 4 ? 17 : 0));
          const int64_t d_len = (k % 6 == 5 && kL > 2) ? kL - kL / 3 : 0;
          ++k;
          if (rl.L > kL) continue;
          run_attention_case({D, rl.rep, kL, rl.L, mask, window, kbits, kbits == 4 ? 3 : 4, 64, DType::kF16, splits,
                              d_len},
                             ++salt);
          const int want = (rl.rep * rl.L <= 4 && packed[0] == '1') ? 2 : 1;
          EXPECT_EQ(detail::tc_last_layout(), want) << "CIDER_ATTN_TC_PACKED=" << packed << " rep " << rl.rep << " L "
                                                    << rl.L;
        }
  }
}

// ---- plain bf16 / f16 caches on the tensor cores (attention_decode_plain_tc.cu) ----------------------------------
//
// Tolerance (derived, per output element (row, d); every element is checked and a NaN fails every comparison):
// the kernel (1) rounds each query row ONCE to the cache's type — bf16(q) (unit roundoff u_q = 2^-8), or for f16
// caches 2^-E·f16(q·2^E) with max|q|·2^E ∈ [2^13, 2^14) (u_q = 2^-11, no subnormals for the row's large elements) —
// (2) forms the scores of q̃ and the stored keys with float32 accumulation, (3) rounds each softmax weight p ≤ 1 to the
// cache's type before P·V (u_p = 2^-8 bf16, 2^-11 f16; f16 p below 2^-14 are subnormal: absolute error ≤ 2^-25) and
// sums the ROUNDED p into l. The test evaluates q̃ exactly as the kernel does and computes in double:
//   emul = softmax(scale·q̃·K [capped]) · V over the row's visible keys (weights w̃_j),
//   exact = the same with q (weights w_j; also the CPU reference, ref_kernels().attention, in float).
// (a) kernel vs emul: p̃_j = p_j·(1 + ε_j), |ε_j| ≤ u := u_p + 2^-20 (ex2.approx and the float32 rescales), so the
//     normalized weights satisfy |w'_j/w̃_j − 1| ≤ 2u/(1 − u), and since Σ w' = Σ w̃ = 1,
//     |out − emul|_d = |Σ_j (w'_j − w̃_j)(v_jd − emul_d)| ≤ 2u/(1 − u) · Σ_j w̃_j·|v_jd − emul_d|
//     (+ f16: n·2^-25·max_j |v_jd − emul_d| for the subnormal p; + the float32 accumulation term of the other tests,
//     1e-5·√(n + 1)·(max|v| + 1)).
// (b) kernel vs exact: the scores differ by δ_j = scale·Σ_d (q̃_d − q_d)·k_jd (a softcap has slope ≤ 1), |δ_j| ≤ β_j :=
//     scale·Σ_d |q̃_d − q_d|·|k_jd| ≤ scale·u_q·Σ_d |q_d||k_jd|; with Δ = max_j β_j, w̃_j = w_j·e^{δ_j}/Z, Z ∈ [e^-Δ, e^Δ]:
//     |emul − exact|_d ≤ Σ_j w_j·(e^{β_j + Δ} − 1)·|v_jd − exact_d|; the bound is that plus (a)'s.
// Plain caches of these shapes must take the path with $CIDER_ATTN_TC_PLAIN=1 (default) and never with 0, where the
// general kernel meets the reference within the float32 tolerance of run_attention_case.
struct PlainCase {
  int64_t B, Hq, Hkv, D, kL, L;
  MaskKind mask;
  int64_t window;
  DType dt;
  float softcap = 0.0f;
  int kv_splits = 0;
  int64_t d_length = 0;  // > 0: the device length (≤ kL, the bound)
};

// The kernel's query rounding of one row (see above).
std::vector<double> plain_tc_query(const float* q, int64_t D, DType dt) {
  std::vector<double> out(static_cast<size_t>(D));
  if (dt == DType::kBF16) {
    for (int64_t d = 0; d < D; ++d) out[static_cast<size_t>(d)] = bf16_to_f32(f32_to_bf16(q[d]));
    return out;
  }
  float mx = 0.0f;
  for (int64_t d = 0; d < D; ++d) mx = std::max(mx, std::fabs(q[d]));
  int E = -7;  // the kernel's q_exponent(0) − 7
  if (mx > 0.0f) {
    int k = 0;
    (void)std::frexp(mx, &k);  // mx = f·2^k, f ∈ [0.5, 1): max|q|·2^(14 − k) ∈ [2^13, 2^14)
    E = 14 - k;
  }
  for (int64_t d = 0; d < D; ++d)
    out[static_cast<size_t>(d)] = std::ldexp(round_to_f16(std::ldexp(static_cast<double>(q[d]), E)), -E);
  return out;
}

void run_plain_tc_case(const PlainCase& c, uint64_t salt) {
  SCOPED_TRACE(::testing::Message() << "plain " << dtype_name(c.dt) << " B " << c.B << " Hq " << c.Hq << " Hkv "
                                    << c.Hkv << " D " << c.D << " kL " << c.kL << " L " << c.L << " mask "
                                    << static_cast<int>(c.mask) << " window " << c.window << " softcap " << c.softcap
                                    << " splits " << c.kv_splits << " d_length " << c.d_length);
  auto rng = test::make_rng(salt);
  const int64_t B = c.B, Hq = c.Hq, Hkv = c.Hkv, D = c.D, L = c.L, rep = Hq / Hkv, cap = c.kL + 3;
  const int64_t kLr = c.d_length > 0 ? c.d_length : c.kL;
  Side K, V;
  K.bits = V.bits = 0;
  K.dtype = V.dtype = c.dt;
  K.build(rng, B, Hkv, c.kL, cap, D, salt);
  V.build(rng, B, Hkv, c.kL, cap, D, salt + 1);
  std::vector<float> q = test::randn(rng, static_cast<size_t>(B * Hq * L * D));

  AttentionArgs ref{};
  ref.q = q.data();
  std::vector<float> want(q.size());
  ref.out = want.data();
  ref.B = B;
  ref.Hq = Hq;
  ref.L = L;
  ref.keys = K.view(false, B, Hkv, kLr, cap, D);
  ref.values = V.view(false, B, Hkv, kLr, cap, D);
  ref.scale = 1.0f / std::sqrt(static_cast<float>(D));
  ref.softcap = c.softcap;
  ref.mask_kind = c.mask;
  ref.window = c.window;
  ref.mask_dtype = DType::kBool;
  kernels::ref_kernels().attention(ref);

  // The emulation and both bounds, in double (see above).
  const bool f16 = c.dt == DType::kF16;
  auto val = [&](const Side& sd, int64_t row, int64_t d) -> double {
    uint16_t h;
    std::memcpy(&h, sd.data.data() + (row * D + d) * 2, 2);
    return f16 ? f16_to_f32(h) : bf16_to_f32(h);
  };
  const double u = std::ldexp(1.0, f16 ? -11 : -8) + std::ldexp(1.0, -20);
  const double base = 1e-5 * std::sqrt(static_cast<double>(kLr) + 1.0) * (V.vmax + 1.0);
  std::vector<double> emul(q.size()), tol_emul(q.size()), tol_exact(q.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hq = 0; hq < Hq; ++hq)
      for (int64_t i = 0; i < L; ++i) {
        const int64_t orow = (b * Hq + hq) * L + i, row0 = (b * Hkv + hq / rep) * cap, pos = kLr - L + i;
        const float* qr = q.data() + orow * D;
        const std::vector<double> qt = plain_tc_query(qr, D, c.dt);
        std::vector<int64_t> vis;
        std::vector<double> s, se, beta;
        for (int64_t j = 0; j < kLr; ++j) {
          if (c.mask == MaskKind::kCausal && (j > pos || (c.window > 0 && j <= pos - c.window))) continue;
          double s0 = 0.0, s1 = 0.0, bt = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            const double k = val(K, row0 + j, d);
            s0 += static_cast<double>(qr[d]) * k;
            s1 += qt[static_cast<size_t>(d)] * k;
            bt += std::fabs(qt[static_cast<size_t>(d)] - static_cast<double>(qr[d])) * std::fabs(k);
          }
          s0 *= ref.scale;
          s1 *= ref.scale;
          if (c.softcap > 0.0f) {
            s0 = c.softcap * std::tanh(s0 / c.softcap);
            s1 = c.softcap * std::tanh(s1 / c.softcap);
          }
          vis.push_back(j);
          s.push_back(s0);
          se.push_back(s1);
          beta.push_back(bt * ref.scale);
        }
        const size_t n = vis.size();
        if (n == 0) continue;  // zeros everywhere, tolerance 0
        const double m0 = *std::max_element(s.begin(), s.end()), m1 = *std::max_element(se.begin(), se.end());
        const double delta = *std::max_element(beta.begin(), beta.end());
        double z0 = 0.0, z1 = 0.0;
        for (size_t t = 0; t < n; ++t) {
          s[t] = std::exp(s[t] - m0);
          se[t] = std::exp(se[t] - m1);
          z0 += s[t];
          z1 += se[t];
        }
        for (int64_t d = 0; d < D; ++d) {
          double o0 = 0.0, o1 = 0.0;
          for (size_t t = 0; t < n; ++t) {
            const double v = val(V, row0 + vis[t], d);
            o0 += s[t] / z0 * v;
            o1 += se[t] / z1 * v;
          }
          double dev1 = 0.0, dev0 = 0.0, maxdev = 0.0;
          for (size_t t = 0; t < n; ++t) {
            const double v = val(V, row0 + vis[t], d);
            dev1 += se[t] / z1 * std::fabs(v - o1);
            dev0 += s[t] / z0 * std::expm1(beta[t] + delta) * std::fabs(v - o0);
            maxdev = std::max(maxdev, std::fabs(v - o1));
          }
          const size_t k = static_cast<size_t>(orow * D + d);
          emul[k] = o1;
          tol_emul[k] = 2.0 * u / (1.0 - u) * dev1 + (f16 ? static_cast<double>(n) * std::ldexp(1.0, -25) * maxdev : 0.0) +
                        base;
          tol_exact[k] = tol_emul[k] + dev0;
        }
      }

  const int32_t len32 = static_cast<int32_t>(kLr);
  DeviceBuffer d_len = to_device(&len32, sizeof(len32));
  DeviceBuffer d_q = to_device(q.data(), q.size() * sizeof(float));
  const size_t out_n = q.size(), guard = 64;
  for (const char* on : {"1", "0"}) {
    SCOPED_TRACE(::testing::Message() << "CIDER_ATTN_TC_PLAIN=" << on);
    const ScopedEnv env("CIDER_ATTN_TC_PLAIN", on);
    DeviceBuffer d_out((out_n + 2 * guard) * sizeof(float));
    d_out.fill(0xFF);
    AttentionArgs a = ref;
    a.q = d_q.as<float>();
    a.out = d_out.as<float>() + guard;
    a.keys = K.view(true, B, Hkv, c.kL, cap, D);
    a.values = V.view(true, B, Hkv, c.kL, cap, D);
    a.kv_splits = c.kv_splits;
    const bool tc = on[0] == '1';
    ASSERT_EQ(detail::plain_tc_eligible(a), tc) << "the path taken";
    const size_t ws = attention_workspace_bytes(a);
    DeviceBuffer d_ws(std::max<size_t>(ws, 256));
    d_ws.fill(0xFF);
    Stream& stream = attention_stream();
    attention(a, c.d_length > 0 ? d_len.as<int32_t>() : nullptr, Exec{stream.handle(), d_ws.data(), ws});
    stream.synchronize();
    std::vector<float> got(out_n + 2 * guard);
    d_out.download(got.data(), got.size() * sizeof(float));
    ASSERT_NO_FATAL_FAILURE(expect_guards_untouched(got, out_n, guard));
    const float* o = got.data() + guard;
    if (!tc) {
      EXPECT_TRUE(test::all_close(o, want.data(), out_n, base, 1e-5)) << "general kernel vs the reference";
      continue;
    }
    size_t bad = 0;
    for (size_t k = 0; k < out_n; ++k) {
      const double e1 = std::fabs(static_cast<double>(o[k]) - emul[k]);
      const double e0 = std::fabs(static_cast<double>(o[k]) - static_cast<double>(want[k]));
      // !(e <= tol): a NaN fails.
      if (!(e1 <= tol_emul[k]) || !(e0 <= tol_exact[k] + 1e-6 * std::fabs(static_cast<double>(want[k])))) {
        if (++bad <= 8)
          ADD_FAILURE() << "element " << k << ": got " << o[k] << ", emulation " << emul[k] << " (tol "
                        << tol_emul[k] << "), reference " << want[k] << " (tol " << tol_exact[k] << ")";
      }
    }
    EXPECT_EQ(bad, size_t{0}) << "elements outside the bounds";
  }
}

// The plain-cache tensor-core decode path: bf16 and f16, B 1/2, Hq/Hkv 32/8, 16/2, 8/8, D 128/256, key lengths with
// tails of the 16-key tile and the 64-key split quantum (1, 63, 65, 1000, 4097), 1 and 2 query positions with causal
// masks, windows, softcaps 0.5 / 5, device lengths below the bound, forced and automatic splits; then long caches
// (accumulation over 20 000+ keys, 200 splits). Each case also runs the general kernel ($CIDER_ATTN_TC_PLAIN=0).
TEST(CudaAttention, PlainTensorCoreDecode) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 21000;
  struct Heads {
    int64_t Hq, Hkv;
  };
  const Heads heads[] = {{32, 8}, {16, 2}, {8, 8}};
  const int64_t kLs[] = {1, 63, 65, 1000, 4097};
  int k = 0;
  for (DType dt : {DType::kBF16, DType::kF16})
    for (int64_t D : {128, 256})
      for (const Heads& h : heads)
        for (int64_t kL : kLs) {
          PlainCase c{};
          c.B = (k % 2) ? 2 : 1;
          c.Hq = h.Hq;
          c.Hkv = h.Hkv;
          c.D = D;
          c.kL = kL;
          c.L = (k % 3 == 1 && kL > 1) ? 2 : 1;
          c.mask = (k % 4 != 0) ? MaskKind::kCausal : MaskKind::kNone;
          c.window = (k % 5 == 2) ? std::max<int64_t>(1, kL / 3) : 0;
          c.dt = dt;
          c.softcap = (k % 7 == 3) ? 5.0f : ((k % 11 == 5) ? 0.5f : 0.0f);
          c.kv_splits = (k % 5 == 1) ? 3 : ((k % 9 == 4) ? 1 : 0);
          c.d_length = (k % 6 == 5 && kL > 2) ? kL - kL / 3 : 0;
          ++k;
          if (h.Hq / h.Hkv * c.L > 8) c.L = 1;  // at most 8 query rows per KV head (rep 8: one position)
          run_plain_tc_case(c, ++salt);
        }
  const MaskKind C = MaskKind::kCausal;
  run_plain_tc_case({1, 32, 8, 128, 33000, 1, C, 0, DType::kBF16, 0.0f, 0, 20000}, ++salt);
  run_plain_tc_case({2, 8, 2, 256, 20000, 2, C, 700, DType::kBF16, 0.0f, 64}, ++salt);  // rep·L = 8
  run_plain_tc_case({1, 16, 2, 128, 20000, 1, C, 0, DType::kF16, 5.0f, 200, 12345}, ++salt);
  run_plain_tc_case({2, 8, 2, 256, 9000, 2, C, 300, DType::kF16, 0.0f, 0, 8999}, ++salt);
  run_plain_tc_case({1, 8, 8, 128, 4097, 1, MaskKind::kNone, 0, DType::kBF16, 0.5f, 0, 700}, ++salt);
}

// Calls outside the path's scope keep the general kernel: D 64, f32 caches, mixed bf16/f16 sides, 9 query rows per KV
// head, a misaligned q; $CIDER_ATTN_TC=0 is read once per process and is not toggled here.
TEST(CudaAttention, PlainTensorCoreDecodeEligibility) {
  CIDER_REQUIRE_GPU();
  DeviceBuffer buf(1 << 16);
  AttentionArgs a{};
  a.q = buf.as<float>();
  a.out = buf.as<float>() + 1024;
  a.B = 1;
  a.Hq = 8;
  a.L = 1;
  KVTensorView kv{};
  kv.data = buf.data();
  kv.dtype = DType::kBF16;
  kv.B = 1;
  kv.H = 2;
  kv.length = 10;
  kv.capacity = 16;
  kv.dim = 128;
  a.keys = kv;
  a.values = kv;
  a.scale = 0.1f;
  a.mask_kind = MaskKind::kCausal;
  EXPECT_TRUE(detail::plain_tc_eligible(a));
  {
    const ScopedEnv off("CIDER_ATTN_TC_PLAIN", "0");
    EXPECT_FALSE(detail::plain_tc_eligible(a));
  }
  {
    const ScopedEnv bogus("CIDER_ATTN_TC_PLAIN", "2");
    expect_error([&] { (void)detail::plain_tc_eligible(a); }, "cuda.attention");
  }
  auto not_taken = [&](auto mutate) {
    AttentionArgs b = a;
    mutate(b);
    EXPECT_FALSE(detail::plain_tc_eligible(b));
  };
  not_taken([](AttentionArgs& b) { b.keys.dim = b.values.dim = 64; });
  not_taken([](AttentionArgs& b) { b.keys.dtype = b.values.dtype = DType::kF32; });
  not_taken([](AttentionArgs& b) { b.values.dtype = DType::kF16; });
  not_taken([](AttentionArgs& b) { b.L = 3; });  // rep 4 × 3 rows = 12 > 8
  not_taken([](AttentionArgs& b) { b.q = b.q + 1; });
  not_taken([](AttentionArgs& b) { b.values.dim = 256; });
}

// The split merge: the one-round-trip merge4_kernel meets the reference over head dims 64/128/256 (one or two column
// blocks per row), split counts 2..200 (one chunk, several chunks per thread), empty splits (a device length far below
// the bound, windows), both cache kinds (tensor-core and CUDA-core kernels), misaligned outputs (the scalar
// merge_kernel).
TEST(CudaAttention, MergeKernelsAgree) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 16000;
  run_attention_case({128, 4, 4097, 1, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16, 64}, ++salt);
  run_attention_case({128, 4, 20000, 1, MaskKind::kCausal, 0, 8, 4, 64, DType::kF16, 200}, ++salt);
  run_attention_case({256, 2, 5000, 1, MaskKind::kNone, 0, 4, 3, 64, DType::kF16, 33, 1234}, ++salt);
  run_attention_case({256, 8, 3000, 1, MaskKind::kCausal, 500, 8, 4, 64, DType::kF16, 17}, ++salt);
  run_attention_case({64, 2, 777, 2, MaskKind::kCausal, 0, 4, 4, 32, DType::kF16, 5}, ++salt);
  run_attention_case({128, 1, 300, 1, MaskKind::kNone, 0, 0, 0, 0, DType::kBF16, 2}, ++salt);
  AttnCase mis{128, 4, 2000, 1, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16, 9};
  mis.misalign = true;
  run_attention_case(mis, ++salt);
  attention_stream().synchronize();
}

// The in-kernel merge of the tensor-core path (the last CTA of each head merges the splits and resets its counter):
// six launches on one workspace and one stream, each with new queries and a new device length (some making most
// splits empty), checked against the reference: three direct launches, then a CUDA graph captured once and replayed
// three times with the inputs changed in device memory between replays. A counter left non-zero by one launch would
// make the next one merge early (wrong output) or never (poison left in out).
void run_repeated_case(int64_t D, int64_t rep, int kbits, int vbits, int kv_splits, uint64_t salt) {
  SCOPED_TRACE(::testing::Message() << "repeated launches D " << D << " rep " << rep << " K" << kbits << "V" << vbits
                                    << " splits " << kv_splits);
  auto rng = test::make_rng(salt);
  const int64_t B = 2, Hkv = 2, Hq = Hkv * rep, L = 1, kL = 5000, cap = kL + 3;
  Side K, V;
  K.bits = kbits;
  V.bits = vbits;
  K.gs = V.gs = 64;
  K.dtype = V.dtype = DType::kF16;
  K.build(rng, B, Hkv, kL, cap, D, salt);
  V.build(rng, B, Hkv, kL, cap, D, salt);
  const size_t q_n = static_cast<size_t>(B * Hq * L * D), guard = 64;
  DeviceBuffer d_q(q_n * sizeof(float)), d_out((q_n + 2 * guard) * sizeof(float)), d_len(sizeof(int32_t));
  AttentionArgs a{};
  a.q = d_q.as<float>();
  a.out = d_out.as<float>() + guard;
  a.B = B;
  a.Hq = Hq;
  a.L = L;
  a.keys = K.view(true, B, Hkv, kL, cap, D);
  a.values = V.view(true, B, Hkv, kL, cap, D);
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  a.mask_kind = MaskKind::kCausal;
  a.mask_dtype = DType::kBool;
  a.kv_splits = kv_splits;
  const size_t ws = attention_workspace_bytes(a);
  ASSERT_GT(ws, size_t{0}) << "the case must split the keys";
  DeviceBuffer d_ws(ws);
  d_ws.fill(0xFF);
  Stream& stream = attention_stream();
  const Exec exec{stream.handle(), d_ws.data(), ws};
  // Real lengths: all keys, then lengths that leave most splits (or all but the first) empty.
  const int64_t lens[6] = {5000, 3001, 129, 4097, 1, 2500};
  auto set_inputs = [&](int k, std::vector<float>& q) {
    q = test::randn(rng, q_n, 1.0f + 0.5f * static_cast<float>(k));
    d_q.upload(q.data(), q.size() * sizeof(float));
    const int32_t len32 = static_cast<int32_t>(lens[k]);
    d_len.upload(&len32, sizeof(len32));
    d_out.fill(0xFF);
  };
  auto check = [&](int k, const std::vector<float>& q) {
    SCOPED_TRACE(::testing::Message() << "launch " << k << " length " << lens[k]);
    AttentionArgs ref = a;
    std::vector<float> want(q_n);
    ref.q = q.data();
    ref.out = want.data();
    ref.keys = K.view(false, B, Hkv, lens[k], cap, D);
    ref.values = V.view(false, B, Hkv, lens[k], cap, D);
    ref.kv_splits = 0;
    kernels::ref_kernels().attention(ref);
    std::vector<float> got(q_n + 2 * guard);
    d_out.download(got.data(), got.size() * sizeof(float));
    ASSERT_NO_FATAL_FAILURE(expect_guards_untouched(got, q_n, guard));
    const double tol = 1e-5 * std::sqrt(static_cast<double>(lens[k]) + 1.0) * (V.vmax + 1.0);
    EXPECT_TRUE(test::all_close(got.data() + guard, want.data(), q_n, tol, 1e-5));
  };
  std::vector<float> q;
  for (int k = 0; k < 3; ++k) {
    set_inputs(k, q);
    attention(a, d_len.as<int32_t>(), exec);
    stream.synchronize();
    check(k, q);
  }
  cudaStream_t st = static_cast<cudaStream_t>(stream.handle());
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graph_exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  attention(a, d_len.as<int32_t>(), exec);
  ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&graph_exec, graph, 0), cudaSuccess);
  for (int k = 3; k < 6; ++k) {
    set_inputs(k, q);  // synchronous copies; the stream is idle (synchronized after each replay)
    ASSERT_EQ(cudaGraphLaunch(graph_exec, st), cudaSuccess);
    stream.synchronize();
    check(k, q);
  }
  cudaGraphExecDestroy(graph_exec);
  cudaGraphDestroy(graph);
}

TEST(CudaAttention, FoldedMergeRepeatedLaunchesAndGraphReplays) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 13000;
  {
  const ScopedEnv on("CIDER_ATTN_TC_FOLD", "1");  // the fold is opt-in (measured slower, docs/cuda/attention.md)
  for (int64_t D : {128, 256}) {
    // Automatic splits (one wave; D256: 79 splits × 4 rows × 1 KB is past the fold's 256 KB, so 40 forced).
    run_repeated_case(D, 4, 4, 3, D == 128 ? 0 : 40, ++salt);
    run_repeated_case(D, 8, 4, 3, 17, ++salt);  // R = 8 rows per head
    run_repeated_case(D, 1, 8, 4, 5, ++salt);   // K8V4, R = 1
    run_repeated_case(D, 2, 8, 4, 0, ++salt);   // K8V4, R = 2
  }
  }
  // The same with the fold off ($CIDER_ATTN_TC_FOLD=0: the partials go to the merge kernel, two launches).
  const ScopedEnv off("CIDER_ATTN_TC_FOLD", "0");
  run_repeated_case(128, 4, 4, 3, 0, ++salt);
  run_repeated_case(256, 4, 8, 4, 3, ++salt);
}

// Empty splits: a device length far below the bound leaves most splits with no key (their partials m = −inf, l = 0
// must not disturb the merge), including lengths that end inside the first split, and windows that start late. Some
// of these cases fold (partials ≤ 256 KB per head), the others run the merge kernel: both meet the reference.
TEST(CudaAttention, FoldedMergeEmptySplits) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 14000;
  for (const char* fold : {"1", "0"})
  for (int64_t D : {128, 256})
    for (int kb : {4, 8}) {
      const int vb = kb == 4 ? 3 : 4;
      const ScopedEnv env("CIDER_ATTN_TC_FOLD", fold);
      run_attention_case({D, 4, 33000, 1, MaskKind::kCausal, 0, kb, vb, 64, DType::kF16, 0, 700}, ++salt);
      run_attention_case({D, 8, 20000, 1, MaskKind::kCausal, 0, kb, vb, 64, DType::kF16, 64, 1}, ++salt);
      run_attention_case({D, 2, 9000, 4, MaskKind::kCausal, 300, kb, vb, 64, DType::kF16, 0, 8999}, ++salt);
      run_attention_case({D, 1, 4097, 1, MaskKind::kNone, 0, kb, vb, 64, DType::kF16, 33, 2000}, ++salt);
    }
  // A q / out that is only 4-byte aligned does not take the tensor-core path (its loads are 16-byte): still correct.
  for (int kb : {4, 8}) {
    AttnCase c{128, 4, 3000, 1, MaskKind::kCausal, 0, kb, kb == 4 ? 3 : 4, 64, DType::kF16, 0, 0};
    c.misalign = true;
    run_attention_case(c, ++salt);
  }
}

// The tensor-core PREFILL path (attention_prefill_tc.cu: K4V3 / K8V4 g64 f16 scales, D 128/256, none / causal,
// rep·L > 8): every case runs with $CIDER_ATTN_PREFILL_TC=1 (asserting that the path takes it) and =0 (the general
// kernel), both against the CPU reference on the same cache bytes. Row counts with tails of the 64-row block and of the
// 16-row warp (L 9 .. 300 × rep 1, 3, 4, 8), past = kL − L ∈ {0, 5, 1000} (key tiles with tails, diagonal tiles),
// causal windows (37: tiles inside the union but not the intersection), forced splits (many of them empty), d_length
// below keys.length (rows at negative positions: zeros), a long square prefill (L = kL = 1030) and a misaligned q/out
// (falls back to the general kernel).
TEST(CudaAttention, TensorCorePrefillPath) {
  CIDER_REQUIRE_GPU();
  uint64_t salt = 13000;
  struct P {
    int kbits, vbits;
    int64_t D, rep, L, past;
    MaskKind mask;
    int64_t window;
    int splits;
    int64_t d_length;  // > 0: the device length
  };
  const MaskKind C = MaskKind::kCausal, N = MaskKind::kNone;
  const P cases[] = {
      {4, 3, 128, 1, 9, 0, C, 0, 0, 0},       {4, 3, 128, 4, 16, 5, C, 0, 0, 0},
      {4, 3, 128, 8, 33, 1000, C, 37, 0, 0},  {4, 3, 128, 1, 67, 0, N, 0, 0, 0},
      {4, 3, 128, 4, 129, 5, C, 0, 3, 0},     {4, 3, 128, 1, 300, 1000, C, 37, 0, 0},
      {4, 3, 256, 8, 9, 5, N, 0, 0, 0},       {4, 3, 256, 1, 16, 1000, C, 0, 7, 0},
      {4, 3, 256, 4, 67, 0, C, 37, 0, 0},     {4, 3, 256, 1, 129, 1000, C, 0, 0, 929},
      {8, 4, 128, 1, 9, 1000, C, 0, 0, 0},    {8, 4, 128, 4, 33, 0, C, 37, 2, 0},
      {8, 4, 128, 8, 67, 5, N, 0, 0, 0},      {8, 4, 128, 1, 300, 0, C, 0, 0, 0},
      {8, 4, 256, 4, 16, 1000, C, 37, 0, 0},  {8, 4, 256, 1, 129, 5, C, 0, 0, 0},
      {8, 4, 256, 8, 33, 1000, N, 0, 5, 0},   {8, 4, 256, 1, 300, 1000, C, 0, 0, 800},
      {4, 3, 128, 3, 50, 7, C, 0, 0, 0},      {8, 4, 128, 3, 50, 7, C, 11, 0, 0},
      {4, 3, 128, 4, 16, 1000, C, 37, 17, 0},  // 17 forced splits, most of them empty for the window
      {8, 4, 256, 4, 64, 36, C, 0, 0, 40},     // d_length 40 < L: the first 24 positions see nothing
      {4, 3, 128, 4, 64, 36, N, 0, 3, 40},
      {4, 3, 128, 1, 1030, 0, C, 0, 0, 0},     // long square prefill
      {8, 4, 128, 2, 1030, 0, C, 0, 0, 0},
      {4, 3, 256, 1, 1030, 0, C, 300, 0, 0},
  };
  for (const P& pc : cases) {
    AttnCase c{pc.D, pc.rep, pc.L + pc.past, pc.L, pc.mask, pc.window, pc.kbits, pc.vbits, 64, DType::kF16,
               pc.splits, pc.d_length};
    c.both_prefill_paths = true;
    run_attention_case(c, ++salt);
  }
  AttnCase mis{128, 4, 100, 33, MaskKind::kCausal, 0, 4, 3, 64, DType::kF16};
  mis.misalign = true;
  mis.both_prefill_paths = true;
  run_attention_case(mis, ++salt);
}

// The f16 prefill kernel alone (the default $CIDER_ATTN_PREFILL_MATH), a few small cases of each instantiation
// (both D128 CTA sizes, tails, a window, forced splits, d_length): the set compute-sanitizer runs
// (docs/cuda/attention.md).
TEST(CudaAttention, PrefillF16KernelSmall) {
  CIDER_REQUIRE_GPU();
  const ScopedEnv tc("CIDER_ATTN_PREFILL_TC", "1");
  const ScopedEnv math("CIDER_ATTN_PREFILL_MATH", "f16");
  uint64_t salt = 15000;
  const MaskKind C = MaskKind::kCausal;
  for (const char* warps : {"8", "12", "auto"})
  for (int kb : {4, 8})
    for (int64_t D : {128, 256}) {
      if (D == 256 && warps[0] != '8') continue;  // D256 has one CTA size
      SCOPED_TRACE(::testing::Message() << "CIDER_ATTN_PREFILL_F16_WARPS=" << warps);
      const ScopedEnv cta("CIDER_ATTN_PREFILL_F16_WARPS", warps);
      run_attention_case({D, 4, 67 + 5, 67, C, 0, kb, kb == 4 ? 3 : 4, 64, DType::kF16}, ++salt);
      run_attention_case({D, 3, 200, 40, C, 37, kb, kb == 4 ? 3 : 4, 64, DType::kF16, 3}, ++salt);
      run_attention_case({D, 1, 150, 129, MaskKind::kNone, 0, kb, kb == 4 ? 3 : 4, 64, DType::kF16, 0, 140}, ++salt);
    }
}

// Arguments the launcher accepts, for the argument-error tests to break one at a time: B1 Hq4 Hkv2 D128, K4V4 g64
// with f16 scales (every pointer into buf; nothing is read before validation), causal.
AttentionArgs well_formed_args(DeviceBuffer& buf, int64_t out_offset, int64_t L, int64_t length, int64_t capacity) {
  AttentionArgs a{};
  a.q = buf.as<float>();
  a.out = buf.as<float>() + out_offset;
  a.B = 1;
  a.Hq = 4;
  a.L = L;
  KVTensorView kv{};
  kv.data = buf.data();
  kv.scales = buf.data();
  kv.biases = buf.data();
  kv.dtype = DType::kU32;
  kv.scale_dtype = DType::kF16;
  kv.bits = 4;
  kv.group_size = 64;
  kv.B = 1;
  kv.H = 2;
  kv.length = length;
  kv.capacity = capacity;
  kv.dim = 128;
  a.keys = kv;
  a.values = kv;
  a.scale = 0.1f;
  a.mask_kind = MaskKind::kCausal;
  return a;
}

// Eligibility of the prefill path and the launcher's checks on a prefill-shaped call.
TEST(CudaAttention, PrefillPathEligibilityAndBadArguments) {
  CIDER_REQUIRE_GPU();
  DeviceBuffer buf(1 << 20);
  AttentionArgs good = well_formed_args(buf, /*out_offset=*/65536, /*L=*/16, /*length=*/20, /*capacity=*/32);
  good.values.bits = 3;
  const ScopedEnv on("CIDER_ATTN_PREFILL_TC", "1");
  EXPECT_TRUE(detail::prefill_tc_eligible(good));
  auto not_eligible = [&](auto mutate) {
    AttentionArgs a = good;
    mutate(a);
    EXPECT_FALSE(detail::prefill_tc_eligible(a));
  };
  not_eligible([](AttentionArgs& a) { a.L = 4; });  // rep·L = 8: the decode path
  not_eligible([](AttentionArgs& a) { a.values.bits = 4; });
  not_eligible([](AttentionArgs& a) { a.keys.group_size = a.values.group_size = 32; });
  not_eligible([](AttentionArgs& a) { a.keys.scale_dtype = DType::kBF16; });
  not_eligible([](AttentionArgs& a) { a.keys.dim = a.values.dim = 64; });
  not_eligible([](AttentionArgs& a) { a.q += 1; });
  not_eligible([](AttentionArgs& a) { a.mask_kind = MaskKind::kBool; });
  {
    const ScopedEnv off("CIDER_ATTN_PREFILL_TC", "0");
    EXPECT_FALSE(detail::prefill_tc_eligible(good));
  }
  Exec exec{nullptr, buf.data(), buf.bytes()};
  auto bad = [&](auto mutate) {
    AttentionArgs a = good;
    mutate(a);
    expect_error([&] { attention(a, nullptr, exec); }, "cuda.attention");
  };
  bad([](AttentionArgs& a) { a.mask_kind = MaskKind::kBool; });
  bad([](AttentionArgs& a) { a.window = -1; });
  {  // auto (the default) takes the f16 kernel above 64 query rows per KV head, else the exact one
    const ScopedEnv automatic("CIDER_ATTN_PREFILL_MATH", "auto");
    EXPECT_FALSE(detail::prefill_math_f16(good));  // rep 2 × L 16 = 32 rows
    EXPECT_FALSE(detail::prefill_tc_plan(good).f16);
    AttentionArgs longer = good;
    longer.L = 33;  // 66 rows
    longer.keys.length = longer.values.length = 33;
    EXPECT_TRUE(detail::prefill_math_f16(longer));
    EXPECT_TRUE(detail::prefill_tc_plan(longer).f16);
  }
  {  // the prefill path's switches take only their words: anything else is an error naming the variable
    const ScopedEnv bogus("CIDER_ATTN_PREFILL_MATH", "fp8");
    expect_error([&] { attention(good, nullptr, exec); }, "CIDER_ATTN_PREFILL_MATH");
  }
  {  // read by the f16 kernel's plan only: force that kernel (good has 32 query rows per KV head, auto takes exact)
    const ScopedEnv f16("CIDER_ATTN_PREFILL_MATH", "f16");
    const ScopedEnv bogus("CIDER_ATTN_PREFILL_F16_WARPS", "16");
    expect_error([&] { attention(good, nullptr, exec); }, "CIDER_ATTN_PREFILL_F16_WARPS");
  }
  bad([](AttentionArgs& a) { a.values.length = 19; });
  {  // a workspace too small for forced split partials
    AttentionArgs a = good;
    a.kv_splits = 4;
    a.keys.length = a.values.length = a.keys.capacity = a.values.capacity = 256;  // 4 key tiles
    ASSERT_TRUE(detail::prefill_tc_eligible(a));
    Exec small{nullptr, buf.data(), 16};
    ASSERT_GT(attention_workspace_bytes(a), size_t{16});
    expect_error([&] { attention(a, nullptr, small); }, "cuda.attention");
  }
}

// ---- per-channel keys (nn::KeyLayout::kChannel) ------------------------------------------------------------------
// The CPU cache (nn::QuantizedKVCache) is the oracle: the device append must write its bytes, the device refill its
// window after a trim, and the attention kernel must match the reference attention over the same bytes.

// A view's planes copied to the device (codes/values, scales, biases, and the residual window of per-channel keys).
struct DeviceView {
  DeviceBuffer data, scales, biases, residual, ocodes, oindex;
  KVTensorView view{};
};

size_t plane_bytes(const KVTensorView& v, int which) {  // 0 data, 1 scales/biases, 2 residual
  const size_t bh = static_cast<size_t>(v.B * v.H);
  if (which == 0)
    return bh * static_cast<size_t>(v.capacity) *
           (v.bits ? static_cast<size_t>(v.dim * v.bits / 8) : static_cast<size_t>(v.dim * dtype_size(v.dtype)));
  const size_t ss = dtype_size(v.scale_dtype);
  if (which == 1)
    return v.layout == 1 ? bh * static_cast<size_t>(v.blocks * v.dim) * ss
                         : bh * static_cast<size_t>(v.capacity * (v.dim / v.group_size)) * ss;
  return v.layout == 1 ? bh * static_cast<size_t>(v.group_size * v.dim) * 2 : 0;
}

DeviceView upload_view(const KVTensorView& v) {
  DeviceView d;
  d.view = v;
  d.data = to_device(v.data, plane_bytes(v, 0));
  d.view.data = d.data.data();
  if (v.bits) {
    d.scales = to_device(v.scales, plane_bytes(v, 1));
    d.biases = to_device(v.biases, plane_bytes(v, 1));
    d.view.scales = d.scales.data();
    d.view.biases = d.biases.data();
  }
  if (v.layout == 1) {
    d.residual = to_device(v.residual, plane_bytes(v, 2));
    d.view.residual = d.residual.data();
  }
  if (v.layout == 1 && v.outliers > 0) {  // outlier channels: codes [B, H, blocks, N·gs/2], indices [.., N] uint16
    const size_t rows = static_cast<size_t>(v.B * v.H * v.blocks * v.outliers);
    d.ocodes = to_device(v.outlier_codes, rows * static_cast<size_t>(v.group_size / 2));
    d.oindex = to_device(v.outlier_index, rows * sizeof(uint16_t));
    d.view.outlier_codes = d.ocodes.data();
    d.view.outlier_index = d.oindex.data();
  }
  return d;
}

nn::QuantizedKVCacheConfig channel_cache_config(int kb, int vb, int gs, DType sd, uint64_t seed) {
  nn::QuantizedKVCacheConfig cfg;
  cfg.k_bits = kb;
  cfg.v_bits = vb;
  cfg.group_size = gs;
  cfg.rotation = nn::RotationKind::kHadamard;
  cfg.seed = seed;
  cfg.scale_dtype = sd;
  cfg.key_layout = nn::KeyLayout::kChannel;
  return cfg;
}

std::vector<uint8_t> download_bytes(const DeviceBuffer& b, size_t n) {
  std::vector<uint8_t> h(n);
  b.download(h.data(), n);
  return h;
}

// Bytes [0, n) of each (b, h) slab of `per` bytes equal in both (the valid prefix of every head's plane).
::testing::AssertionResult slabs_equal(const std::vector<uint8_t>& got, const uint8_t* want, int64_t BH, size_t per,
                                       size_t n, const char* what) {
  for (int64_t bh = 0; bh < BH; ++bh)
    for (size_t i = 0; i < n; ++i)
      if (got[static_cast<size_t>(bh) * per + i] != want[static_cast<size_t>(bh) * per + i])
        return ::testing::AssertionFailure() << what << ": head slab " << bh << " byte " << i << " differs";
  return ::testing::AssertionSuccess();
}

TEST(CudaKvChannel, AppendAndRefillWriteTheCpuCacheBytes) {
  CIDER_REQUIRE_GPU();
  // Outlier channels (outliers > 0): the device chooses and refines the same channels from the same queries (rep
  // query heads per KV head, channel-dependent magnitudes, one non-finite row), or by range alone without queries,
  // and keeps the window positions' query statistics (plane 9) as the CPU cache does.
  struct Case {
    int kb, gs;
    DType sd;
    int64_t D;
    int outliers = 0;
    bool queries = true;
  };
  const Case cases[] = {{4, 64, DType::kF16, 128},       {5, 64, DType::kF16, 128},       {3, 32, DType::kBF16, 64},
                        {2, 128, DType::kF32, 256},      {6, 32, DType::kF16, 64},        {8, 64, DType::kBF16, 128},
                        {5, 64, DType::kF16, 128, 4},    {4, 64, DType::kF16, 256, 16},   {5, 64, DType::kF16, 256, 8},
                        {3, 32, DType::kBF16, 64, 3},    {4, 128, DType::kF32, 128, 32},  {5, 64, DType::kF16, 128, 4, false}};
  uint64_t salt = 7100;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "k" << c.kb << " g" << c.gs << " " << dtype_name(c.sd) << " D " << c.D
                                      << " outliers " << c.outliers << (c.queries ? "" : " without queries"));
    auto rng = test::make_rng(++salt);
    const int64_t B = 2, H = 3, N = 420, rep = 2, Hq = H * rep;
    std::vector<float> keys = test::randn(rng, static_cast<size_t>(B * H * N * c.D), 1.5f);
    for (size_t i = 0; i < keys.size(); i += 61) keys[i] *= 9.0f;  // outlier channels' kind of values
    std::vector<float> vals = test::randn(rng, keys.size());
    std::vector<float> qs = test::randn(rng, static_cast<size_t>(B * Hq * N * c.D));
    for (size_t i = 0; i < qs.size(); ++i) qs[i] *= 1.0f + static_cast<float>((i % static_cast<size_t>(c.D)) % 7);
    qs[static_cast<size_t>((1 * Hq + 3) * N + 200) * static_cast<size_t>(c.D) + 5] = std::nanf("");  // a row counts 0
    const bool use_q = c.outliers > 0 && c.queries;
    nn::QuantizedKVCacheConfig ccfg = channel_cache_config(c.kb, 4, c.gs, c.sd, salt);
    ccfg.key_outliers = c.outliers;
    nn::QuantizedKVCache cpu(ccfg);
    DeviceBuffer d_src = to_device(keys.data(), keys.size() * sizeof(float));
    // The device planes are sized by the CPU cache's capacity once it holds everything (it grows in steps).
    std::vector<std::pair<int64_t, int64_t>> runs = {{0, 37}, {37, 90}, {127, 1}, {128, 1}, {129, 66}, {195, 120}};
    int64_t capacity = 0, blocks = 0;
    {
      nn::QuantizedKVCache probe(ccfg);
      std::vector<float> z(static_cast<size_t>(B * H * N * c.D), 0.0f);
      probe.update_and_fetch(TensorView(z.data(), DType::kF32, {B, H, N, c.D}),
                             TensorView(z.data(), DType::kF32, {B, H, N, c.D}));
      capacity = probe.capacity();
      blocks = probe.keys().blocks;
    }
    const size_t wpr_bytes = static_cast<size_t>(c.D * c.kb / 8), ss = dtype_size(c.sd);
    DeviceBuffer d_codes(static_cast<size_t>(B * H * capacity) * wpr_bytes);
    DeviceBuffer d_sc(static_cast<size_t>(B * H * blocks * c.D) * ss), d_bi(d_sc.bytes());
    DeviceBuffer d_res(static_cast<size_t>(B * H * c.gs * c.D) * 2);
    const size_t on = static_cast<size_t>(std::max(c.outliers, 1));
    DeviceBuffer d_oc(static_cast<size_t>(B * H * blocks) * on * static_cast<size_t>(c.gs / 2));
    DeviceBuffer d_oi(static_cast<size_t>(B * H * blocks) * on * 2);
    DeviceBuffer d_qst(static_cast<size_t>(B * H * c.gs * (c.D + 1)));
    DeviceBuffer d_q = to_device(qs.data(), qs.size() * sizeof(float));
    for (DeviceBuffer* b : {&d_codes, &d_sc, &d_bi, &d_res, &d_oc, &d_oi, &d_qst}) b->fill(kPoison);
    KVChannelKeysArgs a{};
    a.src_dtype = DType::kF32;
    a.B = B;
    a.H = H;
    a.dim = c.D;
    a.src_stride_b = H * N * c.D;
    a.src_stride_h = N * c.D;
    a.src_stride_t = c.D;
    a.codes = d_codes.as<uint32_t>();
    a.scales = d_sc.data();
    a.biases = d_bi.data();
    a.residual = d_res.as<uint16_t>();
    a.scale_dtype = c.sd;
    a.bits = c.kb;
    a.group_size = c.gs;
    a.capacity = capacity;
    a.blocks = blocks;
    a.outliers = c.outliers;
    if (c.outliers > 0) {
      a.outlier_codes = d_oc.as<uint8_t>();
      a.outlier_index = d_oi.as<uint16_t>();
      a.qstats = d_qst.as<uint8_t>();
    }
    Stream stream;
    const Exec exec{stream.handle(), nullptr, 0};
    DeviceBuffer d_off(sizeof(int32_t));
    // Slices [t0, t0 + m) of keys/values as CPU tensors (copied: the cache reads [B, H, m, D] contiguous).
    auto slice = [&](const std::vector<float>& x, int64_t t0, int64_t m) {
      std::vector<float> out(static_cast<size_t>(B * H * m * c.D));
      for (int64_t bh = 0; bh < B * H; ++bh)
        std::memcpy(out.data() + bh * m * c.D, x.data() + (bh * N + t0) * c.D, static_cast<size_t>(m * c.D) * 4);
      return out;
    };
    auto append_both = [&](int64_t t0, int64_t m, int64_t at, bool device_offset) {
      std::vector<float> ks = slice(keys, t0, m), vs = slice(vals, t0, m);
      if (use_q) {  // the positions' queries [B, Hq, m, D], shown before the append as the model does
        std::vector<float> qm(static_cast<size_t>(B * Hq * m * c.D));
        for (int64_t bh = 0; bh < B * Hq; ++bh)
          std::memcpy(qm.data() + bh * m * c.D, qs.data() + (bh * N + t0) * c.D, static_cast<size_t>(m * c.D) * 4);
        cpu.observe_queries(TensorView(qm.data(), DType::kF32, {B, Hq, m, c.D}));
      }
      cpu.update_and_fetch(TensorView(ks.data(), DType::kF32, {B, H, m, c.D}),
                           TensorView(vs.data(), DType::kF32, {B, H, m, c.D}));
      KVChannelKeysArgs k = a;
      if (use_q) {
        k.q = d_q.as<float>() + t0 * c.D;
        k.Hq = Hq;
        k.q_stride_b = Hq * N * c.D;
        k.q_stride_h = N * c.D;
        k.q_stride_t = c.D;
      }
      k.src = d_src.as<float>() + t0 * c.D;
      k.n = m;
      k.offset = device_offset ? 999999 : at;
      const int32_t at32 = static_cast<int32_t>(at);
      d_off.upload(&at32, sizeof(at32));
      kv_append_channel_keys(k, device_offset ? d_off.as<int32_t>() : nullptr, exec);
      stream.synchronize();
    };
    auto compare = [&](const char* when) {
      SCOPED_TRACE(when);
      const KVTensorView v = cpu.keys();
      ASSERT_EQ(v.layout, 1);
      ASSERT_EQ(v.capacity, capacity);
      ASSERT_EQ(v.blocks, blocks);
      const int64_t len = v.length, nq = len / c.gs;
      const std::vector<uint8_t> codes = download_bytes(d_codes, d_codes.bytes());
      const std::vector<uint8_t> sc = download_bytes(d_sc, d_sc.bytes()), bi = download_bytes(d_bi, d_bi.bytes());
      const std::vector<uint8_t> res = download_bytes(d_res, d_res.bytes());
      EXPECT_TRUE(slabs_equal(codes, static_cast<const uint8_t*>(v.data), B * H, capacity * wpr_bytes,
                              static_cast<size_t>(nq * c.gs) * wpr_bytes, "codes"));
      EXPECT_TRUE(slabs_equal(sc, static_cast<const uint8_t*>(v.scales), B * H, blocks * c.D * ss,
                              static_cast<size_t>(nq * c.D) * ss, "block scales"));
      EXPECT_TRUE(slabs_equal(bi, static_cast<const uint8_t*>(v.biases), B * H, blocks * c.D * ss,
                              static_cast<size_t>(nq * c.D) * ss, "block biases"));
      EXPECT_TRUE(slabs_equal(res, static_cast<const uint8_t*>(v.residual), B * H, c.gs * c.D * 2,
                              static_cast<size_t>((len % c.gs) * c.D) * 2, "residual window"));
      if (c.outliers > 0) {
        ASSERT_EQ(v.outliers, c.outliers);
        const size_t oc_row = static_cast<size_t>(c.outliers * c.gs / 2), oi_row = static_cast<size_t>(c.outliers) * 2;
        EXPECT_TRUE(slabs_equal(download_bytes(d_oc, d_oc.bytes()), static_cast<const uint8_t*>(v.outlier_codes),
                                B * H, static_cast<size_t>(blocks) * oc_row, static_cast<size_t>(nq) * oc_row,
                                "outlier codes"));
        EXPECT_TRUE(slabs_equal(download_bytes(d_oi, d_oi.bytes()), static_cast<const uint8_t*>(v.outlier_index),
                                B * H, static_cast<size_t>(blocks) * oi_row, static_cast<size_t>(nq) * oi_row,
                                "outlier channel indices"));
        const nn::KVCacheSnapshot snap = cpu.snapshot();
        ASSERT_GE(snap.num_planes(), 10u);
        const size_t qrow = static_cast<size_t>(c.D + 1);  // one byte per statistic (quant/kv_stats.h)
        EXPECT_TRUE(slabs_equal(download_bytes(d_qst, d_qst.bytes()), static_cast<const uint8_t*>(snap.plane(9).data()),
                                B * H, static_cast<size_t>(c.gs) * qrow, static_cast<size_t>(len % c.gs) * qrow,
                                "window query statistics"));
      }
    };
    for (auto [t0, m] : runs) append_both(t0, m, t0, m == 1 && t0 == 127);
    ASSERT_NO_FATAL_FAILURE(compare("after the appends"));
    // Trim inside the window (nothing to refill: the device side only moves its length), then back into a
    // quantized block (refill), then append again.
    const int64_t len0 = cpu.offset();
    cpu.trim(3);
    ASSERT_NO_FATAL_FAILURE(compare("after a trim inside the window"));
    const int64_t back = (len0 - 3) % c.gs + c.gs / 2 + 1;  // into the previous, quantized block
    cpu.trim(back);
    kv_channel_refill(a, len0 - 3 - back, exec);
    stream.synchronize();
    ASSERT_NO_FATAL_FAILURE(compare("after a trim back into a quantized block"));
    const int64_t at = cpu.offset();
    append_both(300, std::min<int64_t>(N - 300, capacity - at), at, false);
    ASSERT_NO_FATAL_FAILURE(compare("after appending past the refilled block"));
  }
}

TEST(CudaKvChannel, RejectsBadArguments) {
  CIDER_REQUIRE_GPU();
  DeviceBuffer buf(1 << 16);
  KVChannelKeysArgs a{};
  a.src = buf.data();
  a.src_dtype = DType::kF32;
  a.B = 1;
  a.H = 1;
  a.n = 1;
  a.dim = 64;
  a.codes = buf.as<uint32_t>();
  a.scales = buf.data();
  a.biases = buf.data();
  a.residual = buf.as<uint16_t>();
  a.scale_dtype = DType::kF16;
  a.bits = 4;
  a.group_size = 64;
  a.capacity = 128;
  a.blocks = 2;
  Stream stream;
  const Exec exec{stream.handle(), nullptr, 0};
  kv_append_channel_keys(a, nullptr, exec);  // valid
  stream.synchronize();
  auto bad = [&](auto edit, const char* why) {
    SCOPED_TRACE(why);
    KVChannelKeysArgs b = a;
    edit(b);
    expect_error([&] { kv_append_channel_keys(b, nullptr, exec); }, "cuda.kv_append_channel_keys");
  };
  bad([](KVChannelKeysArgs& b) { b.bits = 7; }, "bits 7");
  bad([](KVChannelKeysArgs& b) { b.group_size = 48; }, "group 48");
  bad([](KVChannelKeysArgs& b) { b.blocks = 1; }, "too few blocks");
  bad([](KVChannelKeysArgs& b) { b.offset = 128; }, "past the capacity");
  bad([](KVChannelKeysArgs& b) { b.residual = nullptr; }, "no window");
  bad([](KVChannelKeysArgs& b) { b.dim = 512; }, "dim 512");
  expect_error([&] { kv_channel_refill(a, 129, exec); }, "cuda.kv_channel_refill");
}

// Attention over per-channel keys (quantized blocks, then the bf16 window) against the reference on the same bytes;
// returns whether the call took the tensor-core decode path (detail::tc_eligible).
struct ChannelCase {
  int64_t D, rep, kL, L;
  MaskKind mask;
  int64_t window;
  int kb, vb, gs;
  DType sd;
  int kv_splits;
  bool device_length;
  float softcap = 0.0f;  // > 0: attention logit softcapping (Gemma 2)
  int outliers = 0;      // outlier key channels per block (chosen from queries shown to the cache)
};
// Runs the case on the device against the reference; returns whether the tensor-core decode path took it. Outlier
// channels off the tensor-core kernels must be refused (kUnsupported, naming them).
bool run_channel_case(const ChannelCase& c, uint64_t salt) {
  SCOPED_TRACE(::testing::Message() << "D " << c.D << " rep " << c.rep << " kL " << c.kL << " L " << c.L << " k" << c.kb
                                    << "v" << c.vb << " g" << c.gs << " " << dtype_name(c.sd) << " mask "
                                    << static_cast<int>(c.mask) << " window " << c.window << " splits "
                                    << c.kv_splits << (c.device_length ? " device length" : "") << " softcap "
                                    << c.softcap << " outliers " << c.outliers);
  auto rng = test::make_rng(salt);
  const int64_t B = 2, Hkv = 2, Hq = Hkv * c.rep;
  nn::QuantizedKVCacheConfig cfg = channel_cache_config(c.kb, c.vb, c.gs, c.sd, salt);
  cfg.key_outliers = c.outliers;
  nn::QuantizedKVCache cache(cfg);
  std::vector<float> kf = test::randn(rng, static_cast<size_t>(B * Hkv * c.kL * c.D), 1.0f);
  for (size_t i = 0; i < kf.size(); i += static_cast<size_t>(c.D)) kf[i] *= 8.0f;  // an outlier channel
  std::vector<float> vf = test::randn(rng, kf.size());
  if (c.outliers > 0) {  // the positions' queries, channel magnitudes varying: the choice weighs them
    std::vector<float> qo = test::randn(rng, static_cast<size_t>(B * Hq * c.kL * c.D));
    for (size_t i = 0; i < qo.size(); ++i) qo[i] *= 0.5f + static_cast<float>((i * 7) % static_cast<size_t>(c.D) % 5);
    cache.observe_queries(TensorView(qo.data(), DType::kF32, {B, Hq, c.kL, c.D}));
  }
  cache.update_and_fetch(TensorView(kf.data(), DType::kF32, {B, Hkv, c.kL, c.D}),
                         TensorView(vf.data(), DType::kF32, {B, Hkv, c.kL, c.D}));
  std::vector<float> q = test::randn(rng, static_cast<size_t>(B * Hq * c.L * c.D));
  for (size_t i = 0; i < q.size(); i += 7) q[i] *= 6.0f;  // query rows with a wide range (the folds' exponents)
  AttentionArgs ref{};
  ref.q = q.data();
  std::vector<float> want(static_cast<size_t>(B * Hq * c.L * c.D));
  ref.out = want.data();
  ref.B = B;
  ref.Hq = Hq;
  ref.L = c.L;
  ref.keys = cache.keys();
  ref.values = cache.values();
  ref.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  ref.softcap = c.softcap;
  ref.mask_kind = c.mask;
  ref.window = c.window;
  ref.mask_dtype = DType::kBool;
  kernels::ref_kernels().attention(ref);
  float vmax = 0.0f;
  for (float x : want) vmax = std::max(vmax, std::fabs(x));

  DeviceView dk = upload_view(cache.keys()), dv = upload_view(cache.values());
  DeviceBuffer d_q = to_device(q.data(), q.size() * sizeof(float));
  const size_t out_n = want.size(), guard = 64;
  DeviceBuffer d_out((out_n + 2 * guard) * sizeof(float));
  d_out.fill(0xFF);
  AttentionArgs a = ref;
  a.q = d_q.as<float>();
  a.out = d_out.as<float>() + guard;
  a.keys = dk.view;
  a.values = dv.view;
  a.kv_splits = c.kv_splits;
  const int32_t len32 = static_cast<int32_t>(c.kL);
  DeviceBuffer d_len = to_device(&len32, sizeof(len32));
  if (c.device_length) {  // a graph's bound above the real length
    a.keys.length = a.values.length = std::min(a.keys.capacity, c.kL + 100);
  }
  const bool tc = detail::tc_eligible(a);
  const size_t ws = attention_workspace_bytes(a);
  DeviceBuffer d_ws(std::max<size_t>(ws, 256));
  Stream& stream = attention_stream();
  const Exec exec{stream.handle(), d_ws.data(), ws};
  if (c.outliers > 0 && !tc && !detail::prefill_tc_eligible(a)) {
    try {
      attention(a, c.device_length ? d_len.as<int32_t>() : nullptr, exec);
      ADD_FAILURE() << "outlier channels ran off the tensor-core kernels";
    } catch (const cider::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported) << e.what();
      EXPECT_NE(std::string(e.what()).find("outlier key channels"), std::string::npos) << e.what();
    }
    return false;
  }
  attention(a, c.device_length ? d_len.as<int32_t>() : nullptr, exec);
  stream.synchronize();
  std::vector<float> got(out_n + 2 * guard);
  d_out.download(got.data(), got.size() * sizeof(float));
  EXPECT_NO_FATAL_FAILURE(expect_guards_untouched(got, out_n, guard));
  // Float32 sums over kL keys and D dims on both sides (the kernels fold each block's scales into the query; the
  // tensor-core path's scores are exact integers of a 2^-22-rounded query, its value weights 22-bit).
  const double tol = 1e-5 * std::sqrt(static_cast<double>(c.kL) + 1.0) * (vmax + 1.0);
  EXPECT_TRUE(test::all_close(got.data() + guard, want.data(), out_n, tol, 1e-5));
  return tc;
}

TEST(CudaAttention, PerChannelKeysMatchReference) {
  CIDER_REQUIRE_GPU();
  const ChannelCase cases[] = {
      {128, 4, 1000, 1, MaskKind::kCausal, 0, 4, 4, 64, DType::kF16, 0, false},
      {128, 4, 1000, 1, MaskKind::kCausal, 0, 5, 5, 64, DType::kF16, 0, true},
      {128, 8, 4097, 1, MaskKind::kCausal, 0, 4, 4, 64, DType::kF16, 0, false},
      {128, 1, 37, 1, MaskKind::kNone, 0, 4, 3, 64, DType::kF16, 0, false},       // window only
      {128, 4, 64, 3, MaskKind::kCausal, 0, 4, 4, 64, DType::kF16, 0, false},     // one full block, empty window
      {64, 2, 333, 17, MaskKind::kCausal, 50, 3, 3, 32, DType::kBF16, 3, false},  // sliding window, 3 splits
      {256, 2, 700, 5, MaskKind::kCausal, 0, 5, 4, 128, DType::kF32, 0, false},
      {256, 4, 900, 1, MaskKind::kCausal, 0, 4, 4, 64, DType::kF16, 7, false},
      {128, 2, 1500, 67, MaskKind::kCausal, 0, 2, 2, 64, DType::kF16, 0, false},  // prefill-sized L
      {64, 1, 129, 16, MaskKind::kNone, 0, 8, 4, 64, DType::kBF16, 2, false},
      {128, 4, 1000, 1, MaskKind::kCausal, 0, 4, 4, 64, DType::kF16, 0, true, 0.5f},     // softcapped: K4V4 kernel
      {128, 2, 700, 5, MaskKind::kCausal, 60, 5, 5, 64, DType::kF16, 3, false, 2.0f},   // K5V5 kernel
      {64, 2, 333, 17, MaskKind::kCausal, 50, 3, 3, 32, DType::kBF16, 0, false, 0.5f},  // run-time kernel
  };
  // The CUDA-core kernels here (the K4V4 g64 f16 decode cases take the tensor cores unless switched off).
  const ScopedEnv off("CIDER_ATTN_TC_KCHAN", "0");
  uint64_t salt = 7300;
  for (const ChannelCase& c : cases) EXPECT_FALSE(run_channel_case(c, ++salt));
}

// The tensor-core decode path for per-channel keys (K4V4, K5V4 and K5V5, blocks of 64, f16 scales, D 128/256, R = rep·L ≤ 8): each
// warp folds its blocks' scales into its own query digits; the window block is scored from bf16 on the tensor
// cores. Rows 1..8 (packed and three-chain layouts), lengths with and without a window tail (1 key, exactly whole
// blocks, block + 1), masks, sliding windows that start mid-block, forced splits, a device length below the bound,
// softcap; each case also with $CIDER_ATTN_TC_KCHAN=0 (the CUDA-core kernel), both against the reference.
TEST(CudaAttention, TensorCoreDecodePerChannelKeys) {
  CIDER_REQUIRE_GPU();
  struct RL {
    int64_t rep, L;
  };
  const RL rls[] = {{4, 1}, {1, 1}, {8, 1}, {2, 3}, {4, 2}, {3, 1}, {1, 8}, {7, 1}};
  const int64_t kLs[] = {1, 63, 64, 65, 200, 4097, 20000, 4160};
  uint64_t salt = 7600;
  int k = 0;
  for (int64_t D : {128, 256})
    for (const RL& rl : rls)
      for (int64_t kL : {kLs[k % 8], kLs[(k + 3) % 8]}) {
        ++k;
        if (rl.L > kL) continue;
        const MaskKind mask = (k % 3 == 0) ? MaskKind::kNone : MaskKind::kCausal;
        const int64_t window = (k % 4 == 2 && mask == MaskKind::kCausal) ? std::max<int64_t>(1, kL / 3) : 0;
        const int splits = (k % 5 == 1) ? 3 : (k % 5 == 3 ? 1 : 0);
        const bool dlen = k % 6 == 5;
        const float cap = k % 7 == 4 ? 1.5f : 0.0f;
        const int kb = k % 2 == 0 ? 5 : 4;      // 5-bit keys: the CPU default's width
        const int vb = kb == 5 && k % 4 == 0 ? 5 : 4;  // K5V5: the previous CPU default
        const ChannelCase c{D, rl.rep, kL, rl.L, mask, window, kb, vb, 64, DType::kF16, splits, dlen, cap};
        EXPECT_TRUE(run_channel_case(c, ++salt));
        const ScopedEnv off("CIDER_ATTN_TC_KCHAN", "0");
        EXPECT_FALSE(run_channel_case(c, salt));
      }
  // Long caches, the model's shapes (Llama-3-8B decode rep 4; Gemma-like D256 rep 8).
  EXPECT_TRUE(run_channel_case({128, 4, 33000, 1, MaskKind::kCausal, 0, 4, 4, 64, DType::kF16, 0, false}, ++salt));
  EXPECT_TRUE(run_channel_case({256, 8, 20000, 1, MaskKind::kCausal, 0, 4, 4, 64, DType::kF16, 0, true}, ++salt));
  EXPECT_TRUE(run_channel_case({128, 4, 5000, 2, MaskKind::kCausal, 700, 4, 4, 64, DType::kF16, 64, false}, ++salt));
  EXPECT_TRUE(run_channel_case({128, 4, 33000, 1, MaskKind::kCausal, 0, 5, 4, 64, DType::kF16, 0, false}, ++salt));
  EXPECT_TRUE(run_channel_case({256, 8, 20000, 1, MaskKind::kCausal, 0, 5, 4, 64, DType::kF16, 0, true}, ++salt));
  EXPECT_TRUE(run_channel_case({128, 4, 33000, 1, MaskKind::kCausal, 0, 5, 5, 64, DType::kF16, 0, false}, ++salt));
  // Outlier channels (the CPU default's k5v4 + Dk/32; up to Dk/16 with K4V4 and K5V5): each block's refinement term,
  // lengths with and without a window tail, packed and three-chain rows, splits, windows, a device length, softcap;
  // with the tensor cores off (or more than Dk/16 channels) the call is refused.
  struct OC {
    int64_t D, rep, kL, L;
    int kb, vb, n;
    MaskKind mask;
    int64_t window;
    int splits;
    bool dlen;
    float cap;
  };
  const OC ocs[] = {{128, 4, 1000, 1, 5, 4, 4, MaskKind::kCausal, 0, 0, false, 0.0f},
                    {128, 1, 65, 1, 5, 4, 4, MaskKind::kCausal, 0, 0, false, 0.0f},
                    {128, 8, 4160, 1, 4, 4, 8, MaskKind::kCausal, 0, 3, false, 0.0f},
                    {128, 2, 640, 3, 5, 5, 8, MaskKind::kCausal, 100, 0, true, 0.0f},
                    {128, 1, 64, 8, 4, 4, 4, MaskKind::kNone, 0, 0, false, 1.5f},
                    {128, 4, 33000, 1, 5, 4, 4, MaskKind::kCausal, 0, 0, false, 0.0f},
                    {256, 8, 20000, 1, 5, 4, 8, MaskKind::kCausal, 0, 0, true, 0.0f},
                    {256, 4, 700, 2, 4, 4, 16, MaskKind::kCausal, 0, 1, false, 0.0f},
                    {256, 2, 129, 1, 5, 5, 8, MaskKind::kCausal, 50, 0, false, 0.0f}};
  for (const OC& o : ocs) {
    const ChannelCase c{o.D, o.rep, o.kL, o.L, o.mask, o.window, o.kb, o.vb, 64, DType::kF16, o.splits, o.dlen, o.cap, o.n};
    EXPECT_TRUE(run_channel_case(c, ++salt));
    const ScopedEnv off("CIDER_ATTN_TC_KCHAN", "0");
    EXPECT_FALSE(run_channel_case(c, salt));
  }
  EXPECT_FALSE(run_channel_case({128, 4, 300, 1, MaskKind::kCausal, 0, 5, 4, 64, DType::kF16, 0, false, 0.0f, 9}, ++salt));
  // Not this path: bf16 scales, other widths (more than 8 rows take the f16 prefill kernel: PrefillF16PerChannelKeys).
  EXPECT_FALSE(run_channel_case({128, 4, 300, 1, MaskKind::kCausal, 0, 4, 4, 64, DType::kBF16, 0, false}, ++salt));
  EXPECT_FALSE(run_channel_case({128, 4, 300, 1, MaskKind::kCausal, 0, 6, 4, 64, DType::kF16, 0, false}, ++salt));
  EXPECT_FALSE(run_channel_case({128, 4, 300, 1, MaskKind::kCausal, 0, 4, 5, 64, DType::kF16, 0, false}, ++salt));
}

// The f16 prefill kernel over per-channel keys (K4V4 / K5V4, blocks of 64, f16 scales, D 128/256, more than 8 rows per KV
// head): quantized blocks dequantized with their per-channel scales, k̃ = fl16(s_d·c + b_d); the window's bf16 rows
// taken as fl16(k). Against the emulation of that contract (tight) and the exact reference (loose), and the same call
// on the CUDA-core kernel ($CIDER_ATTN_TC_KCHAN=0) against the reference: chunked and whole prefills, window tails,
// causal and none, sliding windows starting mid-block, forced splits, a device length, softcap, 8 and 12 warps.
TEST(CudaAttention, PrefillF16PerChannelKeys) {
  CIDER_REQUIRE_GPU();
  struct Case {
    int64_t D, rep, kL, L;
    MaskKind mask;
    int64_t window;
    int splits;
    bool device_length;
    float softcap;
    const char* warps;
    int kb, vb = 4;
    int outliers = 0;
  };
  const Case cases[] = {
      {128, 4, 300, 300, MaskKind::kCausal, 0, 0, false, 0.0f, "auto", 4},    // whole prefill, window tail 44
      {128, 4, 1000, 512, MaskKind::kCausal, 0, 0, false, 0.0f, "12", 4},     // a chunk after 488 cached keys
      {128, 1, 200, 17, MaskKind::kNone, 0, 3, false, 0.0f, "8", 4},
      {128, 8, 640, 64, MaskKind::kCausal, 100, 0, true, 0.0f, "auto", 4},    // sliding window, device length
      {128, 2, 4097, 129, MaskKind::kCausal, 0, 5, false, 1.5f, "auto", 4},   // softcap, splits
      {256, 2, 700, 200, MaskKind::kCausal, 0, 0, false, 0.0f, "auto", 4},
      {256, 8, 129, 33, MaskKind::kCausal, 50, 2, false, 0.0f, "auto", 4},
      {256, 4, 64, 64, MaskKind::kCausal, 0, 0, true, 0.0f, "auto", 4},       // one full block, empty window
      {128, 4, 1000, 512, MaskKind::kCausal, 0, 0, false, 0.0f, "12", 5},     // 5-bit keys
      {128, 8, 640, 64, MaskKind::kCausal, 100, 3, true, 0.0f, "8", 5},
      {256, 2, 700, 200, MaskKind::kCausal, 0, 0, false, 1.5f, "auto", 5},
      {128, 4, 1000, 512, MaskKind::kCausal, 0, 2, false, 0.0f, "auto", 5, 5},  // K5V5
      {256, 8, 129, 33, MaskKind::kCausal, 50, 0, true, 0.0f, "auto", 5, 5},
      // outlier key channels: Dk/32 (the CPU default) and Dk/16
      {128, 4, 1000, 512, MaskKind::kCausal, 0, 0, false, 0.0f, "12", 5, 4, 4},
      {128, 8, 640, 64, MaskKind::kCausal, 100, 3, true, 0.0f, "8", 4, 4, 8},
      {256, 2, 700, 200, MaskKind::kCausal, 0, 0, false, 1.5f, "auto", 5, 4, 8},
      {256, 8, 129, 33, MaskKind::kCausal, 50, 2, true, 0.0f, "auto", 5, 5, 16},
  };
  uint64_t salt = 8100;
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "D " << c.D << " rep " << c.rep << " kL " << c.kL << " L " << c.L << " mask "
                                      << static_cast<int>(c.mask) << " window " << c.window << " splits " << c.splits
                                      << (c.device_length ? " device length" : "") << " softcap " << c.softcap
                                      << " warps " << c.warps << " k" << c.kb << "v" << c.vb << " outliers "
                                      << c.outliers);
    auto rng = test::make_rng(++salt);
    const int64_t B = 2, Hkv = 2, Hq = Hkv * c.rep;
    nn::QuantizedKVCacheConfig cfg = channel_cache_config(c.kb, c.vb, 64, DType::kF16, salt);
    cfg.key_outliers = c.outliers;
    nn::QuantizedKVCache cache(cfg);
    std::vector<float> kf = test::randn(rng, static_cast<size_t>(B * Hkv * c.kL * c.D), 1.0f);
    for (size_t i = 0; i < kf.size(); i += static_cast<size_t>(c.D)) kf[i] *= 8.0f;  // an outlier channel
    std::vector<float> vf = test::randn(rng, kf.size());
    if (c.outliers > 0) {
      std::vector<float> qo = test::randn(rng, static_cast<size_t>(B * Hq * c.kL * c.D));
      for (size_t i = 0; i < qo.size(); ++i) qo[i] *= 0.5f + static_cast<float>((i * 7) % static_cast<size_t>(c.D) % 5);
      cache.observe_queries(TensorView(qo.data(), DType::kF32, {B, Hq, c.kL, c.D}));
    }
    cache.update_and_fetch(TensorView(kf.data(), DType::kF32, {B, Hkv, c.kL, c.D}),
                           TensorView(vf.data(), DType::kF32, {B, Hkv, c.kL, c.D}));
    std::vector<float> q = test::randn(rng, static_cast<size_t>(B * Hq * c.L * c.D));
    const KVTensorView K = cache.keys(), V = cache.values();
    AttentionArgs ref{};
    ref.q = q.data();
    std::vector<float> want(static_cast<size_t>(B * Hq * c.L * c.D));
    ref.out = want.data();
    ref.B = B;
    ref.Hq = Hq;
    ref.L = c.L;
    ref.keys = K;
    ref.values = V;
    ref.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
    ref.softcap = c.softcap;
    ref.mask_kind = c.mask;
    ref.window = c.window;
    ref.mask_dtype = DType::kBool;
    kernels::ref_kernels().attention(ref);
    // The kernel's rows: keys from the blocks' per-channel scales or the bf16 window, values per row (f16 planes).
    const int64_t nq = c.kL / 64 * 64;
    auto key_row = [&](int64_t bh, int64_t j, std::vector<double>& out) {
      out.resize(static_cast<size_t>(c.D));
      for (int64_t d = 0; d < c.D; ++d) {
        double x;
        if (j < nq) {
          const auto* words = static_cast<const uint32_t*>(K.data) + (bh * K.capacity + j) * c.D * c.kb / 32;
          const int64_t srow = (bh * K.blocks + j / 64) * c.D + d;
          x = round_to_f16(static_cast<double>(f16_to_f32(static_cast<const uint16_t*>(K.scales)[srow])) *
                               static_cast<double>(quant::unpack_code(words, d, c.kb)) +
                           static_cast<double>(f16_to_f32(static_cast<const uint16_t*>(K.biases)[srow])));
          for (int o = 0; o < c.outliers; ++o) {  // an outlier channel: fl16(k̃ + (|s|/15)·(r − 7.5))
            const int64_t orow = (bh * K.blocks + j / 64) * c.outliers + o;
            if (static_cast<const uint16_t*>(K.outlier_index)[orow] != d) continue;
            const uint8_t byte = static_cast<const uint8_t*>(K.outlier_codes)[orow * 32 + (j % 64) / 2];
            const double r = static_cast<double>((byte >> (4 * (j % 2))) & 15);
            const double sd = std::fabs(static_cast<double>(f16_to_f32(static_cast<const uint16_t*>(K.scales)[srow])));
            x = round_to_f16(x + sd / 15.0 * (r - 7.5));
          }
        } else {
          const uint16_t bits = static_cast<const uint16_t*>(K.residual)[(bh * 64 + j % 64) * c.D + d];
          const uint32_t u = static_cast<uint32_t>(bits) << 16;
          float f;
          std::memcpy(&f, &u, 4);
          x = round_to_f16(f);
        }
        out[static_cast<size_t>(d)] = x;
      }
    };
    auto value_row = [&](int64_t bh, int64_t j, std::vector<double>& out) {
      out.resize(static_cast<size_t>(c.D));
      const auto* words = static_cast<const uint32_t*>(V.data) + (bh * V.capacity + j) * c.D * c.vb / 32;
      const auto* sc = static_cast<const uint16_t*>(V.scales) + (bh * V.capacity + j) * (c.D / 64);
      const auto* bi = static_cast<const uint16_t*>(V.biases) + (bh * V.capacity + j) * (c.D / 64);
      for (int64_t d = 0; d < c.D; ++d)
        out[static_cast<size_t>(d)] =
            round_to_f16(static_cast<double>(f16_to_f32(sc[d / 64])) * static_cast<double>(quant::unpack_code(words, d, c.vb)) +
                         static_cast<double>(f16_to_f32(bi[d / 64])));
    };
    const F16Emulation em = emulate_f16_prefill_rows(q, key_row, value_row, B, Hq, Hkv, c.L, c.kL, c.D, ref.scale,
                                                     c.mask, c.window, c.softcap);

    DeviceView dk = upload_view(K), dv = upload_view(V);
    DeviceBuffer d_q = to_device(q.data(), q.size() * sizeof(float));
    const size_t out_n = want.size(), guard = 64;
    const int32_t len32 = static_cast<int32_t>(c.kL);
    DeviceBuffer d_len = to_device(&len32, sizeof(len32));
    for (const char* kchan : {"1", "0"}) {
      SCOPED_TRACE(::testing::Message() << "CIDER_ATTN_TC_KCHAN=" << kchan);
      if (c.outliers > 0 && kchan[0] == '0') {  // refused off the tensor cores
        const ScopedEnv env("CIDER_ATTN_TC_KCHAN", kchan);
        AttentionArgs a = ref;
        a.q = d_q.as<float>();
        DeviceBuffer d_out(out_n * sizeof(float));
        a.out = d_out.as<float>();
        a.keys = dk.view;
        a.values = dv.view;
        const size_t ws = attention_workspace_bytes(a);
        DeviceBuffer d_ws(std::max<size_t>(ws, 256));
        const Exec exec{attention_stream().handle(), d_ws.data(), ws};
        EXPECT_THROW(attention(a, nullptr, exec), cider::Error);
        continue;
      }
      const ScopedEnv env("CIDER_ATTN_TC_KCHAN", kchan);
      const ScopedEnv warps("CIDER_ATTN_PREFILL_F16_WARPS", c.warps);
      DeviceBuffer d_out((out_n + 2 * guard) * sizeof(float));
      d_out.fill(0xFF);
      AttentionArgs a = ref;
      a.q = d_q.as<float>();
      a.out = d_out.as<float>() + guard;
      a.keys = dk.view;
      a.values = dv.view;
      a.kv_splits = c.splits;
      if (c.device_length) a.keys.length = a.values.length = std::min(a.keys.capacity, c.kL + 100);
      const bool tc = kchan[0] == '1';
      EXPECT_EQ(detail::prefill_tc_eligible(a), tc);
      const size_t ws = attention_workspace_bytes(a);
      DeviceBuffer d_ws(std::max<size_t>(ws, 256));
      Stream& stream = attention_stream();
      const Exec exec{stream.handle(), d_ws.data(), ws};
      attention(a, c.device_length ? d_len.as<int32_t>() : nullptr, exec);
      stream.synchronize();
      std::vector<float> got(out_n + 2 * guard);
      d_out.download(got.data(), got.size() * sizeof(float));
      EXPECT_NO_FATAL_FAILURE(expect_guards_untouched(got, out_n, guard));
      if (tc) {
        EXPECT_TRUE(within_row_bounds(got.data() + guard, em.out.data(), em.tight, c.D)) << "vs the emulation";
        EXPECT_TRUE(within_row_bounds(got.data() + guard, want.data(), em.loose, c.D)) << "vs the reference";
      } else {
        float vmax = 0.0f;
        for (float x : want) vmax = std::max(vmax, std::fabs(x));
        const double tol = 1e-5 * std::sqrt(static_cast<double>(c.kL) + 1.0) * (vmax + 1.0);
        EXPECT_TRUE(test::all_close(got.data() + guard, want.data(), out_n, tol, 1e-5));
      }
    }
  }
}

TEST(CudaAttention, RejectsBadArguments) {
  CIDER_REQUIRE_GPU();
  DeviceBuffer buf(1 << 20);
  AttentionArgs good = well_formed_args(buf, /*out_offset=*/0, /*L=*/1, /*length=*/10, /*capacity=*/16);
  Exec exec{nullptr, buf.data(), buf.bytes()};
  auto bad = [&](auto mutate) {
    AttentionArgs a = good;
    mutate(a);
    expect_error([&] { attention(a, nullptr, exec); }, "cuda.attention");
  };
  bad([](AttentionArgs& a) { a.mask_kind = MaskKind::kBool; });
  bad([](AttentionArgs& a) { a.mask_kind = MaskKind::kAdditive; });
  bad([](AttentionArgs& a) { a.keys.bits = 7; });
  bad([](AttentionArgs& a) { a.values.group_size = 48; });
  bad([](AttentionArgs& a) { a.Hq = 3; });
  bad([](AttentionArgs& a) { a.keys.dim = 96; });
  bad([](AttentionArgs& a) { a.values.length = 9; });
  bad([](AttentionArgs& a) { a.keys.length = 17; });
  bad([](AttentionArgs& a) { a.keys.bits = 0; a.keys.dtype = DType::kI8; });
  bad([](AttentionArgs& a) { a.softcap = -1.0f; });
  bad([](AttentionArgs& a) { a.softcap = std::nanf(""); });
  bad([](AttentionArgs& a) { a.softcap = INFINITY; });
  {  // a cache of 2^31 keys: the split arithmetic is 32-bit, so it is refused before any plan or launch
    AttentionArgs a = good;
    a.keys.length = a.values.length = a.keys.capacity = a.values.capacity = int64_t{1} << 31;
    try {
      attention(a, nullptr, exec);
      ADD_FAILURE() << "a 2^31-key cache was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kOutOfRange);
      EXPECT_NE(std::string(e.what()).find("below 2^31"), std::string::npos) << e.what();
    }
  }
  try {
    AttentionArgs a = good;
    a.mask_kind = MaskKind::kBool;
    attention(a, nullptr, exec);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
  {  // a workspace too small for the split partials
    AttentionArgs a = good;
    a.keys.length = a.values.length = 16;
    a.kv_splits = 4;
    Exec small{nullptr, buf.data(), 16};
    ASSERT_GT(attention_workspace_bytes(a), size_t{16});
    expect_error([&] { attention(a, nullptr, small); }, "cuda.attention");
  }
}

}  // namespace
}  // namespace cider::cuda
