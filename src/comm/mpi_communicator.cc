// MpiCommunicator: see mpi_communicator.h.
#include "comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstdlib>

#include "comm/bootstrap.h"
#include "common/check.h"

namespace ncf {

namespace {
// Allreduce acts element-wise, so a buffer beyond INT_MAX elements can
// go in pieces with the same result; 2^30 keeps every piece well inside an int.
constexpr size_t kMaxChunk = size_t{1} << 30;
}  // namespace

int to_mpi_count(int64_t value, const char* what) {
  NCF_CHECK(value >= 0 && value <= INT_MAX, what, " = ", value,
            " does not fit the int that MPI 3.1 takes (max ", INT_MAX,
            "); Open MPI 4.1 has no large-count MPI_Alltoallv_c: exchange in smaller steps");
  return static_cast<int>(value);
}

MPI_Datatype mpi_dtype(DType t) {
  switch (t) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kUInt8:
      return MPI_UINT8_T;
    case DType::kBFloat16:
      return MPI_UINT16_T;  // bit patterns: moved, never summed
  }
  NCF_CHECK(false, "unknown DType ", static_cast<int>(t));
}

MpiCommunicator::MpiCommunicator(const RankInfo& info, MPI_Comm comm)
    : Communicator(info.rank, info.world, info.local_rank, info.local_world) {
  NCF_CHECK(info.mpi, "MpiCommunicator needs MPI: start through bootstrap_mpi()");
  int size = 0, rank = 0;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  NCF_CHECK(size == info.world && rank == info.rank, "RankInfo says rank ", info.rank, " of ",
            info.world, " but the MPI communicator has rank ", rank, " of ", size);
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  set_node_map(info.nodes);
  ints_.resize(4 * size_t(size));
}

MpiCommunicator::~MpiCommunicator() {
  // Freeing after MPI_Finalize is erroneous; Open MPI frees a communicator locally,
  // so this does not wait for other ranks even on an error path.
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

MpiGroups::~MpiGroups() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
  if (rail_ != MPI_COMM_NULL) MPI_Comm_free(&rail_);
}

void MpiGroups::setup(MPI_Comm parent, int rank, int L) {
  if (node_ != MPI_COMM_NULL) return;
  MPI_CHECK(MPI_Comm_split(parent, rank / L, rank % L, &node_));
  MPI_CHECK(MPI_Comm_split(parent, rank % L, rank / L, &rail_));
  MPI_CHECK(MPI_Comm_set_errhandler(node_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_set_errhandler(rail_, MPI_ERRORS_RETURN));
}

MPI_Comm MpiGroups::get(CommGroup g) const {
  const MPI_Comm c = g == CommGroup::kNode ? node_ : g == CommGroup::kRail ? rail_ : MPI_COMM_NULL;
  NCF_CHECK(c != MPI_COMM_NULL, "MPI group communicator not set up");
  return c;
}

void MpiGroups::exchange_counts(CommGroup g, const int64_t* send, int64_t* recv, int k) const {
  MPI_CHECK(MPI_Alltoall(send, k, MPI_INT64_T, recv, k, MPI_INT64_T, get(g)));
}

void MpiCommunicator::do_setup_groups() {
  groups_.setup(comm_, rank(), world() / node_map().nodes());
}

void MpiCommunicator::do_group_all_to_all_v(CommGroup g, const void* send,
                                            const int64_t* send_counts, const int64_t* send_displs,
                                            void* recv, const int64_t* recv_counts,
                                            const int64_t* recv_displs, DType t) {
  mpi_all_to_all_v(groups_.get(g), group_size(g), send, send_counts, send_displs, recv, recv_counts,
                   recv_displs, t, &ints_);
}

void MpiCommunicator::do_group_exchange_counts(CommGroup g, const int64_t* send, int64_t* recv,
                                               int k) {
  groups_.exchange_counts(g, send, recv, k);
}

void MpiCommunicator::do_all_to_all_v(const void* send, const int64_t* send_counts,
                                      const int64_t* send_displs, void* recv,
                                      const int64_t* recv_counts, const int64_t* recv_displs,
                                      DType t) {
  mpi_all_to_all_v(comm_, world(), send, send_counts, send_displs, recv, recv_counts, recv_displs,
                   t, &ints_);
}

void mpi_all_to_all_v(MPI_Comm c, int G, const void* send, const int64_t* send_counts,
                      const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                      const int64_t* recv_displs, DType t, std::vector<int>* ints) {
  if (ints->size() < 4 * size_t(G)) ints->resize(4 * size_t(G));
  int* sc = ints->data();
  int* sd = sc + G;
  int* rc = sd + G;
  int* rd = rc + G;
  for (int p = 0; p < G; ++p) {
    sc[p] = to_mpi_count(send_counts[p], "all_to_all_v send count");
    sd[p] = to_mpi_count(send_displs[p], "all_to_all_v send displacement");
    rc[p] = to_mpi_count(recv_counts[p], "all_to_all_v recv count");
    rd[p] = to_mpi_count(recv_displs[p], "all_to_all_v recv displacement");
  }
  MPI_CHECK(MPI_Alltoallv(send, sc, sd, mpi_dtype(t), recv, rc, rd, mpi_dtype(t), c));
}

void MpiCommunicator::do_exchange_counts(const int64_t* send_counts, int64_t* recv_counts) {
  MPI_CHECK(MPI_Alltoall(send_counts, 1, MPI_INT64_T, recv_counts, 1, MPI_INT64_T, comm_));
}

void MpiCommunicator::do_all_reduce_sum(void* buf, size_t n, DType t) {
  const size_t es = dtype_size(t);
  for (size_t off = 0; off < n; off += kMaxChunk) {
    const int c = static_cast<int>(std::min(kMaxChunk, n - off));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(buf) + off * es, c, mpi_dtype(t),
                            MPI_SUM, comm_));
  }
}

void MpiCommunicator::do_barrier() { MPI_CHECK(MPI_Barrier(comm_)); }

}  // namespace ncf
