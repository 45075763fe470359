// cider/core/thread_pool.h — a small fork-join pool for kernels: parallel_for over [0, n) split into one contiguous
// chunk per thread (static split: kernels give it work of equal cost per index, e.g. output rows or KV blocks).
//
// The calling thread takes chunk 0, so a pool of 1 thread runs inline with no synchronisation. Calls are not
// re-entrant: a task must not call parallel_for on the same pool.
#pragma once

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
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int64_t, int64_t, int)>* task_ = nullptr;
  int64_t n_ = 0;
  int n_chunks_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// The process-wide pool the kernels use. Its size is set by set_num_threads (the CLI's --threads) or, before the
// first use, by $CIDER_NUM_THREADS, else std::thread::hardware_concurrency().
ThreadPool& default_thread_pool();
// Replaces the default pool (not while kernels are running). n >= 1; throws cider::Error otherwise.
void set_num_threads(int n);
int num_threads();

}  // namespace cider
