#include "runtime/prompt_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"
#include "kernels/kernel_table.h"
#include "runtime/engine.h"

namespace cider::runtime {

namespace {

namespace fs = std::filesystem;
constexpr const char* kOp = "prompt_cache";
constexpr char kMagic[8] = {'C', 'I', 'D', 'E', 'R', 'P', 'C', '\0'};
constexpr const char* kSuffix = ".cpc";
constexpr size_t kNameDigits = 16;
// A cache holds at most this many planes (KVCacheSnapshot: 10 for per-channel keys with outliers).
constexpr int64_t kMaxPlanes = 16;
// Per layer, the most bytes of the payload that are not cache data: the fields above, with room to spare.
constexpr int64_t kLayerOverhead = 1024;

// The payload as a sequence of pieces (encode: hashed, then written; both from the same list, so they agree).
using Piece = std::function<void(const void*, size_t)>;

template <typename T>
void put(const Piece& out, T v) {
  out(&v, sizeof v);
}

void payload(const std::vector<int32_t>& tokens, const model::SessionState& st, const Piece& out) {
  put<int64_t>(out, st.position);
  out(tokens.data(), tokens.size() * sizeof(int32_t));
  put<int64_t>(out, static_cast<int64_t>(st.caches.size()));
  for (size_t l = 0; l < st.caches.size(); ++l) {
    const nn::KVCacheSnapshot& c = st.caches[l];
    const nn::KVCacheMeta& m = c.meta();
    put<uint8_t>(out, m.has_dims ? 1 : 0);
    put<uint8_t>(out, m.quantized ? 1 : 0);
    for (int v : {m.k_bits, m.v_bits, m.group_size, static_cast<int>(m.scale_dtype), static_cast<int>(m.dtype),
                  static_cast<int>(m.rotation), static_cast<int>(m.key_layout), m.key_outliers})
      put<int32_t>(out, v);
    put<uint64_t>(out, m.seed);
    for (int64_t v : {m.B, m.H, m.Dk, m.Dv, m.length, m.window, m.start}) put<int64_t>(out, v);
    put<int64_t>(out, static_cast<int64_t>(c.num_planes()));
    for (size_t p = 0; p < c.num_planes(); ++p) {
      put<int64_t>(out, static_cast<int64_t>(c.plane(p).nbytes()));
      out(c.plane(p).data(), c.plane(p).nbytes());
    }
    const model::LinearStateCopy& ls = st.linear[l];
    put<int64_t>(out, ls.pos);
    put<int64_t>(out, static_cast<int64_t>(ls.S.size()));
    out(ls.S.data(), ls.S.size() * sizeof(float));
    put<int64_t>(out, static_cast<int64_t>(ls.conv.size()));
    out(ls.conv.data(), ls.conv.size() * sizeof(float));
  }
}

std::string header_bytes(const PromptCacheHeader& h) {
  std::string b(kHeaderBytes, '\0');
  std::memcpy(b.data(), kMagic, 8);
  const uint32_t version = kPromptCacheVersion, size = kHeaderBytes;
  std::memcpy(b.data() + 8, &version, 4);
  std::memcpy(b.data() + 12, &size, 4);
  std::memcpy(b.data() + 16, &h.identity, 8);
  std::memcpy(b.data() + 24, &h.payload_bytes, 8);
  std::memcpy(b.data() + 32, &h.checksum, 8);
  std::memcpy(b.data() + 40, &h.sequence, 8);
  return b;
}

PromptCacheHeader measure(const std::vector<int32_t>& tokens, const model::SessionState& st, uint64_t identity,
                          uint64_t sequence) {
  PromptCacheHeader h;
  h.identity = identity;
  h.sequence = sequence;
  h.checksum = kFnvOffset;
  payload(tokens, st, [&](const void* p, size_t n) {
    h.checksum = fnv1a64(p, n, h.checksum);
    h.payload_bytes += n;
  });
  return h;
}

// Reads the payload, checking that every read fits the bytes left.
class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  size_t left() const { return b_.size() - pos_; }
  template <typename T>
  bool get(T& v) {
    if (left() < sizeof v) return false;
    std::memcpy(&v, b_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return true;
  }
  bool bytes(void* dst, size_t n) {
    if (left() < n) return false;
    if (n > 0) std::memcpy(dst, b_.data() + pos_, n);
    pos_ += n;
    return true;
  }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

template <typename... Args>
std::string why(Args&&... parts) {
  std::ostringstream o;
  (o << ... << parts);
  return o.str();
}

bool is_entry_name(const std::string& name) {
  if (name.size() != kNameDigits + std::strlen(kSuffix) || name.compare(kNameDigits, std::string::npos, kSuffix) != 0)
    return false;
  return std::all_of(name.begin(), name.begin() + kNameDigits,
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// A temporary file an interrupted write left: "<entry name>.XXXXXX" (core/file_io.h AtomicFile).
bool is_temporary_name(const std::string& name) {
  const size_t entry = kNameDigits + std::strlen(kSuffix);
  return name.size() == entry + 7 && name[entry] == '.' && is_entry_name(name.substr(0, entry));
}

std::string entry_name(uint64_t sequence) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%016llx%s", static_cast<unsigned long long>(sequence), kSuffix);
  return buf;
}

// Up to max_bytes of a regular file (all of it when whole); "" on success, else the reason.
std::string read_file(const std::string& path, int64_t max_bytes, bool whole, std::string& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return why("cannot open it: ", std::strerror(errno));
  struct stat st {};
  std::string reason;
  if (::fstat(fd, &st) != 0) {
    reason = why("cannot stat it: ", std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    reason = "not a regular file";
  } else if (whole && st.st_size > max_bytes) {
    reason = why("it holds ", st.st_size, " bytes, more than an entry of this model can (", max_bytes, ")");
  } else {
    out.resize(static_cast<size_t>(std::min<int64_t>(st.st_size, max_bytes)));
    size_t got = 0;
    while (got < out.size()) {
      const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        reason = why("cannot read it: ", std::strerror(errno));
        break;
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    out.resize(got);
  }
  ::close(fd);
  return reason;
}

void sync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t model_identity(const model::Model& m, const std::string& path) {
  const model::ModelConfig& c = m.config();
  const model::ModelOptions& o = m.options();
  std::ostringstream s;
  s.precision(17);
  s << "cider prompt cache v" << kPromptCacheVersion << "\narch " << model::architecture_name(c.arch) << " vocab "
    << c.vocab_size << " hidden " << c.hidden_size << " inter " << c.intermediate_size << " layers " << c.num_layers
    << " heads " << c.num_heads << " kv_heads " << c.num_kv_heads << " head_dim " << c.head_dim << " rotary "
    << c.rotary_dim << " window " << c.sliding_window << " eps " << c.rms_norm_eps << " rope " << c.rope.theta << ' '
    << static_cast<int>(c.rope.scaling) << ' ' << c.rope.factor << " local " << c.rope_local.theta << " experts "
    << c.num_experts << ' ' << c.experts_per_token << " linear " << c.linear_attn.num_k_heads << ' '
    << c.linear_attn.num_v_heads << ' ' << c.linear_attn.k_head_dim << ' ' << c.linear_attn.v_head_dim << ' '
    << c.linear_attn.conv_kernel << " sliding";
  for (uint8_t v : c.layer_sliding) s << ' ' << int{v};
  s << " linear_layers";
  for (uint8_t v : c.layer_linear) s << ' ' << int{v};
  const nn::KVSpec& kv = o.kv;
  s << "\nweights " << model::weight_format_name(o.weights) << "\nkv " << kv.name() << " outliers "
    << kv.key_outliers << " scale " << dtype_name(kv.scale_dtype) << " plain " << dtype_name(kv.plain_dtype)
    << " full_sliding " << o.kv_full_sliding << "\nctx " << m.context_length() << " device "
    << model::device_name(o.device) << " tp " << o.tp << " kernels " << kernels::active_kernels().name << '\n';
  if (!path.empty()) {
    // The model's files: a GGUF file, or a directory's regular files (by name).
    std::error_code ec;
    std::vector<fs::path> files;
    if (fs::is_directory(path, ec)) {
      for (const auto& e : fs::directory_iterator(path, ec))
        if (e.is_regular_file(ec)) files.push_back(e.path());
      std::sort(files.begin(), files.end());
    } else {
      files.emplace_back(path);
    }
    for (const auto& f : files) {
      const auto size = fs::file_size(f, ec);
      const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
      s << "file " << f.filename().string() << ' ' << size << ' ' << mtime << '\n';
    }
  }
  const std::string text = s.str();
  return fnv1a64(text.data(), text.size());
}

int64_t max_file_bytes(const model::Model& m) {
  const int64_t ctx = m.context_length();
  return static_cast<int64_t>(kHeaderBytes) + 16 + 4 * ctx + m.config().num_layers * kLayerOverhead +
         kv_bytes_at(m, ctx);
}

std::string encode_entry(const std::vector<int32_t>& tokens, const model::SessionState& state, uint64_t identity,
                         uint64_t sequence) {
  check(static_cast<int64_t>(tokens.size()) == state.position, ErrorCode::kInvalidArgument, kOp,
        "an entry holds one token per position of its session (", state.position, "); got ", tokens.size());
  std::string out = header_bytes(measure(tokens, state, identity, sequence));
  payload(tokens, state, [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); });
  return out;
}

std::string decode_header(std::string_view b, uint64_t identity, PromptCacheHeader& h) {
  if (b.size() < 8 || std::memcmp(b.data(), kMagic, 8) != 0) return "not a cider prompt cache file (wrong magic)";
  if (b.size() < kHeaderBytes) return why("truncated: ", b.size(), " bytes, less than the ", kHeaderBytes,
                                          "-byte header");
  uint32_t version = 0, size = 0;
  std::memcpy(&version, b.data() + 8, 4);
  std::memcpy(&size, b.data() + 12, 4);
  if (version != kPromptCacheVersion || size != kHeaderBytes)
    return why("version ", version, " (header ", size, " bytes); this server reads version ", kPromptCacheVersion);
  std::memcpy(&h.identity, b.data() + 16, 8);
  std::memcpy(&h.payload_bytes, b.data() + 24, 8);
  std::memcpy(&h.checksum, b.data() + 32, 8);
  std::memcpy(&h.sequence, b.data() + 40, 8);
  if (h.identity != identity)
    return why("written for another model, weights format or KV cache format (identity ", std::hex, h.identity,
               "; this server's ", identity, ")");
  return "";
}

std::string decode_entry(std::string_view b, const model::Model& m, uint64_t identity, std::vector<int32_t>& tokens,
                         std::unique_ptr<model::Session>& session) {
  PromptCacheHeader h;
  if (std::string r = decode_header(b, identity, h); !r.empty()) return r;
  const uint64_t have = b.size() - kHeaderBytes;
  if (h.payload_bytes != have)
    return why(have < h.payload_bytes ? "truncated" : "trailing bytes", ": the header gives a payload of ",
               h.payload_bytes, " bytes; the file holds ", have);
  const std::string_view body = b.substr(kHeaderBytes);
  if (fnv1a64(body.data(), body.size()) != h.checksum) return "corrupt: the payload's checksum does not match";

  const model::ModelConfig& c = m.config();
  Reader r(body);
  const auto short_of = [](const char* what) { return why("corrupt: the payload ends inside ", what); };
  model::SessionState st;
  if (!r.get(st.position)) return short_of("the position");
  if (st.position < 1 || st.position > m.context_length())
    return why("corrupt: the position must be in [1, ", m.context_length(), "] (the context); got ", st.position);
  if (r.left() / sizeof(int32_t) < static_cast<uint64_t>(st.position)) return short_of("the tokens");
  tokens.assign(static_cast<size_t>(st.position), 0);
  r.bytes(tokens.data(), tokens.size() * sizeof(int32_t));
  for (int32_t t : tokens)
    if (t < 0 || t >= c.vocab_size) return why("corrupt: token ids must be in [0, ", c.vocab_size, "); got ", t);
  int64_t layers = 0;
  if (!r.get(layers)) return short_of("the layer count");
  if (layers != c.num_layers) return why("corrupt: ", layers, " layers; this model has ", c.num_layers);
  const model::ModelConfig::LinearAttention& la = c.linear_attn;
  for (int64_t l = 0; l < layers; ++l) {
    const nn::KVCacheMeta want = model::expected_cache_meta(m, l);
    uint8_t has_dims = 0, quantized = 0;
    int32_t f[8] = {};
    uint64_t seed = 0;
    int64_t d[7] = {};
    int64_t planes = 0;
    if (!r.get(has_dims) || !r.get(quantized)) return short_of("a cache's metadata");
    for (int32_t& v : f)
      if (!r.get(v)) return short_of("a cache's metadata");
    if (!r.get(seed)) return short_of("a cache's metadata");
    for (int64_t& v : d)
      if (!r.get(v)) return short_of("a cache's metadata");
    if (!r.get(planes)) return short_of("a cache's metadata");
    // The format must be this model's cache's, field by field, before any of it is used.
    const int32_t w[8] = {want.k_bits, want.v_bits, want.group_size, static_cast<int32_t>(want.scale_dtype),
                          static_cast<int32_t>(want.dtype), static_cast<int32_t>(want.rotation),
                          static_cast<int32_t>(want.key_layout), want.key_outliers};
    const bool dims = has_dims == 1;
    bool same = (has_dims <= 1) && quantized == (want.quantized ? 1 : 0) && seed == want.seed &&
                std::equal(f, f + 8, w) && d[5] == want.window;
    if (dims) same = same && want.has_dims && d[0] == want.B && d[1] == want.H && d[2] == want.Dk && d[3] == want.Dv;
    if (!same)
      return why("layer ", l, "'s cache format differs from this model's (bits ", f[0], "/", f[1], ", group ", f[2],
                 ", rotation ", f[5], ", key layout ", f[6], ", outliers ", f[7], ", seed ", seed, ", window ", d[5],
                 "; this model: bits ", want.k_bits, "/", want.v_bits, ", group ", want.group_size, ", rotation ",
                 w[5], ", key layout ", w[6], ", outliers ", want.key_outliers, ", seed ", want.seed, ", window ",
                 want.window, ")");
    const int64_t length = d[4], start = d[6];
    if (length < 0 || length > m.context_length() || start < 0 || start > m.context_length() ||
        (dims && start + length != st.position) || (!dims && (length != 0 || start != 0)))
      return why("corrupt: layer ", l, "'s cache holds positions [", start, ", ", start + length,
                 "); the session ends at ", st.position);
    if (planes < 0 || planes > kMaxPlanes || (!dims && planes != 0))
      return why("corrupt: layer ", l, "'s cache has ", planes, " planes");
    nn::KVCacheMeta meta = want;
    meta.has_dims = dims;
    if (!dims) meta.B = meta.H = meta.Dk = meta.Dv = 0;
    meta.length = length;
    meta.start = start;
    std::vector<Buffer> bufs;
    for (int64_t p = 0; p < planes; ++p) {
      int64_t n = 0;
      if (!r.get(n)) return short_of("a plane's size");
      if (n < 0 || static_cast<uint64_t>(n) > r.left())
        return why("corrupt: layer ", l, " plane ", p, " claims ", n, " bytes; ", r.left(), " are left");
      Buffer buf(static_cast<size_t>(n));
      r.bytes(buf.data(), static_cast<size_t>(n));
      bufs.push_back(std::move(buf));
    }
    try {
      st.caches.emplace_back(meta, std::move(bufs));  // checks each plane's size against the metadata
    } catch (const Error& e) {
      return why("corrupt: layer ", l, ": ", e.what());
    }
    model::LinearStateCopy ls;
    int64_t nS = 0, nconv = 0;
    if (!r.get(ls.pos) || !r.get(nS)) return short_of("a linear-attention state");
    const bool linear = c.is_linear_layer(l);
    const int64_t wantS = linear ? la.num_v_heads * la.k_head_dim * la.v_head_dim : 0;
    const int64_t wantC = linear ? (la.conv_kernel - 1) * la.conv_dim() : 0;
    if ((nS != 0 && nS != wantS) || r.left() / sizeof(float) < static_cast<uint64_t>(nS))
      return why("corrupt: layer ", l, "'s recurrent state holds ", nS, " floats; this model's ", wantS);
    ls.S.resize(static_cast<size_t>(nS));
    r.bytes(ls.S.data(), ls.S.size() * sizeof(float));
    if (!r.get(nconv)) return short_of("a linear-attention state");
    if ((nconv != 0 && nconv != wantC) || r.left() / sizeof(float) < static_cast<uint64_t>(nconv))
      return why("corrupt: layer ", l, "'s conv window holds ", nconv, " floats; this model's ", wantC);
    ls.conv.resize(static_cast<size_t>(nconv));
    r.bytes(ls.conv.data(), ls.conv.size() * sizeof(float));
    st.linear.push_back(std::move(ls));
  }
  if (r.left() != 0) return why("corrupt: ", r.left(), " bytes after the last layer");
  try {
    session = m.restore_session(st);
  } catch (const Error& e) {
    return why("corrupt: ", e.what());
  }
  return "";
}

// ---- PromptCacheStore -----------------------------------------------------------------------------------------------

PromptCacheStore::PromptCacheStore(const model::Model& m, std::string dir, uint64_t identity, Warn warn)
    : model_(m), dir_(std::move(dir)), identity_(identity), warn_(std::move(warn)) {
  check(!dir_.empty(), ErrorCode::kInvalidArgument, kOp, "the prompt cache directory must be named; got \"\"");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  check(fs::is_directory(dir_, ec), ErrorCode::kIo, kOp, "the prompt cache directory \"", dir_,
        "\" must be a directory that exists or can be made", ec ? ": " + ec.message() : std::string());
  check(::access(dir_.c_str(), W_OK | X_OK) == 0, ErrorCode::kIo, kOp, "the prompt cache directory \"", dir_,
        "\" must be writable: ", std::strerror(errno));
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (is_temporary_name(e.path().filename().string())) fs::remove(e.path(), ec);
  // Sequences grow with the wall clock (nanoseconds), and past every file already there (load()).
  next_sequence_ = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  thread_ = std::thread([this] { run(); });
}

PromptCacheStore::~PromptCacheStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

int64_t PromptCacheStore::load(const std::function<bool(Loaded&)>& take) {
  struct Found {
    uint64_t sequence;
    std::string name;
  };
  std::vector<Found> found;
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (is_entry_name(e.path().filename().string())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  const int64_t max_bytes = max_file_bytes(model_);
  for (const std::string& name : names) {
    // New names never take an existing one's, whoever's it is.
    next_sequence_ = std::max<uint64_t>(next_sequence_, std::stoull(name.substr(0, kNameDigits), nullptr, 16) + 1);
    std::string head;
    const std::string path = dir_ + "/" + name;
    std::string reason = read_file(path, kHeaderBytes, false, head);
    PromptCacheHeader h;
    if (reason.empty()) reason = decode_header(head, identity_, h);
    if (!reason.empty()) {
      warn_("prompt cache: ignoring " + path + ": " + reason);
      continue;
    }
    found.push_back({h.sequence, name});
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.sequence > b.sequence; });
  int64_t taken = 0;
  bool full = false;
  for (const Found& f : found) {
    const std::string path = dir_ + "/" + f.name;
    if (full) {  // older than what the pool could take: beyond the bound on disk too
      fs::remove(path, ec);
      continue;
    }
    std::string bytes;
    Loaded e;
    e.name = f.name;
    std::string reason = read_file(path, max_bytes, true, bytes);
    if (reason.empty()) reason = decode_entry(bytes, model_, identity_, e.tokens, e.session);
    if (!reason.empty()) {
      warn_("prompt cache: ignoring " + path + ": " + reason);
      continue;
    }
    bytes = std::string();
    if (take(e)) {
      ++taken;
    } else {
      full = true;
      fs::remove(path, ec);
    }
  }
  return taken;
}

std::string PromptCacheStore::write(std::vector<int32_t> tokens, model::SessionState state) {
  Job job;
  job.tokens = std::move(tokens);
  job.state = std::move(state);
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mu_);
    job.sequence = next_sequence_++;
    job.name = name = entry_name(job.sequence);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
  return name;
}

void PromptCacheStore::remove(const std::string& name) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A write still queued is dropped instead: the file never appears, and the queue holds at most one write per
    // pooled session.
    const auto it = std::find_if(jobs_.begin(), jobs_.end(), [&](const Job& j) { return j.write && j.name == name; });
    if (it != jobs_.end()) {
      jobs_.erase(it);
      return;
    }
    Job job;
    job.write = false;
    job.name = name;
    jobs_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void PromptCacheStore::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return jobs_.empty() && !busy_; });
}

void PromptCacheStore::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) break;  // stopped, with everything written
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    const std::string path = dir_ + "/" + job.name;
    if (job.write) {
      try {
        write_file(job);
      } catch (const std::exception& e) {
        warn_(std::string("prompt cache: not kept on disk: ") + e.what());
      }
    } else {
      std::error_code ec;
      fs::remove(path, ec);
      if (ec) warn_("prompt cache: cannot delete " + path + ": " + ec.message());
    }
    job = Job{};  // the state's copy goes now, not with the next job
    lock.lock();
    busy_ = false;
    cv_.notify_all();  // flush() waits for this
  }
}

void PromptCacheStore::write_file(const Job& job) {
  const std::string path = dir_ + "/" + job.name;
  const PromptCacheHeader h = measure(job.tokens, job.state, identity_, job.sequence);
  AtomicFile f(path, kOp);
  const std::string head = header_bytes(h);
  f.write(head.data(), head.size());
  // The payload through a buffer: its scalars are a few bytes each, its planes large.
  std::string buf;
  constexpr size_t kBuffer = size_t{1} << 20;
  payload(job.tokens, job.state, [&](const void* p, size_t n) {
    if (buf.size() + n > kBuffer) {
      f.write(buf.data(), buf.size());
      buf.clear();
    }
    if (n > kBuffer)
      f.write(p, n);
    else
      buf.append(static_cast<const char*>(p), n);
  });
  f.write(buf.data(), buf.size());
  f.commit();
  sync_dir(dir_);
}

}  // namespace cider::runtime
