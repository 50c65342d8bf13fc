// Which peer ranks are still there, known without MPI or NCCL, and said in our words.
//
// When a node dies or is cut off mid-run, MPI and NCCL learn of it in their own ways
// and tell us nothing we could print: Open MPI's TCP transport (ob1) asks its launcher
// to kill the job as soon as a pending send to the lost peer fails, and waits forever
// when only receives are pending; NCCL kernels spin. So each rank keeps a TCP
// connection of its own to its two ring neighbours (rank - 1 and rank + 1 mod W) and a
// thread that sends a heartbeat on them every second (every lost_after / 4 when that
// is shorter) and reads theirs.
//
// A neighbour is lost when its connection closes without a goodbye (its process was
// killed or its host went down: the kernel closes a dead process's sockets at once) or
// when nothing has come from it for lost_after seconds (its host is cut off). The rank
// that notices prints one line on stderr, naming itself and its host, the lost rank and
// its host, how it noticed and the collective it was waiting in; passes the news along
// the ring (each rank that hears it prints its own line and passes it on), and exits
// with code 1 without calling MPI, which would wait for the lost peer.
//
// Ranks that end normally say goodbye first (stop_peer_watch, from run_main). A rank
// that fails with an error sends "the job is ending" around the ring and waits (a few
// seconds at most) until it comes back, so that no rank reports the others as lost while
// the launcher takes the job down (announce_job_ending, from run_main's error path and
// the --peer_timeout watchdog).
//
// A process that was stopped (SIGSTOP, `scontrol suspend`) finds, when it runs again,
// that it slept far longer than it asked to: it forgives the silence of that time.
#pragma once

#include <string>

#include "comm/bootstrap.h"

namespace ncf {

struct PeerWatchOptions {
  double lost_after = 30;            // s of silence that make a neighbour lost (> 0)
  const char* program = "ncf_dist";  // opens every line the watch prints
};

// Collective over MPI_COMM_WORLD when info.mpi and W > 1 (otherwise it does nothing):
// every rank publishes a listening port and its addresses, connects to rank + 1 and
// accepts rank - 1 (a shared random cookie keeps strangers out), and the ranks agree
// whether every connection came up. If one did not (a neighbour not reached in 10 s,
// e.g. behind a firewall), the job goes on without the watch; `warning` then says why
// on the ranks whose connection failed, and on rank 0, for the caller to print.
struct PeerWatchStart {
  bool running = false;
  std::string warning;
};
PeerWatchStart start_peer_watch(const RankInfo& info, const PeerWatchOptions& options);

// Says goodbye to both neighbours and stops the thread. Idempotent; nothing without a
// running watch.
void stop_peer_watch();

// This rank ends with an error: the news goes around the ring, so that the other ranks
// do not report this one (or each other, as the launcher ends them) as lost. Waits until
// the news came back from the other side or up to `wait_s` seconds. Any thread;
// nothing without a running watch. A rank that receives it ends by itself (code 1,
// one line naming the failed rank) if the launcher has not ended it within 10 s.
void announce_job_ending(const std::string& why, double wait_s = 5);

// A stop signal came (SIGTERM, SIGUSR1): a neighbour that has said nothing for 5 s (a
// healthy one beats every second) is reported lost at once instead of after lost_after,
// so that a launcher ending the job for a lost node (after its own node timeout) still
// gets our words. Async-signal-safe.
void peer_watch_stop_signal();

// Rank r's host as it published it; "" before the watch started or for a bad r.
std::string peer_host(int r);

// For error messages of other parts (an NCCL error): "rank 3 on node2 (its connection
// closed without a goodbye)" when the watch has noticed a lost neighbour, else "".
std::string peer_watch_lost();

}  // namespace ncf
