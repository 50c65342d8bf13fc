// Counter-based random numbers (Philox-4x32-10). Every random draw in ncf_dist is
// a pure function of (key, counter), so results do not depend on thread count,
// rank count or the order in which work is done. Usable from host and device.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define NCF_HD __host__ __device__ __forceinline__
#else
#define NCF_HD inline
#endif

namespace ncf {

struct Philox4 {
  uint32_t v[4];
};

NCF_HD uint32_t mulhilo32(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// 10 rounds of Philox-4x32 on counter (c0..c3) with key (k0, k1).
NCF_HD Philox4 philox4x32(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                          uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo32(kM0, c0, &hi0);
    uint32_t lo1 = mulhilo32(kM1, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kW0;
    k1 += kW1;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// A stream of draws for one logical entity: key = (seed, stream id), counter =
// (entity index, draw index). Four 32-bit words per Philox call.
struct CounterRng {
  uint64_t seed;
  uint32_t stream;
  uint64_t index;

  NCF_HD Philox4 block(uint32_t draw) const {
    return philox4x32(static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), draw,
                      stream, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  }
  // The d-th 32-bit word of this entity's stream.
  NCF_HD uint32_t u32(uint64_t d) const { return block(static_cast<uint32_t>(d >> 2)).v[d & 3]; }
  // The d-th 64-bit word (uses words 2d, 2d+1).
  NCF_HD uint64_t u64(uint64_t d) const { return half(block(static_cast<uint32_t>(d >> 1)), d); }
  // The 64-bit word d of the stream, taken from its block b = block(d >> 1):
  // a caller walking d = 0, 1, 2 … computes each block once for two words.
  NCF_HD static uint64_t half(const Philox4& b, uint64_t d) {
    return (d & 1) ? (static_cast<uint64_t>(b.v[2]) << 32 | b.v[3])
                   : (static_cast<uint64_t>(b.v[0]) << 32 | b.v[1]);
  }
  // Uniform in [0, 1) with 24 bits.
  NCF_HD float uniform(uint64_t d) const { return (u32(d) >> 8) * (1.0f / 16777216.0f); }
  // Uniform in [0, 1) with 53 bits.
  NCF_HD double uniform_double(uint64_t d) const {
    return (u64(d) >> 11) * (1.0 / 9007199254740992.0);
  }
  // Uniform integer in [0, n), n > 0 (multiply-shift; bias < n / 2^64).
  NCF_HD uint64_t below(uint64_t d, uint64_t n) const { return scale(u64(d), n); }
  // A uniform 64-bit word w scaled to [0, n) (multiply-shift).
  NCF_HD static uint64_t scale(uint64_t w, uint64_t n) {
#if defined(__CUDA_ARCH__)
    return __umul64hi(w, n);
#else
    return static_cast<uint64_t>((static_cast<unsigned __int128>(w) * n) >> 64);
#endif
  }
};

// Stream ids: one per purpose, so no two purposes ever share draws.
enum RngStream : uint32_t {
  kStreamSynthUser = 1,
  kStreamSynthItem = 2,
  kStreamShuffle = 3,
  kStreamEvalNegatives = 4,
  kStreamTrainNegatives = 5,
  kStreamInit = 6,
  kStreamEpochOrder = 7,
  kStreamEvalUsers = 8,
  kStreamEvalNegativesWithReplacement = 9,
  kStreamTableRounding = 10,
};

}  // namespace ncf
