// See input_stager.h.
#include "train/input_stager.h"

#include <cstring>

#include "common/check.h"
#include "common/cuda_context.h"

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ncf {

#ifdef NCF_WITH_CUDA
namespace {

constexpr size_t kPartAlign = 256;  // each part's offset in a slot

size_t aligned_up(size_t bytes) { return (bytes + kPartAlign - 1) / kPartAlign * kPartAlign; }

}  // namespace
#endif

struct ArrayStager::Slot {
  std::vector<const void*> ptrs;  // what acquire() hands out
  std::vector<size_t> bytes;      // each part's size
  // CUDA contexts: the parts back to back at kPartAlign offsets.
  PinnedBuffer<uint8_t> pinned;
  Buffer<uint8_t> dev{Device::kCuda, 0};
#ifdef NCF_WITH_CUDA
  cudaEvent_t copied = nullptr;    // on the copy stream: the slot's H2D copy is done
  cudaEvent_t consumed = nullptr;  // on the compute stream: the slot's last reader is done
  bool copy_pending = false;
  bool consume_recorded = false;
#endif
};

ArrayStager::ArrayStager(const ExecContext& ctx, int parts)
    : ctx_(ctx), parts_(parts), slots_(new Slot[2]) {
  NCF_CHECK(parts >= 1, "ArrayStager: ", parts, " parts");
#ifdef NCF_WITH_CUDA
  if (ctx_.device == Device::kCuda) {
    cuda_resources(ctx_, "ArrayStager");  // a context from make_cuda_context
    for (int k = 0; k < 2; ++k) {
      CUDA_CHECK(cudaEventCreateWithFlags(&slots_[k].copied, cudaEventDisableTiming));
      CUDA_CHECK(cudaEventCreateWithFlags(&slots_[k].consumed, cudaEventDisableTiming));
    }
  }
#else
  NCF_CHECK(ctx_.device == Device::kCpu, "ArrayStager on cuda in a build without CUDA");
#endif
}

ArrayStager::~ArrayStager() {
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

void ArrayStager::stage(const std::vector<Part>& parts) {
  NCF_CHECK(staged_ < 2, "ArrayStager: two batches are staged already");
  NCF_CHECK(int(parts.size()) == parts_, "ArrayStager: ", parts.size(), " parts, expected ",
            parts_);
  Slot& s = slots_[head_];
  s.ptrs.assign(parts.size(), nullptr);
  s.bytes.clear();
  for (const Part& p : parts) s.bytes.push_back(p.bytes);
  if (ctx_.device == Device::kCpu) {
    for (size_t i = 0; i < parts.size(); ++i) s.ptrs[i] = parts[i].data;
  } else {
#ifdef NCF_WITH_CUDA
    CudaResources& r = cuda_resources(ctx_, "ArrayStager::stage");
    size_t total = 0;
    for (const Part& p : parts) total += aligned_up(p.bytes);
    // The pinned slot may still feed the copy issued two batches ago. That copy waited
    // for the work that last read the device slot, which may wait for a collective:
    // an interruptible wait.
    if (s.copy_pending) wait_event(s.copied);
    s.copy_pending = false;
    // Growing frees the old pinned and device arrays once the device has drained
    // (pinned_free, device_free), so no copy or kernel still uses them.
    s.pinned.reserve(total);
    s.dev.reserve(total);
    size_t at = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (parts[i].bytes) std::memcpy(s.pinned.data() + at, parts[i].data, parts[i].bytes);
      s.ptrs[i] = s.dev.data() + at;
      at += aligned_up(parts[i].bytes);
    }
    // The device slot may still be read by the work that used it last.
    if (s.consume_recorded) CUDA_CHECK(cudaStreamWaitEvent(r.copy_stream, s.consumed, 0));
    if (total)
      CUDA_CHECK(cudaMemcpyAsync(s.dev.data(), s.pinned.data(), total, cudaMemcpyHostToDevice,
                                 r.copy_stream));
    CUDA_CHECK(cudaEventRecord(s.copied, r.copy_stream));
    s.copy_pending = true;
#endif
  }
  head_ ^= 1;
  ++staged_;
}

void ArrayStager::reset() {
#ifdef NCF_WITH_CUDA
  if (ctx_.device == Device::kCuda)
    for (int k = 0; k < 2; ++k)
      if (slots_[k].copy_pending) {
        wait_event(slots_[k].copied);  // interruptible, as in stage
        slots_[k].copy_pending = false;
      }
#endif
  for (int k = 0; k < 2; ++k) {
    slots_[k].ptrs.clear();
    slots_[k].bytes.clear();
  }
  head_ = tail_ = staged_ = 0;
  acquired_ = false;
}

const std::vector<const void*>& ArrayStager::acquire() {
  NCF_CHECK(staged_ > 0 && !acquired_, "ArrayStager: acquire without a staged batch");
  Slot& s = slots_[tail_];
  acquired_ = true;
#ifdef NCF_WITH_CUDA
  if (ctx_.device == Device::kCuda)
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(ctx_.stream), s.copied, 0));
#endif
  return s.ptrs;
}

size_t ArrayStager::acquired_bytes(int k) const {
  NCF_CHECK(acquired_, "ArrayStager: acquired_bytes without an acquired batch");
  NCF_CHECK(k >= 0 && k < parts_, "ArrayStager: part ", k, " of ", parts_);
  return slots_[tail_].bytes[size_t(k)];
}

void ArrayStager::release() {
  NCF_CHECK(acquired_, "ArrayStager: release without acquire");
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

void InputStager::stage(const TrainBatch& b) {
  NCF_CHECK(staged() < 2, "InputStager: two batches are staged already");
  NCF_CHECK(b.users.size() == b.items.size(), "InputStager: ", b.users.size(), " users but ",
            b.items.size(), " items");
  const size_t n = b.users.size();
  arrays_.stage({{b.users.data(), n * 4}, {b.items.data(), n * 4}});
}

InputStager::Staged InputStager::acquire() {
  NCF_CHECK(staged() > 0, "InputStager: acquire without a staged batch");
  const std::vector<const void*>& p = arrays_.acquire();
  return {static_cast<const int32_t*>(p[0]), static_cast<const int32_t*>(p[1]),
          int64_t(arrays_.acquired_bytes(0) / 4)};
}

}  // namespace ncf
