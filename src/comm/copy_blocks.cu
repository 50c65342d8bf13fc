// copy_blocks_cuda: see copy_blocks.h.
#include <cuda_runtime.h>

#include <algorithm>

#include "comm/copy_blocks.h"
#include "common/check.h"
#include "common/cuda_sizes.h"

namespace ncf {
namespace {

// Passed by value: the launch copies it, so the host may reuse its array at once.
struct BlockTable {
  CopyBlock b[kCopyBlocksPerLaunch];
};

// blockIdx.y picks the block, blockIdx.x and the threads stride over its bytes:
// 16-byte words where the block's addresses and size allow, else 4-byte words,
// else single bytes.
__global__ void copy_blocks_kernel(char* dst, const char* src, BlockTable t) {
  const CopyBlock c = t.b[blockIdx.y];
  char* d = dst + c.dst_off;
  const char* s = src + c.src_off;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool wide =
      ((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s) | uintptr_t(c.bytes)) &
       15) == 0;
  if (wide) {
    const int64_t n = c.bytes / 16;
    for (int64_t i = first; i < n; i += stride)
      reinterpret_cast<int4*>(d)[i] = reinterpret_cast<const int4*>(s)[i];
  } else if (((reinterpret_cast<uintptr_t>(d) | reinterpret_cast<uintptr_t>(s) |
               uintptr_t(c.bytes)) &
              3) == 0) {
    const int64_t n = c.bytes / 4;
    for (int64_t i = first; i < n; i += stride)
      reinterpret_cast<int*>(d)[i] = reinterpret_cast<const int*>(s)[i];
  } else {
    for (int64_t i = first; i < c.bytes; i += stride) d[i] = s[i];
  }
}

}  // namespace

void copy_blocks_cuda(void* stream, void* dst, const void* src, const CopyBlock* blocks,
                      int64_t n) {
  BlockTable t;
  for (int64_t at = 0; at < n;) {
    int k = 0;
    int64_t most = 0;
    for (; at < n && k < kCopyBlocksPerLaunch; ++at)
      if (blocks[at].bytes > 0) {
        t.b[k++] = blocks[at];
        most = std::max(most, blocks[at].bytes);
      }
    if (k == 0) break;
    // Enough threads for the largest block in 16-byte words, at most 256 x 64 per block.
    const int64_t words = (most + 15) / 16;
    const unsigned gx = unsigned(
        std::min<int64_t>(64, std::max<int64_t>(1, (words + cuda::kThreads - 1) / cuda::kThreads)));
    copy_blocks_kernel<<<dim3(gx, unsigned(k)), cuda::kThreads, 0,
                         static_cast<cudaStream_t>(stream)>>>(static_cast<char*>(dst),
                                                              static_cast<const char*>(src), t);
    const cudaError_t e = cudaGetLastError();
    NCF_CHECK(e == cudaSuccess, "copy_blocks: launch of ", k, " blocks: ", cudaGetErrorString(e));
  }
}

}  // namespace ncf
