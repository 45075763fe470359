// attention_bench: decode attention over a packed KV cache, timed per ISA level (issue 4).
//
// Cases: Hq query heads sharing Hkv KV heads (default Hq 32, Hkv 8), head dim D, kL cached keys, one query row (B = 1,
// L = 1, decode), K4/V3 group 64 f16 scales (or --kbits/--vbits/--group; --kv-layout channel: per-channel keys,
// scales per block of group positions, a bf16 residual window of group rows, read only past the last full block). The kernel entry is called directly
// (kernels_for_isa(level).attention) on storage laid out as the cache stores it (docs/kv_cache.md); codes, scales
// and biases are random bytes of the right ranges — the kernel's time does not depend on their values.
//   hot:    one cache, every call reads it again (what llama.cpp's test-backend-ops perf mode does: its K/V stay in
//           the last-level cache when they fit);
//   stream: calls rotate over distinct copies whose total exceeds --pool-mb (default 1024 MiB), so each call reads
//           its cache from DRAM as a real decode step reads one layer's cache.
// Also printed: "nn" = nn::attention on a QuantizedKVCache (query rotation, kernel, inverse rotation, output copy)
// for the first case, hot; kv_append (rotate + quantize + store, D 128, 1 and 512 rows) per level with the
// reference; with --prefill, one prefill chunk per case (512 causal query rows over the cache: query blocks × key
// tiles, fully masked tiles skipped).
// Output: one line per case (best / median / max ms over --reps calls after one warm-up, GB/s of cache bytes at the
// best time), or JSON lines with --json. tools/bench_attention_peers.sh runs it interleaved with llama.cpp.
// The same code is `cider bench attention [options]` (apps/bench.cpp includes this file with
// CIDER_ATTENTION_BENCH_NO_MAIN defined and calls cider::bench_attention::main_with_args), so both take the same
// options and print the same table.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <utility>
#include <sstream>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <time.h>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/kernel_table.h"
#include "nn/attention.h"
#include "nn/kv_cache.h"
#include "nn/rotation.h"
#include "quant/affine.h"

namespace cider::bench_attention {

namespace {

using cider::DType;
using cider::kernels::AttentionArgs;
using cider::kernels::KVTensorView;

struct Options {
  std::vector<int64_t> ctx = {8192, 32768};
  std::vector<int64_t> dims = {128, 256};
  int64_t hq = 32, hkv = 8, L = 1;
  int kbits = 4, vbits = 3, group = 64;
  bool kchan = false;  // --kv-layout channel: per-channel keys (scales [blocks, D], a bf16 residual window)
  int outliers = 0;    // --kv-outliers N (with --kv-layout channel): refined channels per block (random codes)
  bool vsym = false;   // --kv-values symmetric: value steps only, no value biases (KVTensorView::symmetric)
  bool recent = false; // --kv-recent exact: the "nn" row reads each query's own block from bfloat16 (nn::attention)
  int reps = 20;
  int threads = 0;
  int64_t pool_mb = 1024;
  std::string isa;    // empty = every level this machine runs, highest first
  std::string mode = "hot,stream";
  bool json = false;
  bool nn = true;
  bool cputime = false;  // time with the process CPU clock (a loaded machine; meaningful with --threads 1)
  bool append = true;    // also time kv_append (rotate + quantize + store) per level, reference included
  bool prefill = false;  // also time one prefill chunk (L = 512 causal queries over the last 512 of the keys)
};

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int64_t v = std::strtoll(item.c_str(), nullptr, 10);
    if (!item.empty() && (item.back() == 'k' || item.back() == 'K')) v *= 1024;
    out.push_back(v);
  }
  return out;
}

void usage(const char* prog) {
  std::printf(
      "usage: %s [--ctx 8k,32k] [--dims 128,256] [--hq 32] [--hkv 8] [--L 1] [--kbits 4] [--vbits 3]\n"
      "         [--group 64] [--kv-layout token|channel] [--kv-outliers N] [--kv-values affine|symmetric] [--kv-recent quantized|exact] [--reps 20] [--threads N] [--pool-mb 1024] [--isa ref|avx2|avx512]\n"
      "         [--mode hot,stream] [--no-nn] [--no-append] [--prefill] [--hugepages] [--json] [--cputime]\n"
      "decode attention (B 1, L query rows) over a packed K/V cache, timed per ISA level; table or --json lines\n"
      "--cputime: time with the process CPU clock (for development on a loaded machine, with --threads 1)\n",
      prog);
}

bool g_hugepages = false;  // --hugepages: planes in 2 MiB-aligned memory advised for transparent huge pages

// An owned, 2 MiB-aligned allocation (huge pages advised with --hugepages), zero-filled.
class Plane {
 public:
  Plane() = default;
  explicit Plane(size_t n) : n_(n) {
    const size_t align = size_t{2} << 20, bytes = (n + align - 1) / align * align;
    p_ = std::aligned_alloc(align, bytes);
    if (!p_) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (g_hugepages) madvise(p_, bytes, MADV_HUGEPAGE);
#endif
    std::memset(p_, 0, bytes);
  }
  Plane(Plane&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  Plane& operator=(Plane&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  Plane(const Plane&) = delete;
  ~Plane() { std::free(p_); }
  void* data() const { return p_; }
  size_t nbytes() const { return n_; }
  template <typename T>
  T* as() const { return static_cast<T*>(p_); }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// One copy of a cache's key and value planes: [1, Hkv, cap, ·] each, random contents of the right ranges.
struct Planes {
  Plane kc, ks, kb, vc, vs, vb, kr, ko, ki;
  KVTensorView keys{}, values{};
};

uint16_t f16(float v) { return cider::f32_to_f16(v); }

Planes make_planes(const Options& o, int64_t D, int64_t kL, std::mt19937_64& rng) {
  Planes p;
  const int64_t cap = (kL + 255) / 256 * 256, G = D / o.group;
  auto fill_random = [&](Plane& b) {
    uint64_t* w = b.as<uint64_t>();
    for (size_t i = 0; i < b.nbytes() / 8; ++i) w[i] = rng();
  };
  auto fill_scales = [&](Plane& b, float lo, float hi, bool sign) {
    std::uniform_real_distribution<float> u(lo, hi);
    uint16_t* h = b.as<uint16_t>();
    for (size_t i = 0; i < b.nbytes() / 2; ++i) h[i] = f16(sign && (rng() & 1) ? -u(rng) : u(rng));
  };
  p.kc = Plane(static_cast<size_t>(o.hkv * cap * D * o.kbits / 8));
  p.vc = Plane(static_cast<size_t>(o.hkv * cap * D * o.vbits / 8));
  p.ks = Plane(static_cast<size_t>(o.hkv * cap * G * 2));
  p.kb = Plane(p.ks.nbytes());
  p.vs = Plane(p.ks.nbytes());
  p.vb = Plane(p.ks.nbytes());
  fill_random(p.kc);
  fill_random(p.vc);
  // Scales about range/(2^bits − 1) of unit-variance data, either sign (MLX's convention); biases about the minimum.
  fill_scales(p.ks, 0.3f, 0.6f, true);
  fill_scales(p.kb, 1.5f, 3.0f, true);
  fill_scales(p.vs, 0.6f, 1.2f, true);
  fill_scales(p.vb, 1.5f, 3.0f, true);
  if (o.kchan) {  // the residual window (positions past the last full block), bf16 values of unit scale
    p.kr = Plane(static_cast<size_t>(o.hkv * o.group * D * 2));
    uint16_t* h = p.kr.as<uint16_t>();
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (size_t i = 0; i < p.kr.nbytes() / 2; ++i) h[i] = cider::f32_to_bf16(nd(rng));
  }
  auto view = [&](const Plane& c, const Plane& s, const Plane& b, int bits) {
    KVTensorView v{};
    v.data = c.data();
    v.scales = s.data();
    v.biases = b.data();
    v.dtype = DType::kU32;
    v.scale_dtype = DType::kF16;
    v.bits = bits;
    v.group_size = o.group;
    v.B = 1;
    v.H = o.hkv;
    v.length = kL;
    v.capacity = cap;
    v.dim = D;
    return v;
  };
  p.keys = view(p.kc, p.ks, p.kb, o.kbits);
  p.values = view(p.vc, p.vs, p.vb, o.vbits);
  if (o.vsym) {
    p.values.biases = nullptr;
    p.values.symmetric = true;
  }
  if (o.kchan) {  // key scales/biases read as [Hkv, cap/group, D]: the same bytes as [Hkv, cap, D/group]
    p.keys.layout = 1;
    p.keys.blocks = cap / o.group;
    p.keys.residual = p.kr.data();
    if (o.outliers > 0) {  // random refinement codes; N channels spread over the head, ascending
      const int64_t n = o.outliers, blocks = cap / o.group;
      p.ko = Plane(static_cast<size_t>(o.hkv * blocks * n * o.group / 2));
      fill_random(p.ko);
      p.ki = Plane(static_cast<size_t>(o.hkv * blocks * n * 2 + 8));
      uint16_t* idx = p.ki.as<uint16_t>();
      for (int64_t r = 0; r < o.hkv * blocks; ++r)
        for (int64_t j = 0; j < n; ++j) idx[r * n + j] = static_cast<uint16_t>(j * D / n);
      p.keys.outliers = static_cast<int>(n);
      p.keys.outlier_codes = p.ko.data();
      p.keys.outlier_index = p.ki.data();
    }
  }
  return p;
}

struct Timing {
  double best, median, max;
};

bool g_cputime = false;
const char* g_prog = "attention_bench";  // the program's name in the table's title line

double now_ms() {
  if (g_cputime) {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
Timing time_calls(int reps, F&& f) {
  f();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const double t0 = now_ms();
    f();
    ms.push_back(now_ms() - t0);
  }
  std::sort(ms.begin(), ms.end());
  return {ms.front(), ms[ms.size() / 2], ms.back()};
}

void report(const Options& o, const char* level, const char* mode, int64_t D, int64_t kL, double bytes,
            const Timing& t) {
  const double gbps = bytes / (t.best * 1e-3) / 1e9;
  char name[96];
  std::snprintf(name, sizeof name, "decode_hq%lld_hkv%lld_d%lld_ctx%lld", static_cast<long long>(o.hq),
                static_cast<long long>(o.hkv), static_cast<long long>(D), static_cast<long long>(kL));
  if (o.json) {
    std::printf(
        "{\"case\":\"%s\",\"level\":\"%s\",\"mode\":\"%s\",\"kbits\":%d,\"vbits\":%d,\"group\":%d,\"L\":%lld,"
        "\"threads\":%d,\"best_ms\":%.4f,\"median_ms\":%.4f,\"max_ms\":%.4f,\"cache_mb\":%.2f,\"gbps\":%.2f}\n",
        name, level, mode, o.kbits, o.vbits, o.group, static_cast<long long>(o.L), cider::num_threads(), t.best,
        t.median, t.max, bytes / 1e6, gbps);
  } else {
    std::printf("%-32s %-7s %-7s %9.3f %9.3f %9.3f %9.1f %8.1f\n", name, level, mode, t.best, t.median, t.max,
                bytes / 1e6, gbps);
  }
  std::fflush(stdout);
}

int run(const Options& o) {
  g_cputime = o.cputime;
  if (o.threads > 0) cider::set_num_threads(o.threads);
  std::vector<cider::IsaLevel> levels;
  if (o.isa.empty()) {
    for (cider::IsaLevel l : cider::supported_isas())
      if (l != cider::IsaLevel::kRef) levels.insert(levels.begin(), l);
  } else {
    levels.push_back(cider::parse_isa(o.isa, "attention_bench"));
  }
  if (!o.json) {
    std::printf("%s: Hq %lld, Hkv %lld, L %lld, K%d/V%d g%d f16 scales, %d threads, best/median/max of %d "
                "calls%s\n",
                g_prog, static_cast<long long>(o.hq), static_cast<long long>(o.hkv), static_cast<long long>(o.L), o.kbits,
                o.vbits, o.group, cider::num_threads(), o.reps, o.cputime ? ", process CPU time" : "");
    std::printf("%-32s %-7s %-7s %9s %9s %9s %9s %8s\n", "case", "level", "mode", "best ms", "median", "max",
                "cache MB", "GB/s");
  }
  std::mt19937_64 rng(12345);
  bool nn_done = !o.nn;
  for (int64_t D : o.dims)
    for (int64_t kL : o.ctx) {
      const int64_t cap = (kL + 255) / 256 * 256;
      const double per_copy = static_cast<double>(o.hkv * cap * D * (o.kbits + o.vbits) / 8 +
                                                  4 * o.hkv * cap * (D / o.group) * 2);
      const double bytes = static_cast<double>(o.hkv * kL) *
                           (static_cast<double>(D * (o.kbits + o.vbits)) / 8.0 + 4.0 * static_cast<double>(D / o.group) * 2.0);
      const bool want_stream = o.mode.find("stream") != std::string::npos;
      const int copies = want_stream ? std::max(2, static_cast<int>(std::ceil(static_cast<double>(o.pool_mb) * 1048576.0 / per_copy))) : 1;
      std::vector<Planes> planes;
      for (int c = 0; c < copies; ++c) planes.push_back(make_planes(o, D, kL, rng));
      std::vector<float> q(static_cast<size_t>(o.hq * o.L * D)), out(static_cast<size_t>(o.hq * o.L * D));
      std::normal_distribution<float> nd(0.0f, 1.0f);
      for (float& x : q) x = nd(rng);
      AttentionArgs a{};
      a.q = q.data();
      a.out = out.data();
      a.B = 1;
      a.Hq = o.hq;
      a.L = o.L;
      a.scale = 1.0f / std::sqrt(static_cast<float>(D));
      a.mask_kind = cider::kernels::MaskKind::kCausal;
      for (cider::IsaLevel level : levels) {
        const cider::kernels::KernelTable& t = cider::kernels::kernels_for_isa(level);
        if (o.mode.find("hot") != std::string::npos) {
          a.keys = planes[0].keys;
          a.values = planes[0].values;
          report(o, t.name, "hot", D, kL, bytes, time_calls(o.reps, [&] { t.attention(a); }));
        }
        if (want_stream) {
          size_t next = 0;
          report(o, t.name, "stream", D, kL, bytes, time_calls(o.reps, [&] {
                   a.keys = planes[next].keys;
                   a.values = planes[next].values;
                   next = (next + 1) % planes.size();
                   t.attention(a);
                 }));
        }
      }
      if (!nn_done) {  // the public op, once: query rotation + kernel + inverse rotation + output store
        nn_done = true;
        cider::nn::QuantizedKVCacheConfig cc{o.kbits, o.vbits, o.group, cider::nn::RotationKind::kSO4Full, 7,
                                             DType::kF16,
                                             o.kchan ? cider::nn::KeyLayout::kChannel : cider::nn::KeyLayout::kToken};
        cc.key_outliers = o.outliers;  // chosen by range (no queries shown)
        cc.v_symmetric = o.vsym;
        cc.recent_exact = o.recent;
        cider::nn::QuantizedKVCache cache(cc);
        const int64_t chunk = 1024;
        std::vector<float> kv(static_cast<size_t>(o.hkv * chunk * D));
        // In chunks, the last position alone: the cache as a decode step leaves it (a recent block's stage).
        for (int64_t t0 = 0; t0 < kL;) {
          const int64_t n = t0 + chunk >= kL ? (kL - t0 > 1 ? kL - t0 - 1 : 1) : chunk;
          for (float& x : kv) x = nd(rng);
          cider::TensorView v(kv.data(), DType::kF32, {1, o.hkv, n, D});
          cache.update_and_fetch(v, v);
          t0 += n;
        }
        cider::TensorView qv(q.data(), DType::kF32, {1, o.hq, o.L, D}), ov(out.data(), DType::kF32, {1, o.hq, o.L, D});
        cider::nn::AttentionMask m;
        m.kind = cider::kernels::MaskKind::kCausal;
        report(o, cider::kernels::active_kernels().name, "nn-hot", D, kL, bytes,
               time_calls(o.reps, [&] { cider::nn::attention(qv, cache, a.scale, m, ov); }));
      }
      if (o.prefill) {  // one prefill chunk: the last 512 positions as causal queries (query blocks × key tiles)
        std::vector<float> qp(static_cast<size_t>(o.hq * 512 * D)), op(qp.size());
        for (float& x : qp) x = nd(rng);
        AttentionArgs pa = a;
        pa.q = qp.data();
        pa.out = op.data();
        pa.L = 512;
        pa.keys = planes[0].keys;
        pa.values = planes[0].values;
        for (cider::IsaLevel level : levels) {
          const cider::kernels::KernelTable& t = cider::kernels::kernels_for_isa(level);
          report(o, t.name, "prefill512", D, kL, bytes, time_calls(std::max(3, o.reps / 4), [&] { t.attention(pa); }));
        }
      }
    }
  if (o.append) {  // kv_append: n rows of one head, D 128, f32 input, so4_full, K at kbits and V at vbits
    std::vector<cider::IsaLevel> all = levels;
    all.push_back(cider::IsaLevel::kRef);
    for (int64_t n : {int64_t{1}, int64_t{512}}) {
      const int64_t D = 128;
      std::normal_distribution<float> nd(0.0f, 1.0f);
      std::vector<float> src(static_cast<size_t>(n * D));
      for (float& x : src) x = nd(rng);
      cider::nn::SO4Rotation rot(D, cider::nn::RotationKind::kSO4Full, 3);
      std::vector<uint32_t> codes(static_cast<size_t>(n * D));
      std::vector<uint16_t> sc(static_cast<size_t>(n * D / o.group)), bi(sc.size());
      cider::kernels::KVAppendArgs ka{};
      ka.src = src.data();
      ka.src_dtype = DType::kF32;
      ka.src_row_stride = D;
      ka.src_elem_stride = 1;
      ka.n = n;
      ka.dim = D;
      ka.rotation = 2;
      ka.qL = rot.left().data();
      ka.qR = rot.right().data();
      ka.dst = codes.data();
      ka.scales = sc.data();
      ka.biases = bi.data();
      ka.dst_dtype = DType::kF16;
      ka.group_size = o.group;
      for (cider::IsaLevel level : all) {
        const cider::kernels::KernelTable& t = cider::kernels::kernels_for_isa(level);
        for (int bits : {o.kbits, o.vbits}) {
          ka.bits = bits;
          const Timing tm = time_calls(o.reps, [&] { t.kv_append(ka); });
          const double ns = tm.best * 1e6 / static_cast<double>(n * D);
          if (o.json) {
            std::printf("{\"case\":\"kv_append_d%lld_n%lld_b%d\",\"level\":\"%s\",\"best_ms\":%.5f,\"median_ms\":%.5f,"
                        "\"ns_per_value\":%.3f}\n",
                        static_cast<long long>(D), static_cast<long long>(n), bits, t.name, tm.best, tm.median, ns);
          } else {
            char name[64];
            std::snprintf(name, sizeof name, "kv_append_d%lld_n%lld_%dbit", static_cast<long long>(D),
                          static_cast<long long>(n), bits);
            std::printf("%-32s %-7s %-7s %9.4f %9.4f %9.4f %9s %6.2f ns/value\n", name, t.name, "-", tm.best, tm.median,
                        tm.max, "", ns);
          }
        }
      }
    }
  }
  return 0;
}

}  // namespace

// The whole program: argv[0] is the name printed by the usage line; returns the exit status (0, or 2 on a usage
// error or a failure). --help / -h print the usage and return 0.
int main_with_args(int argc, char** argv) {
  const char* prog = argc > 0 ? argv[0] : "attention_bench";
  g_prog = prog;
  Options o;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      bool missing = false;
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) {
          missing = true;
          return "0";
        }
        return argv[++i];
      };
      if (arg == "--ctx") o.ctx = parse_list(next());
      else if (arg == "--dims") o.dims = parse_list(next());
      else if (arg == "--hq") o.hq = std::stoll(next());
      else if (arg == "--hkv") o.hkv = std::stoll(next());
      else if (arg == "--L") o.L = std::stoll(next());
      else if (arg == "--kbits") o.kbits = std::stoi(next());
      else if (arg == "--kv-layout") o.kchan = next() == std::string("channel");
      else if (arg == "--kv-outliers") o.outliers = std::stoi(next());
      else if (arg == "--kv-values") o.vsym = next() == std::string("symmetric");
      else if (arg == "--kv-recent") o.recent = next() == std::string("exact");
      else if (arg == "--vbits") o.vbits = std::stoi(next());
      else if (arg == "--group") o.group = std::stoi(next());
      else if (arg == "--reps") o.reps = std::stoi(next());
      else if (arg == "--threads") o.threads = std::stoi(next());
      else if (arg == "--pool-mb") o.pool_mb = std::stoll(next());
      else if (arg == "--isa") o.isa = next();
      else if (arg == "--mode") o.mode = next();
      else if (arg == "--no-nn") o.nn = false;
      else if (arg == "--json") o.json = true;
      else if (arg == "--cputime") o.cputime = true;
      else if (arg == "--no-append") o.append = false;
      else if (arg == "--prefill") o.prefill = true;
      else if (arg == "--hugepages") g_hugepages = true;
      else {
        const bool help = arg == "--help" || arg == "-h";
        if (!help) std::fprintf(stderr, "%s: error: unknown option %s\n", prog, arg.c_str());
        usage(prog);
        return help ? 0 : 2;
      }
      if (missing) {
        std::fprintf(stderr, "%s: error: %s needs a value\n", prog, arg.c_str());
        usage(prog);
        return 2;
      }
    }
    if (o.outliers != 0 && (!o.kchan || o.outliers < 0)) {
      std::fprintf(stderr, "%s: error: --kv-outliers N (N > 0) refines per-channel keys: it needs --kv-layout channel; "
                   "got %d\n", prog, o.outliers);
      return 2;
    }
    if (o.recent && (!o.kchan || !o.nn)) {
      std::fprintf(stderr, "%s: error: --kv-recent exact is read by nn::attention on per-channel keys: it needs "
                   "--kv-layout channel and the nn row (no --no-nn)\n", prog);
      return 2;
    }
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
    return 2;
  }
}

}  // namespace cider::bench_attention

#ifndef CIDER_ATTENTION_BENCH_NO_MAIN
int main(int argc, char** argv) { return cider::bench_attention::main_with_args(argc, argv); }
#endif
