// cider/core/thread_pool.h — a small fork-join pool for kernels: parallel_for over [0, n) split into one contiguous
// chunk per thread (static split: kernels give it work of equal cost per index, e.g. output rows or KV blocks).
//
// The calling thread takes chunk 0, so a pool of 1 thread runs inline with no synchronisation. Calls are not
// re-entrant: a task must not call parallel_for on the same pool.
//
// Hand-off: a decode step makes hundreds of short parallel_for calls, and a futex sleep/wake per call cost about half
// of the two threads' time (perf, docs/benchmarks.md "Where the time goes"). So the workers and the caller first
// spin on atomics (with a pause instruction) for up to spin_us microseconds — $CIDER_SPIN_US, default 200; 0 sleeps
// at once, for machines with more runnable threads than cores — and only then sleep on the condition variables.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cider {

class ThreadPool {
 public:
  // n_threads >= 1 (the caller counts as one).
  explicit ThreadPool(int n_threads);
  // spin_us: how long a waiting thread spins before it sleeps (< 0: $CIDER_SPIN_US, else 200).
  ThreadPool(int n_threads, int spin_us);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) for the chunks of [0, n) — at most size() chunks, none empty — and returns
  // when all are done. The first exception thrown by a chunk is rethrown here after every chunk has finished.
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end, int thread)>& fn);

 private:
  void worker(int index);

  int n_threads_;
  int spin_us_;
  std::vector<std::thread> workers_;
  std::mutex mu_;  // guards the sleeps (with the condition variables) and error_
  std::condition_variable start_cv_, done_cv_;
  // The task of the current generation: written by the caller before it publishes generation_ (release), read by a
  // worker after it sees the new generation (acquire).
  const std::function<void(int64_t, int64_t, int)>* task_ = nullptr;
  int64_t n_ = 0;
  int n_chunks_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};  // workers that have not finished the current generation
  std::atomic<bool> stop_{false};
  std::exception_ptr error_;
};

// The process-wide pool the kernels use. Its size is set by set_num_threads (the CLI's --threads) or, before the
// first use, by $CIDER_NUM_THREADS, else std::thread::hardware_concurrency().
ThreadPool& default_thread_pool();
// Replaces the default pool (not while kernels are running). 1 <= n <= max_num_threads(); throws cider::Error
// (kInvalidArgument, naming the bound and why) otherwise.
void set_num_threads(int n);
// The most threads a pool may have: 4 × the CPUs this process may run on (sched_getaffinity), at most 1024
// (core/limits.h). More threads than that only slow the spinning pool down, and an unbounded count can exhaust the
// machine's process table.
int max_num_threads();
// The CPUs this process may run on.
int available_cpus();
int num_threads();

}  // namespace cider
