// cider/core/dtype.h — element types and exact float16 / bfloat16 conversions.
//
// Conversions are plain bit manipulation (round to nearest, ties to even; NaN stays NaN, overflow goes to inf),
// used by the reference kernels. Fast paths (F16C, AVX-512 BF16) must agree with them bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#include "cider/dtype.hpp"  // DType: public

namespace cider {

inline int dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kU32: return 4;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kBool: return 1;
    case DType::kF64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t);

inline bool is_float_dtype(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// The result type of combining two float types, as MLX promotes: equal types stay, f16 with bf16 gives f32,
// anything with f32 gives f32.
inline DType promote_float(DType a, DType b) { return a == b ? a : DType::kF32; }

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bfloat16: the top 16 bits of a float32, rounded to nearest even.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(static_cast<uint32_t>(h) << 16); }

// IEEE binary16.
inline float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_f32(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_f32(sign);
    // Subnormal: value = mant * 2^-24.
    float v = static_cast<float>(mant) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t f32_to_f16(float f) {
  uint32_t u = f32_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24 rounded to nearest even.
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal (exactly half rounds to 0, even)
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - exp;  // 113 - exp + 13
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits (carry may bump the exponent; that is correct).
  uint32_t v = abs - 0x38000000u;  // exponent 127 -> 15
  uint32_t rounding = 0xfffu + ((v >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((v + rounding) >> 13));
}

// Reads element i of a float buffer of type t as float32.
inline float load_float(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::kF64: return static_cast<float>(static_cast<const double*>(p)[i]);
    default: return 0.0f;
  }
}

// The index of the first NaN or infinity among n elements of a float buffer of type t (f32/f16/bf16/f64), or -1.
// A branch-free scan of the exponent bits per block (vectorized by the compiler): checking every weight of a model
// at load costs a fraction of reading it.
int64_t find_nonfinite(const void* p, DType t, int64_t n);

// Writes a float32 as element i of a float buffer of type t (rounding to nearest even).
inline void store_float(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(p)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(p)[i] = f32_to_f16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(p)[i] = f32_to_bf16(v); break;
    case DType::kF64: static_cast<double*>(p)[i] = v; break;
    default: break;
  }
}

// Rounds a float32 to the precision of type t and back (identity for f32).
inline float round_to(DType t, float v) {
  switch (t) {
    case DType::kF16: return f16_to_f32(f32_to_f16(v));
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(v));
    default: return v;
  }
}

}  // namespace cider
