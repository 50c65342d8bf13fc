// Communicator tests. One set of checks (check_all_collectives) runs every collective
// on integer-coded data whose expected result is computed here by a plain loop over the
// ranks, so comparisons are exact. It runs in-process on SingleCommunicator, and on
// MpiCommunicator in real multi-process jobs: the CommMpi.* tests re-launch this very
// binary under mpirun with NCF_COMM_WORKER set, which enables one CommWorker.* test
// per process (MPI starts once per process; the worker is skipped otherwise).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/collective_watch.h"
#include "comm/communicator.h"
#include "comm/mpi_communicator.h"
#include "comm/single_communicator.h"
#include "common/check.h"
#include "common/philox.h"
#include "test_util.h"

namespace ncf {
namespace {

// ---- checks shared by the in-process and the multi-rank tests -----------------------

// Counts the mismatches of one check and keeps the first one for the message.
struct Tally {
  int64_t wrong = 0;
  std::string first;
  template <typename T>
  void expect(const T& got, const T& want, const std::string& where) {
    if (got == want) return;
    if (wrong++ == 0) {
      std::ostringstream os;
      os << where << ": got " << +got << ", want " << +want;
      first = os.str();
    }
  }
};

#define EXPECT_TALLY_OK(t, what) \
  EXPECT_EQ((t).wrong, 0) << "[rank " << comm.rank() << "] " << (what) << ": " << (t).first

// Elements rank src sends to rank dst in round `mult`: uneven, and zero for some pairs
// once W >= 2 (never all zero, so W = 1 moves data too).
int64_t a2a_count(int src, int dst, int64_t mult) { return ((src + 2 * dst + 1) % 4) * mult; }

// Element idx of the block src -> dst: unique per (src, dst, idx) and exact in T.
template <typename T>
T a2a_value(int src, int dst, int64_t idx, int W) {
  const int64_t code = (static_cast<int64_t>(src) * W + dst) * 1024 + idx;
  if constexpr (std::is_same_v<T, uint8_t>) return static_cast<T>(code % 251);
  if constexpr (std::is_same_v<T, int64_t>) return code + (int64_t{src + 1} << 40);
  return static_cast<T>(code);
}

template <typename T>
T sentinel() {
  return std::is_same_v<T, uint8_t> ? T(255) : T(-7);
}

template <typename T>
void check_all_to_all_v(Communicator& comm, int64_t mult) {
  const int W = comm.world(), r = comm.rank();
  // Send blocks in peer order with 2 spare elements after each; receive blocks in
  // reverse peer order with 1 spare element: displacements must be honoured, and the
  // spare elements must stay untouched.
  std::vector<int64_t> sc(W), sd(W), rc(W), rd(W);
  int64_t off = 0;
  for (int p = 0; p < W; ++p) {
    sc[p] = a2a_count(r, p, mult);
    sd[p] = off;
    off += sc[p] + 2;
  }
  std::vector<T> send(off, sentinel<T>());
  for (int p = 0; p < W; ++p)
    for (int64_t i = 0; i < sc[p]; ++i) send[sd[p] + i] = a2a_value<T>(r, p, i, W);

  std::vector<int64_t> got_rc(W);
  comm.exchange_counts(sc.data(), got_rc.data());
  Tally counts;
  for (int p = 0; p < W; ++p)
    counts.expect(got_rc[p], a2a_count(p, r, mult), "recv count from " + std::to_string(p));
  EXPECT_TALLY_OK(counts, "exchange_counts");

  off = 0;
  for (int p = W - 1; p >= 0; --p) {
    rc[p] = a2a_count(p, r, mult);
    rd[p] = off;
    off += rc[p] + 1;
  }
  std::vector<T> recv(off + 3, sentinel<T>());
  comm.all_to_all_v(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(),
                    dtype_of<T>());

  Tally data;
  std::vector<bool> covered(recv.size(), false);
  for (int p = 0; p < W; ++p)
    for (int64_t i = 0; i < rc[p]; ++i) {
      covered[rd[p] + i] = true;
      data.expect(recv[rd[p] + i], a2a_value<T>(p, r, i, W),
                  "from " + std::to_string(p) + " element " + std::to_string(i));
    }
  for (size_t k = 0; k < recv.size(); ++k)
    if (!covered[k]) data.expect(recv[k], sentinel<T>(), "spare element " + std::to_string(k));
  EXPECT_TALLY_OK(
      data, std::string("all_to_all_v ") + dtype_name(dtype_of<T>()) + " x" + std::to_string(mult));
}

// Rank r's element i for the sum checks; the largest W used keeps every sum exact.
template <typename T>
T reduce_value(int r, int64_t i) {
  if constexpr (std::is_same_v<T, uint8_t>) return static_cast<T>((r + i) % 5);
  if constexpr (std::is_same_v<T, int64_t>) return (int64_t{r + 1} << 33) + (r + 1) * (i % 13) - r;
  return static_cast<T>((r + 1) * (i % 13) - r);
}

template <typename T>
void check_all_reduce(Communicator& comm, size_t n) {
  const int W = comm.world(), r = comm.rank();
  std::vector<T> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = reduce_value<T>(r, i);
  comm.all_reduce_sum(buf.data(), n, dtype_of<T>());
  Tally t;
  for (size_t i = 0; i < n; ++i) {
    T want = 0;
    for (int q = 0; q < W; ++q) want = static_cast<T>(want + reduce_value<T>(q, i));
    t.expect(buf[i], want, "element " + std::to_string(i));
  }
  EXPECT_TALLY_OK(
      t, std::string("all_reduce_sum ") + dtype_name(dtype_of<T>()) + " n=" + std::to_string(n));
}

// Non-integer floats: the sum depends on summation order, so this checks what the
// trainer relies on instead — repeat calls give the same bits and every rank holds the
// same bits — plus closeness to a double-precision sum.
void check_float_sum_reproducible(Communicator& comm, size_t n) {
  const int W = comm.world(), r = comm.rank();
  auto value = [](int q, size_t i) {
    uint32_t u = philox4x32(static_cast<uint32_t>(i), q, 0, 0, 1234, 5678).v[0];
    return static_cast<float>(u) * 0x1p-32f * 2.0f - 1.0f;
  };
  std::vector<float> a(n), b;
  for (size_t i = 0; i < n; ++i) a[i] = value(r, i);
  b = a;
  comm.all_reduce_sum(a.data(), n, DType::kFloat32);
  comm.all_reduce_sum(b.data(), n, DType::kFloat32);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0)
      << "[rank " << r << "] two identical float allreduces differ";

  // Every rank's result, exchanged: identical bits on every rank.
  const size_t w = static_cast<size_t>(W);
  std::vector<int64_t> counts(w, static_cast<int64_t>(n)), displs(w), send_displs(w, 0);
  for (int q = 0; q < W; ++q) displs[size_t(q)] = int64_t(q) * int64_t(n);
  std::vector<float> all(n * w);
  comm.all_to_all_v(a.data(), counts.data(), send_displs.data(), all.data(), counts.data(),
                    displs.data(), DType::kFloat32);
  for (int q = 0; q < W; ++q)
    EXPECT_EQ(std::memcmp(a.data(), all.data() + size_t(q) * n, n * sizeof(float)), 0)
        << "[rank " << r << "] float allreduce result differs from rank " << q << "'s";

  Tally close;
  for (size_t i = 0; i < n; ++i) {
    double want = 0, mag = 0;
    for (int q = 0; q < W; ++q) {
      want += value(q, i);
      mag += std::abs(value(q, i));
    }
    const double tol = W * 6e-8 * mag;  // W roundings of at most half an ulp each
    close.expect(std::abs(a[i] - want) <= tol, true, "element " + std::to_string(i));
  }
  EXPECT_TALLY_OK(close, "float allreduce vs double sum");
}

// Rank 0 arrives late; everyone else must wait for it: each rank leaves the
// barrier after the instant rank 0 entered it. The ranks share one machine and so
// one steady clock, and the instants are compared, not the time a rank waited (a
// rank that left the first barrier late waits less, on a loaded machine maybe not
// at all).
void check_barrier_waits(Communicator& comm) {
  if (comm.world() == 1) return;
  auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  comm.barrier();
  double entered = 0;  // rank 0's instant, summed over the ranks below
  if (comm.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    entered = now();
  }
  comm.barrier();
  const double left = now();
  comm.all_reduce_sum(&entered, 1, DType::kFloat64);
  EXPECT_GE(left, entered) << "[rank " << comm.rank() << "] left the barrier before rank 0 arrived";
}

// Bad arguments throw on every rank alike, before any data moves.
void check_argument_errors(Communicator& comm) {
  const int W = comm.world();
  std::vector<int64_t> c(W, 0), d(W, 0);
  c[W - 1] = -3;
  float x = 0;
  try {
    comm.all_to_all_v(&x, c.data(), d.data(), &x, d.data(), d.data(), DType::kFloat32);
    ADD_FAILURE() << "negative count accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("send_counts[" + std::to_string(W - 1) + "] = -3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(comm.exchange_counts(c.data(), d.data()), Error);
  if (std::string(comm.name()) == "mpi") {
    // MPI 3.1 counts are ints: above INT_MAX the exchange must refuse, not truncate.
    c.assign(W, 0);
    c[0] = int64_t{INT_MAX} + 1;
    try {
      comm.all_to_all_v(&x, c.data(), d.data(), &x, d.data(), d.data(), DType::kFloat32);
      ADD_FAILURE() << "count above INT_MAX accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("2147483648"), std::string::npos) << e.what();
    }
  }
}

void check_all_collectives(Communicator& comm) {
  for (int64_t mult : {1, 300}) {
    check_all_to_all_v<float>(comm, mult);
    check_all_to_all_v<int64_t>(comm, mult);
  }
  check_all_to_all_v<int32_t>(comm, 7);
  check_all_to_all_v<double>(comm, 5);
  check_all_to_all_v<uint8_t>(comm, 11);
  for (size_t n : {size_t{1}, size_t{1000}, size_t{100003}}) {
    check_all_reduce<float>(comm, n);
    check_all_reduce<int64_t>(comm, n);
  }
  check_all_reduce<double>(comm, 777);
  check_all_reduce<int32_t>(comm, 777);
  check_all_reduce<uint8_t>(comm, 777);
  check_float_sum_reproducible(comm, 1000);
  check_float_sum_reproducible(comm, 200000);  // large: Open MPI switches algorithm
  check_barrier_waits(comm);
  check_argument_errors(comm);
}

// host_all_to_all_v (the host path a device communicator takes for host buffers): none on a
// host communicator. Where an implementation has one (here a communicator whose host path
// is MPI's own all-to-all, standing in for NCCL's): the data and counters of all_to_all_v,
// and no path (nothing done) past an int's counts or at W = 1.
class HostPathMpi : public MpiCommunicator {
 public:
  using MpiCommunicator::MpiCommunicator;

 protected:
  bool has_host_all_to_all_v() const override { return true; }
  void do_host_all_to_all_v(const void* send, const int64_t* send_counts,
                            const int64_t* send_displs, void* recv, const int64_t* recv_counts,
                            const int64_t* recv_displs, DType t) override {
    do_all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, t);
  }
};

void check_host_all_to_all_v(Communicator& plain, const RankInfo& info) {
  const int W = plain.world(), r = plain.rank();
  const size_t w = size_t(W);
  std::vector<int64_t> sc(w), sd(w), rc(w), rd(w);
  int64_t ns = 0, nr = 0;
  for (int p = 0; p < W; ++p) {
    sc[size_t(p)] = a2a_count(r, p, 3);
    sd[size_t(p)] = ns;
    ns += sc[size_t(p)];
    rc[size_t(p)] = a2a_count(p, r, 3);
    rd[size_t(p)] = nr;
    nr += rc[size_t(p)];
  }
  std::vector<int32_t> send(size_t(ns) + 1), want(size_t(nr) + 1), got(size_t(nr) + 1, -7);
  for (int p = 0; p < W; ++p)
    for (int64_t i = 0; i < sc[size_t(p)]; ++i)
      send[size_t(sd[size_t(p)] + i)] = a2a_value<int32_t>(r, p, i, W);
  const CommCounters c0 = plain.counters();
  EXPECT_FALSE(plain.host_all_to_all_v(send.data(), sc.data(), sd.data(), got.data(), rc.data(),
                                       rd.data(), DType::kInt32))
      << "a host communicator has no host path of its own";
  EXPECT_EQ(plain.counters().total_calls(), c0.total_calls());

  HostPathMpi comm(info);
  const CommCounters z = comm.counters();
  comm.all_to_all_v(send.data(), sc.data(), sd.data(), want.data(), rc.data(), rd.data(),
                    DType::kInt32);
  const CommCounters a = comm.counters();
  const bool took = comm.host_all_to_all_v(send.data(), sc.data(), sd.data(), got.data(), rc.data(),
                                           rd.data(), DType::kInt32);
  const CommCounters b = comm.counters();
  if (W == 1) {
    EXPECT_FALSE(took) << "W = 1: nothing to move";
    EXPECT_EQ(b.total_calls(), a.total_calls());
    return;
  }
  ASSERT_TRUE(took);
  for (int64_t k = 0; k < nr; ++k) EXPECT_EQ(got[size_t(k)], want[size_t(k)]) << "element " << k;
  EXPECT_EQ(got[size_t(nr)], -7) << "past the last block";
  // Counted as the all_to_all_v before it was.
  for (int k = 0; k < kCollectiveKinds; ++k) {
    EXPECT_EQ(b.calls[k] - a.calls[k], a.calls[k] - z.calls[k]) << "kind " << k;
    EXPECT_EQ(b.bytes[k] - a.bytes[k], a.bytes[k] - z.bytes[k]) << "kind " << k;
  }
  EXPECT_EQ(b.intra_msgs - a.intra_msgs, a.intra_msgs - z.intra_msgs);
  EXPECT_EQ(b.intra_bytes - a.intra_bytes, a.intra_bytes - z.intra_bytes);
  EXPECT_EQ(b.inter_msgs - a.inter_msgs, a.inter_msgs - z.inter_msgs);
  EXPECT_GT(b.total_calls(), a.total_calls());
  // A count past an int: no host path, nothing done (the caller stages).
  std::vector<int64_t> big = sc;
  big[size_t((r + 1) % W)] = int64_t{INT32_MAX} + 1;
  EXPECT_FALSE(comm.host_all_to_all_v(send.data(), big.data(), sd.data(), got.data(), rc.data(),
                                      rd.data(), DType::kInt32));
  EXPECT_EQ(comm.counters().total_calls(), b.total_calls());
}

// ---- in-process tests (no MPI) ----------------------------------------------------

TEST(CommSingle, AllCollectives) {
  SingleCommunicator comm;
  EXPECT_EQ(comm.world(), 1);
  EXPECT_EQ(comm.device(), Device::kCpu);
  check_all_collectives(comm);
}

TEST(CommSingle, AllToAllVRejectsMismatchedSelfCounts) {
  SingleCommunicator comm;
  int64_t sc = 3, rc = 2, zero = 0;
  float s[3] = {1, 2, 3}, r[3] = {0, 0, 0};
  EXPECT_THROW(comm.all_to_all_v(s, &sc, &zero, r, &rc, &zero, DType::kFloat32), Error);
}

TEST(CommTypes, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::kFloat32), sizeof(float));
  EXPECT_EQ(dtype_size(DType::kInt32), sizeof(int32_t));
  EXPECT_EQ(dtype_size(DType::kInt64), sizeof(int64_t));
  EXPECT_EQ(dtype_size(DType::kFloat64), sizeof(double));
  EXPECT_EQ(dtype_size(DType::kUInt8), sizeof(uint8_t));
  EXPECT_STREQ(dtype_name(dtype_of<int64_t>()), "int64");
}

TEST(CommMpiCount, FitsIntOrSaysWhy) {
  EXPECT_EQ(to_mpi_count(0, "x"), 0);
  EXPECT_EQ(to_mpi_count(INT_MAX, "x"), INT_MAX);
  try {
    to_mpi_count(int64_t{INT_MAX} + 1, "send count");
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("send count = 2147483648"), std::string::npos) << m;
    EXPECT_NE(m.find("MPI_Alltoallv_c"), std::string::npos) << m;
  }
  EXPECT_THROW(to_mpi_count(-1, "x"), Error);
}

TEST(CommFactory, ChoosesAndRefuses) {
  RankInfo one = bootstrap_single();
  EXPECT_FALSE(one.mpi);
  EXPECT_EQ(one.world, 1);
  auto c = make_communicator(one, Device::kCpu, "auto");
  EXPECT_STREQ(c->name(), "single");
  EXPECT_STREQ(make_communicator(one, Device::kCpu, "single")->name(), "single");

  auto message = [](const RankInfo& info, Device d, const std::string& kind) {
    try {
      make_communicator(info, d, kind);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no throw");
  };
  // One rank on a GPU needs no NCCL: the single communicator copies on the stream.
#ifdef NCF_WITH_CUDA
  EXPECT_STREQ(make_communicator(one, Device::kCuda, "auto")->name(), "single");
#else
  EXPECT_NE(message(one, Device::kCuda, "auto").find("SingleCommunicator on cuda"),
            std::string::npos)
      << message(one, Device::kCuda, "auto");
#endif
  EXPECT_NE(message(one, Device::kCpu, "mpi").find("bootstrap_mpi"), std::string::npos);
  EXPECT_NE(message(one, Device::kCpu, "nccl").find("needs device cuda"), std::string::npos);
  EXPECT_NE(message(one, Device::kCpu, "bogus").find("'bogus'"), std::string::npos);
  RankInfo two = one;
  two.world = 2;
  EXPECT_NE(message(two, Device::kCpu, "single").find("W = 2"), std::string::npos);
  // W > 1 without MPI cannot be served by anything.
  EXPECT_NE(message(two, Device::kCpu, "auto").find("bootstrap_mpi"), std::string::npos);
}

// Sets or unsets environment variables for one scope and restores them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (auto [name, value] : vars) {
      const char* old = std::getenv(name);
      saved_.push_back({name, old != nullptr, old ? old : ""});
      if (value)
        setenv(name, value, 1);
      else
        unsetenv(name);
    }
  }
  ~ScopedEnv() {
    for (const Saved& s : saved_) {
      if (s.had)
        setenv(s.name.c_str(), s.value.c_str(), 1);
      else
        unsetenv(s.name.c_str());
    }
  }

 private:
  struct Saved {
    std::string name;
    bool had;
    std::string value;
  };
  std::vector<Saved> saved_;
};

// Every variable detect_launcher reads.
const char* const kLauncherVars[] = {"OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_RANK",
                                     "PMIX_RANK",
                                     "SLURM_STEP_ID",
                                     "PMI_FD",
                                     "PMI_JOBID",
                                     "PMI_RANK",
                                     "PMI_SIZE"};

TEST(CommBootstrap, DetectsTheLauncherFromItsVariables) {
  ScopedEnv none({{kLauncherVars[0], nullptr},
                  {kLauncherVars[1], nullptr},
                  {kLauncherVars[2], nullptr},
                  {kLauncherVars[3], nullptr},
                  {kLauncherVars[4], nullptr},
                  {kLauncherVars[5], nullptr},
                  {kLauncherVars[6], nullptr},
                  {kLauncherVars[7], nullptr}});
  EXPECT_EQ(detect_launcher(), "");
  {
    ScopedEnv e({{"OMPI_COMM_WORLD_SIZE", "2"}});
    EXPECT_EQ(detect_launcher(), "open-mpi");
  }
  {
    ScopedEnv e({{"OMPI_COMM_WORLD_RANK", "0"}});
    EXPECT_EQ(detect_launcher(), "open-mpi");
  }
  {
    ScopedEnv e({{"PMIX_RANK", "3"}});
    EXPECT_EQ(detect_launcher(), "pmix");
  }
  {
    // srun without a PMI plugin cannot wire MPI up: not a launcher for MPI.
    ScopedEnv e({{"SLURM_STEP_ID", "0"}});
    EXPECT_EQ(detect_launcher(), "");
  }
  {
    ScopedEnv e({{"SLURM_STEP_ID", "0"}, {"PMI_FD", "5"}});
    EXPECT_EQ(detect_launcher(), "slurm");
  }
  {
    ScopedEnv e({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}});
    EXPECT_EQ(detect_launcher(), "pmi");
  }
  // No launcher: bootstrap starts no MPI.
  RankInfo info = bootstrap(nullptr, nullptr);
  EXPECT_FALSE(info.mpi);
  EXPECT_EQ(info.world, 1);
  int initialized = 1;
  MPI_Initialized(&initialized);
  EXPECT_EQ(initialized, 0);
}

// ---- multi-process tests: this binary again, under mpirun --------------------------

// `timeout` first so that a hang fails the test instead of the test run; `env` lets the
// VAR=value prefix of test::mpirun follow it.
std::string worker_command(int np, const std::string& worker, const std::string& extra_env) {
  std::string launch = np > 0 ? "env " + test::mpirun(np) + " " : "";
  return "NCF_COMM_WORKER=" + worker + " " + extra_env + " timeout -k 5 60 " + launch +
         test::self_exe() + " --gtest_filter=CommWorker.*";
}

int count_of(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

class CommMpi : public ::testing::TestWithParam<int> {};

TEST_P(CommMpi, AllCollectivesExact) {
  const int np = GetParam();
  test::RunResult r = test::run(worker_command(np, "all", ""));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "comm worker: world=" + std::to_string(np)), np) << r.output;
  for (int k = 0; k < np; ++k)
    EXPECT_NE(r.output.find("comm worker: world=" + std::to_string(np) +
                            " rank=" + std::to_string(k) + " local_rank=" + std::to_string(k) +
                            " local_world=" + std::to_string(np) + " comm=mpi launcher=open-mpi"),
              std::string::npos)
        << r.output;
  EXPECT_EQ(r.output.find("[  FAILED  ]"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Ranks, CommMpi, ::testing::Values(1, 2, 3, 4));

// The environment of a plain process on a box where Open MPI's singleton init cannot
// start: no launcher variables, and an installation prefix that does not exist (as
// when the MPI libraries were unpacked somewhere else), so MPI_Init finds no orted.
std::string no_launcher_env() {
  std::string e = "env";
  for (const char* v : kLauncherVars) e += std::string(" -u ") + v;
  return e + " OPAL_PREFIX=/nonexistent-ompi-prefix";
}

// Without mpirun, MPI asked for explicitly: Open MPI's singleton init gives a
// one-rank job.
TEST(CommBootstrap, PlainProcessAskingForMpiIsSingletonMpi) {
  test::RunResult r = test::run(worker_command(0, "all", "NCF_COMM_FORCE_MPI=1"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("comm worker: world=1 rank=0 local_rank=0 local_world=1 comm=mpi "
                          "launcher=\n"),
            std::string::npos)
      << r.output;
}

// Without a launcher the mains do not start MPI at all, so a plain process works
// where a singleton MPI_Init cannot (shown by the same worker forced onto MPI), and
// its error path needs no MPI either.
TEST(CommBootstrap, PlainProcessWithoutLauncherNeedsNoMpi) {
  test::RunResult forced =
      test::run(worker_command(0, "all", "NCF_COMM_FORCE_MPI=1 " + no_launcher_env()));
  EXPECT_NE(forced.exit_code, 0) << "this environment does not stop a singleton MPI_Init, so "
                                    "the test below shows nothing\n"
                                 << forced.output;
  EXPECT_NE(forced.exit_code, 124) << forced.output;

  test::RunResult r = test::run(worker_command(0, "plain", no_launcher_env()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("comm worker: world=1 rank=0 mpi=0 initialized=0 comm=single"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("[  FAILED  ]"), std::string::npos) << r.output;

  test::RunResult f =
      test::run(worker_command(0, "plain", "NCF_COMM_FAIL_KIND=ncf " + no_launcher_env()));
  EXPECT_EQ(f.exit_code, 1) << f.output;
  EXPECT_EQ(count_of(f.output, "ncf_dist: error: "), 1) << f.output;
  EXPECT_NE(f.output.find("injected ncf failure"), std::string::npos) << f.output;
  EXPECT_EQ(f.output.find("MPI_"), std::string::npos) << "MPI was involved:\n" << f.output;
}

// One rank throws while the others wait in a collective: the job must end, non-zero,
// with the thrower's message. Nothing else could end it (no --peer_timeout): the
// worker's `timeout` (exit 124) only says that it hung.
TEST(CommFailure, ThrowingRankTakesJobDown) {
  for (auto [np, rank, kind] : {std::tuple{3, 1, "ncf"}, std::tuple{2, 0, "std"}}) {
    test::RunResult r = test::run(worker_command(
        np, "fail", "NCF_COMM_FAIL_RANK=" + std::to_string(rank) + " NCF_COMM_FAIL_KIND=" + kind));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "timed out: a rank hung\n" << r.output;
    const std::string want =
        "ncf_dist: error: [rank " + std::to_string(rank) + "] injected " + kind + " failure";
    EXPECT_EQ(count_of(r.output, want), 1) << r.output;
    EXPECT_EQ(count_of(r.output, "ncf_dist: error:"), 1) << r.output;
  }
}

// A peer that never arrives (its node died or was cut off, here: it sleeps for
// good): with --peer_timeout the waiting rank ends itself after the limit, naming
// its rank, its host and the collective, and the job ends. Only the watch can end
// it: the worker's `timeout` (exit 124) only says that it hung.
TEST(CommFailure, RankWaitingForALostPeerEndsItself) {
  test::RunResult r = test::run(worker_command(2, "lost", ""));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "timed out: the waiting rank hung\n" << r.output;
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  EXPECT_NE(r.output.find(std::string("ncf_dist: error: [rank 0 on ") + host +
                          "] waited 2 s in "
                          "all_reduce_sum for its peers (--peer_timeout 2)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("peer arrived"), std::string::npos) << r.output;
}

// ---- worker side: active only in processes launched by the tests above -------------

bool worker_is(const char* name) {
  const char* w = std::getenv("NCF_COMM_WORKER");
  return w && std::string(w) == name;
}

TEST(CommWorker, AllCollectives) {
  if (!worker_is("all")) GTEST_SKIP() << "runs only inside the jobs that CommMpi.* starts";
  int rc = run_main(0, nullptr, [](int& argc, char**& argv) {
    // Under mpirun the launcher must be found (else "mpi" below fails: no MPI). Read
    // before MPI starts: a singleton MPI_Init sets PMIX_* variables of its own.
    const std::string launcher = detect_launcher();
    RankInfo info = bootstrap(&argc, &argv, std::getenv("NCF_COMM_FORCE_MPI") != nullptr);
    auto comm = make_communicator(info, Device::kCpu, "mpi");
    std::printf(
        "comm worker: world=%d rank=%d local_rank=%d local_world=%d comm=%s "
        "launcher=%s\n",
        comm->world(), comm->rank(), comm->local_rank(), comm->local_world(), comm->name(),
        launcher.c_str());
    std::fflush(stdout);
    EXPECT_EQ(comm->rank(), info.rank);
    check_all_collectives(*comm);
    check_host_all_to_all_v(*comm, info);
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

// A plain process as the mains start it: bootstrap without a launcher.
TEST(CommWorker, PlainProcess) {
  if (!worker_is("plain")) GTEST_SKIP() << "runs only inside the processes CommBootstrap.* starts";
  const char* fail = std::getenv("NCF_COMM_FAIL_KIND");
  int rc = run_main(0, nullptr, [&](int& argc, char**& argv) {
    RankInfo info = bootstrap(&argc, &argv);
    int initialized = -1;
    MPI_Initialized(&initialized);
    auto comm = make_communicator(info, Device::kCpu, "auto");
    std::printf("comm worker: world=%d rank=%d mpi=%d initialized=%d comm=%s\n", comm->world(),
                comm->rank(), int(info.mpi), initialized, comm->name());
    std::fflush(stdout);
    check_all_collectives(*comm);
    if (fail) NCF_FAIL("injected ", fail, " failure");
    return 0;
  });
  if (fail) {
    EXPECT_EQ(rc, 1);
    std::fflush(stdout);
    std::_Exit(rc);  // the exit code the test checks, without gtest's report
  }
  EXPECT_EQ(rc, 0);
}

TEST(CommWorker, OneRankFails) {
  if (!worker_is("fail")) GTEST_SKIP() << "runs only inside the jobs that CommFailure.* starts";
  const int fail_rank = std::atoi(std::getenv("NCF_COMM_FAIL_RANK"));
  const std::string kind = std::getenv("NCF_COMM_FAIL_KIND");
  int rc = run_main(0, nullptr, [&](int& argc, char**& argv) {
    RankInfo info = bootstrap_mpi(&argc, &argv);
    auto comm = make_communicator(info, Device::kCpu, "mpi");
    if (comm->rank() == fail_rank) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the others block
      if (kind == "ncf") NCF_FAIL("injected ncf failure");
      throw std::runtime_error("injected std failure");
    }
    comm->barrier();
    double x = 1;
    comm->all_reduce_sum(&x, 1, DType::kFloat64);
    return 0;
  });
  // Only reached if the job was not taken down.
  ADD_FAILURE() << "run_main returned " << rc << " on rank " << error_rank();
}

TEST(CommWorker, LostPeer) {
  if (!worker_is("lost")) GTEST_SKIP() << "runs only inside the jobs that CommFailure.* starts";
  run_main(0, nullptr, [&](int& argc, char**& argv) {
    RankInfo info = bootstrap_mpi(&argc, &argv);
    auto comm = make_communicator(info, Device::kCpu, "mpi");
    set_collective_timeout(2);
    comm->barrier();  // a collective that completes: the watch lets it pass
    // Never arrives (a peer that came after the watch's 2 s, on a slow machine, would
    // make the outcome a race): only the job's end ends this sleep.
    if (comm->rank() == 1)
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    double x = 1;
    comm->all_reduce_sum(&x, 1, DType::kFloat64);
    std::printf("peer arrived\n");
    return 0;
  });
  ADD_FAILURE() << "the waiting rank was not ended, rank " << error_rank();
}

}  // namespace
}  // namespace ncf
