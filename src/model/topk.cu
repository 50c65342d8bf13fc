// CUDA twin of topk.h. Each (score, item) becomes one 64-bit key: the score's
// bits made order-preserving as an unsigned integer (after -0 → +0) in the
// high half, the item id complemented in the low half. Keys are then all
// distinct, and sorting them descending gives exactly the CPU order (score
// descending, item ascending) with no reliance on the sort's stability.
// Excluded items get key 0, below every real key. CUB's segmented radix sort
// orders each row; the first K of each row are decoded back. Rows are sorted a
// block at a time, so the sort's size stays within int range and its scratch
// bounded; no score travels to the host.
#include <cub/device/device_segmented_radix_sort.cuh>
#include <limits>

#include "common/cuda_util.cuh"
#include "model/topk.h"

namespace ncf::cuda {
namespace {

__device__ __forceinline__ uint64_t make_key(float score, int64_t item) {
  uint32_t b = __float_as_uint(score + 0.0f);  // -0 + 0 = +0
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (uint64_t(b) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(item));
}

__device__ __forceinline__ float key_score(uint64_t key) {
  uint32_t b = uint32_t(key >> 32);
  b = (b & 0x80000000u) ? (b & 0x7FFFFFFFu) : ~b;
  return __uint_as_float(b);
}

__global__ void keys_kernel(const float* scores, int64_t n, int64_t I, uint64_t* keys,
                            int* seg_offsets) {
  for (int64_t x = thread_first(); x < n * I; x += thread_stride())
    keys[x] = make_key(scores[x], x % I);
  for (int64_t u = thread_first(); u <= n; u += thread_stride()) seg_offsets[u] = int(u * I);
}

// Excluded entries of rows [0, n): key 0. One thread per entry; an entry
// outside [0, I) would land in another row's keys, so it is recorded instead
// (the CPU twin refuses it too).
__global__ void exclude_kernel(uint64_t* keys, int64_t n, int64_t I, const int64_t* offsets,
                               const int32_t* excluded, DeviceErrorRecord* err) {
  const int64_t first = offsets[0], total = offsets[n] - first;
  for (int64_t e = thread_first(); e < total; e += thread_stride()) {
    // The entry's row: the last u with offsets[u] <= first + e.
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= first + e)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int32_t item = excluded[first + e];
    if (item < 0 || item >= I)
      record_error(err, DeviceErrorCode::kTopKExcludedOutOfRange, first + e, item, I);
    else
      keys[lo * I + item] = 0;
  }
}

__global__ void keep_kernel(const uint64_t* sorted, int64_t n, int64_t I, int K,
                            const int64_t* offsets, int32_t* out_items, float* out_scores) {
  for (int64_t x = thread_first(); x < n * K; x += thread_stride()) {
    const int64_t u = x / K, r = x % K;
    const int64_t remaining = offsets ? I - (offsets[u + 1] - offsets[u]) : I;
    // K may exceed the row (K > I): read only inside it.
    const bool keep = r < remaining && r < I;
    const uint64_t key = keep ? sorted[u * I + r] : 0;
    out_items[x] = keep ? int32_t(0xFFFFFFFFu - uint32_t(key)) : -1;
    out_scores[x] = keep ? key_score(key) : -std::numeric_limits<float>::infinity();
  }
}

}  // namespace

void top_k(const ExecContext& ctx, const float* scores, int64_t n, int64_t I,
           const int64_t* offsets, const int32_t* excluded, int K, int32_t* out_items,
           float* out_scores) {
  const char* op = "top_k";
  if (n == 0) return;
  check_int_range(op, "I", I);
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(n, kTopKBlockElements / I));
  check_int_range(op, "rows x I", rows * I);
  const int block_keys = static_cast<int>(rows * I);
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(
      nullptr, temp_bytes, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
      block_keys, static_cast<int>(rows), static_cast<const int*>(nullptr),
      static_cast<const int*>(nullptr), 0, 64, stream));
  uint64_t* keys = nullptr;    // [rows×I]
  uint64_t* sorted = nullptr;  // [rows×I]
  int* seg = nullptr;          // [rows+1]
  void* temp = nullptr;
  carve_scratch(r, [&](ScratchLayout& s) {
    keys = s.take<uint64_t>(size_t(block_keys));
    sorted = s.take<uint64_t>(size_t(block_keys));
    seg = s.take<int>(size_t(rows + 1));
    temp = s.take<char>(temp_bytes);
  });
  for (int64_t u0 = 0; u0 < n; u0 += rows) {
    const int64_t m = std::min(rows, n - u0);
    keys_kernel<<<grid_for(m * I), kThreads, 0, stream>>>(scores + u0 * I, m, I, keys, seg);
    if (offsets)
      exclude_kernel<<<grid_for(m * I), kThreads, 0, stream>>>(keys, m, I, offsets + u0, excluded,
                                                               r.error_dev);
    check_launch(op);
    CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortKeysDescending(
        temp, temp_bytes, keys, sorted, static_cast<int>(m * I), static_cast<int>(m), seg, seg + 1,
        0, 64, stream));
    keep_kernel<<<grid_for(m * K), kThreads, 0, stream>>>(
        sorted, m, I, K, offsets ? offsets + u0 : nullptr, out_items + u0 * K, out_scores + u0 * K);
    check_launch(op);
  }
}

}  // namespace ncf::cuda
