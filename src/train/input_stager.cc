// See input_stager.h.
#include "train/input_stager.h"

#include <cstring>

#include "common/check.h"
#include "common/cuda_context.h"

namespace ncf {

struct InputStager::Slot {
  // CPU contexts: the staged batch's arrays.
  const int32_t* host_users = nullptr;
  const int32_t* host_items = nullptr;
  int64_t n = 0;
  // CUDA contexts.
  PinnedBuffer<int32_t> pinned;           // [2n]: users then items
  Buffer<int32_t> dev{Device::kCuda, 0};  // [2n]
#ifdef NCF_WITH_CUDA
  cudaEvent_t copied = nullptr;    // on the copy stream: the slot's H2D copy is done
  cudaEvent_t consumed = nullptr;  // on the compute stream: the slot's last reader is done
  bool copy_pending = false;
  bool consume_recorded = false;
#endif
};

InputStager::InputStager(const ExecContext& ctx) : ctx_(ctx), slots_(new Slot[2]) {
#ifdef NCF_WITH_CUDA
  if (ctx_.device == Device::kCuda) {
    cuda_resources(ctx_, "InputStager");  // a context from make_cuda_context
    for (int k = 0; k < 2; ++k) {
      CUDA_CHECK(cudaEventCreateWithFlags(&slots_[k].copied, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&slots_[k].consumed, cudaEventDisableTiming));
    }
  }
#else
  NCF_CHECK(ctx_.device == Device::kCpu, "InputStager on cuda in a build without CUDA");
#endif
}

InputStager::~InputStager() {
#ifdef NCF_WITH_CUDA
  // No wait here: a copy still pending reads pinned memory that the slots'
  // PinnedBuffer destructors free after this body, and those drain the device first
  // (pinned_release, which cannot throw). Destroying a pending event is safe.
  if (ctx_.device == Device::kCuda)
    for (int k = 0; k < 2; ++k) {
      Slot& s = slots_[k];
      if (s.copied) cudaEventDestroy(s.copied);
      if (s.consumed) cudaEventDestroy(s.consumed);
    }
#endif
}

void InputStager::stage(const TrainBatch& b) {
  NCF_CHECK(staged_ < 2, "InputStager: two batches are staged already");
  NCF_CHECK(b.users.size() == b.items.size(), "InputStager: ", b.users.size(), " users but ",
            b.items.size(), " items");
  Slot& s = slots_[head_];
  s.n = int64_t(b.users.size());
  if (ctx_.device == Device::kCpu) {
    s.host_users = b.users.data();
    s.host_items = b.items.data();
  } else {
#ifdef NCF_WITH_CUDA
    CudaResources& r = cuda_resources(ctx_, "InputStager::stage");
    const size_t n = size_t(s.n);
    // The pinned slot may still feed the copy issued two steps ago. That copy waited
    // for the step that last read the device slot, which may wait for a collective:
    // an interruptible wait.
    if (s.copy_pending) wait_event(s.copied);
    s.copy_pending = false;
    // Growing frees the old pinned and device arrays once the device has drained
    // (pinned_free, device_free), so no copy or kernel still uses them.
    s.pinned.reserve(2 * n);
    if (n) {
      std::memcpy(s.pinned.data(), b.users.data(), n * 4);
      std::memcpy(s.pinned.data() + n, b.items.data(), n * 4);
    }
    s.dev.reserve(2 * n);
    // The device slot may still be read by the step that used it last.
    if (s.consume_recorded) CUDA_CHECK(cudaStreamWaitEvent(r.copy_stream, s.consumed, 0));
    if (n)
      CUDA_CHECK(cudaMemcpyAsync(s.dev.data(), s.pinned.data(), 2 * n * 4, cudaMemcpyHostToDevice,
                                 r.copy_stream));
    CUDA_CHECK(cudaEventRecord(s.copied, r.copy_stream));
    s.copy_pending = true;
#endif
  }
  head_ ^= 1;
  ++staged_;
}

void InputStager::reset() {
#ifdef NCF_WITH_CUDA
  if (ctx_.device == Device::kCuda)
    for (int k = 0; k < 2; ++k)
      if (slots_[k].copy_pending) {
        wait_event(slots_[k].copied);  // interruptible, as in stage
        slots_[k].copy_pending = false;
      }
#endif
  for (int k = 0; k < 2; ++k) {
    slots_[k].host_users = slots_[k].host_items = nullptr;
    slots_[k].n = 0;
  }
  head_ = tail_ = staged_ = 0;
  acquired_ = false;
}

InputStager::Staged InputStager::acquire() {
  NCF_CHECK(staged_ > 0 && !acquired_, "InputStager: acquire without a staged batch");
  Slot& s = slots_[tail_];
  acquired_ = true;
  if (ctx_.device == Device::kCpu) return {s.host_users, s.host_items, s.n};
#ifdef NCF_WITH_CUDA
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(ctx_.stream), s.copied, 0));
#endif
  return {s.dev.data(), s.dev.data() + s.n, s.n};
}

void InputStager::release() {
  NCF_CHECK(acquired_, "InputStager: release without acquire");
#ifdef NCF_WITH_CUDA
  if (ctx_.device == Device::kCuda) {
    Slot& s = slots_[tail_];
    CUDA_CHECK(cudaEventRecord(s.consumed, static_cast<cudaStream_t>(ctx_.stream)));
    s.consume_recorded = true;
  }
#endif
  acquired_ = false;
  tail_ ^= 1;
  --staged_;
}

}  // namespace ncf
