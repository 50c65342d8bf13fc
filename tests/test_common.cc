// Philox determinism and distribution sanity; every check of check.h names the
// expression, file:line and rank in what it throws; the step timer's phase
// bookkeeping on a CPU context; a program re-executed through /proc/self/exe keeps its
// name.
#include <gtest/gtest.h>

#ifdef NCF_WITH_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/blas_setup.h"
#include "common/check.h"
#include "common/philox.h"
#include "common/step_timer.h"
#include "test_util.h"

namespace ncf {
namespace probe {
struct Counts {
  std::vector<int64_t> sc, rc, sd, rd;
};
void counts_and_offsets(Counts* c, const std::vector<int64_t>& a, const std::vector<int64_t>& b,
                        int W);
}  // namespace probe

// GCC 12.2 (Debian 12's) at -O3 left the second running sum of toolchain_probe.cc's loop at
// zero: its loop distribution read each count before the store of it. The project's flags
// turn loop distribution off; this fails if they stop doing so on a compiler that has it.
TEST(Toolchain, KeepsTwoRunningSumsBesideTheCountsTheyRead) {
  probe::Counts c;
  for (auto* v : {&c.sc, &c.rc, &c.sd, &c.rd}) v->assign(4, -1);
  probe::counts_and_offsets(&c, {5, 6, 7, 8}, {7, 8, 9, 10}, 4);
  EXPECT_EQ(c.sc, (std::vector<int64_t>{5, 6, 7, 8}));
  EXPECT_EQ(c.rc, (std::vector<int64_t>{7, 8, 9, 10}));
  EXPECT_EQ(c.sd, (std::vector<int64_t>{0, 5, 11, 18}));
  EXPECT_EQ(c.rd, (std::vector<int64_t>{0, 7, 15, 24}));
}

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

namespace {

// What a check threw, or "no throw" when it passed.
std::string thrown(const std::function<void()>& check) {
  try {
    check();
  } catch (const Error& e) {
    return e.what();
  }
  return "no throw";
}

int status(int s) { return s; }

// Where throw_error says a check failed: "(test_common.cc:<line>)".
std::string at(int line) { return "(test_common.cc:" + std::to_string(line) + ")"; }

}  // namespace

// NCF_CHECK (an internal invariant) names the condition, the message parts and
// file:line; NCF_FAIL and NCF_REQUIRE (refusals of the user's input) only the parts:
// a sentence about the input. All add the rank.
TEST(Check, MessageHasExpressionLocationAndRank) {
  int x = 3;
  EXPECT_EQ(thrown([&] { NCF_CHECK(x == 3, "x is ", x); }), "no throw");
  EXPECT_EQ(thrown([&] { NCF_REQUIRE(x == 3, "x is ", x); }), "no throw");
  set_error_rank(2);
  const int check_line = __LINE__ + 1;
  const std::string check = thrown([&] { NCF_CHECK(x == 4, "x is ", x); });
  const std::string fail = thrown([&] { NCF_FAIL("bad x: ", x); });
  const std::string require = thrown([&] { NCF_REQUIRE(x == 4, "flag --x ", x, " is not 4"); });
  set_error_rank(-1);
  EXPECT_EQ(check, "[rank 2] check failed: x == 4: x is 3 " + at(check_line));
  EXPECT_EQ(fail, "[rank 2] bad x: 3");
  EXPECT_EQ(require, "[rank 2] flag --x 3 is not 4");
  EXPECT_EQ(thrown([&] { NCF_FAIL("bad x: ", x); }), "bad x: 3");  // no rank set
}

// A catch that adds context passes the error on as what it was: a refusal stays a
// sentence without a location, an internal check keeps its one file:line; the rank
// is said once, and message() is the text without it.
TEST(Check, RethrowInContextKeepsTheKindAndSaysTheRankOnce) {
  auto caught = [](const std::function<void()>& f) -> Error {
    try {
      f();
    } catch (const Error& e) {
      return e;
    }
    return Error("no throw");
  };
  set_error_rank(1);
  const Error refusal = caught([] { NCF_FAIL("f.csv line 3: bad id"); });
  const int check_line = __LINE__ + 1;
  const Error internal = caught([] { NCF_CHECK(1 == 2, "sizes"); });
  const Error passed_refusal = caught([&] { NCF_RETHROW(refusal, "table user"); });
  const Error passed_internal = caught([&] { NCF_RETHROW(internal, "table user"); });
  set_error_rank(-1);
  EXPECT_EQ(refusal.message(), "f.csv line 3: bad id");
  EXPECT_FALSE(refusal.located());
  EXPECT_TRUE(internal.located());
  EXPECT_EQ(std::string(passed_refusal.what()), "[rank 1] table user: f.csv line 3: bad id");
  EXPECT_FALSE(passed_refusal.located());
  EXPECT_EQ(std::string(passed_internal.what()),
            "[rank 1] table user: check failed: 1 == 2: sizes " + at(check_line));
  EXPECT_TRUE(passed_internal.located());
  EXPECT_EQ(message_of(passed_refusal), "table user: f.csv line 3: bad id");
  EXPECT_EQ(message_of(std::runtime_error("plain")), "plain");
  // An Error made from a text takes it whole.
  EXPECT_EQ(Error("[rank 0] as is").message(), "[rank 0] as is");
}

// The library checks: 0 passes; any other status throws with the library, the
// expression, file:line and the rank.
TEST(Check, LibraryChecksNameTheLibraryExpressionAndLocation) {
  EXPECT_EQ(thrown([] { MPI_CHECK(status(0)); }), "no throw");
  EXPECT_EQ(thrown([] { CUDA_CHECK(status(0)); }), "no throw");
  EXPECT_EQ(thrown([] { CUBLAS_CHECK(status(0)); }), "no throw");
  EXPECT_EQ(thrown([] { NCCL_CHECK(status(0)); }), "no throw");
  set_error_rank(3);
  const int mpi_line = __LINE__ + 1;
  const std::string mpi = thrown([] { MPI_CHECK(status(5)); });
  const int cuda_line = __LINE__ + 1;
  const std::string cuda = thrown([] { CUDA_CHECK(status(1)); });
  const int cublas_line = __LINE__ + 1;
  const std::string cublas = thrown([] { CUBLAS_CHECK(status(7)); });
  const int nccl_line = __LINE__ + 1;
  const std::string nccl = thrown([] { NCCL_CHECK(status(4)); });
  set_error_rank(-1);
  struct Case {
    const std::string& m;
    const char* lib;
    const char* expr;
    int line;
  };
  for (const Case& c : {Case{mpi, "MPI call failed (5", "status(5)", mpi_line},
                        Case{cuda, "CUDA error", "status(1)", cuda_line},
                        Case{cublas, "cuBLAS error", "status(7)", cublas_line},
                        Case{nccl, "NCCL error", "status(4)", nccl_line}}) {
    EXPECT_EQ(c.m.rfind("[rank 3] ", 0), 0u) << c.m;
    EXPECT_NE(c.m.find(c.lib), std::string::npos) << c.m;
    EXPECT_NE(c.m.find(c.expr), std::string::npos) << c.m;
    EXPECT_NE(c.m.find(at(c.line)), std::string::npos) << c.m << " expected line " << c.line;
  }
  // No rank set (before the communicator exists): no rank prefix.
  const std::string no_rank = thrown([] { CUDA_CHECK(status(2)); });
  EXPECT_EQ(no_rank.find("[rank"), std::string::npos) << no_rank;
  EXPECT_NE(no_rank.find("status(2)"), std::string::npos) << no_rank;
}

#ifdef NCF_WITH_CUDA
// The libraries' own texts: looking them up needs no GPU. The expected strings
// are the CUDA 13 toolkit's wording, written out here.
TEST(Check, LibraryChecksCarryTheLibrarysErrorText) {
  EXPECT_EQ(thrown([] { CUDA_CHECK(cudaSuccess); }), "no throw");
  EXPECT_EQ(thrown([] { CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS); }), "no throw");
  EXPECT_EQ(thrown([] { NCCL_CHECK(ncclSuccess); }), "no throw");
  set_error_rank(1);
  const int cuda_line = __LINE__ + 1;
  const std::string cuda = thrown([] { CUDA_CHECK(cudaErrorInvalidValue); });
  const int cublas_line = __LINE__ + 1;
  const std::string cublas = thrown([] { CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE); });
  const int nccl_line = __LINE__ + 1;
  const std::string nccl = thrown([] { NCCL_CHECK(ncclInvalidArgument); });
  set_error_rank(-1);
  EXPECT_EQ(cuda, "[rank 1] CUDA error invalid argument: cudaErrorInvalidValue " + at(cuda_line));
  EXPECT_EQ(cublas,
            "[rank 1] cuBLAS error an unsupported value or parameter was passed to the function: "
            "CUBLAS_STATUS_INVALID_VALUE " +
                at(cublas_line));
  EXPECT_EQ(nccl.rfind("[rank 1] NCCL error 'invalid argument", 0), 0u) << nccl;
  EXPECT_NE(nccl.find("ncclInvalidArgument " + at(nccl_line)), std::string::npos) << nccl;
}

// cuBLAS and cuBLASLt are loaded by their first call (common/cublas_loader.cc), not when
// a program starts: until then this process has neither mapped; the first call of each
// reaches the real library (its version, its wording). ctest runs each test in a process
// of its own, so no earlier test has called them.
TEST(CublasLoader, EachLibraryIsLoadedByItsFirstCall) {
  auto mapped = [](const std::string& soname) {
    std::ifstream maps("/proc/self/maps");
    const std::string text((std::istreambuf_iterator<char>(maps)),
                           std::istreambuf_iterator<char>());
    return text.find("/" + soname) != std::string::npos;
  };
  const std::string major = std::to_string(CUBLAS_VER_MAJOR);
  ASSERT_FALSE(mapped("libcublasLt.so." + major));
  ASSERT_FALSE(mapped("libcublas.so." + major));
  EXPECT_EQ(cublasLtGetVersion() / 10000, size_t(CUBLAS_VER_MAJOR));
  EXPECT_TRUE(mapped("libcublasLt.so." + major));
  EXPECT_FALSE(mapped("libcublas.so." + major));
  EXPECT_STREQ(cublasGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED),
               "the requested functionality is not supported");
  EXPECT_TRUE(mapped("libcublas.so." + major));
}
#endif

// Each mark charges the time since the previous one to its phase; sleeps give
// lower bounds only, and the host clock read around the marks upper bounds (the
// test asserts no speed: a loaded machine may stretch any interval).
TEST(StepTimer, ChargesEachIntervalToItsPhase) {
  using Clock = std::chrono::steady_clock;
  ExecContext cpu;
  StepTimer t(cpu);
  t.begin(7);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const Clock::time_point before = Clock::now();
  t.mark(StepPhase::kExchange);
  t.mark(StepPhase::kCompute);
  const double around = std::chrono::duration<double>(Clock::now() - before).count();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  t.mark(StepPhase::kAllreduce);
  t.end();
  std::vector<StepTimes> done = t.take_finished(false);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].step, 7);
  EXPECT_GE(done[0].seconds[int(StepPhase::kExchange)], 0.030);
  EXPECT_GE(done[0].seconds[int(StepPhase::kAllreduce)], 0.010);
  // Compute is charged only the interval between its two marks, not the sleep before.
  EXPECT_LE(done[0].seconds[int(StepPhase::kCompute)], around);
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

namespace {
std::string own_comm() {
  std::ifstream f("/proc/self/comm");
  std::string name;
  std::getline(f, name);
  return name;
}
}  // namespace

// Run by the next test, started through /proc/PID/exe: writes its name, then its name
// after name_after_own_binary, to $NCF_TEST_NAME_OUT.
TEST(ProcessNameWorker, WritesItsNameBeforeAndAfter) {
  const char* out = std::getenv("NCF_TEST_NAME_OUT");
  if (!out) GTEST_SKIP() << "run by ProcessName.AProgramStartedThroughProcExeTakesItsFileName";
  std::ofstream f(out);
  f << own_comm() << "\n";
  name_after_own_binary();
  f << own_comm() << "\n";
}

// ncf_dist re-executes itself through /proc/self/exe where OpenBLAS picked generic
// kernels (a hypervisor's CPU model): such a process is named "exe", and ps, pgrep and
// pkill no longer find it as ncf_dist. It takes its binary's file name back; one started
// under its own name keeps it.
TEST(ProcessName, AProgramStartedThroughProcExeTakesItsFileName) {
  const std::string out = ::testing::TempDir() + "process_name_" + std::to_string(getpid());
  const std::string cmd = "NCF_TEST_NAME_OUT=" + out + " /proc/" + std::to_string(getpid()) +
                          "/exe --gtest_filter=ProcessNameWorker.* >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out);
  std::string before, after;
  std::getline(f, before);
  std::getline(f, after);
  std::remove(out.c_str());
  std::string file = test::self_exe();
  file = file.substr(file.rfind('/') + 1).substr(0, 15);
  EXPECT_EQ(before, "exe") << "started through /proc/PID/exe, as ncf_dist re-executes itself";
  EXPECT_EQ(after, file);
  const std::string mine = own_comm();
  name_after_own_binary();
  EXPECT_EQ(own_comm(), mine) << "a process started under its own name keeps it";
}

}  // namespace ncf
