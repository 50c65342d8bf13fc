// The host tier's side stream: see tier_stream.h.
#include "embedding/tier_stream.h"

#include <algorithm>

#include "common/check.h"
#include "common/cuda_context.h"

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ncf {

#ifdef NCF_WITH_CUDA
namespace {
cudaStream_t as_stream(void* p) { return static_cast<cudaStream_t>(p); }
cudaEvent_t as_event(void* p) { return static_cast<cudaEvent_t>(p); }
}  // namespace
#endif

TierStream::TierStream(const ExecContext& compute)
    : compute_(compute), side_(compute), cuda_(compute.device == Device::kCuda) {
  if (!cuda_) return;
#ifdef NCF_WITH_CUDA
  cudaStream_t s = nullptr;
  // Non-blocking: its copies overlap the compute stream's kernels and the legacy stream's
  // copies; every order it needs is an event below.
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  stream_ = s;
  side_.stream = s;
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  compute_mark_ = e;
#else
  NCF_CHECK(false, "a host tier stream on a cuda context in a build without CUDA");
#endif
}

TierStream::~TierStream() {
#ifdef NCF_WITH_CUDA
  if (!cuda_) return;
  // Errors ignored: a destructor. Events still pending are freed once they complete.
  wait_device_nothrow();  // the copies done (interruptible: see cuda_context.h)
  for (const auto& [through, e] : marks_) cudaEventDestroy(as_event(e));
  for (void* e : spare_) cudaEventDestroy(as_event(e));
  cudaEventDestroy(as_event(compute_mark_));
  cudaStreamDestroy(as_stream(stream_));
#endif
}

void* TierStream::take_event() {
#ifdef NCF_WITH_CUDA
  if (!spare_.empty()) {
    void* e = spare_.back();
    spare_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
#else
  return nullptr;
#endif
}

void TierStream::after_compute() {
  if (!cuda_) return;
#ifdef NCF_WITH_CUDA
  CUDA_CHECK(cudaEventRecord(as_event(compute_mark_), as_stream(compute_.stream)));
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream_), as_event(compute_mark_), 0));
#endif
}

void TierStream::copies_done(int64_t through) {
  if (!cuda_) return;
#ifdef NCF_WITH_CUDA
  void* e = take_event();
  CUDA_CHECK(cudaEventRecord(as_event(e), as_stream(stream_)));
  marks_.emplace_back(through, e);
#endif
}

void TierStream::limit(int64_t through) {
  for (auto& m : marks_) m.first = std::min(m.first, through);
}

void TierStream::compute_waits(int64_t step) {
  if (!cuda_ || marks_.empty()) return;
#ifdef NCF_WITH_CUDA
  size_t k = 0;
  while (k + 1 < marks_.size() && marks_[k].first < step) ++k;
  CUDA_CHECK(cudaStreamWaitEvent(as_stream(compute_.stream), as_event(marks_[k].second), 0));
  // The marks before it are covered by this wait (one stream, in order): their events go
  // back to the spares. A wait already enqueued keeps the record it was given, so an
  // event may be recorded again.
  for (size_t j = 0; j < k; ++j) spare_.push_back(marks_[j].second);
  marks_.erase(marks_.begin(), marks_.begin() + std::ptrdiff_t(k));
#endif
}

void TierStream::join() {
  if (!cuda_) return;
#ifdef NCF_WITH_CUDA
  wait_stream(as_stream(stream_));  // interruptible: see cuda_context.h
  for (const auto& [through, e] : marks_) spare_.push_back(e);
  marks_.clear();
#endif
}

}  // namespace ncf
