// A rank that waits in one collective for longer than a limit ends itself: when a
// node dies or is cut off, its peers' collectives never complete, and no launcher
// ends every one of them (a node whose network is down cannot be reached by its
// launcher at all). The rank prints which collective, how long, its rank and host,
// and exits with code 1 without calling MPI (which would wait for the lost peers).
//
// Every public collective of Communicator holds a CollectiveWatch for its whole call;
// a watchdog thread, started by the first set_collective_timeout(> 0), checks once a
// second. The limit must exceed the longest legitimate wait of a healthy job (a peer
// writing a checkpoint chunk, a slow rank's step): it is off by default
// (ncf_dist --peer_timeout).
#pragma once

namespace ncf {

// seconds <= 0: off.
void set_collective_timeout(double seconds);
double collective_timeout();

// The collective this process is waiting in, for messages from other threads:
// true with its name and how long it has waited so far, false between collectives.
bool collective_in_progress(const char** what, double* waited);

// Ends this rank the way the watchdog does when a collective outlives the limit:
// the line "[rank R on HOST] waited W s in WHAT for its peers (--peer_timeout L)
// ...", the job-ending announcement to the ring, exit code 1 without MPI. For
// waits the watchdog cannot see (a GPU rank waiting on a stream behind an NCCL
// collective that does not complete: comm/nccl_communicator.cc).
[[noreturn]] void give_up_waiting(double waited, const char* what);

class CollectiveWatch {
 public:
  explicit CollectiveWatch(const char* what);  // what: a string literal
  ~CollectiveWatch();
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

 private:
  bool outer_;  // the outermost watch of this thread (nested collectives keep its start)
};

}  // namespace ncf
