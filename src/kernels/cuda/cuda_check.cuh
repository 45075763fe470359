// cider/kernels/cuda/cuda_check.cuh — turning CUDA runtime errors into cider::Error (CUDA translation units only).
#pragma once

#include <cuda_runtime.h>

#include "core/error.h"

namespace cider::cuda::detail {
[[noreturn]] inline void fail_cuda(const char* op, const char* expr, cudaError_t e) {
  fail(e == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kInternal, op, expr, " failed: ",
       cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}
}  // namespace cider::cuda::detail

// CIDER_CUDA_CHECK("cuda.op", cudaMemcpy(...)): throws cider::Error naming the op, the call and the CUDA error.
#define CIDER_CUDA_CHECK(op, expr)                                             \
  do {                                                                         \
    const cudaError_t cider_cuda_err_ = (expr);                                \
    if (cider_cuda_err_ != cudaSuccess) ::cider::cuda::detail::fail_cuda(op, #expr, cider_cuda_err_); \
  } while (0)
