// cider/kernels/cuda/pdl.cuh — programmatic dependent launch (PDL, sm_90) for the decode path's kernels.
//
// Why: a decode step is ~400 short kernels back to back; each one's start (CTA launch, prologue, the first HBM
// round trips) waits for the previous kernel's last CTA. With PDL a kernel launched by `pdl::launch` may start while
// its predecessor is still running; it must call `pdl::wait()` before it reads anything an earlier kernel wrote or
// writes anything an earlier kernel reads (griddepcontrol.wait returns once the predecessor grid has completed and
// its memory is visible). What it does before the wait may only touch immutable data (weights, scales, tables): a
// GEMV issues its first weight loads there; the decode attention kernel its first cache tiles below length − L and
// *d_length, which cuda::attention's contract (cuda_api.h) keeps the previous kernel from writing. `pdl::launch_dependents()` lets the next kernel start; we call it right
// after the wait, so at most the next kernel's prologue overlaps this kernel's work (no cascade of waiting grids).
//
// Rules for every kernel launched through pdl::launch: call wait() on every path before the first dependent access
// (an early `return` before it is fine only if the CTA touches no dependent memory at all); both instructions are
// no-ops when the kernel was launched without the attribute (tests, CIDER_PDL=0), so the same kernel serves both.
// Works inside stream capture: CUDA graphs keep the programmatic edges.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/env.h"

namespace cider::cuda::pdl {

__device__ __forceinline__ void wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// CIDER_PDL=0 launches without the attribute (A/B in the benchmarks); read at every launch, so a graph captured
// after changing it follows it.
inline bool enabled() { return env_flag("CIDER_PDL", true, "cuda.pdl"); }

// kernel<<<grid, block, smem, stream>>>(args...) with the programmatic-stream-serialization attribute when enabled().
// Returns the launch error (the caller checks it with check_last_launch / CIDER_CUDA_CHECK as for <<<>>>).
template <typename... KernelArgs, typename... Args>
cudaError_t launch(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = enabled() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace cider::cuda::pdl
