#include "core/thread_pool.h"

#include <sched.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "core/env.h"
#include "core/error.h"
#include "core/limits.h"

namespace cider {

namespace {
// [begin, end) of chunk c when n items are split into k near-equal chunks.
inline void chunk_range(int64_t n, int k, int c, int64_t* begin, int64_t* end) {
  const int64_t base = n / k, extra = n % k;
  *begin = c * base + std::min<int64_t>(c, extra);
  *end = *begin + base + (c < extra ? 1 : 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Spins until done() or spin_us microseconds have passed; true when done(). Every 64 pauses it reads the clock and
// yields the core: when more threads are runnable than there are cores (a busy machine), the thread we wait for may
// be the one that needs it (without the yield, 2 threads beside 2 compiler jobs on 2 cores decoded at a fraction of
// the idle speed).
template <typename Done>
bool spin_until(Done done, int spin_us) {
  if (spin_us <= 0) return done();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::yield();
  }
}

int default_spin_us() {
  if (const char* env = std::getenv("CIDER_SPIN_US")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    check(end != env && *end == '\0' && v >= 0 && v <= 1000000, ErrorCode::kInvalidArgument, "thread_pool",
          "CIDER_SPIN_US must be an integer in [0, 1000000] (microseconds); got '", env, "'");
    return static_cast<int>(v);
  }
  return 200;
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : ThreadPool(n_threads, -1) {}

ThreadPool::ThreadPool(int n_threads, int spin_us) : n_threads_(n_threads), spin_us_(spin_us) {
  check(n_threads >= 1, ErrorCode::kInvalidArgument, "thread_pool", "the number of threads must be >= 1; got ",
        n_threads);
  if (spin_us_ < 0) spin_us_ = default_spin_us();
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    auto started = [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(started, spin_us_)) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, started);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    const std::function<void(int64_t, int64_t, int)>* task = task_;
    const int64_t n = n_;
    const int chunks = n_chunks_;
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
    // The last worker to finish wakes the caller if it went to sleep (the lock orders this notify after the caller's
    // check of pending_ under the same lock: no lost wake-up).
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
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
  // Every worker has finished the previous generation (parallel_for returned only then), so none reads these now.
  task_ = &fn;
  n_ = n;
  n_chunks_ = chunks;
  error_ = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);  // every worker reports, with or without a chunk
  {
    // Publish under the lock: a worker that found no new generation and is about to sleep checks again under it.
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
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
  auto finished = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(finished, spin_us_)) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, finished);
  }
  task_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  std::lock_guard<std::mutex> lock(mu_);
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
  const int cpus = available_cpus();
  return env_int("CIDER_NUM_THREADS", cpus, 1, max_num_threads(), "thread_pool");
}
}  // namespace

int available_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return hw ? static_cast<int>(hw) : 1;
}

int max_num_threads() {
  return std::min(limits::kMaxThreadsAbsolute, limits::kThreadsPerCpu * available_cpus());
}

ThreadPool& default_thread_pool() {
  std::lock_guard<std::mutex> lock(pool_mutex());
  auto& slot = pool_slot();
  if (!slot) slot = std::make_unique<ThreadPool>(default_thread_count());
  return *slot;
}

void set_num_threads(int n) {
  const int hi = max_num_threads();
  check(n >= 1 && n <= hi, ErrorCode::kInvalidArgument, "set_num_threads", "the number of threads must be in [1, ",
        hi, "] (at most ", limits::kThreadsPerCpu, " per CPU this process may use: ", available_cpus(), "); got ", n);
  std::lock_guard<std::mutex> lock(pool_mutex());
  pool_slot() = std::make_unique<ThreadPool>(n);
}

int num_threads() { return default_thread_pool().size(); }

}  // namespace cider
