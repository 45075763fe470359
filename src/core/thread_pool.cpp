#include "core/thread_pool.h"

#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace cider {

namespace {
// [begin, end) of chunk c when n items are split into k near-equal chunks.
inline void chunk_range(int64_t n, int k, int c, int64_t* begin, int64_t* end) {
  const int64_t base = n / k, extra = n % k;
  *begin = c * base + std::min<int64_t>(c, extra);
  *end = *begin + base + (c < extra ? 1 : 0);
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  check(n_threads >= 1, ErrorCode::kInvalidArgument, "thread_pool", "the number of threads must be >= 1; got ",
        n_threads);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t, int)>* task;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
      n = n_;
      chunks = n_chunks_;
    }
    if (index < chunks) {
      int64_t b, e;
      chunk_range(n, chunks, index, &b, &e);
      try {
        (*task)(b, e, index);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!error_) error_ = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  const int chunks = static_cast<int>(std::min<int64_t>(n, n_threads_));
  if (chunks == 1) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    n_ = n;
    n_chunks_ = chunks;
    pending_ = n_threads_ - 1;  // every worker reports, with or without a chunk
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr mine;
  int64_t b, e;
  chunk_range(n, chunks, 0, &b, &e);
  try {
    fn(b, e, 0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

namespace {
std::unique_ptr<ThreadPool>& pool_slot() {
  static std::unique_ptr<ThreadPool> pool;
  return pool;
}
std::mutex& pool_mutex() {
  static std::mutex mu;
  return mu;
}
int default_thread_count() {
  if (const char* env = std::getenv("CIDER_NUM_THREADS")) {
    const int n = std::atoi(env);
    check(n >= 1, ErrorCode::kInvalidArgument, "thread_pool", "CIDER_NUM_THREADS must be an integer >= 1; got '",
          env, "'");
    return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}
}  // namespace

ThreadPool& default_thread_pool() {
  std::lock_guard<std::mutex> lock(pool_mutex());
  auto& slot = pool_slot();
  if (!slot) slot = std::make_unique<ThreadPool>(default_thread_count());
  return *slot;
}

void set_num_threads(int n) {
  check(n >= 1, ErrorCode::kInvalidArgument, "set_num_threads", "the number of threads must be >= 1; got ", n);
  std::lock_guard<std::mutex> lock(pool_mutex());
  pool_slot() = std::make_unique<ThreadPool>(n);
}

int num_threads() { return default_thread_pool().size(); }

}  // namespace cider
