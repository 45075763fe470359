// cider/kernels/cuda/so4_rotation.cuh — device code of the SO(4) block rotation shared by kv_append.cu and the GPU
// model's kernels (kernels/cuda/model_ops.cu): every multiply and add rounded (_rn intrinsics, never contracted into
// FMA) in nn/rotation.cpp's order, so rotated rows equal the CPU's bit for bit.
#pragma once

#include <cuda_runtime.h>

namespace cider::cuda::so4 {

// out = p·q, Hamilton product of (w, x, y, z) quaternions, in the order nn/rotation.cpp writes it: ((a − b) − c) − d.
__device__ __forceinline__ void qmul_rn(const float p[4], const float q[4], float out[4]) {
  out[0] = __fsub_rn(__fsub_rn(__fsub_rn(__fmul_rn(p[0], q[0]), __fmul_rn(p[1], q[1])), __fmul_rn(p[2], q[2])),
                     __fmul_rn(p[3], q[3]));
  out[1] = __fsub_rn(__fadd_rn(__fadd_rn(__fmul_rn(p[0], q[1]), __fmul_rn(p[1], q[0])), __fmul_rn(p[2], q[3])),
                     __fmul_rn(p[3], q[2]));
  out[2] = __fadd_rn(__fadd_rn(__fsub_rn(__fmul_rn(p[0], q[2]), __fmul_rn(p[1], q[3])), __fmul_rn(p[2], q[0])),
                     __fmul_rn(p[3], q[1]));
  out[3] = __fadd_rn(__fsub_rn(__fadd_rn(__fmul_rn(p[0], q[3]), __fmul_rn(p[1], q[2])), __fmul_rn(p[2], q[1])),
                     __fmul_rn(p[3], q[0]));
}

// Forward (w = qL·v[·conj(qR)]) or inverse (v = conj(qL)·w[·qR]) rotation of one 4-d block in place; rotation 1
// (fast) uses qL only, 2 (full) both. qL/qR point at this block's quaternion (4 floats).
__device__ __forceinline__ void rotate_block(float v[4], const float* qL, const float* qR, int rotation,
                                             bool inverse) {
  float l[4] = {qL[0], qL[1], qL[2], qL[3]};
  if (inverse) {
    l[1] = -l[1];
    l[2] = -l[2];
    l[3] = -l[3];
  }
  float t[4];
  qmul_rn(l, v, t);
  if (rotation == 2) {
    float r[4] = {qR[0], qR[1], qR[2], qR[3]};
    if (!inverse) {
      r[1] = -r[1];
      r[2] = -r[2];
      r[3] = -r[3];
    }
    qmul_rn(t, r, v);
  } else {
    for (int k = 0; k < 4; ++k) v[k] = t[k];
  }
}

}  // namespace cider::cuda::so4
