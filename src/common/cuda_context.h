// The CUDA state of one rank's compute stream, beyond the stream itself: a copy
// stream for input transfers issued ahead of use, the cuBLAS and cuBLASLt handles, the cuBLASLt
// workspace, a grow-only scratch arena (CUB temporary storage, partial sums, row maps), pinned host
// staging for the few results that must come back to the host, and a sticky device error record.
//
// make_cuda_context builds an ExecContext whose `cuda_resources` points at one
// CudaResources; destroy_cuda_context frees it. One CudaResources serves one
// stream: the scratch arena is reused by consecutive ops on that stream, which
// is safe only because they are ordered on it.
//
// Kernels cannot throw, so a kernel that meets bad input (an id out of range,
// unsorted rows) records the first such problem in the device error record and
// skips the offending work; state-changing kernels (optimizers, scatters) do
// nothing while a record is pending. The record is raised as ncf::Error by the
// ops that synchronize anyway (sort_reduce_rows, unique_ids, bucketize_by_owner,
// hit_ndcg) and by check_device_errors.
//
// Host waits: every place where the host waits for the GPU goes through wait_stream,
// wait_event or wait_device, which registered pollers can interrupt. A rank whose
// peer died may otherwise wait forever for an NCCL kernel that will never finish; the
// NCCL communicator registers a poller that turns NCCL's asynchronous error into an
// ncf::Error (and aborts the communicator so the streams drain). cudaFree and
// cudaFreeHost wait for the whole device, so the frees of device.h drain it through
// wait_device first; tests/test_host_waits.cc holds src/ to this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "common/check.h"  // CUDA_CHECK, CUBLAS_CHECK
#include "common/device.h"

#ifdef NCF_WITH_CUDA
// The handle types of the CUDA runtime, cuBLAS and cuBLASLt as their headers define them
// (cudaStream_t is CUstream_st*, and so on), so that the many files that include this
// one do not each parse those headers (0.8 s of a compile); the files that call CUDA or
// cuBLAS include them.
struct CUstream_st;
struct CUevent_st;
struct cublasContext;
struct cublasLtContext;
#endif

namespace ncf {

#ifdef NCF_WITH_CUDA
using CudaStream = CUstream_st*;      // cudaStream_t
using CudaEvent = CUevent_st*;        // cudaEvent_t
using CublasHandle = cublasContext*;  // cublasHandle_t
using LtHandle = cublasLtContext*;    // cublasLtHandle_t
#endif

// An ExecContext on GPU `device_id` (made current on the calling thread) with a
// new stream and the handles above. The stream is a blocking stream, so plain
// cudaMemcpy / cudaMemset (device_copy, Buffer::zero) on the legacy default
// stream stay ordered with it. Throws when this build or machine has no GPU.
ExecContext make_cuda_context(int device_id);
// Frees what make_cuda_context made (waits for the device first) and resets
// ctx to a CPU context. A context not made by make_cuda_context is left alone.
void destroy_cuda_context(ExecContext& ctx);

// Waits for ctx's stream, then throws ncf::Error describing the first bad input
// a kernel recorded since the last check (the op, the position, the value and
// the bound it broke), clearing the record. No-op on CPU contexts.
void check_device_errors(const ExecContext& ctx);

// ---- interruptible host waits -------------------------------------------------

// Registers poll under `key` (usually the registering object; registering a key
// again replaces its poller). While a host wait is pending, the pollers run on the
// waiting thread about once a millisecond, in registration order; the first one
// that throws ends the wait with its exception. Thread-safe.
void register_wait_poller(const void* key, std::function<void()> poll);
// Removes key's poller; no-op for an unknown key.
void unregister_wait_poller(const void* key);
// True while at least one poller is registered.
bool wait_pollers_registered();
// Returns once done() is true, calling the pollers in between; what done() or a
// poller throws propagates. Yields for the first 2 ms, then sleeps from 50 us
// doubling to 1 ms, so that short waits return promptly and long ones cost no CPU.
void wait_until(const std::function<bool()>& done);

#ifdef NCF_WITH_CUDA
// Waits on the host for the work queued so far on `s` (nullptr = the legacy
// default stream, including the work of blocking streams that it waits for); `s`
// belongs to the current device. Without pollers this is cudaStreamSynchronize; with
// pollers, an event recorded on `s` is polled through wait_until. Throws ncf::Error
// on a CUDA error, or what a poller throws.
void wait_stream(CudaStream s);
// Waits on the host for event `e` (of the current device) to complete: without
// pollers cudaEventSynchronize, with pollers cudaEventQuery through wait_until.
void wait_event(CudaEvent e);
// Waits on the host for all work queued so far on the current device, on every
// stream: also the non-blocking streams that no host wait here knows of, such as the
// NCCL communicator's, which neither wait_stream(nullptr) nor the compute stream
// covers while a deferred collective is in flight. This is what cudaFree and
// cudaFreeHost wait for implicitly. Without pollers cudaDeviceSynchronize; with
// pollers that runs on a helper thread while the caller polls, and when a poller
// throws, the caller gets the error and the helper ends once the device drains.
void wait_device();
// wait_device for destructors, which cannot throw: should a poller throw, the wait goes
// on without pollers (the NCCL poller aborts its communicator before it throws, so the
// device drains). Errors are dropped: the error that unwinds the stack, or the next
// wait's, is the one to report.
void wait_device_nothrow() noexcept;
#endif

// What a kernel found wrong (the device error record's code).
enum class DeviceErrorCode : int {
  kNone = 0,
  kGatherRowOutOfRange = 1,      // gather_rows: ids[index] = value outside [0, bound)
  kUniqueRowOutOfRange = 2,      // embedding optimizers: unique_rows[index] outside [0, bound)
  kUniqueRowsNotIncreasing = 3,  // embedding optimizers: unique_rows[index] = value <= previous
  kNegativesUserOutOfRange = 4,  // sample_negatives: users[index] = value outside [0, bound)
  kNegativesNoFreeItem = 5,      // sample_negatives: user value has all bound items
  kIndexOutOfRange = 6,          // permute_rows: idx[index] = value outside [0, bound)
  kNotAPermutation = 7,     // unpermute_rows: perm[index] = value repeated or outside [0, bound)
  kScatterRowsInvalid = 9,  // scatter_rows_dense: rows[index] = value outside [0, bound)
                            // or not above rows[index - 1]
  kIdOutOfRange = 10,       // ids_to_keys: ids[index] = value outside [0, bound)
  kKeyNotRouted = 11,       // bucketize_by_owner: keys[index] = value outside the
                            // routed tables' keys [0, bound) or of a replicated table
  kTopKExcludedOutOfRange = 12,  // top_k: excluded[index] = value outside [0, bound)
  kSortIdOutOfRange = 13,   // unique_ids / sort_reduce_rows / item_runs: ids[index] = value outside
                            // [0, bound)
  kRowNotCached = 14,       // map_rows: rows[index] = value has no slot in the device cache
  kCopyRowOutOfRange = 15,  // copy_rows / store_rows_bf16_at: rows[index] = value outside
                            // [0, bound)
};
const char* device_error_text(DeviceErrorCode code);

#ifdef NCF_WITH_CUDA
// Written by the first failing kernel (atomicCAS on code), read by the host.
struct DeviceErrorRecord {
  int code;  // a DeviceErrorCode, 0 = none
  int unused;
  long long index;  // position in the op's input
  long long value;  // the offending value
  long long bound;  // the limit it broke
};

struct CudaResources {
  int device_id = 0;
  CudaStream stream = nullptr;       // compute
  CudaStream copy_stream = nullptr;  // host->device input copies (non-blocking)
  CublasHandle cublas = nullptr;
  LtHandle lt = nullptr;
  void* lt_workspace = nullptr;  // cuBLASLt matmul workspace
  size_t lt_workspace_bytes = 0;
  void* cublas_workspace = nullptr;         // cuBLAS's, set on its handle
  int sm_count = 1;                         // the GPU's multiprocessors
  int smem_optin = 0;                       // the shared memory a block can opt into, bytes
  DeviceErrorRecord* error_dev = nullptr;   // device
  DeviceErrorRecord* error_host = nullptr;  // pinned mirror for the check

  // Grow-only scratch arena on the device. Growing frees the old arena once the
  // device has drained (device_free), so kernels still using it have finished; when
  // a poller interrupts that wait, the old arena stays in place.
  void* scratch(size_t bytes);
  // Grow-only pinned host staging for results copied back (counts, sums); grows
  // like the scratch arena.
  void* pinned(size_t bytes);

  // NCF_SCRATCH_DEBUG=separate (read by make_cuda_context; any other value is
  // refused): carve_scratch gives every array an allocation of its own instead of
  // a place in the arena, so compute-sanitizer's memcheck sees an overrun from
  // one array into the next and initcheck a read of an array no kernel of the op
  // wrote. The allocations are stream-ordered (cudaMallocAsync on `stream`) and
  // freed on the stream when the next op carves, as the arena is reused then.
  bool separate_scratch = false;
  void* separate_take(size_t bytes);
  void separate_release();

  CudaResources() = default;
  CudaResources(const CudaResources&) = delete;
  CudaResources& operator=(const CudaResources&) = delete;
  ~CudaResources();

 private:
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  void* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  std::vector<void*> separate_;  // the last carve's arrays in separate mode
};

// ctx's resources; throws naming `op` when ctx was not made by make_cuda_context.
CudaResources& cuda_resources(const ExecContext& ctx, const char* op);
#endif

}  // namespace ncf
