// The peer watch (comm/peer_watch.h) with real processes under mpirun: a killed rank
// is named by its neighbours in our words, a silent (stopped) one after the limit, a
// rank that ends normally or with an error is never reported as lost, and a job that
// is stopped and continued as a whole forgives its own silence.
//
// The jobs that lose a rank run under `mpirun --enable-recovery`: Open MPI then leaves
// the surviving ranks alone when one dies, so nothing but the watch can end them (the
// test's timeout fails the test if it does not). This binary is started again under
// mpirun with NCF_PEER_WORKER set and a filter that selects that one PeerWorker.* test.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "comm/peer_watch.h"
#include "common/check.h"
#include "test_util.h"

namespace ncf {
namespace {

std::string host_name() {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  return host;
}

int count_of(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// `timeout` around mpirun: a rank the watch fails to end makes the test fail, not hang.
std::string job(int np, const std::string& worker, const std::string& env, bool recovery = true) {
  return "NCF_PEER_WORKER=" + worker + " " + env + " timeout -k 5 90 " + test::mpirun(np) +
         (recovery ? " --enable-recovery" : "") + " " + test::self_exe() +
         " --gtest_filter=PeerWorker." + worker + " 2>&1";
}

TEST(PeerWatch, AKilledRankIsNamedByEveryOtherRankInItsOwnWords) {
  const test::RunResult r = test::run(job(4, "Killed", ""));
  EXPECT_NE(r.exit_code, 124) << "timed out: the watch did not end the surviving ranks\n"
                              << r.output;
  const std::string h = host_name();
  // Its two neighbours notice the closed connection themselves or hear it from the
  // other; rank 0 hears it from one of them. Each says it in one line of its own.
  for (int rank : {0, 1, 3}) {
    const std::string line =
        "ncf_dist: error: [rank " + std::to_string(rank) + " on " + h + "] lost rank 2 on " + h;
    EXPECT_EQ(count_of(r.output, line), 1) << line << "\n" << r.output;
  }
  // Closed, or reset when it died with our heartbeats unread: either way no goodbye.
  EXPECT_NE(r.output.find("without a goodbye: its process was killed or its host went down"),
            std::string::npos)
      << r.output;
  // Where each rank was: in the next sum, or on its way to it (rank 2 died right after
  // its 20th, so a rank may notice before it called the 21st).
  EXPECT_EQ(count_of(r.output, "; this rank was waiting in all_reduce_sum for ") +
                count_of(r.output, "; this rank was between collectives;"),
            3)
      << r.output;
  EXPECT_EQ(count_of(r.output, "survived"), 0) << r.output;
}

TEST(PeerWatch, ASilentRankIsLostAfterTheLimitNamedWithItsSilence) {
  const test::RunResult r = test::run(job(4, "Silent", ""));
  EXPECT_NE(r.exit_code, 124) << "timed out: the watch did not end the ranks\n" << r.output;
  const std::string h = host_name();
  // Each of the other ranks says it once: its own finding, or the news of one.
  for (int rank : {0, 1, 3}) {
    const std::string line =
        "ncf_dist: error: [rank " + std::to_string(rank) + " on " + h + "] lost rank 2 on " + h;
    EXPECT_EQ(count_of(r.output, line), 1) << line << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("lost rank 2 on " + h + ": nothing heard from it for "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(--peer_lost_after 5)"), std::string::npos) << r.output;
  // Five seconds after rank 2 stopped, the others wait in their next sum.
  EXPECT_NE(r.output.find("this rank was waiting in all_reduce_sum for "), std::string::npos)
      << r.output;
}

TEST(PeerWatch, AStopSignalReportsASilentNeighbourWithoutWaitingForTheLimit) {
  // --peer_lost_after is an hour here: only the stop signal can end the ranks in time.
  const test::RunResult r = test::run(job(3, "Signalled", ""));
  EXPECT_NE(r.exit_code, 124) << "timed out: the stop signal did not end the ranks\n" << r.output;
  const std::string h = host_name();
  for (int rank : {0, 1}) {
    const std::string line =
        "ncf_dist: error: [rank " + std::to_string(rank) + " on " + h + "] lost rank 2 on " + h;
    EXPECT_EQ(count_of(r.output, line), 1) << line << "\n" << r.output;
  }
  EXPECT_NE(r.output.find("when a stop signal came"), std::string::npos) << r.output;
}

TEST(PeerWatch, RanksThatEndNormallyAtDifferentTimesAreNotLost) {
  const test::RunResult r = test::run(job(3, "Goodbye", "", false));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count_of(r.output, "lost"), 0) << r.output;
  EXPECT_EQ(count_of(r.output, "peer worker done"), 3) << r.output;
}

TEST(PeerWatch, ARankThatFailsIsTheOnlyOneToSayAnything) {
  // Plain mpirun: the failing rank's MPI_Abort ends the others; the news that the job is
  // ending went round first, so none of them reports a neighbour lost on the way.
  for (int round = 0; round < 3; ++round) {
    const test::RunResult r = test::run(job(4, "Fails", "", false));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << r.output;
    EXPECT_EQ(count_of(r.output, "ncf_dist: error:"), 1) << r.output;
    EXPECT_EQ(count_of(r.output, "ncf_dist: error: [rank 1] injected failure"), 1) << r.output;
    EXPECT_EQ(count_of(r.output, "lost"), 0) << r.output;
  }
}

TEST(PeerWatch, AJobStoppedAndContinuedAsAWholeForgivesItsOwnSilence) {
  test::TempDir dir;
  // The workers write their pids and wait for "go"; the test stops them all for three
  // times --peer_lost_after (3 s: one kill after the other, the last rank stops well
  // within it of the first), continues them, and says go.
  const std::string cmd = job(3, "Suspended", "NCF_PEER_DIR=" + dir.path(), false);
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::vector<pid_t> pids;
  for (int k = 0; k < 3; ++k) {
    const std::string f = dir.file("pid." + std::to_string(k));
    for (int t = 0; t < 6000 && !std::ifstream(f + ".done"); ++t)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::ifstream in(f);
    pid_t pid = 0;
    in >> pid;
    ASSERT_GT(pid, 0) << "worker " << k << " wrote no pid";
    pids.push_back(pid);
  }
  for (pid_t pid : pids) kill(pid, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(9));  // 3 x --peer_lost_after
  for (pid_t pid : pids) kill(pid, SIGCONT);
  test::write_file(dir.file("go"), "go\n");
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, p)) out += buf;
  const int status = pclose(p);
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0) << out;
  EXPECT_EQ(count_of(out, "lost"), 0) << out;
  EXPECT_EQ(count_of(out, "peer worker done"), 3) << out;
}

// ---- worker side: active only in the jobs the tests above start -----------------------

bool worker_is(const char* name) {
  const char* w = std::getenv("NCF_PEER_WORKER");
  return w && std::string(w) == name;
}

// A rank of a job with the watch running and a communicator to wait in.
template <class Body>
int run_worker(double lost_after, Body body) {
  return run_main(0, nullptr, [&](int& argc, char**& argv) {
    RankInfo info = bootstrap(&argc, &argv, true);
    auto comm = make_communicator(info, Device::kCpu, "mpi");
    const PeerWatchStart w = start_peer_watch(info, {lost_after, "ncf_dist"});
    NCF_CHECK(w.running, "peer watch did not start: ", w.warning);
    return body(info, *comm);
  });
}

// Sums in a loop; `stop_at` is the iteration at which `event` happens on `who`.
void sum_loop(Communicator& comm, int iterations) {
  std::vector<float> x(1024, 1.0f);
  for (int it = 0; it < iterations; ++it) comm.all_reduce_sum(x.data(), x.size(), DType::kFloat32);
}

// A process: its pid and its start time (field 22 of /proc/PID/stat), so that a pid
// the kernel gave to another process since is not taken for it.
struct Proc {
  pid_t pid = 0;
  int64_t start = 0;
};

// State letter and start time of pid, or false when there is no such process.
bool stat_of(pid_t pid, char* state, int64_t* start) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  rest >> *state;
  for (int k = 4; k <= 22 && rest >> field; ++k)
    if (k == 22) *start = std::stoll(field);
  return true;
}

// Whether the process is there (the same one) and not a zombie.
bool alive(const Proc& p) {
  char state = 0;
  int64_t start = -1;
  return stat_of(p.pid, &state, &start) && start == p.start && state != 'Z';
}

// Every rank's process (collective).
std::vector<Proc> all_pids(Communicator& comm) {
  std::vector<int64_t> both(2 * size_t(comm.world()), 0);
  char state = 0;
  int64_t start = 0;
  stat_of(getpid(), &state, &start);
  both[2 * size_t(comm.rank())] = getpid();
  both[2 * size_t(comm.rank()) + 1] = start;
  comm.all_reduce_sum(both.data(), both.size(), DType::kInt64);
  std::vector<Proc> out(size_t(comm.world()));
  for (size_t r = 0; r < out.size(); ++r) out[r] = {pid_t(both[2 * r]), both[2 * r + 1]};
  return out;
}

// Stops this process until every other rank of `pids` is gone: a child continues it.
// With signal_them, the child first waits until this process is stopped, then sends
// the other ranks SIGUSR1, the stop signal a launcher would send.
void stop_until_the_others_are_gone(const std::vector<Proc>& pids, bool signal_them = false) {
  const pid_t me = getpid();
  const pid_t child = fork();
  if (child == 0) {
    if (signal_them) {
      for (;;) {  // until the parent is stopped
        char state = 0;
        int64_t start = 0;
        if (stat_of(me, &state, &start) && state == 'T') break;
        usleep(20000);
      }
      for (const Proc& p : pids)
        if (p.pid != me && alive(p)) kill(p.pid, SIGUSR1);
    }
    for (;;) {
      bool any = false;
      for (const Proc& p : pids)
        if (p.pid != me && alive(p)) any = true;
      if (!any) break;
      usleep(50000);
    }
    kill(me, SIGCONT);
    _exit(0);
  }
  raise(SIGSTOP);
  waitpid(child, nullptr, 0);
}

TEST(PeerWorker, Killed) {
  if (!worker_is("Killed")) GTEST_SKIP() << "runs only inside the jobs PeerWatch.* starts";
  run_worker(30, [](const RankInfo& info, Communicator& comm) {
    sum_loop(comm, 20);
    if (info.rank == 2) raise(SIGKILL);
    sum_loop(comm, 1000000);
    std::printf("rank %d survived\n", info.rank);
    return 0;
  });
}

TEST(PeerWorker, Silent) {
  if (!worker_is("Silent")) GTEST_SKIP() << "runs only inside the jobs PeerWatch.* starts";
  run_worker(5, [](const RankInfo& info, Communicator& comm) {
    const std::vector<Proc> pids = all_pids(comm);
    sum_loop(comm, 20);
    if (info.rank == 2) stop_until_the_others_are_gone(pids);
    sum_loop(comm, 1000000);
    return 0;
  });
}

volatile sig_atomic_t g_signalled = 0;
void on_usr1(int) {
  g_signalled = 1;
  peer_watch_stop_signal();
}

TEST(PeerWorker, Signalled) {
  if (!worker_is("Signalled")) GTEST_SKIP() << "runs only inside the jobs PeerWatch.* starts";
  signal(SIGUSR1, on_usr1);
  run_worker(3600, [](const RankInfo& info, Communicator& comm) {
    const std::vector<Proc> pids = all_pids(comm);
    sum_loop(comm, 20);
    // Stopped, then the others get the stop signal a launcher would send.
    if (info.rank == 2) stop_until_the_others_are_gone(pids, true);
    sum_loop(comm, 1000000);
    return 0;
  });
}

TEST(PeerWorker, Goodbye) {
  if (!worker_is("Goodbye")) GTEST_SKIP() << "runs only inside the jobs PeerWatch.* starts";
  const int rc = run_worker(3, [](const RankInfo& info, Communicator& comm) {
    sum_loop(comm, 20);
    // Rank 0 goes on alone for twice the limit after the others said goodbye.
    if (info.rank == 0) std::this_thread::sleep_for(std::chrono::seconds(6));
    std::printf("peer worker done\n");
    std::fflush(stdout);
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

TEST(PeerWorker, Fails) {
  if (!worker_is("Fails")) GTEST_SKIP() << "runs only inside the jobs PeerWatch.* starts";
  run_worker(30, [](const RankInfo& info, Communicator& comm) {
    sum_loop(comm, 20);
    if (info.rank == 1) NCF_FAIL("injected failure");
    sum_loop(comm, 1000000);
    return 0;
  });
}

TEST(PeerWorker, Suspended) {
  if (!worker_is("Suspended")) GTEST_SKIP() << "runs only inside the jobs PeerWatch.* starts";
  const std::string dir = std::getenv("NCF_PEER_DIR");
  const int rc = run_worker(3, [&](const RankInfo& info, Communicator& comm) {
    sum_loop(comm, 20);
    const std::string f = dir + "/pid." + std::to_string(info.rank);
    test::write_file(f, std::to_string(getpid()) + "\n");
    test::write_file(f + ".done", "");
    while (!std::ifstream(dir + "/go")) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    sum_loop(comm, 20);
    std::printf("peer worker done\n");
    std::fflush(stdout);
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace ncf
