// The block copies of a two-hop exchange (communicator.h CopyBlock): host memcpy,
// and its CUDA twin, one kernel launch per kCopyBlocksPerLaunch blocks on a stream
// instead of one cudaMemcpyAsync per block (a 16-node x 8-GPU exchange packs 128
// blocks per hop). Both copy exactly the bytes named; blocks must not overlap.
#pragma once

#include <cstdint>

#include "comm/communicator.h"

namespace ncf {

constexpr int kCopyBlocksPerLaunch = 64;

void copy_blocks_host(void* dst, const void* src, const CopyBlock* blocks, int64_t n);

#ifdef NCF_WITH_CUDA
// Device buffers, enqueued on `stream` (a cudaStream_t). Throws ncf::Error on a
// launch failure.
void copy_blocks_cuda(void* stream, void* dst, const void* src, const CopyBlock* blocks, int64_t n);
#endif

}  // namespace ncf
