// CUDA twins of the exchange helpers (embedding_kernels.h). Orders match the
// CPU exactly: bucketize is a stable CUB radix sort of (owner, position) pairs,
// unique_ids a stable sort of (id, position) pairs with run heads scanned into
// unique indices. Row moves read and write float4s when D % 4 == 0 and the
// arrays are 16-byte aligned.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "common/id_runs.cuh"
#include "embedding/embedding_kernels.h"

namespace ncf::cuda {
namespace {

// ---- bucketize ----------------------------------------------------------------------

// keys[k] = ids[k] + offset; an id outside [0, bound) is recorded and keyed
// at the offset (nothing downstream runs past the raise at the next sync).
__global__ void ids_to_keys_kernel(const int32_t* ids, int64_t n, int64_t offset, int64_t bound,
                                   int32_t* keys, DeviceErrorRecord* err) {
  for (int64_t k = thread_first(); k < n; k += thread_stride()) {
    const int32_t id = ids[k];
    const bool ok = id >= 0 && id < bound;
    if (!ok) record_error(err, DeviceErrorCode::kIdOutOfRange, k, id, bound);
    keys[k] = static_cast<int32_t>((ok ? id : 0) + offset);
  }
}

// owners[k], rows[k] = where keys[k] lives; a key outside the routed tables is
// recorded and sent to rank 0.
__global__ void route_keys_kernel(const int32_t* keys, int64_t n, KeyLayout layout, int32_t* owners,
                                  int32_t* rows, DeviceErrorRecord* err) {
  for (int64_t k = thread_first(); k < n; k += thread_stride()) {
    const int32_t key = keys[k];
    if (key < 0 || key >= layout.num_keys() ||
        layout.placement[layout.table_of(key)] == Placement::kReplicated) {
      record_error(err, DeviceErrorCode::kKeyNotRouted, k, key, layout.num_keys());
      owners[k] = 0;
      rows[k] = 0;
      continue;
    }
    int to = 0;
    layout.route(key, &to, rows + k);
    owners[k] = to;
  }
}

// Owner order → out_perm (input index) and out_rows (flat row on the owner).
__global__ void owner_order_kernel(const int32_t* rows, const int32_t* pos_sorted, int64_t n,
                                   int64_t* out_perm, int32_t* out_rows) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) {
    const int32_t k = pos_sorted[i];
    out_perm[i] = k;
    out_rows[i] = rows[k];
  }
}

// First index of sorted[0..n) that is >= x.
__device__ int64_t lower_bound_of(const int32_t* sorted, int64_t n, int32_t x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (sorted[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// counts[p] = number of sorted owner keys equal to p (no atomics: two searches).
__global__ void owner_counts_kernel(const int32_t* sorted_keys, int64_t n, int W, int64_t* counts) {
  for (int64_t p = thread_first(); p < W; p += thread_stride())
    counts[p] = lower_bound_of(sorted_keys, n, static_cast<int32_t>(p + 1)) -
                lower_bound_of(sorted_keys, n, static_cast<int32_t>(p));
}

// ---- unique ---------------------------------------------------------------------------

// run[i] = 1-based index of the unique id at sorted position i.
__global__ void unique_scatter_kernel(const int32_t* sorted, const int32_t* pos_sorted,
                                      const int32_t* head, const int32_t* run, int64_t n,
                                      int32_t* out_unique, int64_t* out_inverse) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) {
    const int32_t u = run[i] - 1;
    if (head[i]) out_unique[u] = sorted[i];
    out_inverse[pos_sorted[i]] = u;
  }
}

// ---- row moves -------------------------------------------------------------------------

template <bool kVec>
__device__ __forceinline__ void copy_row_part(const float* src, float* dst) {
  if constexpr (kVec)
    *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(src);
  else
    *dst = *src;
}

template <bool kVec>
__device__ __forceinline__ void zero_row_part(float* dst) {
  if constexpr (kVec)
    *reinterpret_cast<float4*>(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  else
    *dst = 0.0f;
}

// out[k, :] = src[idx[k], :]; a bad idx gives a zero row and an error record.
template <bool kVec>
__global__ void permute_rows_kernel(const float* src, int64_t n_src, const int64_t* idx, float* out,
                                    int64_t n, int D, DeviceErrorRecord* err) {
  const int lanes = kVec ? D / 4 : D;
  const int64_t total = n * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / lanes;
    const int d = static_cast<int>(i % lanes) * (kVec ? 4 : 1);
    const int64_t s = idx[k];
    if (s >= 0 && s < n_src) {
      copy_row_part<kVec>(src + s * D + d, out + k * D + d);
    } else {
      if (d == 0) record_error(err, DeviceErrorCode::kIndexOutOfRange, k, s, n_src);
      zero_row_part<kVec>(out + k * D + d);
    }
  }
}

// marks[n] starts at 0; a target seen twice or outside [0, n) is recorded.
__global__ void check_permutation_kernel(const int64_t* perm, int64_t n, int32_t* marks,
                                         DeviceErrorRecord* err) {
  for (int64_t k = thread_first(); k < n; k += thread_stride()) {
    const int64_t p = perm[k];
    if (p < 0 || p >= n || atomicExch(&marks[p], 1) != 0)
      record_error(err, DeviceErrorCode::kNotAPermutation, k, p, n);
  }
}

// out[perm[k], :] = src[k, :]; nothing at all while an error is pending.
template <bool kVec>
__global__ void unpermute_rows_kernel(const float* src, const int64_t* perm, float* out, int64_t n,
                                      int D, const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  const int lanes = kVec ? D / 4 : D;
  const int64_t total = n * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / lanes;
    const int d = static_cast<int>(i % lanes) * (kVec ? 4 : 1);
    copy_row_part<kVec>(src + k * D + d, out + perm[k] * D + d);
  }
}

// ---- replicated tables: dense gradient and its touched rows -------------------------

// dense[rows[k], :] = [grads[k, :], 1]; a row outside [0, N) or not above its
// predecessor is recorded and skipped.
__global__ void scatter_rows_dense_kernel(const int32_t* rows, const float* grads, int64_t n, int D,
                                          int64_t N, float* dense, DeviceErrorRecord* err) {
  const int64_t stride = int64_t(D) + 1;  // D gradient columns, a touch count
  const int64_t total = n * stride;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / stride;
    const int d = static_cast<int>(i % stride);
    const int32_t r = rows[k];
    if (r < 0 || r >= N || (k > 0 && r <= rows[k - 1])) {
      if (d == 0) record_error(err, DeviceErrorCode::kScatterRowsInvalid, k, r, N);
      continue;
    }
    dense[int64_t(r) * stride + d] = d < D ? grads[k * D + d] : 1.0f;
  }
}

// flags[r] = 1 when row r of dense[N×(D+1)] has a non-zero touch count.
__global__ void touched_flags_kernel(const float* dense, int64_t N, int D, int32_t* flags) {
  const int64_t stride = int64_t(D) + 1;  // D gradient columns, a touch count
  for (int64_t r = thread_first(); r < N; r += thread_stride())
    flags[r] = dense[r * stride + D] != 0.0f ? 1 : 0;
}

// out_rows[scan[r] - 1] = r for the flagged rows (scan: inclusive sum of flags).
__global__ void touched_rows_kernel(const int32_t* flags, const int32_t* scan, int64_t N,
                                    int32_t* out_rows) {
  for (int64_t r = thread_first(); r < N; r += thread_stride())
    if (flags[r]) out_rows[scan[r] - 1] = static_cast<int32_t>(r);
}

// out_grads[k, :] = dense[out_rows[k], :D].
__global__ void touched_grads_kernel(const float* dense, const int32_t* out_rows, int64_t m, int D,
                                     float* out_grads) {
  const int64_t stride = int64_t(D) + 1;  // D gradient columns, a touch count
  const int64_t total = m * D;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / D;
    const int d = static_cast<int>(i % D);
    out_grads[i] = dense[int64_t(out_rows[k]) * stride + d];
  }
}

// ---- BF16 payloads ------------------------------------------------------------------

__global__ void pack_bf16_kernel(const float* src, uint16_t* out, int64_t n) {
  for (int64_t k = thread_first(); k < n; k += thread_stride()) out[k] = float_to_bf16_bits(src[k]);
}

__global__ void unpack_bf16_kernel(const uint16_t* src, float* out, int64_t n) {
  for (int64_t k = thread_first(); k < n; k += thread_stride()) out[k] = bf16_bits_to_float(src[k]);
}

__global__ void round_bf16_kernel(float* x, int64_t n) {
  for (int64_t k = thread_first(); k < n; k += thread_stride()) x[k] = round_to_bf16(x[k]);
}

}  // namespace

void ids_to_keys(const ExecContext& ctx, const int32_t* ids, int64_t n, int64_t offset,
                 int64_t bound, int32_t* keys) {
  const char* op = "ids_to_keys";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  ids_to_keys_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(ids, n, offset, bound, keys,
                                                                   r.error_dev);
  check_launch(op);
}

void bucketize_by_owner(const ExecContext& ctx, const int32_t* keys, int64_t n,
                        const KeyLayout& layout, int64_t* out_perm, int32_t* out_rows,
                        int64_t* counts) {
  const char* op = "bucketize_by_owner";
  const int W = layout.W;
  std::fill(counts, counts + W, int64_t{0});
  if (n == 0) return;
  check_int_range(op, "n", n);
  const int n_int = static_cast<int>(n);
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n_int, 0,
      key_end_bit(W), stream));
  int32_t* owners = nullptr;         // [n] owner of each input key
  int32_t* rows = nullptr;           // [n] its flat row on the owner
  int32_t* sorted_owners = nullptr;  // [n] owners in owner order
  int32_t* pos_in = nullptr;         // [n] 0..n-1
  int32_t* pos_sorted = nullptr;     // [n] input index in owner order
  int64_t* dev_counts = nullptr;     // [W]
  void* temp = nullptr;
  carve_scratch(r, [&](ScratchLayout& s) {
    owners = s.take<int32_t>(n);
    rows = s.take<int32_t>(n);
    sorted_owners = s.take<int32_t>(n);
    pos_in = s.take<int32_t>(n);
    pos_sorted = s.take<int32_t>(n);
    dev_counts = s.take<int64_t>(W);
    temp = s.take<char>(temp_bytes);
  });
  route_keys_kernel<<<grid_for(n), kThreads, 0, stream>>>(keys, n, layout, owners, rows,
                                                          r.error_dev);
  iota_kernel<<<grid_for(n), kThreads, 0, stream>>>(pos_in, n);
  check_launch(op);
  // LSD radix sort is stable: equal owners keep input order, like the CPU's counting sort.
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, owners, sorted_owners, pos_in,
                                             pos_sorted, n_int, 0, key_end_bit(W), stream));
  owner_order_kernel<<<grid_for(n), kThreads, 0, stream>>>(rows, pos_sorted, n, out_perm, out_rows);
  owner_counts_kernel<<<grid_for(W), kThreads, 0, stream>>>(sorted_owners, n, W, dev_counts);
  check_launch(op);
  auto* host = static_cast<int64_t*>(r.pinned(sizeof(int64_t) * W));
  CUDA_CHECK(
      cudaMemcpyAsync(host, dev_counts, sizeof(int64_t) * W, cudaMemcpyDeviceToHost, stream));
  sync_and_raise(ctx, r);
  std::copy_n(host, W, counts);
}

void unique_ids(const ExecContext& ctx, const int32_t* ids, int64_t n, int32_t* out_unique,
                int64_t* out_inverse, int64_t* n_unique, int64_t bound) {
  const char* op = "unique_ids";
  if (n == 0) {
    *n_unique = 0;
    return;
  }
  check_int_range(op, "n", n);
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);

  // With a bound the ids are checked first (raised at the wait below) and the
  // sort reads only the bits below it; without one, all 32 (negative ids first).
  IdRuns runs(n, bound, stream);
  carve_scratch(r, [&](ScratchLayout& s) { runs.take(s); });
  runs.launch(ids, r.error_dev, op);
  unique_scatter_kernel<<<grid_for(n), kThreads, 0, stream>>>(
      runs.sorted, runs.pos_sorted, runs.head, runs.run, n, out_unique, out_inverse);
  check_launch(op);
  auto* host = static_cast<int32_t*>(r.pinned(sizeof(int32_t)));
  CUDA_CHECK(
      cudaMemcpyAsync(host, runs.run + (n - 1), sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  sync_and_raise(ctx, r);
  *n_unique = *host;
}

void permute_rows(const ExecContext& ctx, const float* src, int64_t n_src, const int64_t* idx,
                  float* out, int64_t n, int D) {
  const char* op = "permute_rows";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  if (D % 4 == 0 && aligned16(src) && aligned16(out))
    permute_rows_kernel<true>
        <<<grid_for(n * (D / 4)), kThreads, 0, stream>>>(src, n_src, idx, out, n, D, r.error_dev);
  else
    permute_rows_kernel<false>
        <<<grid_for(n * D), kThreads, 0, stream>>>(src, n_src, idx, out, n, D, r.error_dev);
  check_launch(op);
}

void unpermute_rows(const ExecContext& ctx, const float* src, const int64_t* perm, float* out,
                    int64_t n, int D) {
  const char* op = "unpermute_rows";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  int32_t* marks = nullptr;  // [n] targets seen
  carve_scratch(r, [&](ScratchLayout& s) { marks = s.take<int32_t>(n); });
  CUDA_CHECK(cudaMemsetAsync(marks, 0, sizeof(int32_t) * n, stream));
  check_permutation_kernel<<<grid_for(n), kThreads, 0, stream>>>(perm, n, marks, r.error_dev);
  if (D % 4 == 0 && aligned16(src) && aligned16(out))
    unpermute_rows_kernel<true>
        <<<grid_for(n * (D / 4)), kThreads, 0, stream>>>(src, perm, out, n, D, r.error_dev);
  else
    unpermute_rows_kernel<false>
        <<<grid_for(n * D), kThreads, 0, stream>>>(src, perm, out, n, D, r.error_dev);
  check_launch(op);
}

void scatter_rows_dense(const ExecContext& ctx, const int32_t* rows, const float* grads, int64_t n,
                        int D, int64_t N, float* dense) {
  const char* op = "scatter_rows_dense";
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  if (N == 0) return;
  CUDA_CHECK(cudaMemsetAsync(dense, 0, size_t(N) * (size_t(D) + 1) * sizeof(float), stream));
  if (n == 0) return;
  scatter_rows_dense_kernel<<<grid_for(n * (int64_t(D) + 1)), kThreads, 0, stream>>>(
      rows, grads, n, D, N, dense, r.error_dev);
  check_launch(op);
}

void compact_touched_rows(const ExecContext& ctx, const float* dense, int64_t N, int D,
                          int32_t* out_rows, float* out_grads, int64_t* n_out) {
  const char* op = "compact_touched_rows";
  if (N == 0) {
    *n_out = 0;
    return;
  }
  check_int_range(op, "N", N);
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  const int n = static_cast<int>(N);
  size_t scan_bytes = 0;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes,
                                           static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), n, stream));
  int32_t* flags = nullptr;
  int32_t* scan = nullptr;
  void* temp = nullptr;
  carve_scratch(r, [&](ScratchLayout& s) {
    flags = s.take<int32_t>(N);
    scan = s.take<int32_t>(N);
    temp = s.take<char>(std::max(scan_bytes, size_t{1}));
  });
  touched_flags_kernel<<<grid_for(N), kThreads, 0, stream>>>(dense, N, D, flags);
  check_launch(op);
  size_t bytes = scan_bytes;
  CUDA_CHECK(cub::DeviceScan::InclusiveSum(temp, bytes, flags, scan, n, stream));
  touched_rows_kernel<<<grid_for(N), kThreads, 0, stream>>>(flags, scan, N, out_rows);
  check_launch(op);
  auto* host = static_cast<int32_t*>(r.pinned(sizeof(int32_t)));
  CUDA_CHECK(
      cudaMemcpyAsync(host, scan + (N - 1), sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  sync_and_raise(ctx, r);
  const int64_t m = *host;
  *n_out = m;
  if (m == 0) return;
  touched_grads_kernel<<<grid_for(m * D), kThreads, 0, stream>>>(dense, out_rows, m, D, out_grads);
  check_launch(op);
}

void pack_bf16(const ExecContext& ctx, const float* src, uint16_t* out, int64_t n) {
  if (n == 0) return;
  pack_bf16_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(src, out, n);
  check_launch("pack_bf16");
}

void unpack_bf16(const ExecContext& ctx, const uint16_t* src, float* out, int64_t n) {
  if (n == 0) return;
  unpack_bf16_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(src, out, n);
  check_launch("unpack_bf16");
}

void round_bf16(const ExecContext& ctx, float* x, int64_t n) {
  if (n == 0) return;
  round_bf16_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(x, n);
  check_launch("round_bf16");
}

}  // namespace ncf::cuda
