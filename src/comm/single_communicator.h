// The W = 1 communicator: every collective is a local copy or nothing, and no MPI is
// needed, so a laptop run and the unit tests need neither mpirun nor MPI_Init.
#pragma once

#include "comm/communicator.h"

namespace ncf {

class SingleCommunicator : public Communicator {
 public:
  // device: where the buffers live. On kCuda (CUDA builds) copies are enqueued on
  // stream (a cudaStream_t, nullptr = default stream), ordered like NCCL's.
  explicit SingleCommunicator(Device device = Device::kCpu, void* stream = nullptr);

  const char* name() const override { return "single"; }
  Device device() const override { return device_; }
  void synchronize() override;

 protected:
  void do_all_to_all_v(const void* send, const int64_t* send_counts, const int64_t* send_displs,
                       void* recv, const int64_t* recv_counts, const int64_t* recv_displs,
                       DType t) override;
  void do_exchange_counts(const int64_t* send_counts, int64_t* recv_counts) override;
  void do_all_reduce_sum(void* buf, size_t n, DType t) override {}
  void do_barrier() override;

 private:
  void copy(void* dst, const void* src, size_t bytes);

  Device device_;
  void* stream_;
};

}  // namespace ncf
