// CRC-32C (Castagnoli): the checksum of shard frames, whole files and dataset
// ids. A checksum only; how frames use it (masking, placement) is format.h's.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ncf {

// CRC-32C of data, continuing from crc (0 for a fresh CRC). Uses SSE4.2 when the
// CPU has it, a table otherwise; both give the same value.
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
// The table (slicing-by-8) path, always available; exposed so tests and
// bench_crc can hold the two paths against each other.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);
// True when crc32c_extend runs on the SSE4.2 crc32 instruction.
bool crc32c_hardware_available();
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }
// The CRC of A followed by B from crc_a = CRC(A), crc_b = CRC(B) and B's length:
// ranks that each checksum their own consecutive part of a file give the
// file's CRC without anyone reading it whole.
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace ncf
