// The two-hop exchange's block copies (comm/copy_blocks.h): the host version
// against a byte-by-byte loop, and the CUDA kernel against the host version on
// blocks of every alignment, more of them than one launch takes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "comm/copy_blocks.h"
#include "common/device.h"
#include "test_util.h"

namespace ncf {
namespace {

// n non-overlapping blocks of a random layout: sources and destinations are
// disjoint runs in shuffled order, with odd offsets and sizes (0 included) as
// well as 4- and 16-byte aligned ones.
std::vector<CopyBlock> random_blocks(int n, uint32_t seed, int64_t* src_bytes, int64_t* dst_bytes) {
  std::mt19937 g(seed);
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int kind = int(g() % 3);
    sizes[size_t(i)] = kind == 0   ? int64_t(g() % 50)
                       : kind == 1 ? 4 * int64_t(g() % 300)
                                   : 16 * int64_t(g() % 500);
  }
  std::vector<CopyBlock> b(static_cast<size_t>(n));
  std::vector<int> order(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) order[size_t(i)] = i;
  int64_t at = int64_t(g() % 3);
  for (int i = 0; i < n; ++i) {
    b[size_t(i)].src_off = at;
    b[size_t(i)].bytes = sizes[size_t(i)];
    at += sizes[size_t(i)] + (g() % 2 ? 16 : int64_t(g() % 7));
  }
  *src_bytes = at;
  std::shuffle(order.begin(), order.end(), g);
  at = int64_t(g() % 3);
  for (int i : order) {
    b[size_t(i)].dst_off = at;
    at += b[size_t(i)].bytes + (g() % 2 ? 0 : int64_t(g() % 5));
  }
  *dst_bytes = at;
  return b;
}

TEST(CopyBlocks, HostCopiesExactlyTheNamedBytes) {
  for (int n : {1, 5, 70, 200}) {
    int64_t sb = 0, db = 0;
    const std::vector<CopyBlock> b = random_blocks(n, uint32_t(n), &sb, &db);
    std::vector<uint8_t> src(static_cast<size_t>(sb)), got(size_t(db), 0xEE),
        want(size_t(db), 0xEE);
    for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 131 + 7);
    copy_blocks_host(got.data(), src.data(), b.data(), n);
    for (const CopyBlock& c : b)
      for (int64_t k = 0; k < c.bytes; ++k)
        want[size_t(c.dst_off + k)] = src[size_t(c.src_off + k)];
    EXPECT_EQ(got, want) << n << " blocks";
  }
}

TEST(CopyBlocksGpu, KernelMatchesHost) {
  NCF_GPU_OR_SKIP();
#ifdef NCF_WITH_CUDA
  for (int n : {1, kCopyBlocksPerLaunch, kCopyBlocksPerLaunch + 1, 3 * kCopyBlocksPerLaunch + 5}) {
    int64_t sb = 0, db = 0;
    const std::vector<CopyBlock> b = random_blocks(n, uint32_t(100 + n), &sb, &db);
    std::vector<uint8_t> src(static_cast<size_t>(sb)), want(size_t(db), 0xEE),
        got(static_cast<size_t>(db));
    for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 131 + 7);
    copy_blocks_host(want.data(), src.data(), b.data(), n);
    Buffer<uint8_t> dsrc(Device::kCuda, src.size()), ddst(Device::kCuda, got.size());
    device_copy(Device::kCuda, dsrc.data(), Device::kCpu, src.data(), src.size());
    std::vector<uint8_t> fill(got.size(), 0xEE);
    device_copy(Device::kCuda, ddst.data(), Device::kCpu, fill.data(), fill.size());
    copy_blocks_cuda(nullptr, ddst.data(), dsrc.data(), b.data(), n);
    device_copy(Device::kCpu, got.data(), Device::kCuda, ddst.data(), got.size());
    EXPECT_EQ(got, want) << n << " blocks";
  }
#endif
}

}  // namespace
}  // namespace ncf
