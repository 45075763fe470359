// cider/kernels/cuda/linear_dispatch.cu — int_linear: the one entry the GPU engine calls for a quantized linear layer.
// Decode-sized batches (M ≤ 16) stream the weights once through the GEMV kernels (kernels/cuda/linear_gemv.cu);
// larger M goes to the tensor-core GEMM (kernels/cuda/linear_gemm.cu). Both validate their own arguments.
#include "kernels/cuda/cuda_api.h"

namespace cider::cuda {

namespace {
constexpr int64_t kMaxGemvRows = 16;  // the GEMV kernels reuse each weight load for at most this many rows
}

void int_linear(const kernels::IntLinearArgs& args, bool int4, const Exec& exec) {
  if (args.M <= kMaxGemvRows) {
    if (int4) {
      w4a8_gemv(args, exec);
    } else {
      w8a8_gemv(args, exec);
    }
  } else if (int4) {
    w4a8_gemm(args, exec);
  } else {
    w8a8_gemm(args, exec);
  }
}

}  // namespace cider::cuda
