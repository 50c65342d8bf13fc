// Moves each training step's positives to the device ahead of their use.
//
// On a CUDA context the host copies a batch's users and items into one of two
// pinned slots and enqueues the host→device copy on the context's copy stream,
// then returns: the trainer stages step s + 1 before it enqueues step s, so the
// copy runs while step s computes. acquire() makes the compute stream wait for
// the slot's copy (an event, no host wait) and release() marks, with another
// event, the compute work after which the slot may be overwritten. The host only
// waits before refilling a pinned slot whose copy (two steps back) is unfinished.
//
// On a CPU context nothing moves: acquire() hands out the batch's own arrays, so
// a staged TrainBatch must stay alive and unchanged until its release().
#pragma once

#include <cstdint>
#include <memory>

#include "common/device.h"
#include "data/reader.h"

namespace ncf {

class InputStager {
 public:
  explicit InputStager(const ExecContext& ctx);
  ~InputStager();
  InputStager(const InputStager&) = delete;
  InputStager& operator=(const InputStager&) = delete;

  // Queues batch b (at most two batches may be staged and not yet released).
  void stage(const TrainBatch& b);

  struct Staged {
    const int32_t* users = nullptr;  // on the context's device
    const int32_t* items = nullptr;
    int64_t n = 0;
  };
  // The oldest staged batch not yet acquired.
  Staged acquire();
  // The acquired batch's arrays are no longer read by work issued after this call.
  void release();

  int staged() const { return staged_; }  // staged and not yet released
  // Forgets every staged batch (after an interrupted epoch), once their copies
  // have finished; the next stage() starts afresh.
  void reset();

 private:
  struct Slot;
  ExecContext ctx_;
  std::unique_ptr<Slot[]> slots_;
  int head_ = 0;  // next slot to fill
  int tail_ = 0;  // next slot to acquire
  int staged_ = 0;
  bool acquired_ = false;
};

}  // namespace ncf
