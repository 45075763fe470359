#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/thread_pool.h"
#include "support/test_support.h"

namespace cider {
namespace {

TEST(ThreadPool, EveryIndexVisitedExactlyOnceForManySizes) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 7, 33, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> chunks{0};
      pool.parallel_for(n, [&](int64_t b, int64_t e, int t) {
        EXPECT_LT(b, e);
        EXPECT_GE(t, 0);
        EXPECT_LT(t, threads);
        ++chunks;
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
      });
      for (auto& h : hits) ASSERT_EQ(h.load(), 1);
      EXPECT_EQ(chunks.load(), n == 0 ? 0 : std::min<int64_t>(n, threads));
    }
  }
}

TEST(ThreadPool, RethrowsAChunksExceptionAfterAllFinish) {
  ThreadPool pool(3);
  std::atomic<int> done{0};
  EXPECT_THROW(pool.parallel_for(3,
                                 [&](int64_t b, int64_t, int) {
                                   ++done;
                                   if (b == 1) throw std::runtime_error("chunk 1 failed");
                                 }),
               std::runtime_error);
  EXPECT_EQ(done.load(), 3);
  // The pool is still usable.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPool, RejectsZeroThreads) {
  EXPECT_THROW(ThreadPool(0), Error);
  EXPECT_THROW(set_num_threads(0), Error);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
}

}  // namespace
}  // namespace cider
