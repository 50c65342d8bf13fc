// CRC-32C throughput of the dispatching path (SSE4.2 where present) and the
// slicing-by-8 table path, over buffer sizes up to 64 MiB. Shard writing and
// reading pay this per byte, twice on write (payload CRC and file CRC).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "data/crc32c.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best of reps passes over total bytes cut into chunks of n, in GB/s.
template <typename F>
double best_gbps(F crc_fn, const unsigned char* data, size_t total, size_t n, int reps,
                 uint32_t* sink) {
  double best = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    uint32_t acc = 0;
    for (size_t off = 0; off + n <= total; off += n) acc ^= crc_fn(0, data + off, n);
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    *sink ^= acc;
    double gbps = static_cast<double>(total / n * n) / s / 1e9;
    if (gbps > best) best = gbps;
  }
  return best;
}

}  // namespace

int main() {
  const size_t kTotal = size_t{64} << 20;  // 64 MiB
  std::vector<unsigned char> buf(kTotal);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= kTotal; i += 8) {
    uint64_t v = rng();
    for (int k = 0; k < 8; ++k) buf[i + k] = static_cast<unsigned char>(v >> (8 * k));
  }

  // Verify before timing: both paths must agree on the whole buffer.
  const uint32_t hw = ncf::crc32c_extend(0, buf.data(), kTotal);
  const uint32_t sw = ncf::crc32c_extend_portable(0, buf.data(), kTotal);
  std::printf("# crc32c of 64 MiB: dispatch 0x%08x, portable 0x%08x (%s)\n", hw, sw,
              hw == sw ? "agree" : "MISMATCH");
  if (hw != sw) return 1;
  std::printf("# dispatch path uses %s\n",
              ncf::crc32c_hardware_available() ? "SSE4.2 crc32" : "the table (no SSE4.2)");

  std::printf("%12s %16s %16s\n", "chunk_bytes", "dispatch_GB/s", "portable_GB/s");
  uint32_t sink = 0;
  for (size_t n : {size_t{64}, size_t{4} << 10, size_t{64} << 10, size_t{1} << 20, kTotal}) {
    double h = best_gbps(ncf::crc32c_extend, buf.data(), kTotal, n, 5, &sink);
    double p = best_gbps(ncf::crc32c_extend_portable, buf.data(), kTotal, n, 3, &sink);
    std::printf("%12zu %16.2f %16.2f\n", n, h, p);
  }
  std::printf("# sink 0x%08x\n", sink);
  return 0;
}
