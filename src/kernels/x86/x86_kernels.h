// cider/kernels/x86 — the x86 fast kernels, one folder per ISA level, one file per op × format.
//
// Files under avx2/ and avx512/ are compiled with that level's flags (CMakeLists.txt, "x86 ISA kernels" block) and
// are reached only through kernels_for_isa(), which checks CPUID + XCR0 first. Rule for those files, because the
// linker keeps ONE copy of every inline function or template instantiated in several files and might keep the one
// compiled with AVX-512 flags: they define everything they use in an anonymous namespace or as `static inline`, and
// call shared code only through the plain (non-inline) functions below or other non-inline library functions. No
// std::vector, std::function, std::min/max or dtype.h inline helpers inside them.
//
// This header has no intrinsics: it is included by the dispatcher (baseline flags) and by the ISA files.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kernel_table.h"

namespace cider::kernels::x86 {

// ---- shared run-time helpers (x86/runtime.cpp, baseline flags) ----
// Runs fn(ctx, begin, end) over near-equal chunks of [0, n), one per thread of the default pool; returns when done.
void parallel_chunks(int64_t n, void (*fn)(void* ctx, int64_t begin, int64_t end), void* ctx);
// A per-thread, per-slot scratch buffer of at least `bytes` bytes, 64-byte aligned, contents unspecified, kept for
// the thread's lifetime (grown on demand). Slots 0..kScratchSlots-1 may be used at the same time.
constexpr int kScratchSlots = 4;
void* scratch(int slot, size_t bytes);

// ---- the kernel entries (the contract of each is its *Args struct in kernels/kernel_table.h) ----
#define CIDER_X86_DECLARE_KERNELS                 \
  void w8a8_gemv(const IntLinearArgs& a);         \
  void w8a8_gemm(const IntLinearArgs& a);         \
  void w4a8_gemv(const IntLinearArgs& a);         \
  void w4a8_gemm(const IntLinearArgs& a);         \
  void dense_gemm(const DenseGemmArgs& a);        \
  void affine_qmm(const AffineQmmArgs& a);        \
  void log_sum_exp(const LogSumExpArgs& a);       \
  void glu(const GluArgs& a);                     \
  void recent_block(const RecentBlockArgs& a);    \
  void hadamard_rows(const HadamardRowsArgs& a);  // log_sum_exp_<level>.cpp, glu_<level>.cpp, recent_block_<level>.cpp,
                                                  // hadamard_rows_<level>.cpp

namespace avx2 {
CIDER_X86_DECLARE_KERNELS
// Native GGUF weights (avx2/ggml_linear.cpp); the avx512 table's ggml_linear sends M < 16 here, and uses
// ggml_dequantize as it is.
void ggml_linear(const GgmlLinearArgs& a);
void ggml_dequantize(const GgmlDequantArgs& a);
// ggml_linear's path for M >= kGgmlGemmFromM rows (avx2/ggml_linear_gemm.cpp: packed panels), format and shapes checked.
constexpr int64_t kGgmlGemmFromM = 16;
void ggml_linear_gemm(const GgmlLinearArgs& a);
// ggml_linear's path for M < kGgmlGemmFromM (avx2/ggml_linear_gemv.cpp: unsigned codes, offsets off in int16) for the
// formats it takes (Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K); format and shapes checked by ggml_linear.
bool ggml_linear_gemv_takes(uint32_t ggml_type);
void ggml_linear_gemv(const GgmlLinearArgs& a);
// ggml_linear's path for interleaved rows (GgmlLinearArgs::interleaved) and M < kGgmlGemmFromM
// (avx2/ggml_linear_gemv_x8.cpp); format, N and shapes checked by ggml_linear.
void ggml_linear_gemv_x8(const GgmlLinearArgs& a);
void gated_delta(const GatedDeltaKernelArgs& a);  // gated_delta_avx2.cpp
}  // namespace avx2
namespace avx512 {
CIDER_X86_DECLARE_KERNELS
// Native GGUF weights with M >= 16 (avx512/ggml_linear.cpp: weights unpacked once per panel, VNNI tiles); fewer
// rows: ggml_linear_gemv for the formats it takes (avx512/ggml_linear_gemv.cpp: Q4_K, Q5_K, Q6_K), else
// avx2::ggml_linear.
void ggml_linear(const GgmlLinearArgs& a);
bool ggml_linear_gemv_takes(uint32_t ggml_type);
void ggml_linear_gemv(const GgmlLinearArgs& a);
}  // namespace avx512

#undef CIDER_X86_DECLARE_KERNELS

// AMX-INT8 GEMM (x86/amx, compiled with the avx512 + AMX flags): the avx512 table's w8a8_gemm / w4a8_gemm where
// the CPU and OS support AMX. Cases it does not take (M = 1, int4 group 32) go to the avx512 kernels.
namespace amx {
// Asks Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM); true when granted. Call before any use.
bool request_tile_permission();
void w8a8_gemm(const IntLinearArgs& a);
void w4a8_gemm(const IntLinearArgs& a);
// Native GGUF weights with M >= 16 on AMX-BF16 tiles (amx/ggml_linear_bf16.cpp: weights decoded and rounded to
// bfloat16 once per call, float32 sums over K); fewer rows and the errors: avx512::ggml_linear. Only where the CPU
// has AMX-BF16 and AVX512-BF16 and the OS grants the tile state.
void ggml_linear_bf16(const GgmlLinearArgs& a);
// Prefill attention (L >= 16) over per-channel keys on AMX-BF16 tiles (amx/attention_prefill_bf16.cpp); anything
// else: avx512::attention. Same conditions as ggml_linear_bf16.
void attention_bf16(const AttentionArgs& a);
bool attention_bf16_takes(const AttentionArgs& a);  // whether attention_bf16 runs these arguments on its tiles
}  // namespace amx

}  // namespace cider::kernels::x86
