// Host side of device.h; the CUDA branches compile only in CUDA builds.
#include "common/device.h"

#include <cstdlib>
#include <cstring>

#include "common/check.h"
#include "common/cuda_context.h"  // CUDA_CHECK and the interruptible waits in CUDA builds

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ncf {

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  NCF_FAIL("unknown device '", name, "' (expected cpu or cuda)");
}

const char* device_name(Device d) { return d == Device::kCpu ? "cpu" : "cuda"; }

bool cuda_available(std::string* why) {
#ifdef NCF_WITH_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
    cudaGetLastError();
    return false;
  }
  if (n == 0) {
    if (why) *why = "no CUDA device found";
    return false;
  }
  return true;
#else
  if (why) *why = "this build has no CUDA backend (configured with NCF_CUDA=OFF or without nvcc)";
  return false;
#endif
}

void* device_alloc(Device d, size_t bytes) {
  if (bytes == 0) return nullptr;
  if (d == Device::kCpu) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    NCF_REQUIRE(p != nullptr, "cannot allocate ", bytes, " bytes of host memory");
    return p;
  }
#ifdef NCF_WITH_CUDA
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so the error path can still query
    size_t free = 0, total = 0;
    int gpu = -1;
    cudaGetDevice(&gpu);
    cudaMemGetInfo(&free, &total);
    NCF_FAIL("GPU ", gpu, ": cannot allocate ", bytes, " bytes (", cudaGetErrorString(e), "); ",
             free, " bytes free of ", total);
  }
  return p;
#else
  NCF_CHECK(false, "device_alloc on cuda in a build without CUDA");
#endif
}

void device_free(Device d, void* p) {
  if (!p) return;
  if (d == Device::kCpu) {
    std::free(p);
    return;
  }
#ifdef NCF_WITH_CUDA
  wait_device();  // interruptible; cudaFree's own wait then finds the device idle
  CUDA_CHECK(cudaFree(p));
#endif
}

void buffer_without_device(size_t n, size_t bytes_each) {
  throw_error(__FILE__, __LINE__,
              detail::concat("Buffer: ", n, " elements of ", bytes_each,
                             " bytes asked of a buffer made without a device (a workspace its "
                             "owner never placed)"));
}

void device_release(Device d, void* p) noexcept {
  if (!p) return;
  if (d == Device::kCpu) {
    std::free(p);
    return;
  }
#ifdef NCF_WITH_CUDA
  wait_device_nothrow();
  cudaFree(p);  // errors ignored: called from destructors
#endif
}

void device_copy(Device dst_dev, void* dst, Device src_dev, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev == Device::kCpu && src_dev == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#ifdef NCF_WITH_CUDA
  // cudaMemcpy to or from the host first waits, uninterruptibly, for the legacy
  // stream and the blocking streams' earlier work (which may wait on a collective);
  // with pollers registered, drain that work through the interruptible wait first.
  if ((dst_dev == Device::kCpu || src_dev == Device::kCpu) && wait_pollers_registered())
    wait_stream(nullptr);
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#else
  NCF_CHECK(false, "device_copy involving cuda in a build without CUDA");
#endif
}

void device_copy_async(const ExecContext& ctx, Device dst_dev, void* dst, Device src_dev,
                       const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (ctx.device == Device::kCpu || (dst_dev == Device::kCpu && src_dev == Device::kCpu)) {
    device_copy(dst_dev, dst, src_dev, src, bytes);
    return;
  }
#ifdef NCF_WITH_CUDA
  CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(ctx.stream)));
#else
  NCF_CHECK(false, "device_copy_async on a cuda context in a build without CUDA");
#endif
}

#ifdef NCF_WITH_CUDA
namespace {
// Decided once per process, so pinned_free knows how pinned_alloc allocated.
bool pinned_by_cuda() {
  static const bool yes = cuda_available();
  return yes;
}
}  // namespace
#endif

void* pinned_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
#ifdef NCF_WITH_CUDA
  if (pinned_by_cuda()) {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    return p;
  }
#endif
  return device_alloc(Device::kCpu, bytes);
}

void pinned_free(void* p) {
  if (!p) return;
#ifdef NCF_WITH_CUDA
  if (pinned_by_cuda()) {
    wait_device();  // as in device_free: cudaFreeHost waits for the whole device
    CUDA_CHECK(cudaFreeHost(p));
    return;
  }
#endif
  std::free(p);
}

void pinned_release(void* p) noexcept {
  if (!p) return;
#ifdef NCF_WITH_CUDA
  if (pinned_by_cuda()) {
    wait_device_nothrow();
    cudaFreeHost(p);  // errors ignored: called from destructors
    return;
  }
#endif
  std::free(p);
}

void host_register(void* p, size_t bytes) {
  if (!p || bytes == 0) return;
#ifdef NCF_WITH_CUDA
  if (pinned_by_cuda()) {
    CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void* dev = nullptr;
    CUDA_CHECK(cudaHostGetDevicePointer(&dev, p, 0));
    NCF_CHECK(dev == p, "host memory registered with the GPU has another address there (", dev,
              " for ", p, "): this GPU and driver lack unified addressing");
  }
#endif
}

void host_unregister(void* p) noexcept {
  if (!p) return;
#ifdef NCF_WITH_CUDA
  if (pinned_by_cuda()) {
    wait_device_nothrow();
    cudaHostUnregister(p);  // errors ignored: called from destructors
  }
#endif
}

void device_zero(Device d, void* p, size_t bytes) {
  if (bytes == 0) return;
  if (d == Device::kCpu) {
    std::memset(p, 0, bytes);
    return;
  }
#ifdef NCF_WITH_CUDA
  CUDA_CHECK(cudaMemset(p, 0, bytes));
#endif
}

}  // namespace ncf
