// Moves batches of host arrays to the device ahead of their use.
//
// ArrayStager: on a CUDA context the host copies a batch's arrays (its parts) into
// one of two pinned slots and enqueues the host→device copy on the context's copy
// stream, then returns, so the copy runs while the device computes the batch before.
// acquire() makes the compute stream wait for the slot's copy (an event, no host
// wait) and release() marks, with another event, the compute work after which the
// slot may be overwritten. The host only waits before refilling a pinned slot whose
// copy (two batches back) is unfinished. On a CPU context nothing moves: acquire()
// hands out the parts' own arrays, so a staged batch's arrays must stay alive and
// unchanged until its release().
//
// InputStager: the training step's positives (users, items) through an ArrayStager;
// the trainer stages step s + 1 before it enqueues step s. The evaluation stages
// its lists (users, candidates, duplicate masks) the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/device.h"
#include "data/reader.h"

namespace ncf {

class ArrayStager {
 public:
  struct Part {
    const void* data = nullptr;  // host memory
    size_t bytes = 0;
  };
  // Every staged batch has `parts` arrays.
  ArrayStager(const ExecContext& ctx, int parts);
  ~ArrayStager();
  ArrayStager(const ArrayStager&) = delete;
  ArrayStager& operator=(const ArrayStager&) = delete;

  // Queues one batch (at most two may be staged and not yet released).
  void stage(const std::vector<Part>& parts);
  // The oldest staged batch not yet acquired: its parts on the context's device,
  // each 256-byte aligned on a GPU.
  const std::vector<const void*>& acquire();
  // The acquired batch's part k, as staged: its size in bytes.
  size_t acquired_bytes(int k) const;
  // The acquired batch's arrays are no longer read by work issued after this call.
  void release();

  int staged() const { return staged_; }  // staged and not yet released
  // Forgets every staged batch (after an interrupted pass), once their copies have
  // finished; the next stage() starts afresh.
  void reset();

 private:
  struct Slot;
  ExecContext ctx_;
  int parts_;
  std::unique_ptr<Slot[]> slots_;
  int head_ = 0;  // next slot to fill
  int tail_ = 0;  // next slot to acquire
  int staged_ = 0;
  bool acquired_ = false;
};

class InputStager {
 public:
  explicit InputStager(const ExecContext& ctx) : arrays_(ctx, 2) {}

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
  void release() { arrays_.release(); }

  int staged() const { return arrays_.staged(); }
  // Forgets every staged batch (after an interrupted epoch), once their copies
  // have finished; the next stage() starts afresh.
  void reset() { arrays_.reset(); }

 private:
  ArrayStager arrays_;
};

}  // namespace ncf
