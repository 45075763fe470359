// The dispatch: one table per ISA level, chosen once (see the end of kernels/kernel_table.h).
//
// What each fast table fills (every other case calls the reference explicitly, inside the same entry):
//   entry        avx512 (F/BW/VL/DQ/VNNI)                        avx2 (AVX2/FMA/F16C)
//   w8a8_gemv    row-major int8, 16 rows at once, vpdpbusd       8 rows at once, vpmaddubsw sign trick
//   w8a8_gemm    packed 64-column panels, 6x64 vpdpbusd tiles    packed int16 16-column panels, vpmaddwd 6x16 tiles
//                (with AMX-INT8: 32x32 tdpbssd tile blocks, x86/amx; int4 group 32 and M = 1 stay on VNNI)
//   w4a8_gemv    nibbles split with and/shift, vpdpbusd          nibbles split, vpmaddubsw
//   w4a8_gemm    as w8a8_gemm (nibbles unpacked at packing)      as w8a8_gemm
//   dense_gemm   f32/f16/bf16 weights widened exactly, f32 FMA   same, 8 lanes
//   affine_qmm   transpose=true with 4 or 8 bits; other bit widths and transpose=false: ref::affine_qmm
//   attention    VNNI int8 scores, f32 value FMAs, split + LSE   same design, 8-row tiles (plain caches: ref)
//   kv_append    fused rotate + quantize, bit-identical to ref    same, 8 lanes
//   glu          x·σ(z), σ from exp16(−|z|), 16 lanes            same with exp8, 8 lanes
//   recent_block bf16 rows widened exactly, f32 FMAs, value sums  same, 8 lanes
//                in 8 registers (bool/additive masks: ref)
//   hadamard_rows butterflies h < 16 in a register, bit-identical  same, h < 8 in a register
//                (rows whose block P is below a vector: ref)
//   ggml_linear  M < 16: 64-byte vpdpbusd GEMV (K-quants);       int8 per 32: GEMV rows, from 16 rows packed panels
//                from 16: VNNI panels (with AMX-BF16: bfloat16 tiles, x86/amx)
//                avx2 (and taken by avx512): Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K rows interleaved 8 at a time
//   any later entry: the reference (the copy below), until a fast kernel is assigned
#include "kernels/kernel_table.h"

#include <cstdlib>
#include <string>

#include "core/cpu_features.h"
#include "core/error.h"
#include "kernels/ref/ref_kernels.h"
#include "kernels/x86/attention_x86.h"
#include "kernels/x86/x86_kernels.h"

namespace cider::kernels {

const KernelTable& ref_kernels() {
  static const KernelTable table = {
      "ref", &ref::affine_qmm, &ref::w8a8_gemm, &ref::w8a8_gemv, &ref::w4a8_gemm, &ref::w4a8_gemv, &ref::attention, &ref::dense_gemm,
      &ref::kv_append, &ref::ggml_linear, &ref::ggml_dequantize, &ref::gated_delta, &ref::log_sum_exp,
      &ref::glu, &ref::recent_block, &ref::hadamard_rows,
  };
  return table;
}

namespace {

#ifdef CIDER_X86_KERNELS
// A fast table starts as a copy of the reference table, so an entry appended to KernelTable later (or one this
// level does not speed up) is the reference until a fast kernel is assigned to it here.
const KernelTable& avx2_kernels() {
  static const KernelTable table = [] {
    KernelTable t = ref_kernels();
    t.name = "avx2";
    t.affine_qmm = &x86::avx2::affine_qmm;
    t.w8a8_gemm = &x86::avx2::w8a8_gemm;
    t.w8a8_gemv = &x86::avx2::w8a8_gemv;
    t.w4a8_gemm = &x86::avx2::w4a8_gemm;
    t.w4a8_gemv = &x86::avx2::w4a8_gemv;
    t.dense_gemm = &x86::avx2::dense_gemm;
    t.ggml_linear = &x86::avx2::ggml_linear;  // M >= 16: packed panels (avx2/ggml_linear_gemm.cpp)
    // Beats dequantize + dense from 16 rows on the AVX2 VM (Q8_0 640 × 262144: 56 vs 96 ms at 16 rows; level at 256).
    t.ggml_linear_prefill = true;
    // Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K rows 8 at a time: the float tail once for 8 rows
    // (avx2/ggml_linear_gemv_x8.cpp)
    t.ggml_interleave = true;
    t.ggml_dequantize = &x86::avx2::ggml_dequantize;
    t.gated_delta = &x86::avx2::gated_delta;
    t.log_sum_exp = &x86::avx2::log_sum_exp;
    t.glu = &x86::avx2::glu;
    t.recent_block = &x86::avx2::recent_block;
    t.hadamard_rows = &x86::avx2::hadamard_rows;
    x86::register_attention_avx2(t);  // attention, kv_append (kernels/x86/attention_x86.h)
    return t;
  }();
  return table;
}

// AMX-INT8 GEMM inside the avx512 level: CPUID + XCR0 + the Linux permission, unless CIDER_NO_AMX is set.
bool amx_usable() {
  const CpuFeatures& f = cpu_features();
  const char* off = std::getenv("CIDER_NO_AMX");
  if (!(f.amx_tile && f.amx_int8 && f.os_amx) || (off && *off && std::string(off) != "0")) return false;
  return x86::amx::request_tile_permission();
}

const KernelTable& avx512_kernels() {
  static const KernelTable table = [] {
    KernelTable t = ref_kernels();
    t.name = "avx512";
    t.affine_qmm = &x86::avx512::affine_qmm;
    t.w8a8_gemm = &x86::avx512::w8a8_gemm;
    t.w8a8_gemv = &x86::avx512::w8a8_gemv;
    t.w4a8_gemm = &x86::avx512::w4a8_gemm;
    t.w4a8_gemv = &x86::avx512::w4a8_gemv;
    t.dense_gemm = &x86::avx512::dense_gemm;
    t.ggml_linear = &x86::avx512::ggml_linear;  // M >= 16: VNNI tiles over packed panels; M < 16: the AVX2 kernel
    t.ggml_linear_prefill = true;  // 1.5-2x dequantize + dense at 512 × {4096², 3584 × 18944}, Q4_K/Q6_K
    // No interleaved rows here (ggml_interleave stays false): on the Xeon host the VNNI / AMX panels reading the blocks
    // back made Q5_0 prefill 8-20% slower, and the GEMV gain varied by host (1.3-2.2x on one, level on another;
    // docs/benchmarks.md, 2026-12-07). The kernels still take interleaved rows (the AVX2 GEMV for M < 16).
    t.ggml_dequantize = &x86::avx2::ggml_dequantize;
    t.gated_delta = &x86::avx2::gated_delta;  // AVX2 + FMA over a value row (Dv ≤ a few hundred): no AVX-512 version
    t.log_sum_exp = &x86::avx512::log_sum_exp;
    t.glu = &x86::avx512::glu;
    t.recent_block = &x86::avx512::recent_block;
    t.hadamard_rows = &x86::avx512::hadamard_rows;
    x86::register_attention_avx512(t);  // attention, kv_append (kernels/x86/attention_x86.h)
    if (amx_usable()) {  // AMX tiles for prefill GEMM; M = 1 and int4 group 32 stay on VNNI inside the entry
      t.w8a8_gemm = &x86::amx::w8a8_gemm;
      t.w4a8_gemm = &x86::amx::w4a8_gemm;
      if (cpu_features().amx_bf16 && cpu_features().avx512bf16) {  // prefill on bfloat16 tiles
        t.ggml_linear = &x86::amx::ggml_linear_bf16;
        t.attention = &x86::amx::attention_bf16;  // prefill over per-channel keys; the rest: avx512::attention
      }
    }
    return t;
  }();
  return table;
}
#endif

}  // namespace

const KernelTable& kernels_for_isa(IsaLevel level) {
  constexpr const char* kOp = "kernels_for_isa";
  check(static_cast<int>(level) <= static_cast<int>(detected_isa()), ErrorCode::kUnsupported, kOp, "ISA level ",
        isa_name(level), " is above this machine's highest level ", isa_name(detected_isa()));
  switch (level) {
    case IsaLevel::kRef: return ref_kernels();
#ifdef CIDER_X86_KERNELS
    case IsaLevel::kAvx2: return avx2_kernels();
    case IsaLevel::kAvx512: return avx512_kernels();
#else
    default: break;
#endif
  }
  fail(ErrorCode::kUnsupported, kOp, "ISA level ", isa_name(level), " was not compiled into this build");
}

const KernelTable& active_kernels() {
  static const KernelTable* const table = &kernels_for_isa(selected_isa());
  return *table;
}

}  // namespace cider::kernels
