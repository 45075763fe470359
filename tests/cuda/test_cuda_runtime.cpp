// The CUDA runtime layer: device discovery, device memory round trips and error reporting.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "core/error.h"
#include "cuda/cuda_test_support.h"
#include "support/test_support.h"

namespace cider::cuda {
namespace {

TEST(CudaRuntime, ReportsDeviceOrSkips) {
  std::string why;
  if (!device_available(&why)) {
    EXPECT_FALSE(why.empty());  // a reason is always given
    EXPECT_THROW(require_device("test"), Error);
    GTEST_SKIP() << "no GPU: " << why;
  }
  const DeviceInfo& d = device_info();
  EXPECT_EQ(d.cc_major, 9);
  EXPECT_GT(d.sm_count, 0);
  EXPECT_GT(d.total_memory, size_t{1} << 30);
}

TEST(CudaRuntime, BufferRoundTripAndBounds) {
  CIDER_REQUIRE_GPU();
  auto rng = test::make_rng(1);
  std::vector<float> host = test::randn(rng, 4099);
  DeviceBuffer b = to_device(host.data(), host.size() * sizeof(float));
  std::vector<float> back(host.size(), -1.0f);
  b.download(back.data(), back.size() * sizeof(float));
  EXPECT_EQ(back, host);
  EXPECT_THROW(b.upload(host.data(), 8, b.bytes() - 4), Error);
  EXPECT_THROW(b.download(back.data(), b.bytes() + 1), Error);
  b.fill(0xFF);
  std::vector<uint8_t> bytes(b.bytes());
  b.download(bytes.data(), bytes.size());
  for (uint8_t v : bytes) ASSERT_EQ(v, 0xFF);
}

TEST(CudaRuntime, HugeAllocationIsOutOfMemory) {
  CIDER_REQUIRE_GPU();
  try {
    DeviceBuffer b(size_t{1} << 50);
    FAIL() << "a 1 PiB allocation succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("cuda.DeviceBuffer"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cider::cuda
