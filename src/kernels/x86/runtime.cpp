// Shared helpers of the x86 kernels, compiled with baseline flags (see x86_kernels.h for why).
#include <cstdlib>
#include <new>

#include "core/thread_pool.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86 {

void parallel_chunks(int64_t n, void (*fn)(void* ctx, int64_t begin, int64_t end), void* ctx) {
  if (n <= 0) return;
  default_thread_pool().parallel_for(n, [fn, ctx](int64_t begin, int64_t end, int) { fn(ctx, begin, end); });
}

namespace {
struct ScratchSlot {
  void* data = nullptr;
  size_t size = 0;
  ~ScratchSlot() { std::free(data); }
};
}  // namespace

void* scratch(int slot, size_t bytes) {
  thread_local ScratchSlot slots[kScratchSlots];
  ScratchSlot& s = slots[slot];
  if (s.size < bytes) {
    std::free(s.data);
    s.data = nullptr;
    s.size = 0;
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    s.data = std::aligned_alloc(64, rounded);
    if (!s.data) throw std::bad_alloc();
    s.size = rounded;
  }
  return s.data;
}

}  // namespace cider::kernels::x86
