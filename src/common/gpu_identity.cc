// GPU sharing from device identities: see gpu_identity.h.
#include "common/gpu_identity.h"

#include <mutex>

#include "common/check.h"

namespace ncf {

GpuSharing gpu_sharing(const std::vector<std::string>& ids, int local_rank) {
  const int L = int(ids.size());
  NCF_CHECK(L > 0, "gpu_sharing: no GPU identities");
  NCF_CHECK(local_rank >= 0 && local_rank < L, "gpu_sharing: local rank ", local_rank,
            " outside the ", L, " identities");
  for (int lr = 0; lr < L; ++lr)
    NCF_CHECK(!ids[lr].empty(), "gpu_sharing: local rank ", lr, " reported no GPU identity");
  GpuSharing s;
  s.sharing = 0;
  for (int lr = 0; lr < L; ++lr) s.sharing += ids[lr] == ids[local_rank];
  for (int a = 0; a < L && s.first < 0; ++a)
    for (int b = a + 1; b < L; ++b)
      if (ids[a] == ids[b]) {
        s.first = a;
        s.second = b;
        s.shared_id = ids[a];
        break;
      }
  return s;
}

std::string describe_gpu_sharing(const GpuSharing& s, const std::vector<int>& world_ranks) {
  if (s.exclusive()) return "";
  const auto world = [&](int lr) { return lr < int(world_ranks.size()) ? world_ranks[lr] : -1; };
  const std::string local = std::to_string(s.first) + " and " + std::to_string(s.second);
  std::string who;
  if (world(s.first) >= 0 && world(s.second) >= 0)
    who = "ranks " + std::to_string(world(s.first)) + " and " + std::to_string(world(s.second)) +
          " (local ranks " + local + ")";
  else
    who = "local ranks " + local;
  return who + " both use the GPU at PCI " + s.shared_id;
}

namespace {
std::mutex g_mu;
LocalGpu g_gpu;
}  // namespace

void set_local_gpu(const LocalGpu& gpu) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_gpu = gpu;
}

LocalGpu local_gpu() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_gpu;
}

}  // namespace ncf
