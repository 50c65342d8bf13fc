// How much memory a rank may still take where its buffers live: the host's
// MemAvailable, or the free bytes of the rank's GPU (cudaMemGetInfo) and how many
// of this node's ranks share that physical GPU. The trainer's memory guard divides
// by that.
#pragma once

#include <cstdint>
#include <string>

#include "common/device.h"

namespace ncf {

struct MemoryInfo {
  int64_t free = 0;    // bytes available now
  int64_t total = 0;   // bytes in all
  int gpu = -1;        // the GPU's CUDA ordinal in this process (CUDA contexts), -1 on the host
  std::string gpu_id;  // its PCI bus id, when select_local_gpu recorded it
  int sharing = 1;     // local ranks on that physical GPU, this one included
};

// MemAvailable and MemTotal from /proc/meminfo (2^40 when unreadable).
MemoryInfo host_memory();
// ctx's device: the host for CPU contexts; for CUDA contexts the current GPU's
// cudaMemGetInfo, and the local ranks on that GPU as select_local_gpu found them
// from the node's PCI bus ids (common/gpu_identity.h). A GPU that select_local_gpu
// did not record counts all local_world ranks as sharing it: without identities the
// guard takes the side that cannot over-commit.
MemoryInfo device_memory(const ExecContext& ctx, int local_world);

}  // namespace ncf
