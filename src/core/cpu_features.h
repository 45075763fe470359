// cider/core/cpu_features.h — what the x86 CPU and the operating system let cider's kernels use.
//
// A level is usable only when CPUID reports the instructions AND the OS saves their register state (XCR0 via
// XGETBV: bits 1-2 for SSE/AVX, bits 5-7 for the AVX-512 opmask and upper ZMM state).
//   ref     the scalar reference kernels (always)
//   avx2    AVX2 + FMA + F16C
//   avx512  AVX-512 F + BW + VL + DQ + VNNI (AVX512_BF16 is reported separately; no kernel requires it). Where
//           AMX-TILE + AMX-INT8 are present too, this level's W8A8/W4A8 GEMM runs on AMX tiles (kernels/x86/amx).
// $CIDER_ISA=ref|avx2|avx512 forces a level at or below the machine's; asking for more is an error.
#pragma once

#include <string>
#include <vector>

namespace cider {

enum class IsaLevel : int { kRef = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuFeatures {
  bool avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512vnni = false;
  bool avx512bf16 = false;
  bool bmi2 = false;  // pdep / pext (the avx512 level's odd-width key unpack)
  bool amx_tile = false, amx_int8 = false, amx_bf16 = false;  // AMX (used by the avx512 level's GEMM when present)
  bool os_avx = false;     // XCR0: XMM and YMM state
  bool os_avx512 = false;  // XCR0: opmask, ZMM_Hi256, Hi16_ZMM state
  bool os_amx = false;     // XCR0: XTILECFG and XTILEDATA state (Linux also needs a per-process permission)
};

// Read once (CPUID + XGETBV); all false on a non-x86 build.
const CpuFeatures& cpu_features();

// The highest level the CPU and OS support.
IsaLevel detected_isa();
// Every level this machine can run, lowest first (always starts with kRef).
std::vector<IsaLevel> supported_isas();

const char* isa_name(IsaLevel level);  // "ref", "avx2", "avx512"
// Parses "ref" / "avx2" / "avx512"; throws Error(kInvalidArgument) naming `op` for anything else.
IsaLevel parse_isa(const std::string& name, const char* op);

// The level to use given a request (nullptr or "" = none) and the machine's highest level: the request if it is
// at or below `detected`, else Error(kUnsupported) "[cpu_features] CIDER_ISA=avx512 is above this machine's
// highest level avx2". Pure: tests call it with any `detected`.
IsaLevel resolve_isa(const char* request, IsaLevel detected);
// resolve_isa($CIDER_ISA, detected_isa()).
IsaLevel selected_isa();

}  // namespace cider
