// SingleCommunicator: see single_communicator.h.
#include "comm/single_communicator.h"

#include <cstdlib>
#include <cstring>

#include "common/check.h"

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>

#include "common/cuda_context.h"  // wait_stream
#endif

namespace ncf {

SingleCommunicator::SingleCommunicator(Device device, void* stream)
    : Communicator(0, 1, 0, 1), device_(device), stream_(stream) {
#ifndef NCF_WITH_CUDA
  NCF_CHECK(device == Device::kCpu, "SingleCommunicator on ", device_name(device),
            " in a build without CUDA");
#endif
}

void SingleCommunicator::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (device_ == Device::kCpu) {
    std::memmove(dst, src, bytes);
    return;
  }
#ifdef NCF_WITH_CUDA
  // On the caller's stream, so the copy is ordered after the kernels that wrote src
  // even when that stream does not synchronise with the legacy default stream.
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                  static_cast<cudaStream_t>(stream_));
  NCF_CHECK(e == cudaSuccess, "cudaMemcpyAsync of ", bytes, " bytes: ", cudaGetErrorString(e));
#endif
}

void SingleCommunicator::synchronize() {
#ifdef NCF_WITH_CUDA
  if (device_ == Device::kCuda) wait_stream(static_cast<cudaStream_t>(stream_));
#endif
}

void SingleCommunicator::do_all_to_all_v(const void* send, const int64_t* send_counts,
                                         const int64_t* send_displs, void* recv,
                                         const int64_t* recv_counts, const int64_t* recv_displs,
                                         DType t) {
  NCF_CHECK(send_counts[0] == recv_counts[0], "all_to_all_v: rank 0 sends ", send_counts[0],
            " elements to itself but expects to receive ", recv_counts[0]);
  const size_t es = dtype_size(t);
  copy(static_cast<char*>(recv) + recv_displs[0] * es,
       static_cast<const char*>(send) + send_displs[0] * es, send_counts[0] * es);
}

void SingleCommunicator::do_exchange_counts(const int64_t* send_counts, int64_t* recv_counts) {
  recv_counts[0] = send_counts[0];
}

void SingleCommunicator::do_barrier() { synchronize(); }

}  // namespace ncf
