// ISA-independent parts of the x86 attention kernels (baseline flags): planning, masks, query quantization, the
// log-sum-exp merge of key-range splits, threads and scratch. See attention_x86.h.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <numeric>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/x86/attention_x86.h"
#include "quant/affine.h"

namespace cider::kernels::x86 {

void register_attention_avx2(KernelTable& t) {
  t.attention = &avx2::attention;
  t.kv_append = &avx2::kv_append;
}

void register_attention_avx512(KernelTable& t) {
  t.attention = &avx512::attention;
  t.kv_append = &avx512::kv_append;
}

namespace attn {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

bool fast_path_supported(const AttentionArgs& a) {
  // Value rows of at least 16 bytes (the code unpack reads 16-byte windows inside a row): all but Dv = 32 with
  // 2- or 3-bit values.
  return a.keys.bits > 0 && a.values.bits > 0 && a.keys.dim % a.keys.group_size == 0 &&
         a.values.dim % a.values.group_size == 0 && a.keys.group_size % 32 == 0 && a.values.group_size % 32 == 0 &&
         a.values.dim * a.values.bits >= 128;
}

Plan make_plan(const AttentionArgs& a, int threads, int64_t max_rows) {
  Plan p{};
  const int64_t Hkv = a.keys.H, kL = a.keys.length;
  p.threads = threads > 0 ? threads : num_threads();
  p.rep = a.Hq / Hkv;
  p.lb = std::min<int64_t>(a.L, std::max<int64_t>(1, max_rows / p.rep));
  p.qblocks = (a.L + p.lb - 1) / p.lb;
  const int64_t items0 = a.B * Hkv * p.qblocks;
  if (a.kv_splits > 0) {
    p.splits = a.kv_splits;
  } else if (p.threads == 1 || items0 % p.threads == 0 || items0 >= 8 * p.threads) {
    p.splits = 1;  // whole items already balance the threads
  } else {
    p.splits = p.threads / std::gcd<int64_t>(items0, p.threads);
  }
  p.splits = std::max<int64_t>(1, std::min<int64_t>(p.splits, (kL + kTileRows - 1) / kTileRows));
  p.items = items0 * p.splits;
  p.max_rows = p.rep * p.lb;
  p.partial_floats = p.max_rows * (2 + a.values.dim);
  return p;
}


Item item_of(const AttentionArgs& a, const Plan& p, int64_t index) {
  Item it{};
  const int64_t Hkv = a.keys.H, kL = a.keys.length;
  const int64_t s = index % p.splits;
  int64_t rest = index / p.splits;
  it.g = rest % Hkv;
  rest /= Hkv;
  it.b = rest % a.B;
  const int64_t qb = rest / a.B;
  it.i0 = qb * p.lb;
  it.nl = std::min<int64_t>(p.lb, a.L - it.i0);
  it.R = p.rep * it.nl;
  // Keys any row of the block may see.
  int64_t vlo = 0, vhi = kL;
  if (a.mask_kind == MaskKind::kCausal) {
    vhi = kL - a.L + it.i0 + it.nl;  // last row's position + 1
    if (a.window > 0) vlo = std::max<int64_t>(0, kL - a.L + it.i0 - a.window + 1);
  }
  if (a.exact_block > 0) {  // the recent block is read elsewhere: the last row's bound is the largest; the first too
    vhi = std::min(vhi, recent_block_start(kL - a.L + it.i0 + it.nl - 1, a.exact_block, a.exact_lo));
    vlo = std::max(vlo, a.exact_sink);
  }
  if (vhi < vlo) vhi = vlo;
  // Split the tiles of [vlo, vhi) into p.splits near-equal pieces (tile boundaries never shared).
  const int64_t t0 = vlo / kTileRows, t1 = (vhi + kTileRows - 1) / kTileRows, n = t1 - t0;
  const int64_t ta = t0 + s * n / p.splits, tb = t0 + (s + 1) * n / p.splits;
  it.klo = std::max(vlo, ta * kTileRows);
  it.khi = std::min(vhi, tb * kTileRows);
  if (it.khi < it.klo) it.khi = it.klo;
  return it;
}

void row_range(const AttentionArgs& a, const Item& it, int64_t r, int64_t* lo, int64_t* hi) {
  *lo = it.klo;
  *hi = it.khi;
  const int64_t pos = a.keys.length - a.L + it.i0 + r % it.nl;
  if (a.exact_block > 0) {
    *hi = std::min(*hi, recent_block_start(pos, a.exact_block, a.exact_lo));
    *lo = std::max(*lo, a.exact_sink);
  }
  if (a.mask_kind == MaskKind::kCausal) {
    *hi = std::min(*hi, pos + 1);
    if (a.window > 0) *lo = std::max(*lo, pos - a.window + 1);
  }
  if (*hi < *lo) *hi = *lo;
}

void fetch_mask(const AttentionArgs& a, const Item& it, int64_t r, int64_t j0, int n, float* out) {
  const int64_t hq = it.g * (a.Hq / a.keys.H) + r / it.nl, i = it.i0 + r % it.nl;
  const int64_t base = it.b * a.mask_stride[0] + hq * a.mask_stride[1] + i * a.mask_stride[2];
  for (int k = 0; k < n; ++k) {
    const int64_t off = base + (j0 + k) * a.mask_stride[3];
    if (a.mask_kind == MaskKind::kBool) {
      out[k] = static_cast<const uint8_t*>(a.mask)[off] != 0 ? 0.0f : kNegInf;
    } else {
      out[k] = load_float(a.mask, a.mask_dtype, off);
    }
  }
}

void merge_partials(const AttentionArgs& a, const Plan& p, const float* partials) {
  const int64_t Dv = a.values.dim, Hkv = a.keys.H;
  std::vector<float> o(static_cast<size_t>(Dv));
  for (int64_t base = 0; base < p.items; base += p.splits) {
    const Item it = item_of(a, p, base);
    for (int64_t r = 0; r < it.R; ++r) {
      const int64_t hq = it.g * p.rep + r / it.nl, i = it.i0 + r % it.nl;
      float* dst = a.out + ((it.b * a.Hq + hq) * a.L + i) * Dv;
      float m = kNegInf;
      for (int64_t s = 0; s < p.splits; ++s) m = std::max(m, partials[(base + s) * p.partial_floats + r * (2 + Dv)]);
      float* lse = a.lse != nullptr ? a.lse + (it.b * a.Hq + hq) * a.L + i : nullptr;
      if (m == kNegInf) {
        std::fill(dst, dst + Dv, 0.0f);
        if (lse != nullptr) *lse = kNegInf;
        continue;
      }
      float l = 0.0f;
      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t s = 0; s < p.splits; ++s) {
        const float* part = partials + (base + s) * p.partial_floats + r * (2 + Dv);
        if (part[0] == kNegInf) continue;
        const float w = std::exp(part[0] - m);
        l += w * part[1];
        for (int64_t d = 0; d < Dv; ++d) o[static_cast<size_t>(d)] += w * part[2 + d];
      }
      for (int64_t d = 0; d < Dv; ++d) dst[d] = o[static_cast<size_t>(d)] / l;
      if (lse != nullptr) *lse = m + std::log(l);
    }
  }
  (void)Hkv;
}

int64_t query_group_size(const AttentionArgs& a) {
  return a.keys.layout == 1 && a.keys.dim <= 256 ? a.keys.dim : a.keys.group_size;
}

void outlier_weights(const AttentionArgs& a, const Plan& p, const Item& it, int64_t blk, float* ow, float* ob) {
  const KVTensorView& K = a.keys;
  const int64_t n = K.outliers, srow = ((it.b * K.H + it.g) * K.blocks + blk) * K.dim;
  const auto* index = static_cast<const uint16_t*>(K.outlier_index) + ((it.b * K.H + it.g) * K.blocks + blk) * n;
  for (int64_t r = 0; r < it.R; ++r) ob[r] = 0.0f;  // Σ_o ow[r, o] first, in channel order
  float step[32];  // the channels' steps, read once per block for every row (chunks of 32 channels)
  for (int64_t o0 = 0; o0 < n; o0 += 32) {
    const int64_t m = std::min<int64_t>(32, n - o0);
    for (int64_t o = 0; o < m; ++o)
      step[o] = quant::outlier_step(load_float(K.scales, K.scale_dtype, srow + index[o0 + o]));
    for (int64_t r = 0; r < it.R; ++r) {
      const int64_t hq = it.g * p.rep + r / it.nl, i = it.i0 + r % it.nl;
      const float* q = a.q + ((it.b * a.Hq + hq) * a.L + i) * K.dim;
      for (int64_t o = 0; o < m; ++o) {
        ow[r * n + o0 + o] = a.scale * q[index[o0 + o]] * step[o];
        ob[r] += ow[r * n + o0 + o];
      }
    }
  }
  for (int64_t r = 0; r < it.R; ++r) ob[r] *= -7.5f;
}

bool float_scores_requested() {
  const char* v = std::getenv("CIDER_ATTN_SCORES");
  return v != nullptr && std::string(v) == "f32";
}

void run_items(int64_t n, void (*fn)(void* ctx, int64_t item), void* ctx) {
  if (n <= 0) return;
  ThreadPool& pool = default_thread_pool();
  const int64_t T = std::min<int64_t>(n, pool.size());
  if (T == 1) {
    for (int64_t i = 0; i < n; ++i) fn(ctx, i);
    return;
  }
  pool.parallel_for(T, [&](int64_t begin, int64_t end, int) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t i = t; i < n; i += T) fn(ctx, i);
  });
}

namespace {
struct AlignedScratch {
  void* data = nullptr;
  size_t size = 0;
  ~AlignedScratch() { std::free(data); }
};
}  // namespace

void* thread_scratch(size_t bytes) {
  thread_local AlignedScratch s;
  if (s.size < bytes) {
    std::free(s.data);
    s.data = nullptr;
    s.size = 0;
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    s.data = std::aligned_alloc(64, rounded);
    if (!s.data) throw std::bad_alloc();
    s.size = rounded;
  }
  return s.data;
}

float* partial_buffer(size_t floats) {
  thread_local std::vector<float> buf;
  if (buf.size() < floats) buf.resize(floats);
  return buf.data();
}

}  // namespace attn

}  // namespace cider::kernels::x86
