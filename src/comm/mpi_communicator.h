// Collectives over MPI on host buffers: the CPU backend's communicator, and the one for
// GPU ranks that stage through the host (several ranks sharing one GPU, no NCCL).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "comm/communicator.h"

namespace ncf {

struct RankInfo;

// The int that MPI's count and displacement arguments need, or an ncf::Error naming
// `what` and the value when it does not fit: Open MPI 4.1 implements MPI 3.1, which has
// no large-count collectives (MPI_Alltoallv_c is MPI 4.0).
int to_mpi_count(int64_t value, const char* what);
MPI_Datatype mpi_dtype(DType t);

// MPI_Alltoallv among the G members of `c` on host buffers, the int64 counts and
// displacements converted by to_mpi_count. ints: the int copies (4·G), kept by the caller so
// that a call allocates nothing once it has grown.
void mpi_all_to_all_v(MPI_Comm c, int G, const void* send, const int64_t* send_counts,
                      const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                      const int64_t* recv_displs, DType t, std::vector<int>* ints);

// The node and rail groups of a two-hop exchange as MPI communicators split from
// `parent` (collective over it), and the count exchange within one.
class MpiGroups {
 public:
  MpiGroups() = default;
  ~MpiGroups();
  MpiGroups(const MpiGroups&) = delete;
  MpiGroups& operator=(const MpiGroups&) = delete;
  // Rank r of parent goes to node group r / L (index r % L) and rail group r % L
  // (index r / L).
  void setup(MPI_Comm parent, int rank, int L);
  MPI_Comm get(CommGroup g) const;
  // k int64 per member: recv[i·k ..] = what member i sent this rank.
  void exchange_counts(CommGroup g, const int64_t* send, int64_t* recv, int k) const;

 private:
  MPI_Comm node_ = MPI_COMM_NULL, rail_ = MPI_COMM_NULL;
};

// Determinism of all_reduce_sum on floats: Open MPI picks its allreduce algorithm
// from W and the message size only, and its algorithms (recursive doubling, ring,
// Rabenseifner) combine the same partial sums in the same order on every call and
// every rank, so the result is reproducible for a fixed W and identical across ranks.
// The MPI standard only recommends this; the multi-rank test checks it bitwise.
class MpiCommunicator : public Communicator {
 public:
  // Works on a duplicate of `comm`, so its messages never match the caller's; the
  // duplicate reports errors (MPI_ERRORS_RETURN) so that they become ncf::Error.
  MpiCommunicator(const RankInfo& info, MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiCommunicator() override;

  const char* name() const override { return "mpi"; }
  Device device() const override { return Device::kCpu; }
  MPI_Comm comm() const { return comm_; }

 protected:
  void do_all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                       void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                       DType t) override;
  void do_exchange_counts(const int64_t* send_counts, int64_t* recv_counts) override;
  void do_all_reduce_sum(void* buf, size_t n, DType t) override;
  void do_barrier() override;
  void do_setup_groups() override;
  void do_group_all_to_all_v(CommGroup g, const void* send, const int64_t* send_counts,
                             const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                             const int64_t* recv_displs, DType t) override;
  void do_group_exchange_counts(CommGroup g, const int64_t* send, int64_t* recv, int k) override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  MpiGroups groups_;
  std::vector<int> ints_;  // mpi_all_to_all_v's int copies
};

}  // namespace ncf
