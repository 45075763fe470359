// Shared helpers of the CUDA tests: skip cleanly (with the reason) where no suitable GPU is present.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/cuda_api.h"

// At the top of every CUDA test body.
#define CIDER_REQUIRE_GPU()                                                        \
  do {                                                                             \
    std::string cider_why_;                                                        \
    if (!::cider::cuda::device_available(&cider_why_))                             \
      GTEST_SKIP() << "no GPU for the CUDA backend: " << cider_why_;               \
  } while (0)
