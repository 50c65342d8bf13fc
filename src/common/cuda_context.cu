// CUDA side of cuda_context.h: creating and freeing a rank's stream, handles,
// workspace, scratch and error record, and raising recorded kernel errors.
#include <algorithm>
#include <string>

#include "common/check.h"
#include "common/cuda_context.h"
#include "common/cuda_util.cuh"

namespace ncf {
namespace {

// cuBLASLt may use this much workspace per matmul (split-K partials); 32 MiB is
// what NVIDIA's samples suggest for Hopper-class GPUs.
constexpr size_t kLtWorkspaceBytes = size_t{32} << 20;

}  // namespace

void wait_stream(cudaStream_t s) {
  if (!wait_pollers_registered()) {
    CUDA_CHECK(cudaStreamSynchronize(s));
    return;
  }
  // An event at the tail of s covers what cudaStreamSynchronize(s) waits for (on the
  // legacy stream also the blocking streams' earlier work) and can be queried.
  struct Event {
    cudaEvent_t e = nullptr;
    ~Event() {
      if (e) cudaEventDestroy(e);  // safe while pending: freed once it completes
    }
  } ev;
  CUDA_CHECK(cudaEventCreateWithFlags(&ev.e, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ev.e, s));
  wait_until([&ev] {
    const cudaError_t q = cudaEventQuery(ev.e);
    if (q == cudaErrorNotReady) return false;
    CUDA_CHECK(q);
    return true;
  });
}

void* CudaResources::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    // Grow by at least 1.5x, so a slowly growing batch does not reallocate every step.
    const size_t want = std::max(bytes, scratch_bytes_ + scratch_bytes_ / 2);
    if (scratch_) CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratch_bytes_ = 0;
    CUDA_CHECK(cudaMalloc(&scratch_, want));
    scratch_bytes_ = want;
  }
  return scratch_;
}

void* CudaResources::pinned(size_t bytes) {
  if (bytes > pinned_bytes_) {
    // The previous staging area may be the target of a copy still in flight.
    wait_stream(stream);
    if (pinned_) CUDA_CHECK(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    const size_t want = std::max<size_t>(bytes, 4096);
    CUDA_CHECK(cudaMallocHost(&pinned_, want));
    pinned_bytes_ = want;
  }
  return pinned_;
}

CudaResources::~CudaResources() {
  // Destructors do not throw: errors here are ignored (the process is tearing down).
  if (stream) cudaStreamSynchronize(stream);
  if (scratch_) cudaFree(scratch_);
  if (pinned_) cudaFreeHost(pinned_);
  if (lt_workspace) cudaFree(lt_workspace);
  if (error_dev) cudaFree(error_dev);
  if (error_host) cudaFreeHost(error_host);
  if (lt) cublasLtDestroy(lt);
  if (cublas) cublasDestroy(cublas);
  if (copy_stream) cudaStreamSynchronize(copy_stream);
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

  auto* r = new CudaResources;
  try {
    r->device_id = device_id;
    CUDA_CHECK(cudaStreamCreate(&r->stream));  // blocking: see the header
    // Non-blocking, so input copies overlap the compute stream's kernels and the
    // legacy stream's copies instead of serializing with them.
    CUDA_CHECK(cudaStreamCreateWithFlags(&r->copy_stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&r->cublas));
    CUBLAS_CHECK(cublasSetStream(r->cublas, r->stream));
    CUBLAS_CHECK(cublasLtCreate(&r->lt));
    r->lt_workspace_bytes = kLtWorkspaceBytes;
    CUDA_CHECK(cudaMalloc(&r->lt_workspace, r->lt_workspace_bytes));
    CUDA_CHECK(cudaMalloc(&r->error_dev, sizeof(DeviceErrorRecord)));
    CUDA_CHECK(cudaMemset(r->error_dev, 0, sizeof(DeviceErrorRecord)));
    CUDA_CHECK(cudaMallocHost(&r->error_host, sizeof(DeviceErrorRecord)));
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
