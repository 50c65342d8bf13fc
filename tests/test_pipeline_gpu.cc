// The step pipeline on a GPU: the input stager's copy stream and events, the NCCL
// communicator's own stream with deferred collectives and join, and the pinned
// host staging of device buffers for a host communicator. Each test checks data
// that crossed a stream boundary, read back on the compute stream after the
// ordering call under test, against the values written on the host. Skips, with
// the reason, where there is no usable GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/device.h"
#include "test_util.h"
#include "train/input_stager.h"

namespace ncf {
namespace {

class PipelineGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    NCF_GPU_OR_SKIP();
    gpu_ = make_cuda_context(0);
  }
  void TearDown() override { destroy_cuda_context(gpu_); }

  // n elements at p (device) copied back on the compute stream, then waited for.
  template <typename T>
  std::vector<T> read_back(const T* p, size_t n) {
    PinnedBuffer<T> h;
    h.reserve(std::max<size_t>(n, 1));
    device_copy_async(gpu_, Device::kCpu, h.data(), Device::kCuda, p, n * sizeof(T));
    check_device_errors(gpu_);  // waits for the compute stream
    return std::vector<T>(h.data(), h.data() + n);
  }

  ExecContext gpu_;
};

TrainBatch random_batch(int64_t n, std::mt19937& rng) {
  TrainBatch b;
  std::uniform_int_distribution<int32_t> d(0, 1 << 30);
  for (int64_t i = 0; i < n; ++i) {
    b.users.push_back(d(rng));
    b.items.push_back(d(rng));
  }
  return b;
}

TEST_F(PipelineGpu, StagerDeliversEveryBatchStagedAheadLikeTheTrainer) {
  InputStager st(gpu_);
  std::mt19937 rng(7);
  const std::vector<int64_t> sizes = {1000, 0, 7, 3000000, 5, 3000000, 1};
  std::vector<TrainBatch> batches;
  for (int64_t n : sizes) batches.push_back(random_batch(n, rng));
  TrainBatch slots[2];
  slots[0] = batches[0];
  st.stage(slots[0]);
  for (size_t s = 0; s < sizes.size(); ++s) {
    if (s + 1 < sizes.size()) {
      slots[(s + 1) % 2] = batches[s + 1];
      st.stage(slots[(s + 1) % 2]);
    }
    InputStager::Staged in = st.acquire();
    ASSERT_EQ(in.n, sizes[s]);
    EXPECT_EQ(read_back(in.users, size_t(in.n)), batches[s].users) << "step " << s;
    EXPECT_EQ(read_back(in.items, size_t(in.n)), batches[s].items) << "step " << s;
    st.release();
  }
}

TEST_F(PipelineGpu, NcclDeferredCollectivesAreVisibleAfterJoin) {
  std::unique_ptr<Communicator> comm = make_communicator(RankInfo{}, Device::kCuda, "nccl",
                                                         gpu_.stream);
  // Large enough that a missing wait would let the read-back overtake the copy.
  const size_t n = size_t(1) << 26;
  std::vector<int32_t> host(n);
  std::iota(host.begin(), host.end(), 3);
  Buffer<int32_t> send(Device::kCuda, n), recv(Device::kCuda, n);
  device_copy(Device::kCuda, send.data(), Device::kCpu, host.data(), n * 4);
  recv.zero();
  const int64_t c[1] = {int64_t(n)}, d[1] = {0};
  CommTicket t = comm->all_to_all_v_async(send.data(), c, d, recv.data(), c, d, DType::kInt32);
  EXPECT_GT(t, 0);
  Buffer<float> x(Device::kCuda, 1000);
  std::vector<float> xs(1000, 0.25f);
  device_copy(Device::kCuda, x.data(), Device::kCpu, xs.data(), 4000);
  CommTicket u = comm->all_reduce_sum_async(x.data(), 1000, DType::kFloat32);
  EXPECT_GT(u, t);
  comm->join(u);  // covers t too: the communication stream is serial
  EXPECT_EQ(read_back(recv.data(), n), host);
  EXPECT_EQ(read_back(x.data(), 1000), xs);  // W = 1: the sum is the input
  EXPECT_THROW(comm->join(u + 1), Error);   // never issued
  // A plain (non-deferred) collective orders the compute stream by itself.
  recv.zero();
  comm->all_to_all_v(send.data(), c, d, recv.data(), c, d, DType::kInt32);
  EXPECT_EQ(read_back(recv.data(), n), host);
}

TEST_F(PipelineGpu, HostCommunicatorStagesDeviceBuffersThroughPinnedMemory) {
  std::unique_ptr<Communicator> comm = make_communicator(RankInfo{}, Device::kCpu, "single");
  const size_t n = 123457;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = float(i) * 0.5f;
  Buffer<float> send(Device::kCuda, n), recv(Device::kCuda, n);
  device_copy(Device::kCuda, send.data(), Device::kCpu, host.data(), n * 4);
  recv.zero();
  const int64_t c[1] = {int64_t(n)}, d[1] = {0};
  CommTicket t = 9;
  all_to_all_v_on(*comm, Device::kCuda, send.data(), c, d, recv.data(), c, d, DType::kFloat32,
                  &t);
  EXPECT_EQ(t, 0);  // staged: complete on return
  EXPECT_EQ(read_back(recv.data(), n), host);
  all_reduce_sum_on(*comm, Device::kCuda, recv.data(), n, DType::kFloat32, &t);
  EXPECT_EQ(t, 0);
  EXPECT_EQ(read_back(recv.data(), n), host);
}

}  // namespace
}  // namespace ncf
