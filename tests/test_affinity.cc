// CPU affinity and thread counts: the cpulist parser and the default thread rule; this
// binary re-run under taskset (its mask, the rule, the pool's workers inside the mask
// and on the CPU each was pinned to); ncf_dist's startup line, warning and binding note
// under real mpirun bindings, checked against counts read from sysfs, not from the
// affinity calls under test.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "common/affinity.h"
#include "common/check.h"
#include "common/parallel.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;

std::vector<int> cpu_range(int lo, int hi) {  // [lo, hi)
  std::vector<int> v;
  for (int c = lo; c < hi; ++c) v.push_back(c);
  return v;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int c : v) s += (s.empty() ? "" : ",") + std::to_string(c);
  return s;
}

// ---- the child: this binary started again with NCF_AFFINITY_CHILD set ----------------
// "threads=T[ pin=a,b,...]": optionally set_pool_cpus(pin), then 100 parallel_for jobs of
// T chunks that spin ~1 ms each, recording per thread the CPUs it ran on and its own
// affinity mask. Prints "allowed L", "threads N", "machine M", "owned 0|1", then one
// "worker ran_on=L mask=L" line per worker that ran a chunk and one "caller ran_on=L".
std::vector<int> thread_mask() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (pthread_getaffinity_np(pthread_self(), sizeof set, &set) != 0) return {};
  std::vector<int> v;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) v.push_back(c);
  return v;
}

int child_main(const std::string& spec) {
  int threads = 2;
  std::istringstream in(spec);
  std::string word;
  while (in >> word) {
    if (word.rfind("threads=", 0) == 0) threads = std::stoi(word.substr(8));
    if (word.rfind("pin=", 0) == 0) set_pool_cpus(parse_cpu_list(word.substr(4)));
  }
  const CpuShare share = cpu_share();
  std::printf("allowed %s\nthreads %d\nmachine %d\nowned %d\n", join(share.cpus).c_str(),
              share.threads, share.machine, int(share.owned));
  struct Seen {
    std::set<int> cpus;
    std::vector<int> mask;
  };
  std::mutex mu;
  std::map<std::thread::id, Seen> seen;
  const std::thread::id caller = std::this_thread::get_id();
  for (int job = 0; job < 100; ++job) {
    // Every chunk waits until all have started, so each runs on a thread of its own
    // and every worker takes part in every job: which threads report does not depend
    // on how fast the scheduler wakes them (the caller could otherwise take them all).
    std::atomic<int> started{0};
    parallel_for(threads, threads, 1, [&](int64_t, int64_t) {
      ++started;
      while (started.load() < threads) std::this_thread::yield();
      const auto t0 = std::chrono::steady_clock::now();
      while (test::seconds_since(t0) < 1e-3) {
      }
      const int cpu = sched_getcpu();
      std::vector<int> mask = thread_mask();
      std::lock_guard<std::mutex> lk(mu);
      Seen& s = seen[std::this_thread::get_id()];
      s.cpus.insert(cpu);
      s.mask = mask;
    });
  }
  for (const auto& [id, s] : seen) {
    const std::vector<int> cpus(s.cpus.begin(), s.cpus.end());
    if (id == caller)
      std::printf("caller ran_on=%s\n", join(cpus).c_str());
    else
      std::printf("worker ran_on=%s mask=%s\n", join(cpus).c_str(), join(s.mask).c_str());
  }
  std::fflush(stdout);
  return 0;
}

// Runs before GoogleTest's main: in the child, the child's work is all this binary does.
[[maybe_unused]] const int kChildExit = [] {
  const char* spec = std::getenv("NCF_AFFINITY_CHILD");
  if (spec != nullptr) std::exit(child_main(spec));
  return 0;
}();

struct ChildReport {
  std::string output;
  std::vector<int> allowed;
  int threads = -1, machine = -1, owned = -1;
  std::vector<int> caller_ran_on;
  struct Worker {
    std::vector<int> ran_on, mask;
  };
  std::vector<Worker> workers;
};

// Starts this binary as the child under `taskset -c cpus` (none when empty).
ChildReport run_child(const std::string& cpus, const std::string& spec) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string cmd = "env NCF_AFFINITY_CHILD='" + spec + "' " +
                          (cpus.empty() ? std::string() : "taskset -c " + cpus + " ") + self;
  const test::RunResult r = run(cmd);
  ChildReport rep;
  rep.output = r.output;
  EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
  std::istringstream in(r.output);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (std::regex_match(line, m, std::regex("allowed (.*)"))) rep.allowed = parse_cpu_list(m[1]);
    if (std::regex_match(line, m, std::regex("threads (\\d+)"))) rep.threads = std::stoi(m[1]);
    if (std::regex_match(line, m, std::regex("machine (\\d+)"))) rep.machine = std::stoi(m[1]);
    if (std::regex_match(line, m, std::regex("owned (\\d)"))) rep.owned = std::stoi(m[1]);
    if (std::regex_match(line, m, std::regex("caller ran_on=(.*)")))
      rep.caller_ran_on = parse_cpu_list(m[1]);
    if (std::regex_match(line, m, std::regex("worker ran_on=(.*) mask=(.*)")))
      rep.workers.push_back({parse_cpu_list(m[1]), parse_cpu_list(m[2])});
  }
  return rep;
}

// ---- what the expectations come from: sysfs and sysconf, not sched_getaffinity --------
int online_cpus() { return int(sysconf(_SC_NPROCESSORS_ONLN)); }

// Hardware threads of CPU 0's core: what `--bind-to core` gives a rank.
int threads_per_core() {
  std::ifstream f("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list");
  std::string text;
  if (!std::getline(f, text)) return 1;
  return std::max<int>(1, int(parse_cpu_list(text).size()));
}

// The CPU count `nproc` reports for a child of this test, when it is the whole machine;
// else the test itself runs narrowed (taskset, a cpuset) and "unbound" means less.
bool test_process_unbound() {
  const test::RunResult r = run("nproc");
  return r.exit_code == 0 && std::atoi(r.output.c_str()) == online_cpus();
}

// ---- the rule ------------------------------------------------------------------------
TEST(CpuList, ParsesTheKernelFormat) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), std::vector<int>{5});
  EXPECT_EQ(parse_cpu_list("2,0-1"), (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(parse_cpu_list("").empty());
  for (const char* bad : {"1-", "3-1", "a", "1,,2", "-1", "1;2"})
    EXPECT_THROW(parse_cpu_list(bad), Error) << bad;
}

TEST(DefaultThreads, DividesEachCpuAmongTheRanksThatMayUseIt) {
  // Alone (ncf_prep, a rank without MPI): the mask size, narrowed or not.
  EXPECT_EQ(default_threads({3}, {}), 1);
  EXPECT_EQ(default_threads(cpu_range(0, 16), {}), 16);
  // Bound by the launcher to CPUs of its own: all of them.
  EXPECT_EQ(default_threads(cpu_range(4, 8), std::vector<int>(16, 1)), 4);
  EXPECT_EQ(default_threads({1}, {1, 1}), 1);
  // Unbound: L ranks that may all run anywhere get machine / L, at least 1.
  EXPECT_EQ(default_threads(cpu_range(0, 16), std::vector<int>(16, 2)), 8);
  EXPECT_EQ(default_threads(cpu_range(0, 16), std::vector<int>(16, 3)), 5);
  EXPECT_EQ(default_threads(cpu_range(0, 6), std::vector<int>(6, 3)), 2);  // not 1.999...
  EXPECT_EQ(default_threads(cpu_range(0, 2), std::vector<int>(2, 4)), 1);
  // Two ranks bound to the same 16-CPU socket (Open MPI's default above -np 2): 8 each.
  EXPECT_EQ(default_threads(cpu_range(0, 16), std::vector<int>(32, 2)), 8);
}

TEST(SpreadOrder, TakesOneThreadOfEveryCoreFirst) {
  const std::vector<int> mine = allowed_cpus();
  const std::vector<int> order = spread_order(mine);
  std::vector<int> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, mine);
  // Cores named by (package, core_id) from sysfs.
  auto core_of = [](int cpu) {
    const std::string t = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream p(t + "physical_package_id"), c(t + "core_id");
    int pkg = -1, core = -1;
    p >> pkg;
    c >> core;
    return std::make_pair(pkg, core);
  };
  std::set<std::pair<int, int>> cores;
  for (int c : mine) cores.insert(core_of(c));
  std::set<std::pair<int, int>> first;
  for (size_t k = 0; k < cores.size(); ++k) first.insert(core_of(order[k]));
  EXPECT_EQ(first.size(), cores.size())
      << "the first " << cores.size() << " of " << join(order) << " are not on distinct cores";
}

// ---- a process under taskset ---------------------------------------------------------
TEST(TasksetChild, OneCpuMaskGivesOneThreadAndEveryChunkRunsThere) {
  const int cpu = allowed_cpus().back();
  const ChildReport r = run_child(std::to_string(cpu), "threads=4");
  EXPECT_EQ(r.allowed, std::vector<int>{cpu}) << r.output;
  EXPECT_EQ(r.threads, 1) << r.output;  // what ncf_prep and a lone rank take
  if (test_process_unbound()) {         // else a cpuset may make the machine smaller than online
    EXPECT_EQ(r.machine, online_cpus()) << r.output;
    EXPECT_EQ(r.owned, online_cpus() > 1 ? 1 : 0) << r.output;
  }
  EXPECT_EQ(r.caller_ran_on, std::vector<int>{cpu}) << r.output;
  ASSERT_FALSE(r.workers.empty()) << r.output;
  for (const auto& w : r.workers) {
    EXPECT_EQ(w.ran_on, std::vector<int>{cpu}) << r.output;
    EXPECT_EQ(w.mask, std::vector<int>{cpu}) << r.output;
  }
}

// Workers pinned with set_pool_cpus: each one's own mask is one CPU, it only ever runs
// there, and with threads <= CPUs no two workers share one nor take slot 0 (the caller's).
TEST(TasksetChild, WorkersRunOnlyOnTheCpuTheyWerePinnedTo) {
  const std::vector<int> mine = allowed_cpus();
  if (mine.size() < 2) GTEST_SKIP() << "needs 2 CPUs, this process may use " << mine.size();
  const std::vector<int> two = {mine[0], mine[1]};
  const std::vector<int> order = spread_order(two);
  {
    const ChildReport r = run_child("", "threads=2 pin=" + join(two));
    ASSERT_EQ(r.workers.size(), 1u) << r.output;
    EXPECT_EQ(r.workers[0].mask, std::vector<int>{order[1]}) << r.output;
    EXPECT_EQ(r.workers[0].ran_on, std::vector<int>{order[1]}) << r.output;
  }
  {  // 4 threads on 2 CPUs: workers 1, 2, 3 round-robin on order[1], order[0], order[1]
    const ChildReport r = run_child("", "threads=4 pin=" + join(two));
    ASSERT_GE(r.workers.size(), 2u) << r.output;
    std::multiset<int> pinned;
    for (const auto& w : r.workers) {
      ASSERT_EQ(w.mask.size(), 1u) << r.output;
      EXPECT_EQ(w.ran_on, w.mask) << r.output;
      pinned.insert(w.mask[0]);
    }
    for (int c : pinned) EXPECT_TRUE(c == two[0] || c == two[1]) << r.output;
    EXPECT_LE(pinned.count(order[0]), 1u) << r.output;
  }
}

// Without set_pool_cpus the pool pins only a mask narrower than the machine; a process
// that may run anywhere (which it shares with everything else) leaves its workers free.
TEST(TasksetChild, AWholeMachineMaskIsNotPinned) {
  if (!test_process_unbound()) GTEST_SKIP() << "this test runs with a narrowed mask";
  if (online_cpus() < 2) GTEST_SKIP() << "one CPU: nothing to tell apart";
  const ChildReport r = run_child("", "threads=2");
  EXPECT_EQ(r.owned, 0) << r.output;
  EXPECT_EQ(int(r.allowed.size()), online_cpus()) << r.output;
  EXPECT_EQ(r.threads, online_cpus()) << r.output;
  for (const auto& w : r.workers) EXPECT_EQ(w.mask, r.allowed) << r.output;
}

// ---- ncf_dist under mpirun -------------------------------------------------------------
class MpiBinding : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    const test::RunResult r = run(bin("ncf_prep") +
                                  " --synthetic custom --users 60 --items 80 --interactions 1500 "
                                  "--eval_negatives 9 --record_rows 64 --num_shards 2 --seed 1 "
                                  "--progress off --output " +
                                  dir_->file("data"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }

  struct Startup {
    std::string output;
    std::string threads, allowed, machine;  // as printed: "2" or "1-2"
  };
  // One step of training, no evaluation: enough to print the startup line.
  static Startup dist(const std::string& prefix, const std::string& flags = "") {
    const std::string cmd = prefix + " " + bin("ncf_dist") + " --device cpu --data_dir " +
                            dir_->file("data") +
                            " --preset ncf-paper --batch_size 100 --train_epochs 1 --max_steps 1 "
                            "--no_eval --progress off " +
                            flags + " 2>&1";
    const test::RunResult r = run(cmd);
    Startup s;
    s.output = cmd + "\n" + r.output;
    EXPECT_EQ(r.exit_code, 0) << s.output;
    std::smatch m;
    static const std::regex line(
        R"(([0-9-]+) threads/rank \(affinity ([0-9-]+) of ([0-9-]+) cores\))");
    if (std::regex_search(r.output, m, line)) s.threads = m[1], s.allowed = m[2], s.machine = m[3];
    EXPECT_FALSE(s.threads.empty()) << "no startup line in\n" << s.output;
    return s;
  }
  static TempDir* dir_;
};
TempDir* MpiBinding::dir_ = nullptr;

const std::string kNote = "fewer than its share";

// The machine count and the note are checked where this test may use the whole machine
// (else a cpuset may make the machine smaller than the online CPUs).
TEST_F(MpiBinding, BindToCoreGivesOneCoreAndSaysHowToGetMore) {
  const int M = online_cpus(), S = threads_per_core();
  const bool whole = test_process_unbound();
  const Startup s = dist(test::mpirun(1, "core"));
  EXPECT_EQ(s.threads, std::to_string(S)) << s.output;
  EXPECT_EQ(s.allowed, std::to_string(S)) << s.output;
  if (whole) {
    EXPECT_EQ(s.machine, std::to_string(M)) << s.output;
  }
  if (whole && S < M) {
    EXPECT_NE(s.output.find(kNote), std::string::npos) << s.output;
    EXPECT_NE(s.output.find("--bind-to none"), std::string::npos) << s.output;
    EXPECT_NE(s.output.find("--map-by slot:PE=" + std::to_string(M)), std::string::npos)
        << s.output;
  }
  EXPECT_EQ(s.output.find("warning: --threads"), std::string::npos) << s.output;
}

TEST_F(MpiBinding, ThreadsAboveTheMaskAreWarnedAbout) {
  const int S = threads_per_core();
  const Startup s = dist(test::mpirun(1, "core"), "--threads " + std::to_string(S + 1));
  EXPECT_EQ(s.threads, std::to_string(S + 1)) << s.output;
  EXPECT_NE(s.output.find("warning: --threads " + std::to_string(S + 1) + " is more than the " +
                          std::to_string(S) + " core(s) rank 0 may run on"),
            std::string::npos)
      << s.output;
}

TEST_F(MpiBinding, BindToNoneSharesTheMachine) {
  if (!test_process_unbound()) GTEST_SKIP() << "this test runs with a narrowed mask";
  const int M = online_cpus();
  const Startup one = dist(test::mpirun(1, "none"));
  EXPECT_EQ(one.threads, std::to_string(M)) << one.output;
  EXPECT_EQ(one.allowed, std::to_string(M)) << one.output;
  EXPECT_EQ(one.machine, std::to_string(M)) << one.output;
  EXPECT_EQ(one.output.find(kNote), std::string::npos) << one.output;
  const Startup two = dist(test::mpirun(2, "none"));
  EXPECT_EQ(two.threads, std::to_string(std::max(1, M / 2))) << two.output;
  EXPECT_EQ(two.allowed, std::to_string(M)) << two.output;
  EXPECT_EQ(two.output.find(kNote), std::string::npos) << two.output;
}

TEST_F(MpiBinding, TwoRanksBoundToCoresOwnOneCoreEach) {
  const int M = online_cpus(), S = threads_per_core();
  if (M / S < 2) GTEST_SKIP() << "needs 2 cores, the machine has " << M / S;
  const Startup s = dist(test::mpirun(2, "core"));
  EXPECT_EQ(s.threads, std::to_string(S)) << s.output;
  EXPECT_EQ(s.allowed, std::to_string(S)) << s.output;
  if (test_process_unbound()) {
    EXPECT_EQ(s.machine, std::to_string(M)) << s.output;
    // Their share is M / 2: a note only when a core is less than that.
    EXPECT_EQ(s.output.find(kNote) != std::string::npos, S < M / 2) << s.output;
  }
}

TEST_F(MpiBinding, PlainRunUnderTasksetTakesItsMask) {
  const int M = online_cpus();
  const Startup s = dist("taskset -c " + std::to_string(allowed_cpus().back()));
  EXPECT_EQ(s.threads, "1") << s.output;
  EXPECT_EQ(s.allowed, "1") << s.output;
  if (test_process_unbound()) {
    EXPECT_EQ(s.machine, std::to_string(M)) << s.output;
    EXPECT_EQ(s.output.find(kNote) != std::string::npos, M > 1) << s.output;
  }
}

}  // namespace
}  // namespace ncf
