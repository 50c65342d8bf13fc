// The step pipeline on a GPU: the input stager's copy stream and events, the NCCL
// communicator's own stream with deferred collectives and join, the pinned host
// staging of device buffers for a host communicator and the device staging of host
// buffers for NCCL, and the interruptible host waits (wait_stream, wait_event,
// wait_device) with every wait routed through them. Each data test checks data that
// crossed a stream boundary, read back on the compute stream after the ordering call
// under test, against the values written on the host. Skips, with the reason, where
// there is no usable GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/communicator.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/device.h"
#include "common/step_timer.h"
#include "test_util.h"
#include "train/input_stager.h"

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ncf {
namespace {

using test::ScopedPoller;
using test::seconds_since;

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

// The evaluation's use: three parts of unrelated byte sizes per batch (users, the
// candidate lists, their one-byte duplicate flags), each delivered whole and 256-byte
// aligned, the next batch staged while the device reads the one before.
TEST_F(PipelineGpu, ArrayStagerDeliversEveryPartOfEveryBatchAligned) {
  ArrayStager st(gpu_, 3);
  std::mt19937 rng(11);
  const std::vector<int64_t> users = {1000, 3, 0, 999, 2500000, 1};
  const int L = 101;
  struct Lists {
    std::vector<int32_t> users, items;
    std::vector<uint8_t> mask;
  };
  std::vector<Lists> batches;
  for (int64_t n : users) {
    Lists b;
    std::uniform_int_distribution<int32_t> d(0, 1 << 30);
    for (int64_t i = 0; i < n; ++i) b.users.push_back(d(rng));
    for (int64_t i = 0; i < n * L; ++i) {
      b.items.push_back(d(rng));
      b.mask.push_back(uint8_t(d(rng) & 1));
    }
    batches.push_back(std::move(b));
  }
  auto stage = [&](const Lists& b) {
    st.stage({{b.users.data(), b.users.size() * 4},
              {b.items.data(), b.items.size() * 4},
              {b.mask.data(), b.mask.size()}});
  };
  stage(batches[0]);
  for (size_t k = 0; k < batches.size(); ++k) {
    const std::vector<const void*>& p = st.acquire();
    ASSERT_EQ(p.size(), 3u);
    for (const void* q : p) EXPECT_EQ(reinterpret_cast<uintptr_t>(q) % 256, 0u) << "batch " << k;
    const Lists& b = batches[k];
    EXPECT_EQ(read_back(static_cast<const int32_t*>(p[0]), b.users.size()), b.users) << k;
    EXPECT_EQ(read_back(static_cast<const int32_t*>(p[1]), b.items.size()), b.items) << k;
    EXPECT_EQ(read_back(static_cast<const uint8_t*>(p[2]), b.mask.size()), b.mask) << k;
    st.release();
    if (k + 1 < batches.size()) stage(batches[k + 1]);
  }
  EXPECT_EQ(st.staged(), 0);
}

TEST_F(PipelineGpu, NcclDeferredCollectivesAreVisibleAfterJoin) {
  std::unique_ptr<Communicator> comm =
      make_communicator(RankInfo{}, Device::kCuda, "nccl", gpu_.stream);
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
  EXPECT_THROW(comm->join(u + 1), Error);    // never issued
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
  all_to_all_v_on(*comm, Device::kCuda, send.data(), c, d, recv.data(), c, d, DType::kFloat32, &t);
  EXPECT_EQ(t, 0);  // staged: complete on return
  EXPECT_EQ(read_back(recv.data(), n), host);
  all_reduce_sum_on(*comm, Device::kCuda, recv.data(), n, DType::kFloat32, &t);
  EXPECT_EQ(t, 0);
  EXPECT_EQ(read_back(recv.data(), n), host);
}

// Host data on a device communicator goes through the communicator's device
// staging: the data passes through slot 0 (all-reduce) and slots 0/1 (all-to-all),
// and a second call of the same or a smaller size reuses the slots (no cudaMalloc
// per call).
TEST_F(PipelineGpu, NcclStagesHostDataThroughReusedDeviceSlots) {
  std::unique_ptr<Communicator> comm =
      make_communicator(RankInfo{}, Device::kCuda, "nccl", gpu_.stream);
  const size_t n = 1000;
  std::vector<int64_t> host(n);
  std::iota(host.begin(), host.end(), int64_t{1} << 40);
  std::vector<int64_t> buf = host;
  all_reduce_sum_on(*comm, Device::kCpu, buf.data(), n, DType::kInt64);
  EXPECT_EQ(buf, host);  // W = 1: the sum is the input
  void* slot0 = comm->device_staging(0, 0);
  EXPECT_EQ(read_back(static_cast<const int64_t*>(slot0), n), host)
      << "the staged all-reduce did not go through device_staging(0)";
  for (size_t m : {n, n / 2}) {
    all_reduce_sum_on(*comm, Device::kCpu, buf.data(), m, DType::kInt64);
    EXPECT_EQ(comm->device_staging(0, 0), slot0) << m << " elements reallocated the slot";
  }
  std::vector<int64_t> recv(n, -1);
  const int64_t c[1] = {int64_t(n)}, d[1] = {0};
  all_to_all_v_on(*comm, Device::kCpu, host.data(), c, d, recv.data(), c, d, DType::kInt64);
  EXPECT_EQ(recv, host);
  EXPECT_EQ(comm->device_staging(0, 0), slot0);
  EXPECT_EQ(read_back(static_cast<const int64_t*>(comm->device_staging(1, 0)), n), host)
      << "the staged all-to-all did not receive into device_staging(1)";
}

// ---- wait_stream: the interruptible host wait --------------------------------------
// (CUDA runtime calls: a CUDA build only; without one the fixture skips above.)
#ifdef NCF_WITH_CUDA

void CUDART_CB sleep_300ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); }

// A stream held by a host function until open() or `limit` seconds, so that a
// failing test cannot hang the suite (the limit is that safety net: the tests end
// their waits by what they see, a poller's calls or its error, never by it). The
// destructor opens the gate and waits for the stream, so that the host function
// never outlives the gate.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t s, double limit = 120) : s_(s), limit_(limit) {
    CUDA_CHECK(cudaLaunchHostFunc(s, &StreamGate::hold, this));
  }
  ~StreamGate() {
    open();
    cudaStreamSynchronize(s_);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  void open() { open_.store(true); }

 private:
  static void CUDART_CB hold(void* p) {
    auto* g = static_cast<StreamGate*>(p);
    const auto t0 = std::chrono::steady_clock::now();
    while (!g->open_.load() && seconds_since(t0) < g->limit_)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  cudaStream_t s_;
  double limit_;
  std::atomic<bool> open_{false};
};

TEST_F(PipelineGpu, WaitStreamWithoutPollersWaitsForTheStream) {
  ASSERT_FALSE(wait_pollers_registered());
  cudaStream_t s = static_cast<cudaStream_t>(gpu_.stream);
  const auto t0 = std::chrono::steady_clock::now();
  CUDA_CHECK(cudaLaunchHostFunc(s, sleep_300ms, nullptr));
  wait_stream(s);
  EXPECT_GE(seconds_since(t0), 0.29);  // a lower bound: the host function began after t0
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  wait_stream(s);  // nothing queued: returns at once
  wait_stream(nullptr);
}

// The gate opens at the poller's 20th call: the wait can only end by polling on.
TEST_F(PipelineGpu, WaitStreamWithAQuietPollerWaitsAndPolls) {
  cudaStream_t s = static_cast<cudaStream_t>(gpu_.stream);
  std::atomic<int> polls{0};
  StreamGate gate(s);
  int key = 0;
  ScopedPoller p(&key, [&] {
    if (++polls == 20) gate.open();
  });
  wait_stream(s);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  EXPECT_GE(polls.load(), 20);
}

TEST_F(PipelineGpu, WaitStreamEndsWithAPollersErrorBeforeTheStreamDrains) {
  cudaStream_t s = static_cast<cudaStream_t>(gpu_.stream);
  int key = 0;
  int polls = 0;  // since the wait began; the error comes at the third
  ScopedPoller p(&key, [&] {
    if (++polls == 3) NCF_FAIL("injected asynchronous error");
  });
  // Allocated up front: cudaFree would wait for the device.
  Buffer<int32_t> one(Device::kCuda, 1);
  int32_t h = 0;
  // wait_stream itself, then two of the waits routed through it.
  const std::vector<std::pair<const char*, std::function<void()>>> waits = {
      {"wait_stream", [&] { wait_stream(s); }},
      {"check_device_errors", [&] { check_device_errors(gpu_); }},
      {"device_copy to the host",
       [&] { device_copy(Device::kCpu, &h, Device::kCuda, one.data(), 4); }}};
  for (const auto& [name, wait] : waits) {
    StreamGate gate(s);  // closed until the end of this pass
    polls = 0;
    std::string what = "no throw";
    try {
      wait();
    } catch (const Error& e) {
      what = e.what();
    }
    EXPECT_NE(what.find("injected asynchronous error"), std::string::npos) << name << ": " << what;
    // The gate is still closed: the wait ended by the poller, not by the stream.
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << name << ": the host function ended already";
  }
}

TEST_F(PipelineGpu, WaitStreamOnTwoThreadsWaitsForEachOnesOwnStream) {
  // Each thread re-records an event of its own: a shared one would let the second
  // wait's record end the first thread's wait early. The slow stream is held at a
  // gate until both waits on the idle one are done; its thread is known to be in
  // its wait (its calls of the poller say so) before they begin.
  cudaStream_t slow = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&slow, cudaStreamNonBlocking));
  std::atomic<std::thread::id> slow_thread{};
  std::atomic<bool> slow_waiting{false}, slow_done{false};
  int key = 0;
  ScopedPoller p(&key, [&] {
    if (std::this_thread::get_id() == slow_thread.load()) slow_waiting.store(true);
  });
  std::string slow_error;
  {
    StreamGate gate(slow);
    std::thread t([&] {
      try {
        CUDA_CHECK(cudaSetDevice(0));
        slow_thread.store(std::this_thread::get_id());
        wait_stream(slow);
      } catch (const Error& e) {
        slow_error = e.what();
      }
      slow_done.store(true);
    });
    const auto t0 = std::chrono::steady_clock::now();
    while (!slow_waiting.load() && !slow_done.load() && seconds_since(t0) < 120)
      std::this_thread::yield();
    EXPECT_TRUE(slow_waiting.load()) << "the slow stream's thread never polled in its wait";
    wait_stream(static_cast<cudaStream_t>(gpu_.stream));  // idle
    wait_stream(static_cast<cudaStream_t>(gpu_.stream));  // the same event, re-recorded
    // They ended with the slow stream still held, and its wait still going.
    EXPECT_EQ(cudaStreamQuery(slow), cudaErrorNotReady) << "the idle waits waited for the gate";
    EXPECT_FALSE(slow_done.load()) << "the slow stream's wait ended before its host function";
    gate.open();
    t.join();
  }
  EXPECT_EQ(slow_error, "");
  EXPECT_EQ(cudaStreamQuery(slow), cudaSuccess);
  CUDA_CHECK(cudaStreamDestroy(slow));
}

// ---- every host wait ends with a poller's error (issue 22) -------------------------
// Each test holds a stream at a gate, so that the wait under test cannot end; arms a
// poller that throws as the NCCL communicator's does after a peer died; expects the
// wait to end with that error while the gate is still closed; then opens the gate and
// checks that the interrupted object still works. No CUDA buffer may be freed while
// a gate is closed (its destructor would wait for the gate), hence the buffers made
// up front.

// A non-blocking stream of the test's own, standing in for the NCCL communicator's:
// neither the compute stream nor the legacy stream waits for it, but cudaFree does.
struct OtherStream {
  cudaStream_t s = nullptr;
  OtherStream() { CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~OtherStream() { cudaStreamDestroy(s); }
  OtherStream(const OtherStream&) = delete;
  OtherStream& operator=(const OtherStream&) = delete;
};

// A wait poller that, while armed, throws as the NCCL communicator's does.
class FailingPoller {
 public:
  void arm(bool on) { armed_.store(on); }

 private:
  std::atomic<bool> armed_{false};
  ScopedPoller poller_{this, [this] {
                         if (armed_.load()) NCF_FAIL("injected asynchronous error");
                       }};
};

// Runs `wait`, which a closed gate keeps from ending, with the poller armed.
void expect_interrupted(FailingPoller& poller, const std::string& name,
                        const std::function<void()>& wait) {
  poller.arm(true);
  std::string what = "no throw";
  try {
    wait();
  } catch (const Error& e) {
    what = e.what();
  }
  poller.arm(false);
  EXPECT_NE(what.find("injected asynchronous error"), std::string::npos) << name << ": " << what;
  // Each caller then checks that its gate is still closed: the wait ended by the
  // poller, not by the gate.
}

TEST_F(PipelineGpu, StepTimerReadEndsWithAPollersError) {
  cudaStream_t s = static_cast<cudaStream_t>(gpu_.stream);
  StepTimer timer(gpu_);
  FailingPoller poller;
  timer.begin(5);
  {
    StreamGate gate(s);
    timer.mark(StepPhase::kCompute);  // recorded behind the gate
    timer.end();
    EXPECT_TRUE(timer.take_finished(false).empty());  // not ready: no wait
    expect_interrupted(poller, "StepTimer::read", [&] { timer.take_finished(true); });
    EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  }
  const std::vector<StepTimes> times = timer.take_finished(true);
  ASSERT_EQ(times.size(), 1u) << "the interrupted read lost or repeated the step";
  EXPECT_EQ(times[0].step, 5);
  EXPECT_GT(times[0].seconds[int(StepPhase::kCompute)], 0.0);
}

TEST_F(PipelineGpu, InputStagerStageEndsWithAPollersError) {
  cudaStream_t copy = cuda_resources(gpu_, "test").copy_stream;
  std::mt19937 rng(11);
  const int64_t n = 1000;
  std::vector<TrainBatch> b;
  for (int k = 0; k < 3; ++k) b.push_back(random_batch(n, rng));
  InputStager st(gpu_);
  FailingPoller poller;
  {
    StreamGate gate(copy);
    st.stage(b[0]);  // its copy is held at the gate
    st.stage(b[1]);
    st.acquire();
    st.release();
    // Slot 0 again: its pinned memory still feeds the held copy.
    expect_interrupted(poller, "InputStager::stage", [&] { st.stage(b[2]); });
    EXPECT_EQ(st.staged(), 1);
    EXPECT_EQ(cudaStreamQuery(copy), cudaErrorNotReady);
  }
  st.stage(b[2]);
  for (int k = 1; k < 3; ++k) {
    const InputStager::Staged in = st.acquire();
    ASSERT_EQ(in.n, n);
    EXPECT_EQ(read_back(in.users, size_t(n)), b[k].users) << "batch " << k;
    EXPECT_EQ(read_back(in.items, size_t(n)), b[k].items) << "batch " << k;
    st.release();
  }
}

TEST_F(PipelineGpu, InputStagerResetEndsWithAPollersError) {
  cudaStream_t copy = cuda_resources(gpu_, "test").copy_stream;
  std::mt19937 rng(12);
  const int64_t n = 1000;
  const TrainBatch b = random_batch(n, rng);
  InputStager st(gpu_);
  FailingPoller poller;
  {
    StreamGate gate(copy);
    st.stage(b);  // its copy is held at the gate
    expect_interrupted(poller, "InputStager::reset", [&] { st.reset(); });
    EXPECT_EQ(cudaStreamQuery(copy), cudaErrorNotReady);
  }
  st.reset();
  EXPECT_EQ(st.staged(), 0);
  st.stage(b);  // afresh
  const InputStager::Staged in = st.acquire();
  ASSERT_EQ(in.n, n);
  EXPECT_EQ(read_back(in.users, size_t(n)), b.users);
  EXPECT_EQ(read_back(in.items, size_t(n)), b.items);
  st.release();
}

TEST_F(PipelineGpu, ScratchAndPinnedStagingGrowthEndWithAPollersError) {
  CudaResources& r = cuda_resources(gpu_, "test");
  void* scratch = r.scratch(4096);
  void* pinned = r.pinned(4096);
  OtherStream other;
  FailingPoller poller;
  {
    StreamGate gate(other.s);
    expect_interrupted(poller, "CudaResources::scratch growth",
                       [&] { r.scratch(size_t(1) << 24); });
    EXPECT_EQ(r.scratch(4096), scratch) << "an interrupted growth must keep the old arena";
    expect_interrupted(poller, "CudaResources::pinned growth", [&] { r.pinned(size_t(1) << 20); });
    EXPECT_EQ(r.pinned(4096), pinned) << "an interrupted growth must keep the old staging";
    EXPECT_EQ(cudaStreamQuery(other.s), cudaErrorNotReady);
  }
  EXPECT_NE(r.scratch(size_t(1) << 24), nullptr);
  EXPECT_NE(r.pinned(size_t(1) << 20), nullptr);
}

TEST_F(PipelineGpu, BufferGrowthAndFreeEndWithAPollersError) {
  Buffer<int32_t> b(Device::kCuda, 16);
  Buffer<int32_t> replacement(Device::kCuda, 8);
  int32_t* const before = b.data();
  OtherStream other;
  FailingPoller poller;
  {
    StreamGate gate(other.s);
    expect_interrupted(poller, "Buffer::reserve growth", [&] { b.reserve(size_t(1) << 22); });
    expect_interrupted(poller, "Buffer move assignment", [&] { b = std::move(replacement); });
    expect_interrupted(poller, "Buffer::reset", [&] { b.reset(); });
    EXPECT_EQ(b.data(), before) << "an interrupted free must keep the buffer";
    EXPECT_EQ(b.size(), 16u);
    EXPECT_EQ(replacement.size(), 8u);
    EXPECT_EQ(cudaStreamQuery(other.s), cudaErrorNotReady);
  }
  b.reserve(size_t(1) << 22);
  EXPECT_EQ(b.size(), size_t(1) << 22);
  b = std::move(replacement);
  EXPECT_EQ(b.size(), 8u);
}

TEST_F(PipelineGpu, PinnedBufferGrowthEndsWithAPollersError) {
  PinnedBuffer<int32_t> p;
  p.reserve(16);
  PinnedBuffer<int32_t> replacement;
  replacement.reserve(8);
  int32_t* const before = p.data();
  OtherStream other;
  FailingPoller poller;
  {
    StreamGate gate(other.s);
    expect_interrupted(poller, "PinnedBuffer::reserve growth", [&] { p.reserve(size_t(1) << 22); });
    expect_interrupted(poller, "PinnedBuffer move assignment", [&] { p = std::move(replacement); });
    EXPECT_EQ(p.data(), before) << "an interrupted free must keep the buffer";
    EXPECT_EQ(p.size(), 16u);
    EXPECT_EQ(replacement.size(), 8u);
    EXPECT_EQ(cudaStreamQuery(other.s), cudaErrorNotReady);
  }
  p.reserve(size_t(1) << 22);
  EXPECT_EQ(p.size(), size_t(1) << 22);
}

TEST_F(PipelineGpu, WaitDeviceWaitsForEveryStreamAndEndsWithAPollersError) {
  OtherStream other;
  {
    // Without pollers: the gate opens itself after 0.3 s, counted from when its host
    // function began, which is after t0 (a lower bound however late the wait begins).
    const auto t0 = std::chrono::steady_clock::now();
    StreamGate gate(other.s, 0.3);
    wait_device();
    EXPECT_GE(seconds_since(t0), 0.29);
    EXPECT_EQ(cudaStreamQuery(other.s), cudaSuccess);
  }
  {
    // With a quiet poller (the helper thread's path): the gate opens at its 20th call.
    std::atomic<int> polls{0};
    StreamGate gate(other.s);
    int key = 0;
    ScopedPoller p(&key, [&] {
      if (++polls == 20) gate.open();
    });
    wait_device();
    EXPECT_EQ(cudaStreamQuery(other.s), cudaSuccess);
    EXPECT_GE(polls.load(), 20);
  }
  FailingPoller poller;
  {
    StreamGate gate(other.s);
    expect_interrupted(poller, "wait_device", [] { wait_device(); });
    EXPECT_EQ(cudaStreamQuery(other.s), cudaErrorNotReady);
  }
  {
    // For destructors: the poller's error ends only the polling, not the wait.
    const auto t0 = std::chrono::steady_clock::now();
    StreamGate gate(other.s, 0.3);
    poller.arm(true);
    wait_device_nothrow();
    EXPECT_GE(seconds_since(t0), 0.29);
    EXPECT_EQ(cudaStreamQuery(other.s), cudaSuccess);
    poller.arm(false);
  }
}

#endif  // NCF_WITH_CUDA

}  // namespace
}  // namespace ncf
