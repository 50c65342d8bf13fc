// How much memory a rank may still take where its buffers live: the host's
// MemAvailable, or the free bytes of the rank's GPU (cudaMemGetInfo) and how many
// of this node's ranks share that GPU. The trainer's memory guard divides by that.
#pragma once

#include <cstdint>

#include "common/device.h"

namespace ncf {

struct MemoryInfo {
  int64_t free = 0;   // bytes available now
  int64_t total = 0;  // bytes in all
  int gpu = -1;       // the GPU (CUDA contexts), -1 on the host
  int sharing = 1;    // local ranks on that GPU (GPU ranks take GPU local_rank % GPUs)
};

// MemAvailable and MemTotal from /proc/meminfo (2^40 when unreadable).
MemoryInfo host_memory();
// ctx's device: the host for CPU contexts; for CUDA contexts the current GPU's
// cudaMemGetInfo, and the number of the node's local_world ranks mapped to it.
MemoryInfo device_memory(const ExecContext& ctx, int local_world);

}  // namespace ncf
