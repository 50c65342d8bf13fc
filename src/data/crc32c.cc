// CRC-32C: the SSE4.2 crc32 instruction where the CPU has it, a slicing-by-8
// table otherwise.
#include "data/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ncf {
namespace {

constexpr uint32_t kCrc32cPoly = 0x82F63B78u;  // Castagnoli, bit-reflected

// kTables[0] is the byte-at-a-time table; kTables[k][b] is the CRC of byte b
// followed by k zero bytes, which lets 8 input bytes be folded with 8 lookups.
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;
constexpr CrcTables make_tables() {
  CrcTables t{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kCrc32cPoly : c >> 1;
    t[0][b] = c;
  }
  for (size_t k = 1; k < 8; ++k)
    for (size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
  return t;
}
constexpr CrcTables kTables = make_tables();

inline uint64_t load_le64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];  // compiles to one load on LE hosts
  return v;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_extend_sse42(uint32_t crc, const void* data,
                                                               size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  // Byte steps up to an 8-byte boundary so the main loop's loads never split a line.
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(c, *p++);
    --n;
  }
  uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; --n) c = _mm_crc32_u8(c, *p++);
  return ~c;
}

bool detect_sse42() {
  __builtin_cpu_init();  // we may run before the runtime's own constructors
  return __builtin_cpu_supports("sse4.2");
}
const bool kHaveSse42 = detect_sse42();
#else
const bool kHaveSse42 = false;
#endif

}  // namespace

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w = load_le64(p) ^ c;
    c = kTables[7][w & 0xff] ^ kTables[6][(w >> 8) & 0xff] ^ kTables[5][(w >> 16) & 0xff] ^
        kTables[4][(w >> 24) & 0xff] ^ kTables[3][(w >> 32) & 0xff] ^ kTables[2][(w >> 40) & 0xff] ^
        kTables[1][(w >> 48) & 0xff] ^ kTables[0][w >> 56];
  }
  for (; n > 0; --n) c = (c >> 8) ^ kTables[0][(c ^ *p++) & 0xff];
  return ~c;
}

bool crc32c_hardware_available() { return kHaveSse42; }

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (kHaveSse42) return crc32c_extend_sse42(crc, data, n);
#endif
  return crc32c_extend_portable(crc, data, n);
}

namespace {

// Product of two polynomials modulo the CRC polynomial, in the bit-reflected
// representation (bit 31 is x^0).
uint32_t mul_mod_poly(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = 1u << 31; bit != 0; bit >>= 1) {
    if (a & bit) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kCrc32cPoly : b >> 1;  // b *= x
  }
  return product;
}

}  // namespace

uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  // Appending len_b bytes multiplies CRC(A)'s polynomial by x^(8·len_b); the
  // pre- and post-inversions of the two parts cancel (linearity), so
  // CRC(A‖B) = CRC(A)·x^(8·len_b) ⊕ CRC(B). The power is built by squaring.
  uint32_t power = 1u << 31;   // x^0
  uint32_t square = 1u << 23;  // x^8: one byte
  for (uint64_t n = len_b; n != 0; n >>= 1) {
    if (n & 1) power = mul_mod_poly(power, square);
    square = mul_mod_poly(square, square);
  }
  return mul_mod_poly(power, crc_a) ^ crc_b;
}

}  // namespace ncf
