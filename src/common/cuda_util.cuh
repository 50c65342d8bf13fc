// What every *.cu launcher shares (include from .cu files only; the checks are
// common/check.h's): the one launch-grid helper, the scratch-arena layout, the
// device error record writer, and the two deterministic reductions (scalar sums
// and column sums over fixed chunks, combined in a fixed order — no float
// atomics, so a result is the same bits on every run).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "common/check.h"
#include "common/cuda_context.h"
#include "common/cuda_sizes.h"  // kThreads, the sums' chunks
#include "common/device.h"

namespace ncf::cuda {

// ---- launching ----------------------------------------------------------------

constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // more work loops inside the kernel

// The launch grid of every 1-D kernel: one thread per work item, in blocks of
// `threads`, capped at kMaxBlocks (kernels walk their range with a grid-stride
// loop, so any count is covered). Callers skip the launch when work == 0.
inline unsigned grid_for(int64_t work, int threads = kThreads) {
  const int64_t blocks = (work + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

// First index and stride of a grid-stride loop (64-bit: B·D may pass 2^31).
__device__ __forceinline__ int64_t thread_first() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

inline cudaStream_t stream_of(const ExecContext& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// Raises a failed launch (bad configuration, no kernel image for this GPU).
inline void check_launch(const char* op) {
  cudaError_t e = cudaGetLastError();
  NCF_CHECK(e == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorString(e));
}

// Vectorized (float4) paths need 16-byte aligned rows: the base pointer and
// every row start (so the row stride is a multiple of 4 floats).
__host__ __device__ inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// The bits a radix sort of keys in [0, bound) reads (end_bit): at least one;
// 32 without a bound (bound <= 0). Fewer bits, fewer passes over the keys.
inline int key_end_bit(int64_t bound) {
  if (bound <= 0) return 32;
  int bits = 1;
  while (bits < 31 && (int64_t{1} << bits) < bound) ++bits;
  return bits;
}

// Device-side checks of sizes that CUB and the 2-D grids take as int.
inline void check_int_range(const char* op, const char* what, int64_t v) {
  NCF_CHECK(v >= 0 && v <= INT_MAX, op, ": ", what, "=", v,
            " exceeds what the CUDA path supports (INT_MAX)");
}

// ---- scratch ------------------------------------------------------------------

// Lays several arrays out in one scratch allocation. Run the same layout twice:
// once on ScratchLayout(nullptr) to measure, then on the arena it returned. In
// the debug mode of CudaResources::separate_scratch every array is an
// allocation of its own instead.
class ScratchLayout {
 public:
  // base: the arena (nullptr to measure); separate: the resources whose
  // separate_take gives each array instead.
  explicit ScratchLayout(void* base, CudaResources* separate = nullptr)
      : base_(static_cast<char*>(base)), separate_(separate) {}
  template <typename T>
  T* take(size_t count) {
    if (separate_) return static_cast<T*>(separate_->separate_take(count * sizeof(T)));
    used_ = (used_ + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    T* p = base_ ? reinterpret_cast<T*>(base_ + used_) : nullptr;
    used_ += count * sizeof(T);
    return p;
  }
  size_t used() const { return std::max<size_t>(used_, 1); }

 private:
  char* base_;
  CudaResources* separate_;
  size_t used_ = 0;
};

// One op's arrays. A later carve reuses the arena (or, in the separate mode,
// frees the earlier arrays), so an op carves once and its arrays live until the
// next op carves.
template <typename Layout>
void carve_scratch(CudaResources& r, Layout&& layout) {
  if (r.separate_scratch) {
    r.separate_release();
    ScratchLayout each(nullptr, &r);
    layout(each);
    return;
  }
  ScratchLayout measure(nullptr);
  layout(measure);
  ScratchLayout real(r.scratch(measure.used()));
  layout(real);
}

// ---- the device error record ----------------------------------------------------

// The first failing thread wins; later ones leave the record as it is.
__device__ __forceinline__ void record_error(DeviceErrorRecord* rec, DeviceErrorCode code,
                                             int64_t index, int64_t value, int64_t bound) {
  if (atomicCAS(&rec->code, 0, static_cast<int>(code)) == 0) {
    rec->index = index;
    rec->value = value;
    rec->bound = bound;
  }
}

// True while a recorded error waits to be raised: state-changing kernels return
// at once, so bad input never half-updates a table.
__device__ __forceinline__ bool error_pending(const DeviceErrorRecord* rec) {
  return *reinterpret_cast<const volatile int*>(&rec->code) != 0;
}

// The one wait of a synchronizing op (its own result copies already enqueued):
// adds the copy of the error record, waits for the stream, and raises a
// recorded error (check_device_errors clears it and throws).
inline void sync_and_raise(const ExecContext& ctx, CudaResources& r) {
  CUDA_CHECK(cudaMemcpyAsync(r.error_host, r.error_dev, sizeof(DeviceErrorRecord),
                             cudaMemcpyDeviceToHost, stream_of(ctx)));
  wait_stream(stream_of(ctx));  // interruptible: see cuda_context.h
  if (r.error_host->code != 0) check_device_errors(ctx);
}

namespace {  // kernels and their templates: one private copy per .cu file

// x[i] = i: the positions that a stable sort-by-key carries along.
template <typename T>
__global__ void iota_kernel(T* x, int64_t n) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) x[i] = static_cast<T>(i);
}

// Records the first id of ids[n] outside [0, bound) under `code`: run before a
// sort that reads only key_end_bit(bound) bits, whose order a bad id would spoil;
// the sorting op's wait then raises it.
__global__ void check_ids_kernel(const int32_t* ids, int64_t n, int64_t bound, DeviceErrorCode code,
                                 DeviceErrorRecord* err) {
  for (int64_t k = thread_first(); k < n; k += thread_stride())
    if (ids[k] < 0 || ids[k] >= bound) record_error(err, code, k, ids[k], bound);
}

// ---- deterministic scalar sums ----------------------------------------------------
// Pass 1: block c sums items [c·kSumChunk, (c+1)·kSumChunk) with a fixed
// thread-to-item map and a fixed shared-memory tree. Pass 2: one block sums the
// chunk partials, thread j taking chunks j, j+kThreads, … in order, then the
// same tree. The order depends only on n, never on the GPU or the timing.

template <int kSums>
__device__ void block_tree_sum(double (&acc)[kSums], double (*sh)[kThreads]) {
  for (int k = 0; k < kSums; ++k) sh[k][threadIdx.x] = acc[k];
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s)
      for (int k = 0; k < kSums; ++k) sh[k][threadIdx.x] += sh[k][threadIdx.x + s];
    __syncthreads();
  }
}

// op(i, acc) adds item i's kSums quantities into acc. partial is [chunks × kSums].
template <int kSums, typename Op>
__global__ void __launch_bounds__(kThreads) chunk_sums_kernel(Op op, int64_t n, double* partial) {
  __shared__ double sh[kSums][kThreads];
  double acc[kSums];
  for (int k = 0; k < kSums; ++k) acc[k] = 0.0;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kSumChunk;
  for (int j = 0; j < kSumItemsPerThread; ++j) {
    const int64_t i = base + static_cast<int64_t>(j) * kThreads + threadIdx.x;
    if (i < n) op(i, acc);
  }
  block_tree_sum<kSums>(acc, sh);
  if (threadIdx.x == 0)
    for (int k = 0; k < kSums; ++k)
      partial[static_cast<int64_t>(blockIdx.x) * kSums + k] = sh[k][0];
}

// store(k, total) receives the kSums totals (zeros when there are no chunks).
template <int kSums, typename Store>
__global__ void __launch_bounds__(kThreads)
    finish_sums_kernel(const double* partial, int64_t chunks, Store store) {
  __shared__ double sh[kSums][kThreads];
  double acc[kSums];
  for (int k = 0; k < kSums; ++k) acc[k] = 0.0;
  for (int64_t c = threadIdx.x; c < chunks; c += kThreads)
    for (int k = 0; k < kSums; ++k) acc[k] += partial[c * kSums + k];
  block_tree_sum<kSums>(acc, sh);
  if (threadIdx.x == 0)
    for (int k = 0; k < kSums; ++k) store(k, sh[k][0]);
}

// Σ over i < n of op's kSums quantities → store. `partial` holds sum_chunks(n)·kSums doubles.
template <int kSums, typename Op, typename Store>
void deterministic_sums(cudaStream_t stream, int64_t n, Op op, double* partial, Store store,
                        const char* what) {
  const int64_t chunks = sum_chunks(n);
  check_int_range(what, "reduction chunks", chunks);
  if (chunks > 0)
    chunk_sums_kernel<kSums>
        <<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(op, n, partial);
  finish_sums_kernel<kSums><<<1, kThreads, 0, stream>>>(partial, chunks, store);
  check_launch(what);
}

// ---- deterministic column sums ------------------------------------------------------
// Σ_b op(b, c) for each of C columns over B rows. Block (x, y) takes rows
// [x·kColChunk, (x+1)·kColChunk) and columns [32y, 32y+32): lane tx owns column
// 32y+tx (coalesced row reads), the 8 thread rows split the chunk's rows
// ty, ty+8, … and are combined in ty order. Then the chunk partials of each
// column: when there are more than kColGroup chunks (B > 16,384), a middle pass
// (one thread per (group, column), many blocks) adds each group of kColGroup
// consecutive chunk partials in chunk order and stores the group's sum over the
// group's first partial; the last pass (one thread per column) adds the group
// sums in group order. So a column's total is Σ_groups (Σ_chunks in group), an
// order fixed by B alone; at B = 2^20 (4096 chunks, 64 groups) a thread of
// either pass adds 64 terms where one thread per column used to add 4096.

constexpr int kColLanes = 32;
constexpr int kColRows = 8;
constexpr int64_t kColGroup = 64;  // chunk partials per middle-pass sum (kColChunk rows each)

// The end of a block of col_sums_kernel's shape, P adjacent columns per thread:
// thread (tx, ty)'s sums acc[j] of column P·c + j over its rows, combined with the
// block's other thread rows in ty order into partial[blockIdx.x, P·c + j], by the
// threads whose P columns lie below C (c < C / P). Every thread of the block calls it.
template <int P>
__device__ __forceinline__ void store_col_partials(const double (&acc)[P], int c, int C,
                                                   double* partial) {
  __shared__ double sh[kColRows][P * kColLanes];
#pragma unroll
  for (int j = 0; j < P; ++j) sh[threadIdx.y][P * threadIdx.x + j] = acc[j];
  __syncthreads();
  if (threadIdx.y == 0 && c < C / P) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      double s = 0.0;
      for (int r = 0; r < kColRows; ++r) s += sh[r][P * threadIdx.x + j];
      partial[static_cast<int64_t>(blockIdx.x) * C + P * c + j] = s;
    }
  }
}

// op(b, c) returns the double to add (it may also write element (b, c) of an
// output: each (b, c) is visited exactly once). partial is [chunks × C].
template <typename Op>
__global__ void __launch_bounds__(kColLanes* kColRows)
    col_sums_kernel(Op op, int64_t B, int C, double* partial) {
  const int c = blockIdx.y * kColLanes + threadIdx.x;
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * kColChunk;
  const int64_t b1 = b0 + kColChunk < B ? b0 + kColChunk : B;
  double acc[1] = {0.0};
  if (c < C)
    for (int64_t b = b0 + threadIdx.y; b < b1; b += kColRows) acc[0] += op(b, c);
  store_col_partials<1>(acc, c, C, partial);
}

// partial[g·kColGroup, c] = Σ partial[x, c] over the chunks x of group g, in
// chunk order. Threads of a block take consecutive columns (coalesced); each
// (g, c) is read and written by its thread only, so the in-place store is safe.
__global__ void col_group_kernel(double* partial, int64_t chunks, int C) {
  const int64_t groups = (chunks + kColGroup - 1) / kColGroup;
  const int64_t total = groups * C;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t g = i / C, c = i % C;
    const int64_t x0 = g * kColGroup;
    const int64_t x1 = x0 + kColGroup < chunks ? x0 + kColGroup : chunks;
    double s = partial[x0 * C + c];
    for (int64_t x = x0 + 1; x < x1; ++x) s += partial[x * C + c];
    partial[x0 * C + c] = s;
  }
}

// store(c, total) for each column: the sum of partial[x·step, c] over
// x·step < chunks, in x order (step 1: the chunk partials themselves; step
// kColGroup: the group sums). Totals are 0 when B == 0.
template <typename Store>
__global__ void col_finish_kernel(const double* partial, int64_t chunks, int64_t step, int C,
                                  Store store) {
  for (int64_t c = thread_first(); c < C; c += thread_stride()) {
    double s = 0.0;
    for (int64_t x = 0; x < chunks; x += step) s += partial[x * C + c];
    store(static_cast<int>(c), s);
  }
}

// The passes after the chunk partials [chunks × C]: the group sums when there are
// more than kColGroup chunks (in place), then each column's total to store.
template <typename Store>
void finish_col_sums(cudaStream_t stream, double* partial, int64_t chunks, int C, Store store) {
  if (C <= 0) return;
  int64_t step = 1;
  if (chunks > kColGroup) {
    const int64_t groups = (chunks + kColGroup - 1) / kColGroup;
    col_group_kernel<<<grid_for(groups * C), kThreads, 0, stream>>>(partial, chunks, C);
    step = kColGroup;
  }
  col_finish_kernel<<<grid_for(C), kThreads, 0, stream>>>(partial, chunks, step, C, store);
}

// The column sums of B rows and C columns: launch(grid, block) runs a kernel of
// col_sums_kernel's shape (chunks × column tiles of kColLanes × kColRows threads)
// writing the chunk partials, then the passes after them store each total.
// `partial` holds col_chunks(B)·C doubles (the group sums reuse it in place).
template <typename Store, typename Launch>
void run_col_sums(cudaStream_t stream, int64_t B, int C, double* partial, Store store,
                  const char* what, Launch launch) {
  const int64_t chunks = col_chunks(B);
  const int64_t tiles = (static_cast<int64_t>(C) + kColLanes - 1) / kColLanes;
  check_int_range(what, "row chunks", chunks);
  NCF_CHECK(tiles <= 65535, what, ": C=", C, " columns exceed the grid's y range");
  if (chunks > 0 && C > 0)
    launch(dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(tiles)),
           dim3(kColLanes, kColRows));
  finish_col_sums(stream, partial, chunks, C, store);
  check_launch(what);
}

template <typename Op, typename Store>
void deterministic_col_sums(cudaStream_t stream, int64_t B, int C, Op op, double* partial,
                            Store store, const char* what) {
  run_col_sums(stream, B, C, partial, store, what, [&](dim3 grid, dim3 block) {
    col_sums_kernel<<<grid, block, 0, stream>>>(op, B, C, partial);
  });
}

}  // namespace
}  // namespace ncf::cuda
