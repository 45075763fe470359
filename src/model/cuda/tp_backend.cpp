// The tensor-parallel CUDA backend (model/cuda/tp_backend.h).
#include "model/cuda/tp_backend.h"

#include <cuda_runtime.h>

#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "core/error.h"
#include "kernels/cuda/cuda_check.cuh"
#include "model/cuda/cuda_backend.h"
#include "model/tensor_parallel.h"
#include "model/transformer.h"

namespace cider::model::gpu {

namespace {

constexpr const char* kOp = "tensor_parallel";

size_t sz(int64_t n) { return static_cast<size_t>(n); }

// One worker thread per rank, its device current for its whole life: run(f) calls f(rank) on every worker at once
// and returns when all have finished, rethrowing the first error (by rank). The ranks of one forward wait for each
// other inside the collectives, so they must run concurrently: one thread each.
class RankThreads {
 public:
  explicit RankThreads(std::vector<int> devices) : devices_(std::move(devices)) {
    for (size_t r = 0; r < devices_.size(); ++r) workers_.emplace_back([this, r] { loop(static_cast<int>(r)); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(devices_.size()); }
  int device(int rank) const { return devices_[sz(rank)]; }

  void run(const std::function<void(int)>& f) {
    std::lock_guard<std::mutex> serial(run_mu_);  // one job at a time (sessions of one model may be driven by several threads)
    std::unique_lock<std::mutex> lock(mu_);
    job_ = &f;
    errors_.assign(devices_.size(), nullptr);
    pending_ = static_cast<int>(devices_.size());
    ++generation_;
    wake_.notify_all();
    done_.wait(lock, [&] { return pending_ == 0; });
    job_ = nullptr;
    rethrow_errors();
  }

 private:
  // One failed rank, or every failed rank with the same message (a check that each rank's share fails alike): that
  // error as it is. Otherwise one error naming each rank's message (a rank that fails first can leave the others
  // waiting for its all-reduce until they give up, so the lowest rank's error need not be the cause), with the code of
  // the lowest rank's cider::Error (kInternal when none is one).
  void rethrow_errors() {
    int failed = 0;
    std::exception_ptr first;
    std::string all, first_message;
    bool same = true, coded = false;
    ErrorCode code = ErrorCode::kInternal;
    for (size_t r = 0; r < errors_.size(); ++r) {
      if (!errors_[r]) continue;
      std::string message;
      try {
        std::rethrow_exception(errors_[r]);
      } catch (const Error& e) {
        message = e.what();
        if (!coded) code = e.code();
        coded = true;
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
        message = "an exception that is not a std::exception";
      }
      if (++failed == 1) {
        first = errors_[r];
        first_message = message;
      }
      same = same && message == first_message;
      all += "; rank " + std::to_string(r) + ": " + message;
    }
    if (failed == 0) return;
    if (failed == 1 || same) std::rethrow_exception(first);
    fail(code, kOp, failed, " ranks failed", all);
  }

  void loop(int rank) {
    uint64_t seen = 0;
    bool device_set = false;
    for (;;) {
      const std::function<void(int)>* job = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        job = job_;
      }
      std::exception_ptr err;
      try {
        if (!device_set) {
          CIDER_CUDA_CHECK(kOp, cudaSetDevice(devices_[sz(rank)]));
          device_set = true;
        }
        (*job)(rank);
      } catch (...) {
        err = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        errors_[sz(rank)] = err;
        if (--pending_ == 0) done_.notify_all();
      }
    }
  }

  std::vector<int> devices_;
  std::vector<std::thread> workers_;
  std::mutex run_mu_, mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  std::vector<std::exception_ptr> errors_;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
};

class TpSession final : public BackendSession {
 public:
  TpSession(std::shared_ptr<RankThreads> threads, const std::vector<std::shared_ptr<const GpuModel>>& ranks)
      : threads_(std::move(threads)), ranks_(ranks.size()) {
    threads_->run([&](int r) { ranks_[sz(r)] = std::make_unique<GpuSession>(ranks[sz(r)]); });
  }
  ~TpSession() override {
    try {  // each rank's streams and buffers released with its device current
      threads_->run([&](int r) { ranks_[sz(r)].reset(); });
    } catch (...) {  // a destructor does not throw; what is left is freed with the process
    }
  }
  size_t kv_bytes() const override {
    size_t b = 0;
    for (const auto& s : ranks_) b += s->kv_bytes();
    return b;
  }
  void truncate(int64_t position) override {
    threads_->run([&](int r) { ranks_[sz(r)]->truncate(position); });
  }
  bool can_truncate(int64_t position) const override { return ranks_[0]->can_truncate(position); }

  std::shared_ptr<RankThreads> threads_;
  std::vector<std::unique_ptr<GpuSession>> ranks_;
};

class TpModel final : public BackendModel {
 public:
  TpModel(const Model::Impl& model, std::vector<int> devices, std::vector<std::shared_ptr<Collective>> comms)
      : vocab_(model.config.vocab_size) {
    const int n = static_cast<int>(devices.size());
    check(n >= 1 && comms.size() == devices.size(), ErrorCode::kInvalidArgument, kOp,
          "tensor parallelism needs one collective per device; got ", comms.size(), " for ", devices.size());
    for (int r = 0; r < n; ++r)
      check(comms[sz(r)] && comms[sz(r)]->rank() == r && comms[sz(r)]->size() == n, ErrorCode::kInvalidArgument,
            kOp, "collective ", r, " must be rank ", r, " of ", n);
    threads_ = std::make_shared<RankThreads>(std::move(devices));
    ranks_.resize(sz(n));
    threads_->run([&](int r) { ranks_[sz(r)] = upload_model(model, comms[sz(r)]); });
  }
  ~TpModel() override {
    try {
      threads_->run([&](int r) { ranks_[sz(r)].reset(); });
    } catch (...) {
    }
  }

  std::unique_ptr<BackendSession> new_session() const override {
    return std::make_unique<TpSession>(threads_, ranks_);
  }
  int64_t pass_rows() const override { return GpuSession::prefill_chunk_for(ranks_[0]->ctx); }

  // Every rank runs the steps on its share, its logits (rows, its vocabulary rows) into a host buffer of its own;
  // then the host lays them side by side into each step's logits.
  void forward(std::span<BackendSession* const> sessions, std::span<const SequenceStep> steps) const override {
    const int n = threads_->size();
    std::vector<std::vector<std::vector<float>>> local(sz(n), std::vector<std::vector<float>>(steps.size()));
    threads_->run([&](int r) {
      const GpuModel& m = *ranks_[sz(r)];
      std::vector<SequenceStep> mine(steps.begin(), steps.end());
      std::vector<GpuSession*> gs;
      for (size_t i = 0; i < steps.size(); ++i) {
        const int64_t rows = steps[i].all_logits ? steps[i].n : 1;
        local[sz(r)][i].resize(sz(rows * m.head_rows()));
        mine[i].logits = local[sz(r)][i].data();
        gs.push_back(static_cast<TpSession*>(sessions[i])->ranks_[sz(r)].get());
      }
      if (gs.size() == 1) {
        gs[0]->forward(mine[0].tokens, mine[0].n, mine[0].start, mine[0].logits, mine[0].all_logits);
      } else {
        GpuSession::forward_batch(gs, mine);
      }
    });
    for (size_t i = 0; i < steps.size(); ++i) {
      if (steps[i].logits == nullptr) continue;
      const int64_t rows = steps[i].all_logits ? steps[i].n : 1;
      for (int r = 0; r < n; ++r) {
        const GpuModel& m = *ranks_[sz(r)];
        const int64_t w = m.head_rows();
        for (int64_t row = 0; row < rows; ++row)
          std::memcpy(steps[i].logits + row * vocab_ + m.vocab0, local[sz(r)][i].data() + row * w,
                      sz(w) * sizeof(float));
      }
    }
  }

  std::shared_ptr<RankThreads> threads_;
  std::vector<std::shared_ptr<const GpuModel>> ranks_;
  int64_t vocab_ = 0;
};

}  // namespace

std::unique_ptr<BackendModel> make_tp_backend(const Model::Impl& model, std::vector<int> devices,
                                              std::vector<std::shared_ptr<Collective>> comms) {
  return std::make_unique<TpModel>(model, std::move(devices), std::move(comms));
}

std::vector<GpuSession*> tp_rank_sessions(BackendSession& s) {
  std::vector<GpuSession*> out;
  if (auto* t = dynamic_cast<TpSession*>(&s))
    for (auto& r : t->ranks_) out.push_back(r.get());
  return out;
}

}  // namespace cider::model::gpu
