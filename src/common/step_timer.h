// Where a training step's time goes, by phase (compute, embedding exchange,
// wait for the dense allreduce), measured where the work runs.
//
// On a CPU context every call of the step has finished when it returns, so the
// host clock between two marks is that phase's time. On a CUDA context the host
// only enqueues work: host clocks around those calls would measure the enqueue,
// not the GPU. There each mark is a CUDA event recorded on the compute stream,
// and a step's phase times are read from its events once the GPU has passed
// them, a few steps later (a ring of kSlots steps; a step whose slot is needed
// again is waited for).
//
//   timer.begin(step);  ...sampling...  timer.mark(StepPhase::kCompute);
//   ...lookups...  timer.mark(StepPhase::kExchange);  ...  timer.end();
//   for (const StepTimes& s : timer.take_finished(false)) ...
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "common/device.h"

namespace ncf {

// kTierWait: with a host tier, the rows of the step that were not resident when it began,
// loaded before it could run (embedding/row_cache.h).
enum class StepPhase { kCompute = 0, kExchange = 1, kAllreduce = 2, kTierWait = 3 };
constexpr int kStepPhases = 4;

struct StepTimes {
  int64_t step = 0;
  double seconds[kStepPhases] = {0, 0, 0, 0};  // indexed by StepPhase
};

class StepTimer {
 public:
  explicit StepTimer(const ExecContext& ctx);
  ~StepTimer();
  StepTimer(const StepTimer&) = delete;
  StepTimer& operator=(const StepTimer&) = delete;

  // Opens step `step`; the time until the first mark belongs to that mark's phase.
  void begin(int64_t step);
  // The time since the previous mark (or begin) was spent in `phase`.
  void mark(StepPhase phase);
  // Closes the step.
  void end();
  // The closed steps whose times are known, in step order, each returned once.
  // wait_all: wait for every closed step (the end of an epoch).
  std::vector<StepTimes> take_finished(bool wait_all);
  // Forgets every step not yet taken (after an epoch that ended in an error).
  void reset();

  static constexpr int kSlots = 8;
  static constexpr int kMaxMarks = 16;

 private:
  struct Slot {
    int64_t step = 0;
    int marks = 0;
    StepPhase phase[kMaxMarks] = {};
    void* events[kMaxMarks + 1] = {};  // cudaEvent_t on CUDA contexts
    std::chrono::steady_clock::time_point host[kMaxMarks + 1];
    bool closed = false;
  };
  bool ready(const Slot& s) const;
  StepTimes read(Slot& s);

  ExecContext ctx_;
  bool cuda_ = false;
  Slot slots_[kSlots];
  int64_t opened_ = 0;           // steps begun
  int64_t harvested_ = 0;        // steps whose times were read (the oldest open slot)
  std::vector<StepTimes> done_;  // read, not yet taken
};

}  // namespace ncf
