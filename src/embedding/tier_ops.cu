// CUDA twins of the host tier's ops (tier_ops.h; the CPU functions check the arguments
// and forward here when ctx.device is kCuda). copy_rows reads or writes host memory
// registered with the device where one side is a home array. Everything runs on
// ctx.stream; a row out of range is recorded (common/cuda_context.h) and raised by the
// next check, and nothing is written for it.
#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "embedding/tier_ops.h"

namespace ncf::cuda {

namespace {

// One thread per word (T: uint32_t for 4-byte pairs of BF16 or FP32 elements, uint16_t
// otherwise) of each copied row.
template <typename T>
__global__ void copy_rows_kernel(const T* __restrict__ src, const RowId* src_rows, int64_t src_R,
                                 T* __restrict__ dst, const RowId* dst_rows, int64_t dst_R,
                                 int64_t n, int words, DeviceErrorRecord* err) {
  const int64_t total = n * words;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / words;
    const int w = static_cast<int>(i - k * words);
    const int64_t from = src_rows ? src_rows[k] : k, to = dst_rows ? dst_rows[k] : k;
    if (from < 0 || from >= src_R || to < 0 || to >= dst_R) {
      if (w == 0)
        record_error(err, DeviceErrorCode::kCopyRowOutOfRange, k,
                     from < 0 || from >= src_R ? from : to,
                     from < 0 || from >= src_R ? src_R : dst_R);
      continue;
    }
    dst[to * words + w] = src[from * words + w];
  }
}

__global__ void map_rows_kernel(const int32_t* map, const RowId* rows, int64_t R, int64_t n,
                                int32_t* out, DeviceErrorRecord* err) {
  for (int64_t k = thread_first(); k < n; k += thread_stride()) {
    const RowId r = rows[k];
    if (r < 0 || r >= R) {
      record_error(err, DeviceErrorCode::kCopyRowOutOfRange, k, r, R);
      out[k] = -1;
      continue;
    }
    const int32_t slot = map[r];
    if (slot < 0) record_error(err, DeviceErrorCode::kRowNotCached, k, r, R);
    out[k] = slot;
  }
}

__global__ void assign_map_kernel(int32_t* map, const RowId* rows, const int32_t* values,
                                  int32_t fill, int64_t n, int64_t R, DeviceErrorRecord* err) {
  for (int64_t k = thread_first(); k < n; k += thread_stride()) {
    const RowId r = rows[k];
    if (r < 0 || r >= R) {
      record_error(err, DeviceErrorCode::kCopyRowOutOfRange, k, r, R);
      continue;
    }
    map[r] = values ? values[k] : fill;
  }
}

__global__ void store_rows_bf16_at_kernel(const float* src, const RowId* key_rows,
                                          const RowId* slots, uint16_t* dst, int64_t C, int64_t n,
                                          int D, RowRounding key, DeviceErrorRecord* err) {
  const int64_t total = n * D;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / D;
    const int d = static_cast<int>(i - k * D);
    const int64_t slot = slots[k];
    if (slot < 0 || slot >= C) {
      if (d == 0) record_error(err, DeviceErrorCode::kCopyRowOutOfRange, k, slot, C);
      continue;
    }
    dst[slot * D + d] = float_to_bf16_bits_stochastic(src[i], key.draw(key_rows[k], d, D));
  }
}

}  // namespace

void copy_rows(const ExecContext& ctx, const void* src, const RowId* src_rows, int64_t src_R,
               void* dst, const RowId* dst_rows, int64_t dst_R, int64_t n, int width,
               int elem_bytes) {
  const char* op = "copy_rows";
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  const int64_t row_bytes = int64_t(width) * elem_bytes;
  if (row_bytes % 4 == 0) {
    const int words = static_cast<int>(row_bytes / 4);
    copy_rows_kernel<uint32_t><<<grid_for(n * words), kThreads, 0, stream>>>(
        static_cast<const uint32_t*>(src), src_rows, src_R, static_cast<uint32_t*>(dst), dst_rows,
        dst_R, n, words, r.error_dev);
  } else {
    const int words = static_cast<int>(row_bytes / 2);
    copy_rows_kernel<uint16_t><<<grid_for(n * words), kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(src), src_rows, src_R, static_cast<uint16_t*>(dst), dst_rows,
        dst_R, n, words, r.error_dev);
  }
  check_launch(op);
}

void map_rows(const ExecContext& ctx, const int32_t* map, const RowId* rows, int64_t R, int64_t n,
              int32_t* out) {
  const char* op = "map_rows";
  CudaResources& r = cuda_resources(ctx, op);
  map_rows_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(map, rows, R, n, out, r.error_dev);
  check_launch(op);
}

void assign_map(const ExecContext& ctx, int32_t* map, const RowId* rows, const int32_t* values,
                int32_t fill, int64_t n, int64_t R) {
  const char* op = "assign_map";
  CudaResources& r = cuda_resources(ctx, op);
  assign_map_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(map, rows, values, fill, n, R,
                                                                  r.error_dev);
  check_launch(op);
}

void store_rows_bf16_at(const ExecContext& ctx, const float* src, const RowId* key_rows,
                        const RowId* slots, uint16_t* dst, int64_t C, int64_t n, int D,
                        const RowRounding& key) {
  const char* op = "store_rows_bf16_at";
  CudaResources& r = cuda_resources(ctx, op);
  store_rows_bf16_at_kernel<<<grid_for(n * D), kThreads, 0, stream_of(ctx)>>>(
      src, key_rows, slots, dst, C, n, D, key, r.error_dev);
  check_launch(op);
}

}  // namespace ncf::cuda
