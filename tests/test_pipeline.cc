// The step pipeline's host-side contracts, on CPU contexts: the input stager's
// order and misuse errors, pinned host buffers, the *_async collectives, the
// staging slots of a host communicator, and the pollers of the interruptible host
// waits. (The CUDA side — copy stream, events, the NCCL communication stream,
// wait_stream — is in test_pipeline_gpu.cc.)
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
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

using test::ScopedPoller;
using test::seconds_since;

TrainBatch batch_of(int64_t n, int32_t first) {
  TrainBatch b;
  b.users.resize(size_t(n));
  b.items.resize(size_t(n));
  std::iota(b.users.begin(), b.users.end(), first);
  std::iota(b.items.begin(), b.items.end(), first + 1000);
  return b;
}

TEST(InputStager, CpuHandsOutTheBatchesInStagingOrder) {
  ExecContext cpu;
  InputStager st(cpu);
  TrainBatch a = batch_of(5, 0), b = batch_of(3, 50), c = batch_of(0, 0);
  st.stage(a);
  st.stage(b);
  EXPECT_EQ(st.staged(), 2);
  InputStager::Staged x = st.acquire();
  EXPECT_EQ(x.users, a.users.data());
  EXPECT_EQ(x.items, a.items.data());
  EXPECT_EQ(x.n, 5);
  st.release();
  st.stage(c);  // a's slot is free again
  InputStager::Staged y = st.acquire();
  EXPECT_EQ(y.users, b.users.data());
  EXPECT_EQ(y.n, 3);
  st.release();
  InputStager::Staged z = st.acquire();
  EXPECT_EQ(z.n, 0);
  st.release();
  EXPECT_EQ(st.staged(), 0);
}

TEST(InputStager, MisuseIsAnError) {
  ExecContext cpu;
  InputStager st(cpu);
  EXPECT_THROW(st.acquire(), Error);  // nothing staged
  EXPECT_THROW(st.release(), Error);  // nothing acquired
  TrainBatch a = batch_of(2, 0), b = batch_of(2, 9), c = batch_of(2, 7);
  st.stage(a);
  st.stage(b);
  EXPECT_THROW(st.stage(c), Error);  // a third batch before a release
  st.acquire();
  EXPECT_THROW(st.acquire(), Error);  // the first one is still acquired
  TrainBatch bad = batch_of(2, 0);
  bad.items.pop_back();
  st.release();
  EXPECT_THROW(st.stage(bad), Error);  // users and items disagree
}

TEST(InputStager, ResetForgetsAnInterruptedEpoch) {
  ExecContext cpu;
  InputStager st(cpu);
  TrainBatch a = batch_of(2, 0), b = batch_of(3, 10), c = batch_of(4, 20);
  st.stage(a);
  st.stage(b);
  st.acquire();  // the step that threw never released it
  st.reset();
  EXPECT_EQ(st.staged(), 0);
  EXPECT_THROW(st.acquire(), Error);
  st.stage(c);
  InputStager::Staged x = st.acquire();
  EXPECT_EQ(x.users, c.users.data());
  EXPECT_EQ(x.n, 4);
  st.release();
}

// ArrayStager on a CPU context hands out each staged batch's own parts, in staging
// order, and refuses a batch with another number of parts.
TEST(ArrayStager, CpuHandsOutEachBatchsPartsInStagingOrder) {
  ExecContext cpu;
  ArrayStager st(cpu, 3);
  std::vector<int32_t> u1 = {1, 2}, i1 = {3, 4, 5, 6}, u2 = {7};
  std::vector<uint8_t> m1 = {1, 0, 1, 1}, m2 = {0};
  st.stage({{u1.data(), 8}, {i1.data(), 16}, {m1.data(), 4}});
  st.stage({{u2.data(), 4}, {nullptr, 0}, {m2.data(), 1}});
  EXPECT_THROW(st.stage({{u1.data(), 8}, {i1.data(), 16}, {m1.data(), 4}}), Error);  // a third
  std::vector<const void*> a = st.acquire();
  EXPECT_EQ(a, (std::vector<const void*>{u1.data(), i1.data(), m1.data()}));
  EXPECT_THROW(st.acquire(), Error);  // still acquired
  st.release();
  EXPECT_THROW(st.stage({{u1.data(), 8}, {i1.data(), 16}}), Error);  // two parts, not three
  std::vector<const void*> b = st.acquire();
  EXPECT_EQ(b, (std::vector<const void*>{u2.data(), nullptr, m2.data()}));
  st.release();
  EXPECT_EQ(st.staged(), 0);
  EXPECT_THROW(st.release(), Error);
  EXPECT_THROW(ArrayStager(cpu, 0), Error);
}

TEST(PinnedBuffer, GrowsKeepsAlignmentAndMoves) {
  PinnedBuffer<double> p;
  EXPECT_EQ(p.data(), nullptr);
  p.reserve(10);
  ASSERT_NE(p.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data()) % 64, 0u);
  for (int i = 0; i < 10; ++i) p.data()[i] = i;
  const double* before = p.data();
  p.reserve(4);  // never shrinks
  EXPECT_EQ(p.data(), before);
  EXPECT_EQ(p.size(), 10u);
  PinnedBuffer<double> q(std::move(p));
  EXPECT_EQ(q.data(), before);
  EXPECT_EQ(p.data(), nullptr);
  EXPECT_EQ(q.data()[9], 9.0);
  q.reserve(1 << 20);
  EXPECT_GE(q.size(), size_t(1) << 20);
  q.data()[(1 << 20) - 1] = 1.0;  // the whole range is writable
}

TEST(Collectives, AsyncVariantsOnAHostCommunicatorCompleteAtOnce) {
  std::unique_ptr<Communicator> comm = make_communicator(RankInfo{}, Device::kCpu, "single");
  std::vector<int32_t> send = {4, 5, 6}, recv(3, 0);
  const int64_t sc[1] = {3}, sd[1] = {0}, rc[1] = {3}, rd[1] = {0};
  EXPECT_EQ(comm->all_to_all_v_async(send.data(), sc, sd, recv.data(), rc, rd, DType::kInt32), 0);
  EXPECT_EQ(recv, send);
  std::vector<float> x = {1.5f, -2.0f};
  EXPECT_EQ(comm->all_reduce_sum_async(x.data(), 2, DType::kFloat32), 0);
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f}));
  comm->join(0);  // nothing to wait for
  // The *_on helpers report ticket 0 as well, and still move the data.
  CommTicket t = 42;
  std::fill(recv.begin(), recv.end(), 0);
  all_to_all_v_on(*comm, Device::kCpu, send.data(), sc, sd, recv.data(), rc, rd, DType::kInt32, &t);
  EXPECT_EQ(t, 0);
  EXPECT_EQ(recv, send);
  t = 42;
  all_reduce_sum_on(*comm, Device::kCpu, x.data(), 2, DType::kFloat32, &t);
  EXPECT_EQ(t, 0);
  // Bad arguments still fail inside an async call, and the next call is not deferred.
  const int64_t neg[1] = {-1};
  EXPECT_THROW(comm->all_to_all_v_async(send.data(), neg, sd, recv.data(), rc, rd, DType::kInt32),
               Error);
  EXPECT_EQ(comm->all_reduce_sum_async(x.data(), 2, DType::kFloat32), 0);
}

TEST(Collectives, HostStagingHasTwoIndependentGrowingSlots) {
  std::unique_ptr<Communicator> comm = make_communicator(RankInfo{}, Device::kCpu, "single");
  char* a = static_cast<char*>(comm->host_staging(0, 100));
  char* b = static_cast<char*>(comm->host_staging(1, 100));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(a + 100 <= b || b + 100 <= a) << "the slots overlap";
  EXPECT_EQ(comm->host_staging(0, 50), a);  // big enough already
  char* big = static_cast<char*>(comm->host_staging(0, 1 << 20));
  big[(1 << 20) - 1] = 1;
  EXPECT_THROW(comm->host_staging(2, 8), Error);
}

// The staging that *_on uses for host data on a device communicator: grow-only per
// slot, so repeated calls of the same or a smaller size reuse one allocation. On a
// host communicator the slots are host memory and the same rules show.
TEST(Collectives, DeviceStagingSlotsAreReusedAndGrowOnly) {
  std::unique_ptr<Communicator> comm = make_communicator(RankInfo{}, Device::kCpu, "single");
  char* a = static_cast<char*>(comm->device_staging(0, 4096));
  char* b = static_cast<char*>(comm->device_staging(1, 4096));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(a + 4096 <= b || b + 4096 <= a) << "the slots overlap";
  std::memset(a, 7, 4096);
  std::memset(b, 9, 4096);
  for (size_t bytes : {size_t(4096), size_t(4096), size_t(100), size_t(0), size_t(4095)})
    EXPECT_EQ(comm->device_staging(0, bytes), a) << bytes << " bytes reallocated slot 0";
  EXPECT_EQ(comm->device_staging(1, 4096), b);
  EXPECT_EQ(comm->device_staging(1, 1), b);
  // The same memory, not a free and a new allocation that happens to land there (the
  // allocator would have written its bookkeeping into the freed block).
  int64_t changed = 0;
  for (int i = 0; i < 4096; ++i) changed += (a[i] != 7) + (b[i] != 9);
  EXPECT_EQ(changed, 0) << "a slot was freed and allocated again";
  char* big = static_cast<char*>(comm->device_staging(0, 1 << 20));
  big[(1 << 20) - 1] = 1;
  EXPECT_EQ(comm->device_staging(0, 1 << 19), big);  // stays at its largest size
  EXPECT_EQ(comm->device_staging(1, 10), b);         // slots grow independently
  EXPECT_NE(comm->device_staging(0, 1), nullptr);
  EXPECT_THROW(comm->device_staging(2, 8), Error);
  EXPECT_THROW(comm->device_staging(-1, 8), Error);
}

// ---- the interruptible host wait (plain C++; wait_stream builds on it) -------------

// The waits below end by what the pollers saw, not by the clock: a loaded machine
// may poll late, never too often. A wait that would run past kLimit ends anyway (a
// safety net, so that a broken wait fails the test instead of hanging it).
constexpr double kLimit = 60;

TEST(WaitPollers, WaitUntilCallsPollersWhileWaitingAndReturnsWhenDone) {
  EXPECT_FALSE(wait_pollers_registered());
  std::atomic<int> polls{0};
  int key = 0;
  {
    ScopedPoller p(&key, [&] { ++polls; });
    EXPECT_TRUE(wait_pollers_registered());
    const auto t0 = std::chrono::steady_clock::now();
    wait_until([&] { return polls.load() >= 5 || seconds_since(t0) > kLimit; });
    const double waited = seconds_since(t0);
    // Done is asked before every poll: the wait ends at the 5th, no later.
    EXPECT_EQ(polls.load(), 5) << "after " << waited << " s";
    // At most once a millisecond (the first at once): 5 polls take 4 ms or more,
    // where a busy loop would take microseconds.
    EXPECT_GE(waited, 0.004);
  }
  EXPECT_FALSE(wait_pollers_registered());
  const int before = polls.load();
  const auto t1 = std::chrono::steady_clock::now();
  wait_until([&] { return seconds_since(t1) >= 0.01; });
  EXPECT_EQ(polls.load(), before) << "an unregistered poller was called";
  // Already done: returns without polling or sleeping.
  wait_until([] { return true; });
}

TEST(WaitPollers, AThrowingPollerEndsTheWait) {
  int key = 0;
  int polls = 0;
  ScopedPoller p(&key, [&] {
    if (++polls == 3) NCF_FAIL("peer is gone");
  });
  const auto t0 = std::chrono::steady_clock::now();
  bool done_called_late = false;
  try {
    // Would end on its own only at the safety net: the poller must end it.
    wait_until([&] {
      done_called_late = seconds_since(t0) > kLimit;
      return done_called_late;
    });
    FAIL() << "wait_until returned without the poller's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("peer is gone"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(done_called_late);
  EXPECT_EQ(polls, 3);
}

TEST(WaitPollers, KeysReplaceAndRemoveOnlyTheirOwnPoller) {
  int k1 = 0, k2 = 0;
  int a = 0, b = 0, c = 0;
  ScopedPoller p1(&k1, [&] { ++a; });
  ScopedPoller p2(&k2, [&] { ++b; });
  register_wait_poller(&k1, [&] { ++c; });  // replaces k1's poller
  int calls = 0;
  wait_until([&] { return ++calls > 1; });  // not done once: one round of pollers
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 1);
  unregister_wait_poller(&k2);
  unregister_wait_poller(&b);  // unknown key: nothing happens
  calls = 0;
  wait_until([&] { return ++calls > 1; });
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 2);
  EXPECT_TRUE(wait_pollers_registered());
  EXPECT_THROW(register_wait_poller(&k2, nullptr), Error);
}

}  // namespace
}  // namespace ncf
