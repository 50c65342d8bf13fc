// Free memory on the host or the rank's GPU: see memory.h.
#include "common/memory.h"

#include <algorithm>
#include <fstream>
#include <string>

#include "common/check.h"
#include "common/cuda_context.h"  // CUDA_CHECK in CUDA builds
#include "common/gpu_identity.h"

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ncf {

MemoryInfo host_memory() {
  MemoryInfo m;
  m.free = m.total = int64_t{1} << 40;
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (f >> key >> kb >> unit) {
    if (key == "MemAvailable:") m.free = kb * 1024;
    if (key == "MemTotal:") m.total = kb * 1024;
  }
  return m;
}

MemoryInfo device_memory(const ExecContext& ctx, int local_world) {
  if (ctx.device == Device::kCpu) return host_memory();
#ifdef NCF_WITH_CUDA
  MemoryInfo m;
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaGetDevice(&m.gpu));
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  m.free = int64_t(free);
  m.total = int64_t(total);
  const LocalGpu g = local_gpu();
  if (g.device == m.gpu) {
    m.gpu_id = g.id;
    m.sharing = g.sharing.sharing;
  } else {
    m.sharing = std::max(1, local_world);
  }
  return m;
#else
  (void)local_world;
  NCF_CHECK(false, "device_memory on a cuda context in a build without CUDA");
#endif
}

}  // namespace ncf
