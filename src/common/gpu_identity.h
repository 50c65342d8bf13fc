// Which of a node's ranks share one physical GPU, decided from the identities of
// the GPUs the ranks took (their PCI bus ids), never from how many GPUs a rank can
// see: a launcher that isolates the ranks (Slurm --gpus-per-task=1 or
// --gpu-bind=single:1, a CUDA_VISIBLE_DEVICES per rank) shows each rank one device,
// device 0, and every rank's device 0 is a different GPU.
//
// select_local_gpu (comm/bootstrap.h) reads its GPU's bus id, gathers those of the
// node's ranks and records the outcome here (set_local_gpu); the memory guard
// (common/memory.h) divides the GPU's free memory by the ranks sharing it, and the
// NCCL communicator refuses a node where two ranks share one.
#pragma once

#include <string>
#include <vector>

namespace ncf {

struct GpuSharing {
  int sharing = 1;  // local ranks on this rank's GPU, itself included
  // The first two local ranks on one GPU (by the lower rank, then the next one on
  // that GPU), and that GPU's identity; -1 and "" when every local rank has a GPU
  // of its own.
  int first = -1, second = -1;
  std::string shared_id;
  bool exclusive() const { return first < 0; }
};

// ids[lr] = the identity of the GPU local rank lr took (lr = 0 .. local_world-1).
// Pure: no CUDA, no MPI. Throws on an empty list, an empty identity or a
// local_rank outside the list.
GpuSharing gpu_sharing(const std::vector<std::string>& ids, int local_rank);

// What NCCL would refuse, as one clause naming the ranks and the GPU ("ranks 0 and
// 2 (local ranks 0 and 2) both use the GPU at PCI 0000:1b:00.0"); "" when the
// sharing is exclusive. world_ranks[lr] = the world rank of local rank lr (empty:
// local ranks only).
std::string describe_gpu_sharing(const GpuSharing& s, const std::vector<int>& world_ranks);

// NCCL refuses two ranks of one communicator on one GPU only when they also have
// the same host hash, which it takes from NCCL_HOSTID when that is set. A rank's key
// for that: "" without NCCL_HOSTID (or an empty one), else a fixed-width digest of
// its value (FNV-1a, hex), short enough to gather with the bus ids.
std::string nccl_host_key(const char* nccl_hostid);
// The sharing as NCCL sees it: local ranks share when they have the same bus id and
// the same host key. shared_id stays the bus id.
GpuSharing nccl_gpu_sharing(const std::vector<std::string>& ids,
                            const std::vector<std::string>& host_keys, int local_rank);

// This process's GPU, as select_local_gpu found it.
struct LocalGpu {
  int device = -1;               // CUDA ordinal among the GPUs this process sees; -1: none yet
  std::string id;                // its PCI bus id (cudaDeviceGetPCIBusId)
  GpuSharing sharing;            // among this node's ranks
  GpuSharing nccl_sharing;       // the same as NCCL sees it (NCCL_HOSTID per rank)
  std::vector<int> world_ranks;  // world rank of each local rank
};
void set_local_gpu(const LocalGpu& gpu);
// A copy of the record (device -1 until select_local_gpu ran).
LocalGpu local_gpu();

}  // namespace ncf
