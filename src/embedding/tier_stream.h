// The host tier's side stream (collection_tier.cc, --device_table_budget). On a GPU rank the
// loads and write-backs a step's announcement orders run on a stream of their own, while
// the steps before it run on the compute stream; a step waits, on the device, only for the
// copies its own rows need. On CPU ranks every call here does nothing and the copies run in
// place, in program order.
//
// The ordering it keeps:
// - after_compute(): the side stream's next copies start after everything enqueued on the
//   compute stream so far: a row written back was last updated by a step already enqueued
//   (it left the window when that step retired), and a slot a load fills was last read then.
// - copies_done(s): every row of steps <= s is loaded by the copies enqueued so far.
// - compute_waits(t): the compute stream waits for the first mark that covers step t, or for
//   every copy enqueued so far where no mark does.
// - limit(s): no mark covers a step after s any more (a step evicted rows of later steps
//   to make room; they load again later).
// - join(): the host waits for every copy (before the host or the legacy stream reads the
//   home arrays or the cache, and before the home arrays are unregistered).
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "common/device.h"

namespace ncf {

class TierStream {
 public:
  explicit TierStream(const ExecContext& compute);
  ~TierStream();
  TierStream(const TierStream&) = delete;
  TierStream& operator=(const TierStream&) = delete;

  // The context the side stream's copies are enqueued on (the compute one on CPU ranks).
  const ExecContext& ctx() const { return side_; }
  void after_compute();
  void copies_done(int64_t through);
  void limit(int64_t through);
  void compute_waits(int64_t step);
  void join();

 private:
  void* take_event();  // cudaEvent_t

  ExecContext compute_, side_;
  bool cuda_ = false;
  [[maybe_unused]] void* stream_ = nullptr;        // cudaStream_t (CUDA builds)
  [[maybe_unused]] void* compute_mark_ = nullptr;  // cudaEvent_t on the compute stream
  // (the last step the copies up to it load, the event after them), oldest first
  std::deque<std::pair<int64_t, void*>> marks_;
  std::vector<void*> spare_;  // events no wait refers to any more
};

}  // namespace ncf
