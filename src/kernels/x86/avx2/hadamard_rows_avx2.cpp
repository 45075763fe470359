// The kernel table's hadamard_rows at the avx2 level: each row through avx2/hadamard.h, bit-identical to
// kernels::ref::hadamard_row (tests/test_hadamard_rows.cpp).
#include "kernels/x86/avx2/hadamard.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels::x86::avx2 {

void hadamard_rows(const HadamardRowsArgs& a) {
  for (int64_t r = 0; r < a.n; ++r) hadamard_row(a.signs, a.dim, a.rows + r * a.dim, a.inverse);
}

}  // namespace cider::kernels::x86::avx2
