// cider/runtime/prompt_cache.h — the server's prefix cache on disk (`cider serve --prompt-cache DIR`,
// EngineOptions::prompt_cache_dir): one file per pooled session, written when the session joins the pool and deleted
// when it leaves it (evicted, replaced by a longer entry holding its tokens, or — where sessions cannot be copied —
// taken by a request); read back into the pool when the engine starts.
//
// A file, DIR/<16 hex digits>.cpc (the digits: its sequence), little-endian:
//   header, kHeaderBytes = 48:
//      0  magic "CIDERPC\0"   8 bytes
//      8  version             u32 (kPromptCacheVersion; another version is not read)
//     12  header bytes        u32 (48)
//     16  model identity      u64 (model_identity: config, weights format, KV format, context, device, kernel level,
//                                  the model files' names, sizes and mtimes; another model's file is not read)
//     24  payload bytes       u64 (the rest of the file, exactly)
//     32  payload checksum    u64 (FNV-1a 64 of the payload)
//     40  sequence            u64 (write order: newer entries load first)
//   payload:
//     position i64, then the session's tokens: i32 × position
//     layers i64 (the model's), then per layer
//       its cache: has_dims u8, quantized u8, k_bits v_bits group_size scale_dtype dtype rotation key_layout
//                  key_outliers i32 (the enums' values), seed u64, B H Dk Dv length window start i64, planes i64,
//                  then per plane: bytes i64 and the bytes (KVCacheSnapshot's planes, nn/kv_cache.h)
//       its linear-attention state: pos i64, S count i64 and f32 × count, conv count i64 and f32 × count
// Writes are atomic: DIR/.tmp-<name> is written, fsynced, renamed to DIR/<name>, and DIR fsynced.
//
// Reading trusts nothing before it is checked: the file's size against the most an entry of this model can hold
// (max_file_bytes), then magic, version, identity, payload size and checksum, then every count and size against the
// model's shapes and the bytes left before anything is allocated, then the KV formats against the model's caches
// (Model::restore_session). A file that fails is ignored with its reason (never a crash). The checksum catches
// corruption, not forgery: DIR is trusted as the model file is.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "model/model.h"
#include "model/session_state.h"

namespace cider::runtime {

constexpr uint32_t kPromptCacheVersion = 1;

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull;
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnvOffset);

// What a file must carry to be read by this model (see above). path: the model file or directory it was loaded from
// (each regular file's name, size and mtime count); "" leaves the files out.
uint64_t model_identity(const model::Model& m, const std::string& path);

// The most bytes a file of this model can hold (a session of the whole context, the largest cache, with headers).
int64_t max_file_bytes(const model::Model& m);

struct PromptCacheHeader {
  uint64_t identity = 0, payload_bytes = 0, checksum = 0, sequence = 0;
};
constexpr size_t kHeaderBytes = 48;

// The whole file for one pooled session: its tokens (as many as the state's position) and state.
std::string encode_entry(const std::vector<int32_t>& tokens, const model::SessionState& state, uint64_t identity,
                         uint64_t sequence);
// The header of `bytes` (at least its first kHeaderBytes): "" when it is one of this version and of `identity`, else
// the reason.
std::string decode_header(std::string_view bytes, uint64_t identity, PromptCacheHeader& out);
// A whole file: the header as above, the payload's size and checksum, every count against the model, then the session
// (Model::restore_session). "" on success (tokens and session set), else the reason.
std::string decode_entry(std::string_view bytes, const model::Model& m, uint64_t identity,
                         std::vector<int32_t>& tokens, std::unique_ptr<model::Session>& session);

// DIR and its files: loads them at start, then writes and deletes them on a thread of its own (the engine's worker
// only copies the session to the host: Model::snapshot).
class PromptCacheStore {
 public:
  using Warn = std::function<void(const std::string&)>;
  // Creates DIR if needed (cider::Error kIo naming it when it cannot be made or written) and removes temporary files
  // an interrupted write left there.
  PromptCacheStore(const model::Model& m, std::string dir, uint64_t identity, Warn warn);
  ~PromptCacheStore();  // writes what is queued, then stops
  PromptCacheStore(const PromptCacheStore&) = delete;
  PromptCacheStore& operator=(const PromptCacheStore&) = delete;

  struct Loaded {
    std::string name;
    std::vector<int32_t> tokens;
    std::unique_ptr<model::Session> session;
  };
  // Reads this model's files, newest first, and offers each to `take` (which keeps the entry and returns true, or
  // returns false when there is no room: that file is deleted, as is every older one once `take` said no). Files
  // that cannot be read, of another version or model, corrupt or truncated, are ignored with one warning each and
  // left in place. Returns how many were taken.
  int64_t load(const std::function<bool(Loaded&)>& take);
  // Queues the file of a session that joined the pool; returns its name.
  std::string write(std::vector<int32_t> tokens, model::SessionState state);
  // Deletes a file (a queued write of it is dropped instead).
  void remove(const std::string& name);
  void flush();  // waits until everything queued is on disk
  const std::string& dir() const { return dir_; }

 private:
  struct Job {
    bool write = true;
    std::string name;
    std::vector<int32_t> tokens;
    model::SessionState state;
    uint64_t sequence = 0;
  };
  void run();
  void write_file(const Job& job);

  const model::Model& model_;
  const std::string dir_;
  const uint64_t identity_;
  Warn warn_;
  uint64_t next_sequence_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> jobs_;
  bool busy_ = false;  // the thread is doing a job it took off jobs_
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cider::runtime
