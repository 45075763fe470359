#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "support/test_support.h"

namespace cider {
namespace {

// float16 conversion checked against exhaustive round trips: every f16 bit pattern survives f16 -> f32 -> f16.
TEST(DType, F16RoundTripsEveryBitPattern) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    uint16_t back = f32_to_f16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(back))) << h;
    } else {
      ASSERT_EQ(back, h) << "pattern " << h << " value " << f;
    }
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // 1 + 2^-11 is exactly halfway between 1 and 1 + 2^-10: ties to even gives 1.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // Slightly above the halfway point rounds up.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // overflows to inf
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // half of it: ties to even (zero)
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

// Compares the bit-manipulation conversion against a double-precision model on random floats.
TEST(DType, F16MatchesDoubleRounding) {
  auto rng = test::make_rng(1);
  std::uniform_real_distribution<double> expo(-26.0, 15.99);
  for (int i = 0; i < 200000; ++i) {
    float f = static_cast<float>(std::pow(2.0, expo(rng)) * ((rng() & 1) ? -1.0 : 1.0));
    float r = f16_to_f32(f32_to_f16(f));
    // Find the nearest f16 by brute force over the neighbours of the result.
    uint16_t h = f32_to_f16(f);
    double err = std::fabs(static_cast<double>(r) - f);
    for (int d : {-1, 1}) {
      uint16_t n = static_cast<uint16_t>(h + d);
      float nf = f16_to_f32(n);
      if (std::isinf(nf) || std::isnan(nf) || (n & 0x7fff) == 0x7fff) continue;
      ASSERT_LE(err, std::fabs(static_cast<double>(nf) - f)) << f;
    }
  }
}

TEST(DType, BF16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(f32_to_bf16(bits_f32(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(f32_to_bf16(f), h);
    }
  }
}

TEST(Tensor, ViewShapeStridesAndContiguity) {
  float data[24] = {};
  TensorView v(data, DType::kF32, {2, 3, 4});
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(v.rows(), 6);
  EXPECT_EQ(v.dim(-1), 4);
  EXPECT_EQ(v.stride_of(0), 12);
  EXPECT_TRUE(v.is_contiguous());
  v.stride[2] = 2;
  EXPECT_FALSE(v.is_contiguous());
  EXPECT_EQ(v.shape_string(), "(2, 3, 4)");
}

TEST(Tensor, RejectsNegativeDimensionAndTooHighRank) {
  float data[1] = {};
  EXPECT_THROW(TensorView(data, DType::kF32, {2, -1}), Error);
  EXPECT_THROW(TensorView(data, DType::kF32, {1, 1, 1, 1, 1, 1, 1, 1, 1}), Error);
}

TEST(Error, MessageNamesOpRuleAndValue) {
  try {
    check(false, ErrorCode::kInvalidArgument, "some_op", "bits must be 4; got ", 5);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "[some_op] bits must be 4; got 5");
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(Buffer, AlignedZeroedAndMovable) {
  Buffer b(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % Buffer::kAlignment, 0u);
  for (size_t i = 0; i < 100; ++i) EXPECT_EQ(b.as<uint8_t>()[i], 0);
  Buffer c = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(c.nbytes(), 100u);
  Buffer d = c.clone();
  EXPECT_NE(d.data(), c.data());
}

}  // namespace
}  // namespace cider
