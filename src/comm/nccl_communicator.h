// Entry point of the NCCL communicator (device buffers, one GPU per rank). The class
// itself stays inside nccl_communicator.cc so that this header needs neither nccl.h
// nor cuda_runtime.h; make_communicator(info, kCuda, "nccl", stream) is the usual way in.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace ncf {

struct RankInfo;

// Defined only in CUDA builds. Expects the current CUDA device to be this rank's GPU
// (select_local_gpu) and `stream` (cudaStream_t, the rank's compute stream) to belong
// to it. The collectives run on a stream of the communicator's own, ordered after
// and before the compute stream's work by events (nccl_communicator.cc). W > 1 needs MPI
// (info.mpi): the NCCL unique id travels by MPI_Bcast, and exchange_counts and
// barrier use MPI.
std::unique_ptr<Communicator> make_nccl_communicator(const RankInfo& info, void* stream);

}  // namespace ncf
