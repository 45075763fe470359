#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
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


// Both hand-offs — spinning (the default) and sleeping at once (spin 0), and a short spin that runs out between
// calls — visit every index of many back-to-back calls exactly once, including calls separated by pauses longer than
// the spin (the workers have gone to sleep and must be woken).
TEST(ThreadPool, SpinAndSleepHandOffsVisitEveryIndex) {
  for (int spin_us : {0, 5, 200}) {
    for (int threads : {2, 3}) {
      SCOPED_TRACE(::testing::Message() << "spin " << spin_us << " us, threads " << threads);
      ThreadPool pool(threads, spin_us);
      for (int call = 0; call < 3000; ++call) {
        const int64_t n = 1 + call % 37;
        std::vector<int> hits(static_cast<size_t>(n), 0);  // each index written by exactly one chunk
        pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "call " << call << " index " << i;
        if (call % 500 == 499) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past any spin
      }
    }
  }
}

TEST(ThreadPool, RejectsABadSpinSetting) {
  ::setenv("CIDER_SPIN_US", "fast", 1);
  try {
    ThreadPool pool(2);
    ADD_FAILURE() << "CIDER_SPIN_US=fast must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CIDER_SPIN_US"), std::string::npos) << e.what();
  }
  ::setenv("CIDER_SPIN_US", "0", 1);
  EXPECT_NO_THROW(ThreadPool(2));
  ::unsetenv("CIDER_SPIN_US");
}

}  // namespace
}  // namespace cider
