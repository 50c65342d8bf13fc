// Software prefetch for the CPU kernels that read rows the hardware prefetcher cannot
// guess: rows by id or by sorted position (random rows of a table or of a gradient
// buffer), or rows of a stride wider than what is read of each.
#pragma once

#include <cstdint>

namespace ncf {

// Asks for the cache lines of row[0..w) ahead of their use.
template <typename T>
inline void prefetch_row(const T* row, int w) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t j = 0; j < int64_t(w) * int64_t(sizeof(T)); j += 64) __builtin_prefetch(bytes + j);
}

}  // namespace ncf
