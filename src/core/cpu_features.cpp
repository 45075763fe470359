#include "core/cpu_features.h"

#include <cstdint>
#include <cstdlib>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define CIDER_X86_HOST 1
#endif

namespace cider {

namespace {

constexpr const char* kOp = "cpu_features";

#ifdef CIDER_X86_HOST
uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures probe() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1u;
  f.avx = (c >> 28) & 1u;
  f.fma = (c >> 12) & 1u;
  f.f16c = (c >> 29) & 1u;
  if (osxsave) {
    const uint64_t xcr0 = xgetbv0();
    f.os_avx = (xcr0 & 0x6u) == 0x6u;                 // SSE + AVX state
    f.os_avx512 = f.os_avx && (xcr0 & 0xe0u) == 0xe0u;  // opmask + ZMM_Hi256 + Hi16_ZMM
    f.os_amx = (xcr0 & 0x60000u) == 0x60000u;           // XTILECFG + XTILEDATA
  }
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b >> 5) & 1u;
    f.bmi2 = (b >> 8) & 1u;
    f.avx512f = (b >> 16) & 1u;
    f.avx512dq = (b >> 17) & 1u;
    f.avx512bw = (b >> 30) & 1u;
    f.avx512vl = (b >> 31) & 1u;
    f.avx512vnni = (c >> 11) & 1u;
    f.amx_tile = (d >> 24) & 1u;
    f.amx_int8 = (d >> 25) & 1u;
    f.amx_bf16 = (d >> 22) & 1u;
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512bf16 = (a >> 5) & 1u;
  }
  return f;
}
#else
CpuFeatures probe() { return {}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = probe();
  return f;
}

IsaLevel detected_isa() {
  const CpuFeatures& f = cpu_features();
  const bool avx2 = f.os_avx && f.avx && f.avx2 && f.fma && f.f16c;
  const bool avx512 =
      avx2 && f.os_avx512 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni && f.bmi2;
  return avx512 ? IsaLevel::kAvx512 : avx2 ? IsaLevel::kAvx2 : IsaLevel::kRef;
}

std::vector<IsaLevel> supported_isas() {
  std::vector<IsaLevel> out;
  for (int l = 0; l <= static_cast<int>(detected_isa()); ++l) out.push_back(static_cast<IsaLevel>(l));
  return out;
}

const char* isa_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::kRef: return "ref";
    case IsaLevel::kAvx2: return "avx2";
    case IsaLevel::kAvx512: return "avx512";
  }
  return "?";
}

IsaLevel parse_isa(const std::string& name, const char* op) {
  for (IsaLevel l : {IsaLevel::kRef, IsaLevel::kAvx2, IsaLevel::kAvx512})
    if (name == isa_name(l)) return l;
  fail(ErrorCode::kInvalidArgument, op, "the ISA level must be ref, avx2 or avx512; got '", name, "'");
}

IsaLevel resolve_isa(const char* request, IsaLevel detected) {
  if (request == nullptr || *request == '\0') return detected;
  const IsaLevel want = parse_isa(request, kOp);
  check(static_cast<int>(want) <= static_cast<int>(detected), ErrorCode::kUnsupported, kOp, "CIDER_ISA=", request,
        " is above this machine's highest level ", isa_name(detected),
        " (CPUID and the OS's saved register state, XCR0, decide it)");
  return want;
}

IsaLevel selected_isa() { return resolve_isa(std::getenv("CIDER_ISA"), detected_isa()); }

}  // namespace cider
