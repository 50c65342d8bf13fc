// Step phase times from host clocks (CPU) or CUDA events (GPU): see step_timer.h.
#include "common/step_timer.h"

#include "common/check.h"
#include "common/cuda_context.h"  // CUDA_CHECK and wait_event in CUDA builds

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ncf {

StepTimer::StepTimer(const ExecContext& ctx) : ctx_(ctx), cuda_(ctx.device == Device::kCuda) {
#ifdef NCF_WITH_CUDA
  if (cuda_)
    for (Slot& s : slots_)
      for (void*& e : s.events) {
        cudaEvent_t ev = nullptr;
        CUDA_CHECK(cudaEventCreate(&ev));
        e = ev;
      }
#else
  NCF_CHECK(!cuda_, "StepTimer on a cuda context in a build without CUDA");
#endif
}

StepTimer::~StepTimer() {
#ifdef NCF_WITH_CUDA
  for (Slot& s : slots_)
    for (void* e : s.events)
      if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void StepTimer::begin(int64_t step) {
  // The slot's previous step must have been read before the slot is reused.
  while (opened_ - harvested_ >= kSlots) {
    Slot& old = slots_[harvested_ % kSlots];
    NCF_CHECK(old.closed, "StepTimer: step ", old.step, " was never ended");
    done_.push_back(read(old));
    ++harvested_;
  }
  Slot& s = slots_[opened_ % kSlots];
  s.step = step;
  s.marks = 0;
  s.closed = false;
  ++opened_;
#ifdef NCF_WITH_CUDA
  if (cuda_) {
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(s.events[0]),
                               static_cast<cudaStream_t>(ctx_.stream)));
    return;
  }
#endif
  s.host[0] = std::chrono::steady_clock::now();
}

void StepTimer::mark(StepPhase phase) {
  NCF_CHECK(opened_ > harvested_, "StepTimer::mark outside a step");
  Slot& s = slots_[(opened_ - 1) % kSlots];
  NCF_CHECK(!s.closed, "StepTimer::mark after end");
  NCF_CHECK(s.marks < kMaxMarks, "StepTimer: more than ", kMaxMarks, " marks in step ", s.step);
  s.phase[s.marks] = phase;
  ++s.marks;
#ifdef NCF_WITH_CUDA
  if (cuda_) {
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(s.events[s.marks]),
                               static_cast<cudaStream_t>(ctx_.stream)));
    return;
  }
#endif
  s.host[s.marks] = std::chrono::steady_clock::now();
}

void StepTimer::end() {
  NCF_CHECK(opened_ > harvested_, "StepTimer::end outside a step");
  slots_[(opened_ - 1) % kSlots].closed = true;
}

bool StepTimer::ready(const Slot& s) const {
  if (!s.closed) return false;
#ifdef NCF_WITH_CUDA
  if (cuda_) {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(s.events[s.marks]));
    if (e == cudaErrorNotReady) return false;
    CUDA_CHECK(e);
  }
#endif
  return true;
}

StepTimes StepTimer::read(Slot& s) {
  StepTimes t;
  t.step = s.step;
#ifdef NCF_WITH_CUDA
  if (cuda_) {
    // Interruptible: the step's last event may sit behind a collective whose peer died.
    wait_event(static_cast<cudaEvent_t>(s.events[s.marks]));
    for (int k = 0; k < s.marks; ++k) {
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(s.events[k]),
                                      static_cast<cudaEvent_t>(s.events[k + 1])));
      t.seconds[int(s.phase[k])] += double(ms) * 1e-3;
    }
    return t;
  }
#endif
  for (int k = 0; k < s.marks; ++k)
    t.seconds[int(s.phase[k])] += std::chrono::duration<double>(s.host[k + 1] - s.host[k]).count();
  return t;
}

void StepTimer::reset() {
  opened_ = harvested_ = 0;
  done_.clear();
}

std::vector<StepTimes> StepTimer::take_finished(bool wait_all) {
  while (harvested_ < opened_) {
    Slot& s = slots_[harvested_ % kSlots];
    if (!s.closed || (!wait_all && !ready(s))) break;
    done_.push_back(read(s));
    ++harvested_;
  }
  std::vector<StepTimes> out;
  out.swap(done_);
  return out;
}

}  // namespace ncf
