// Runs of equal ids on the device (include from .cu files only): the stable sort of
// positions by id and the numbering of its runs that unique_ids and item_runs start from.
#pragma once

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "common/cuda_util.cuh"

namespace ncf::cuda {
namespace {  // one private copy per .cu file, as cuda_util.cuh's kernels

// head[k] = 1 where sorted position k starts a run of equal ids (k = 0 or a new id).
__global__ void run_heads_kernel(const int32_t* __restrict__ sorted, int64_t n,
                                 int32_t* __restrict__ head) {
  for (int64_t k = thread_first(); k < n; k += thread_stride())
    head[k] = k == 0 || sorted[k] != sorted[k - 1] ? 1 : 0;
}

// The runs of equal ids among ids[n] (0 < n <= INT_MAX): with bound > 0 the ids are
// checked against it (a bad id recorded under kSortIdOutOfRange, raised at the op's
// wait) and the sort reads only the bits below it; without, all 32 (negative ids
// first). Made in three steps: the constructor sizes CUB's temporary room, take() lays
// the arrays out in the op's scratch (inside its carve_scratch), launch() runs:
//   sorted[n]     the ids ascending
//   pos_sorted[n] the input position of each sorted id, equal ids in input order (a
//                 stable LSD radix sort of the positions 0..n-1)
//   head[n]       run_heads_kernel's heads
//   run[n]        their inclusive scan: 1 + the run of each sorted position
class IdRuns {
 public:
  int32_t* pos_sorted;
  int32_t* sorted = nullptr;
  int32_t* head = nullptr;
  int32_t* run = nullptr;

  // positions: the op's own array for pos_sorted, or null to take one.
  IdRuns(int64_t n, int64_t bound, cudaStream_t stream, int32_t* positions = nullptr)
      : pos_sorted(positions),
        n_(n),
        bound_(bound),
        end_bit_(key_end_bit(bound)),
        stream_(stream),
        own_pos_(positions == nullptr) {
    const int n_int = static_cast<int>(n);
    size_t sort_bytes = 0, scan_bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        nullptr, sort_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
        static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n_int, 0, end_bit_,
        stream));
    CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes,
                                             static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), n_int, stream));
    temp_bytes_ = std::max({sort_bytes, scan_bytes, size_t{1}});
  }

  void take(ScratchLayout& s) {
    sorted = s.take<int32_t>(n_);
    pos_in_ = s.take<int32_t>(n_);
    if (own_pos_) pos_sorted = s.take<int32_t>(n_);
    head = s.take<int32_t>(n_);
    run = s.take<int32_t>(n_);
    temp_ = s.take<char>(temp_bytes_);
  }

  void launch(const int32_t* ids, DeviceErrorRecord* err, const char* op) {
    const int n_int = static_cast<int>(n_);
    if (bound_ > 0)
      check_ids_kernel<<<grid_for(n_), kThreads, 0, stream_>>>(
          ids, n_, bound_, DeviceErrorCode::kSortIdOutOfRange, err);
    iota_kernel<<<grid_for(n_), kThreads, 0, stream_>>>(pos_in_, n_);
    check_launch(op);
    size_t bytes = temp_bytes_;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp_, bytes, ids, sorted, pos_in_, pos_sorted,
                                               n_int, 0, end_bit_, stream_));
    run_heads_kernel<<<grid_for(n_), kThreads, 0, stream_>>>(sorted, n_, head);
    check_launch(op);
    bytes = temp_bytes_;
    CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp_, bytes, head, run, n_int, stream_));
  }

 private:
  int64_t n_, bound_;
  int end_bit_;
  cudaStream_t stream_;
  bool own_pos_;
  size_t temp_bytes_ = 0;
  int32_t* pos_in_ = nullptr;
  void* temp_ = nullptr;
};

}  // namespace
}  // namespace ncf::cuda
