// CollectiveWatch and its watchdog: see collective_watch.h.
#include "comm/collective_watch.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "comm/peer_watch.h"
#include "common/check.h"

namespace ncf {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<double> g_limit{0.0};
std::atomic<int64_t> g_since_ns{0};  // start of the collective being waited in; 0: none
std::atomic<const char*> g_what{nullptr};
std::once_flag g_started;
thread_local int t_depth = 0;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

[[noreturn]] void give_up_waiting(double waited, const char* what) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  char msg[768];
  const int n = std::snprintf(
      msg, sizeof msg,
      "ncf_dist: error: [rank %d on %s] waited %.0f s in %s for its peers (--peer_timeout %.0f): "
      "a peer rank or its node is lost, or %s is cut off from them; ending this rank\n",
      error_rank(), host, waited, what ? what : "a collective", g_limit.load(), host);
  // write(2): no locks, no MPI; then exit without destructors or MPI_Finalize, which
  // would wait for the lost peers.
  if (n > 0) {
    ssize_t w = write(2, msg, size_t(n) < sizeof msg ? size_t(n) : sizeof msg - 1);
    (void)w;
  }
  std::fflush(stdout);
  announce_job_ending(std::string("gave up waiting in ") + (what ? what : "a collective"));
  _exit(1);
}

namespace {

void watchdog() {
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    const double limit = g_limit.load();
    const int64_t since = g_since_ns.load();
    if (limit <= 0 || since == 0) continue;
    const double waited = double(now_ns() - since) * 1e-9;
    if (waited > limit) give_up_waiting(waited, g_what.load());
  }
}

}  // namespace

void set_collective_timeout(double seconds) {
  g_limit.store(seconds > 0 ? seconds : 0.0);
  if (seconds > 0) std::call_once(g_started, [] { std::thread(watchdog).detach(); });
}

double collective_timeout() { return g_limit.load(); }

bool collective_in_progress(const char** what, double* waited) {
  const int64_t since = g_since_ns.load();
  if (since == 0) return false;
  *what = g_what.load();
  if (*what == nullptr) *what = "a collective";
  *waited = double(now_ns() - since) * 1e-9;
  return true;
}

CollectiveWatch::CollectiveWatch(const char* what) : outer_(t_depth++ == 0) {
  if (!outer_) return;
  g_what.store(what);
  g_since_ns.store(now_ns());
}

CollectiveWatch::~CollectiveWatch() {
  --t_depth;
  if (outer_) g_since_ns.store(0);
}

}  // namespace ncf
