// BF16 (bfloat16: 1 sign, 8 exponent, 7 mantissa bits — the top half of an
// IEEE float) conversions, shared by the CPU code and the CUDA kernels so both
// backends round a float to BF16 identically (the --precision bf16 GEMMs of
// model/ops.h round their inputs with these on either device).
//
// float → BF16 rounds to nearest, ties to even, as an IEEE conversion does:
// a value past the largest finite BF16 by at least half an ulp becomes ±Inf,
// ±Inf stays ±Inf, subnormals round like any other value (no flush to zero),
// and a NaN stays a NaN (made quiet, sign and top payload bits kept).
#pragma once

#include <cstdint>
#include <cstring>

#include "common/philox.h"  // NCF_HD

namespace ncf {

NCF_HD uint32_t float_to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

NCF_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// The BF16 nearest to x (ties to even), as its 16 bits.
NCF_HD uint16_t float_to_bf16_bits(float x) {
  uint32_t u = float_to_bits(x);
  // NaN: the rounding below could carry it into Inf, and truncating a NaN whose
  // payload sits in the low 16 bits would leave Inf too; set the quiet bit.
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Adding just under half of the dropped range, plus the kept LSB, carries into
  // bit 16 exactly when the dropped bits exceed half, or equal half with an odd
  // kept LSB. The float bit pattern is monotone in |x|, so the carry walks
  // mantissa → exponent, and past the largest finite BF16 into Inf (0x7F80).
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The float whose top 16 bits are `bits` (exact: every BF16 is a float).
NCF_HD float bf16_bits_to_float(uint16_t bits) {
  return bits_to_float(static_cast<uint32_t>(bits) << 16);
}

// x rounded to the nearest BF16 value, returned as a float.
NCF_HD float round_to_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

// Two floats as BF16 bits in one word, a in the low half (the first in memory).
NCF_HD uint32_t bf16_pair(float a, float b) {
  return uint32_t(float_to_bf16_bits(a)) | (uint32_t(float_to_bf16_bits(b)) << 16);
}

// x rounded to TF32 (10 mantissa bits; nearest, ties to even) as a float: NaN and the
// infinities as they are, and a finite value whose rounding would overflow truncated.
NCF_HD float round_to_tf32(float x) {
  const uint32_t u = float_to_bits(x);
  if ((u & 0x7F800000u) == 0x7F800000u) return x;  // NaN, ±inf
  const uint32_t r = (u + 0x0FFFu + ((u >> 13) & 1u)) & 0xFFFFE000u;
  if ((r & 0x7F800000u) == 0x7F800000u) return bits_to_float(u & 0xFFFFE000u);
  return bits_to_float(r);
}

// Stochastic rounding with a uniform 16-bit word r (only its low 16 bits are
// read): x goes to the BF16 above it in magnitude with probability (the
// dropped 16 bits) / 2^16, its distance from the BF16 below over their gap,
// else to the one below, so the expected result is x. Adding r to the dropped
// bits carries into the kept ones exactly then. A BF16 value stays itself;
// NaN and ±Inf round as float_to_bf16_bits does.
NCF_HD uint16_t float_to_bf16_bits_stochastic(float x, uint32_t r) {
  const uint32_t u = float_to_bits(x);
  if ((u & 0x7F800000u) == 0x7F800000u) return float_to_bf16_bits(x);
  return static_cast<uint16_t>((u + (r & 0xFFFFu)) >> 16);
}

}  // namespace ncf
