// The block partition of n items over W parts that checkpoints use: part r
// holds items ⌊r·n/W⌋ .. ⌊(r+1)·n/W⌋, so the parts tile [0, n) in rank order
// and differ in size by at most one.
#pragma once

#include <cstdint>

namespace ncf {

inline void block_range(int64_t n, int W, int r, int64_t* first, int64_t* count) {
  const auto at = [&](int p) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(n) * unsigned(p)) / unsigned(W));
  };
  *first = at(r);
  *count = at(r + 1) - *first;
}

}  // namespace ncf
