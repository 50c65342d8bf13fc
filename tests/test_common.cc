// Philox determinism and distribution sanity; error messages carry file:line;
// the step timer's phase bookkeeping on a CPU context.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <utility>

#include "common/check.h"
#include "common/philox.h"
#include "common/step_timer.h"

namespace ncf {

TEST(Philox, KnownAnswerZeroKey) {
  // Random123 known-answer test for philox4x32-10, counter 0, key 0.
  Philox4 r = philox4x32(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Philox, KnownAnswerPi) {
  Philox4 r =
      philox4x32(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(r.v[0], 0xd16cfe09u);
  EXPECT_EQ(r.v[1], 0x94fdccebu);
  EXPECT_EQ(r.v[2], 0x5001e420u);
  EXPECT_EQ(r.v[3], 0x24126ea1u);
}

TEST(Philox, BelowIsInRangeAndCoversIt) {
  CounterRng rng{42, kStreamShuffle, 7};
  std::set<uint64_t> seen;
  for (uint64_t d = 0; d < 2000; ++d) {
    uint64_t v = rng.below(d, 10);
    ASSERT_LT(v, 10u);
    seen.insert(v);
  }
  EXPECT_EQ(seen.size(), 10u);
}

TEST(Check, MessageHasExpressionAndLocation) {
  try {
    int x = 3;
    NCF_CHECK(x == 4, "x is ", x);
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("x == 4"), std::string::npos) << m;
    EXPECT_NE(m.find("x is 3"), std::string::npos) << m;
    EXPECT_NE(m.find("test_common.cc:"), std::string::npos) << m;
  }
}

// The library checks: 0 passes; any other status throws with the library, the
// expression, file:line and the rank.
TEST(Check, LibraryChecksNameTheLibraryExpressionAndLocation) {
  auto message = [](auto&& check) -> std::string {
    try {
      check();
    } catch (const Error& e) {
      return e.what();
    }
    return "no throw";
  };
  auto status = [](int s) { return s; };
  EXPECT_EQ(message([&] { MPI_CHECK(status(0)); }), "no throw");
  EXPECT_EQ(message([&] { CUDA_CHECK(status(0)); }), "no throw");
  EXPECT_EQ(message([&] { CUBLAS_CHECK(status(0)); }), "no throw");
  EXPECT_EQ(message([&] { NCCL_CHECK(status(0)); }), "no throw");
  set_error_rank(3);
  const std::string mpi = message([&] { MPI_CHECK(status(5)); });
  const std::string cuda = message([&] { CUDA_CHECK(status(1)); });
  const std::string cublas = message([&] { CUBLAS_CHECK(status(1)); });
  const std::string nccl = message([&] { NCCL_CHECK(status(4)); });
  set_error_rank(-1);
  for (const auto& [m, lib] : {std::pair{mpi, "MPI call failed (5"}, std::pair{cuda, "CUDA error"},
                               std::pair{cublas, "cuBLAS error"}, std::pair{nccl, "NCCL error"}}) {
    EXPECT_EQ(m.rfind("[rank 3] ", 0), 0u) << m;
    EXPECT_NE(m.find(lib), std::string::npos) << m;
    EXPECT_NE(m.find("status("), std::string::npos) << m;
    EXPECT_NE(m.find("test_common.cc:"), std::string::npos) << m;
  }
#ifdef NCF_WITH_CUDA
  // The libraries' own texts (no GPU needed to look them up).
  EXPECT_NE(cuda.find("invalid argument"), std::string::npos) << cuda;  // cudaErrorInvalidValue
  EXPECT_NE(nccl.find("invalid argument"), std::string::npos) << nccl;  // ncclInvalidArgument
#endif
}

// Each mark charges the time since the previous one to its phase; sleeps give
// lower bounds only (the test asserts no speed).
TEST(StepTimer, ChargesEachIntervalToItsPhase) {
  ExecContext cpu;
  StepTimer t(cpu);
  t.begin(7);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  t.mark(StepPhase::kExchange);
  t.mark(StepPhase::kCompute);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  t.mark(StepPhase::kAllreduce);
  t.end();
  std::vector<StepTimes> done = t.take_finished(false);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].step, 7);
  EXPECT_GE(done[0].seconds[int(StepPhase::kExchange)], 0.030);
  EXPECT_GE(done[0].seconds[int(StepPhase::kAllreduce)], 0.010);
  EXPECT_LT(done[0].seconds[int(StepPhase::kCompute)], done[0].seconds[int(StepPhase::kExchange)]);
  EXPECT_TRUE(t.take_finished(true).empty()) << "a step is returned once";
}

// More steps than the ring holds: none is lost and they come back in order.
TEST(StepTimer, KeepsEveryStepInOrderPastTheRing) {
  ExecContext cpu;
  StepTimer t(cpu);
  std::vector<StepTimes> all;
  for (int64_t s = 0; s < 3 * StepTimer::kSlots + 1; ++s) {
    t.begin(s);
    t.mark(StepPhase::kCompute);
    t.end();
    if (s % 5 == 0)
      for (const StepTimes& x : t.take_finished(false)) all.push_back(x);
  }
  for (const StepTimes& x : t.take_finished(true)) all.push_back(x);
  ASSERT_EQ(all.size(), size_t(3 * StepTimer::kSlots + 1));
  for (size_t k = 0; k < all.size(); ++k) EXPECT_EQ(all[k].step, int64_t(k));
}

TEST(StepTimer, MisuseIsAnError) {
  ExecContext cpu;
  StepTimer t(cpu);
  EXPECT_THROW(t.mark(StepPhase::kCompute), Error);
  EXPECT_THROW(t.end(), Error);
  t.begin(0);
  for (int k = 0; k < StepTimer::kMaxMarks; ++k) t.mark(StepPhase::kCompute);
  EXPECT_THROW(t.mark(StepPhase::kCompute), Error);
  t.end();
  EXPECT_THROW(t.mark(StepPhase::kCompute), Error);
}

}  // namespace ncf
