#include "kernels/kernel_table.h"

#include "kernels/ref/ref_kernels.h"

namespace cider::kernels {

const KernelTable& ref_kernels() {
  static const KernelTable table = {
      "ref", &ref::affine_qmm, &ref::w8a8_gemm, &ref::w8a8_gemv, &ref::w4a8_gemm, &ref::w4a8_gemv, &ref::attention, &ref::dense_gemm,
      &ref::kv_append,
  };
  return table;
}

const KernelTable& active_kernels() { return ref_kernels(); }

}  // namespace cider::kernels
