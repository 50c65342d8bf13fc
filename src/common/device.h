// Where data lives and where kernels run. A Buffer<T> knows its device; every op
// takes an ExecContext and dispatches once per call (never per element) to its
// CPU implementation (*.cc) or its CUDA twin (*.cu, same name and arguments).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ncf {

enum class Device { kCpu, kCuda };

Device parse_device(const std::string& name);  // "cpu" | "cuda"
const char* device_name(Device d);
// True when this build has CUDA and at least one GPU answers cudaGetDeviceCount.
bool cuda_available(std::string* why = nullptr);

// Execution context of one rank: the device, the CPU thread count for CPU
// kernels, and (CUDA builds) the compute stream and BLAS handle.
struct ExecContext {
  Device device = Device::kCpu;
  int threads = 1;                 // CPU kernels split rows over this many threads
  void* stream = nullptr;          // cudaStream_t on kCuda
  void* cublas = nullptr;          // cublasHandle_t on kCuda
  void* cuda_resources = nullptr;  // CudaResources* (common/cuda_context.h) on kCuda
};

// Raw allocation on a device (64-byte aligned on the CPU).
void* device_alloc(Device d, size_t bytes);
// Frees p. On a GPU cudaFree waits for the whole device, uninterruptibly, so the
// device is drained first through wait_device (common/cuda_context.h): a poller's
// error (a peer rank died) ends that wait and is thrown, and p is not freed.
void device_free(Device d, void* p);
// device_free for destructors: never throws (wait_device_nothrow, errors dropped).
void device_release(Device d, void* p) noexcept;
// Throws: a Buffer made without a device was asked for n elements of `bytes_each`.
[[noreturn]] void buffer_without_device(size_t n, size_t bytes_each);
// Copies between any two devices (host<->device via cudaMemcpy: the host waits).
void device_copy(Device dst_dev, void* dst, Device src_dev, const void* src, size_t bytes);
void device_zero(Device d, void* p, size_t bytes);
// The same copy enqueued on ctx's stream: on a CUDA context it returns at once
// and is ordered with the kernels of that stream (host memory involved should
// be pinned, or the driver copies synchronously); on a CPU context a memcpy.
void device_copy_async(const ExecContext& ctx, Device dst_dev, void* dst, Device src_dev,
                       const void* src, size_t bytes);

// Page-locked host memory (cudaMallocHost) in CUDA builds with a GPU, so that
// host<->device copies from it run as DMA without blocking the host; plain
// aligned memory otherwise. Freed with pinned_free, which drains the device first
// as device_free does (cudaFreeHost also waits for the whole device), or, in
// destructors, with pinned_release, which never throws.
void* pinned_alloc(size_t bytes);
void pinned_free(void* p);
void pinned_release(void* p) noexcept;

// Host memory [p, p + bytes) made readable and writable by the GPU's kernels at the same
// address (cudaHostRegister, mapped; under unified addressing the device pointer is the host
// pointer): the host tier's home arrays, which the tier's copy kernels read and write
// directly. Does nothing without a GPU. Undone by host_unregister (after the device drained).
void host_register(void* p, size_t bytes);
void host_unregister(void* p) noexcept;

// A grow-only array of page-locked host memory (see pinned_alloc). Move-only.
// Growing and move assignment free through pinned_free, so they may throw a wait
// poller's error; the buffer is then unchanged.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { pinned_release(p_); }
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  PinnedBuffer& operator=(PinnedBuffer&& o) {
    if (this != &o) {
      pinned_free(p_);
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  // Grows (never shrinks) to at least n elements; contents are not kept. The old
  // memory is freed once the device has drained (pinned_free), so copies still
  // reading or writing it have finished.
  void reserve(size_t n) {
    if (n <= n_) return;
    pinned_free(p_);
    p_ = nullptr;
    n_ = 0;
    p_ = static_cast<T*>(pinned_alloc(n * sizeof(T)));
    n_ = n;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// An owning, typed, device-tagged array. Move-only. reset, reserve (growing) and
// move assignment free through device_free, so on a GPU they wait for the device
// (its kernels may still read the memory) and may throw a wait poller's error; the
// buffer is then unchanged. A default-constructed Buffer has no device: it holds
// nothing and its reserve throws until a Buffer(device, n) is moved into it, so a
// workspace member left out of its owner's set-up fails on CPU ranks too, instead
// of handing host memory to a GPU kernel.
template <typename T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(Device d, size_t n) : dev_(d), placed_(true), n_(n) {
    if (n) p_ = static_cast<T*>(device_alloc(d, n * sizeof(T)));
  }
  ~Buffer() { device_release(dev_, p_); }
  Buffer(Buffer&& o) noexcept : dev_(o.dev_), placed_(o.placed_), p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  Buffer& operator=(Buffer&& o) {
    if (this != &o) {
      reset();
      dev_ = o.dev_;
      placed_ = o.placed_;
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void reset() {
    device_free(dev_, p_);
    p_ = nullptr;
    n_ = 0;
  }
  // Grows (never shrinks) to at least n elements; contents are not kept. The old
  // memory is freed before the new is allocated, so the peak is the larger of the two.
  void reserve(size_t n) {
    if (n <= n_) return;
    if (!placed_) buffer_without_device(n, sizeof(T));
    reset();
    p_ = static_cast<T*>(device_alloc(dev_, n * sizeof(T)));
    n_ = n;
  }
  void zero() {
    if (n_) device_zero(dev_, p_, n_ * sizeof(T));
  }

  Device device() const { return dev_; }
  bool placed() const { return placed_; }  // made with a device, or moved from one that was
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  Device dev_ = Device::kCpu;
  bool placed_ = false;  // made with a device (or moved from one that was)
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace ncf
