// CUDA side of cuda_context.h: creating and freeing a rank's stream, handles,
// workspace, scratch and error record, raising recorded kernel errors, and the
// interruptible waits for a stream, an event and the whole device.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/cuda_context.h"
#include "common/cuda_util.cuh"

namespace ncf {

void wait_event(cudaEvent_t e) {
  if (!wait_pollers_registered()) {
    CUDA_CHECK(cudaEventSynchronize(e));
    return;
  }
  wait_until([e] {
    const cudaError_t q = cudaEventQuery(e);
    if (q == cudaErrorNotReady) return false;
    CUDA_CHECK(q);
    return true;
  });
}

namespace {

// wait_stream's event, one per thread and device, made on first use and then
// re-recorded by every wait instead of made and destroyed per wait (two driver calls
// on each of a step's waits). Per thread, because a wait re-records it: two threads
// sharing one could each end up waiting for the other's stream.
cudaEvent_t this_threads_wait_event() {
  struct Events {
    std::vector<std::pair<int, cudaEvent_t>> by_device;
    ~Events() {
      // At thread or process exit: errors are ignored. Destroying an event that is
      // still pending is safe; it is freed once it completes.
      for (const auto& de : by_device) cudaEventDestroy(de.second);
    }
  };
  thread_local Events events;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  for (const auto& de : events.by_device)
    if (de.first == device) return de.second;
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  events.by_device.emplace_back(device, e);
  return e;
}

}  // namespace

void wait_stream(cudaStream_t s) {
  if (!wait_pollers_registered()) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  // An event at the tail of s covers what cudaStreamSynchronize(s) waits for (on the
  // legacy stream also the blocking streams' earlier work) and can be queried.
  const cudaEvent_t e = this_threads_wait_event();
  CUDA_CHECK(cudaEventRecord(e, s));
  wait_event(e);
}

void wait_device() {
  if (!wait_pollers_registered()) {
    CUDA_CHECK(cudaDeviceSynchronize());
    return;
  }
  // No CUDA call says without blocking whether every stream of the device is idle,
  // and the streams that matter most (NCCL's) are not known here. So a helper thread
  // blocks in cudaDeviceSynchronize and the caller polls for its end. The helper may
  // outlive this call (when a poller throws first), so it owns its state jointly.
  // Device memory growth is rare (grow-only buffers), so a thread per wait is cheap.
  struct Drain {
    std::atomic<bool> done{false};
    cudaError_t status = cudaSuccess;
  };
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  auto drain = std::make_shared<Drain>();
  std::thread([drain, device] {
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    drain->status = e;
    drain->done.store(true, std::memory_order_release);
  }).detach();
  wait_until([&drain] {
    if (!drain->done.load(std::memory_order_acquire)) return false;
    CUDA_CHECK(drain->status);
    return true;
  });
}

void wait_device_nothrow() noexcept {
  try {
    wait_device();
    return;
  } catch (...) {
    // A poller threw (or CUDA failed); finish the wait without pollers below.
  }
  cudaDeviceSynchronize();
}

void* CudaResources::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    // Grow by at least 1.5x, so a slowly growing batch does not reallocate every step.
    const size_t want = std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2);
    // Kernels queued on the stream may still use the old arena: device_free drains
    // the device first. Stream-ordered cudaFreeAsync on this stream would need no
    // wait at all, but growth is rare and one way of freeing serves every buffer,
    // also those read by several streams and the pinned ones (no stream-ordered free).
    device_free(Device::kCuda, scratch_);  // may throw a poller's error: nothing changed yet
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    scratch_ = device_alloc(Device::kCuda, want);
    scratch_bytes_ = want;
  }
  return scratch_;
}

void* CudaResources::separate_take(size_t bytes) {
  void* p = nullptr;
  // At least one byte, so an empty array is an allocation too (and any read of it an error).
  CUDA_CHECK(cudaMallocAsync(&p, std::max<size_t>(bytes, 1), stream));
  separate_.push_back(p);
  return p;
}

void CudaResources::separate_release() {
  // Ordered after every kernel queued so far on the stream, the only one that
  // uses scratch: no host wait.
  for (void* p : separate_) CUDA_CHECK(cudaFreeAsync(p, stream));
  separate_.clear();
}

void* CudaResources::pinned(size_t bytes) {
  if (bytes > pinned_bytes_) {
    // The previous staging area may be the target of a copy still in flight;
    // pinned_free drains the device first.
    pinned_free(pinned_);
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    const size_t want = std::max<size_t>(bytes, 4096);
    pinned_ = pinned_alloc(want);
    pinned_bytes_ = want;
  }
  return pinned_;
}

CudaResources::~CudaResources() {
  // Destructors cannot throw: the waits here poll (a peer's failure noticed now
  // still aborts the communicator, so the streams drain) but drop errors. The one
  // drain covers both streams and everything the frees below would wait for.
  for (void* p : separate_) cudaFreeAsync(p, stream);  // before the drain, which covers them
  wait_device_nothrow();
  device_release(Device::kCuda, scratch_);
  pinned_release(pinned_);
  device_release(Device::kCuda, lt_workspace);
  device_release(Device::kCuda, error_dev);
  pinned_release(error_host);
  if (lt) cublasLtDestroy(lt);
  if (cublas) cublasDestroy(cublas);
  device_release(Device::kCuda, cublas_workspace);
  if (copy_stream) cudaStreamDestroy(copy_stream);
  if (stream) cudaStreamDestroy(stream);
}

CudaResources& cuda_resources(const ExecContext& ctx, const char* op) {
  NCF_CHECK(ctx.device == Device::kCuda && ctx.cuda_resources != nullptr, op,
            ": the ExecContext has no CUDA resources (make it with make_cuda_context)");
  return *static_cast<CudaResources*>(ctx.cuda_resources);
}

ExecContext make_cuda_context(int device_id) {
  std::string why;
  NCF_CHECK(cuda_available(&why), "make_cuda_context(", device_id, "): no usable GPU (", why, ")");
  int count = 0;
  CUDA_CHECK(cudaGetDeviceCount(&count));
  NCF_CHECK(device_id >= 0 && device_id < count, "make_cuda_context: device ", device_id,
            " outside [0, ", count, ")");
  CUDA_CHECK(cudaSetDevice(device_id));

  const char* debug = std::getenv("NCF_SCRATCH_DEBUG");
  const bool separate = debug != nullptr && std::string(debug) == "separate";
  NCF_CHECK(debug == nullptr || *debug == '\0' || separate,
            "NCF_SCRATCH_DEBUG=", debug ? debug : "",
            ": expected 'separate' (every scratch array its own allocation) or unset");
  auto* r = new CudaResources;
  try {
    r->device_id = device_id;
    CUDA_CHECK(cudaDeviceGetAttribute(&r->sm_count, cudaDevAttrMultiProcessorCount, device_id));
    CUDA_CHECK(
        cudaDeviceGetAttribute(&r->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id));
    r->separate_scratch = separate;
    CUDA_CHECK(cudaStreamCreate(&r->stream));  // blocking: see the header
    // Non-blocking, so input copies overlap the compute stream's kernels and the
    // legacy stream's copies instead of serializing with them.
    CUDA_CHECK(cudaStreamCreateWithFlags(&r->copy_stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&r->cublas));
    CUBLAS_CHECK(cublasSetStream(r->cublas, r->stream));
    r->cublas_workspace = device_alloc(Device::kCuda, cuda::kCublasWorkspaceBytes);
    CUBLAS_CHECK(cublasSetWorkspace(r->cublas, r->cublas_workspace, cuda::kCublasWorkspaceBytes));
    CUBLAS_CHECK(cublasLtCreate(&r->lt));
    r->lt_workspace_bytes = cuda::kLtWorkspaceBytes;
    // Allocated through device.h, so that the destructor's device_release and
    // pinned_release match.
    r->lt_workspace = device_alloc(Device::kCuda, r->lt_workspace_bytes);
    r->error_dev =
        static_cast<DeviceErrorRecord*>(device_alloc(Device::kCuda, sizeof(DeviceErrorRecord)));
    CUDA_CHECK(cudaMemset(r->error_dev, 0, sizeof(DeviceErrorRecord)));
    r->error_host = static_cast<DeviceErrorRecord*>(pinned_alloc(sizeof(DeviceErrorRecord)));
  } catch (...) {
    delete r;
    throw;
  }
  ExecContext ctx;
  ctx.device = Device::kCuda;
  ctx.stream = r->stream;
  ctx.cublas = r->cublas;
  ctx.cuda_resources = r;
  return ctx;
}

void destroy_cuda_context(ExecContext& ctx) {
  if (ctx.device != Device::kCuda || ctx.cuda_resources == nullptr) return;
  delete static_cast<CudaResources*>(ctx.cuda_resources);
  ctx = ExecContext{};
}

void check_device_errors(const ExecContext& ctx) {
  if (ctx.device != Device::kCuda) return;
  CudaResources& r = cuda_resources(ctx, "check_device_errors");
  CUDA_CHECK(cudaMemcpyAsync(r.error_host, r.error_dev, sizeof(DeviceErrorRecord),
                             cudaMemcpyDeviceToHost, r.stream));
  wait_stream(r.stream);
  const DeviceErrorRecord e = *r.error_host;
  if (e.code == 0) return;
  CUDA_CHECK(cudaMemsetAsync(r.error_dev, 0, sizeof(DeviceErrorRecord), r.stream));
  wait_stream(r.stream);
  NCF_FAIL("bad input found on the GPU: ", device_error_text(static_cast<DeviceErrorCode>(e.code)),
           " (index ", e.index, ", value ", e.value, ", bound ", e.bound, ")");
}

}  // namespace ncf
