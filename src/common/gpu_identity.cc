// GPU sharing from device identities: see gpu_identity.h.
#include "common/gpu_identity.h"

#include <cstdint>
#include <cstdio>
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

std::string nccl_host_key(const char* nccl_hostid) {
  if (!nccl_hostid || !*nccl_hostid) return "";
  uint64_t h = 1469598103934665603ULL;  // FNV-1a, 64 bits
  for (const char* c = nccl_hostid; *c; ++c) {
    h ^= static_cast<unsigned char>(*c);
    h *= 1099511628211ULL;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

GpuSharing nccl_gpu_sharing(const std::vector<std::string>& ids,
                            const std::vector<std::string>& host_keys, int local_rank) {
  NCF_CHECK(host_keys.size() == ids.size(), "nccl_gpu_sharing: ", host_keys.size(),
            " host keys for ", ids.size(), " GPU identities");
  std::vector<std::string> both(ids.size());
  for (size_t lr = 0; lr < ids.size(); ++lr)
    both[lr] = ids[lr].empty() ? "" : ids[lr] + "|" + host_keys[lr];
  GpuSharing s = gpu_sharing(both, local_rank);
  if (!s.exclusive()) s.shared_id = ids[size_t(s.first)];
  return s;
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
