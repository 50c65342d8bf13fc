// CUDA twins of optim.h: the dense optimizers (element-wise), the embedding
// optimizers (all rows for dense Adam, the touched rows otherwise), the row
// gather, and the owner-side sort-and-reduce (CUB radix sort, run-length
// encoding, then one thread per (unique row, column) summing its gradient rows
// in input order — the CPU's order, so the sums are bit-identical to it).
//
// The update formulas are optim.h's NCF_HD functions, shared with the CPU.
// Table kernels read and write float4s when D % 4 == 0 and every array is
// 16-byte aligned, scalars otherwise. Bad unique_rows / ids are recorded in the
// device error record (see common/cuda_context.h); a pending record makes the
// update kernels do nothing, so a table is never half-updated.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "common/cuda_util.cuh"
#include "model/optim.h"

namespace ncf::cuda {
namespace {

// ---- update rules on one element (or four) of a table and its state ---------------
// apply(i, g): element i; apply4(i, g): elements i..i+3, i a multiple of 4.

__device__ __forceinline__ float4& at4(float* base, int64_t i) {
  return *reinterpret_cast<float4*>(base + i);
}

struct AdamRule {
  float* p;
  float* m;
  float* v;
  AdamStepScalars s;
  __device__ void apply(int64_t i, float g) const { adam_update(p + i, m + i, v + i, g, s); }
  __device__ void apply4(int64_t i, float4 g) const {
    float4 P = at4(p, i), M = at4(m, i), V = at4(v, i);
    adam_update(&P.x, &M.x, &V.x, g.x, s);
    adam_update(&P.y, &M.y, &V.y, g.y, s);
    adam_update(&P.z, &M.z, &V.z, g.z, s);
    adam_update(&P.w, &M.w, &V.w, g.w, s);
    at4(p, i) = P;
    at4(m, i) = M;
    at4(v, i) = V;
  }
  bool aligned() const { return aligned16(p) && aligned16(m) && aligned16(v); }
};

struct AdagradRule {
  float* p;
  float* acc;
  AdagradHyper h;
  __device__ void apply(int64_t i, float g) const { adagrad_update(p + i, acc + i, g, h); }
  __device__ void apply4(int64_t i, float4 g) const {
    float4 P = at4(p, i), A = at4(acc, i);
    adagrad_update(&P.x, &A.x, g.x, h);
    adagrad_update(&P.y, &A.y, g.y, h);
    adagrad_update(&P.z, &A.z, g.z, h);
    adagrad_update(&P.w, &A.w, g.w, h);
    at4(p, i) = P;
    at4(acc, i) = A;
  }
  bool aligned() const { return aligned16(p) && aligned16(acc); }
};

struct SgdRule {
  float* p;
  SgdHyper h;
  __device__ void apply(int64_t i, float g) const { sgd_update(p + i, g, h); }
  __device__ void apply4(int64_t i, float4 g) const {
    float4 P = at4(p, i);
    sgd_update(&P.x, g.x, h);
    sgd_update(&P.y, g.y, h);
    sgd_update(&P.z, g.z, h);
    sgd_update(&P.w, g.w, h);
    at4(p, i) = P;
  }
  bool aligned() const { return aligned16(p); }
};

// ---- kernels ------------------------------------------------------------------------

// Dense parameters: element i of params with gradient grads[i].
template <typename Rule>
__global__ void dense_kernel(Rule rule, const float* grads, int64_t n) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) rule.apply(i, grads[i]);
}

// The contract on unique_rows: inside [0, R) and strictly increasing.
__global__ void check_rows_kernel(const RowId* rows, int64_t R, int64_t n, DeviceErrorRecord* err) {
  for (int64_t k = thread_first(); k < n; k += thread_stride()) {
    const RowId r = rows[k];
    if (r < 0 || r >= R)
      record_error(err, DeviceErrorCode::kUniqueRowOutOfRange, k, r, R);
    else if (k > 0 && r <= rows[k - 1])
      record_error(err, DeviceErrorCode::kUniqueRowsNotIncreasing, k, r, rows[k - 1]);
  }
}

// map[r] = k for the gradient row k of table row r (map starts at -1 everywhere).
__global__ void scatter_row_map_kernel(const RowId* rows, int64_t n, int32_t* map,
                                       const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  for (int64_t k = thread_first(); k < n; k += thread_stride())
    map[rows[k]] = static_cast<int32_t>(k);
}

__global__ void fill_int_kernel(int32_t* x, int64_t n, int32_t value) {
  for (int64_t i = thread_first(); i < n; i += thread_stride()) x[i] = value;
}

// kVec: each thread takes 4 consecutive columns as one float4.
template <bool kVec>
__device__ __forceinline__ int lanes_of(int D) {
  return kVec ? D / 4 : D;
}

// Every row r < R: gradient row map[r], or zero when map[r] < 0.
template <typename Rule, bool kVec>
__global__ void all_rows_kernel(Rule rule, const int32_t* map, const float* grads, int64_t R,
                                int D, const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  const int lanes = lanes_of<kVec>(D);
  const int64_t total = R * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t r = i / lanes;
    const int d = static_cast<int>(i % lanes) * (kVec ? 4 : 1);
    const int32_t k = map[r];
    const int64_t dst = r * D + d, src = static_cast<int64_t>(k) * D + d;
    if constexpr (kVec) {
      rule.apply4(dst, k >= 0 ? *reinterpret_cast<const float4*>(grads + src)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f));
    } else {
      rule.apply(dst, k >= 0 ? grads[src] : 0.0f);
    }
  }
}

// The n listed rows only: gradient row k updates table row rows[k].
template <typename Rule, bool kVec>
__global__ void touched_rows_kernel(Rule rule, const RowId* rows, const float* grads, int64_t n,
                                    int D, const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  const int lanes = lanes_of<kVec>(D);
  const int64_t total = n * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / lanes;
    const int d = static_cast<int>(i % lanes) * (kVec ? 4 : 1);
    const int64_t dst = static_cast<int64_t>(rows[k]) * D + d, src = k * D + d;
    if constexpr (kVec) {
      rule.apply4(dst, *reinterpret_cast<const float4*>(grads + src));
    } else {
      rule.apply(dst, grads[src]);
    }
  }
}

// out[k, :] = table[ids[k], :]; a bad id gives a zero row and an error record.
template <bool kVec>
__global__ void gather_rows_kernel(const float* table, const RowId* ids, float* out, int64_t R,
                                   int64_t n, int D, DeviceErrorRecord* err) {
  const int lanes = lanes_of<kVec>(D);
  const int64_t total = n * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / lanes;
    const int d = static_cast<int>(i % lanes) * (kVec ? 4 : 1);
    const RowId id = ids[k];
    const bool ok = id >= 0 && id < R;
    if (!ok && d == 0) record_error(err, DeviceErrorCode::kGatherRowOutOfRange, k, id, R);
    const int64_t src = static_cast<int64_t>(id) * D + d, dst = k * D + d;
    if constexpr (kVec) {
      *reinterpret_cast<float4*>(out + dst) =
          ok ? *reinterpret_cast<const float4*>(table + src) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    } else {
      out[dst] = ok ? table[src] : 0.0f;
    }
  }
}

// out[u, :] = Σ grads[pos[j], :] over the u-th run j ∈ [start[u], start[u] + len[u])
// of the id-sorted positions, added in run order (= input order: the sort is
// stable) starting from the first row, exactly as the CPU does.
template <bool kVec>
__global__ void reduce_runs_kernel(const float* grads, const int32_t* pos, const int32_t* start,
                                   const int32_t* len, float* out, int64_t U, int D) {
  const int lanes = lanes_of<kVec>(D);
  const int64_t total = U * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t u = i / lanes;
    const int d = static_cast<int>(i % lanes) * (kVec ? 4 : 1);
    const int32_t j0 = start[u], j1 = start[u] + len[u];
    if constexpr (kVec) {
      float4 acc = *reinterpret_cast<const float4*>(grads + static_cast<int64_t>(pos[j0]) * D + d);
      for (int32_t j = j0 + 1; j < j1; ++j) {
        const float4 g = *reinterpret_cast<const float4*>(grads + static_cast<int64_t>(pos[j]) * D + d);
        acc.x += g.x;
        acc.y += g.y;
        acc.z += g.z;
        acc.w += g.w;
      }
      *reinterpret_cast<float4*>(out + u * D + d) = acc;
    } else {
      float acc = grads[static_cast<int64_t>(pos[j0]) * D + d];
      for (int32_t j = j0 + 1; j < j1; ++j) acc += grads[static_cast<int64_t>(pos[j]) * D + d];
      out[u * D + d] = acc;
    }
  }
}

// ---- launchers ------------------------------------------------------------------------

template <typename Rule>
void launch_dense(const ExecContext& ctx, const Rule& rule, const float* grads, int64_t n,
                  const char* op) {
  if (n == 0) return;
  dense_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(rule, grads, n);
  check_launch(op);
}

// Validates unique_rows, then applies `rule` to the n listed rows.
template <typename Rule>
void launch_touched(const ExecContext& ctx, const Rule& rule, const RowId* rows,
                    const float* grads, int64_t R, int64_t n, int D, const char* op) {
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  check_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(rows, R, n, r.error_dev);
  if (D % 4 == 0 && rule.aligned() && aligned16(grads))
    touched_rows_kernel<Rule, true>
        <<<grid_for(n * (D / 4)), kThreads, 0, stream>>>(rule, rows, grads, n, D, r.error_dev);
  else
    touched_rows_kernel<Rule, false>
        <<<grid_for(n * D), kThreads, 0, stream>>>(rule, rows, grads, n, D, r.error_dev);
  check_launch(op);
}

}  // namespace

void dense_adam_step(const ExecContext& ctx, float* params, const float* grads, float* m,
                     float* v, int64_t n, int64_t t, const AdamHyper& h) {
  launch_dense(ctx, AdamRule{params, m, v, adam_step_scalars(h, t)}, grads, n, "dense_adam_step");
}

void dense_adagrad_step(const ExecContext& ctx, float* params, const float* grads, float* acc,
                        int64_t n, const AdagradHyper& h) {
  launch_dense(ctx, AdagradRule{params, acc, h}, grads, n, "dense_adagrad_step");
}

void dense_sgd_step(const ExecContext& ctx, float* params, const float* grads, int64_t n,
                    const SgdHyper& h) {
  launch_dense(ctx, SgdRule{params, h}, grads, n, "dense_sgd_step");
}

void embedding_dense_adam(const ExecContext& ctx, float* table, float* m, float* v,
                          const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                          int D, int64_t t, const AdamHyper& h) {
  const char* op = "embedding_dense_adam";
  if (R == 0) return;
  check_int_range(op, "n", n);
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  // A dense map table row → gradient row (or -1): one lookup per row instead
  // of a binary search in unique_rows.
  int32_t* map = nullptr;
  carve_scratch(r, [&](ScratchLayout& s) { map = s.take<int32_t>(static_cast<size_t>(R)); });
  fill_int_kernel<<<grid_for(R), kThreads, 0, stream>>>(map, R, -1);
  if (n > 0) {
    check_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(unique_rows, R, n, r.error_dev);
    scatter_row_map_kernel<<<grid_for(n), kThreads, 0, stream>>>(unique_rows, n, map, r.error_dev);
  }
  const AdamRule rule{table, m, v, adam_step_scalars(h, t)};
  if (D % 4 == 0 && rule.aligned() && (n == 0 || aligned16(row_grads)))
    all_rows_kernel<AdamRule, true>
        <<<grid_for(R * (D / 4)), kThreads, 0, stream>>>(rule, map, row_grads, R, D, r.error_dev);
  else
    all_rows_kernel<AdamRule, false>
        <<<grid_for(R * D), kThreads, 0, stream>>>(rule, map, row_grads, R, D, r.error_dev);
  check_launch(op);
}

void embedding_lazy_adam(const ExecContext& ctx, float* table, float* m, float* v,
                         const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                         int D, int64_t t, const AdamHyper& h) {
  launch_touched(ctx, AdamRule{table, m, v, adam_step_scalars(h, t)}, unique_rows, row_grads, R, n,
                 D, "embedding_lazy_adam");
}

void embedding_sgd(const ExecContext& ctx, float* table, const RowId* unique_rows,
                   const float* row_grads, int64_t R, int64_t n, int D, const SgdHyper& h) {
  launch_touched(ctx, SgdRule{table, h}, unique_rows, row_grads, R, n, D, "embedding_sgd");
}

void embedding_adagrad(const ExecContext& ctx, float* table, float* acc, const RowId* unique_rows,
                       const float* row_grads, int64_t R, int64_t n, int D,
                       const AdagradHyper& h) {
  launch_touched(ctx, AdagradRule{table, acc, h}, unique_rows, row_grads, R, n, D,
                 "embedding_adagrad");
}

void gather_rows(const ExecContext& ctx, const float* table, const RowId* ids, float* out,
                 int64_t R, int64_t n, int D) {
  const char* op = "gather_rows";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  if (D % 4 == 0 && aligned16(table) && aligned16(out))
    gather_rows_kernel<true>
        <<<grid_for(n * (D / 4)), kThreads, 0, stream>>>(table, ids, out, R, n, D, r.error_dev);
  else
    gather_rows_kernel<false>
        <<<grid_for(n * D), kThreads, 0, stream>>>(table, ids, out, R, n, D, r.error_dev);
  check_launch(op);
}

void sort_reduce_rows(const ExecContext& ctx, const RowId* ids, const float* grads, int64_t n,
                      int D, RowId* out_unique_rows, float* out_row_grads, int64_t* n_unique) {
  const char* op = "sort_reduce_rows";
  if (n == 0) {
    *n_unique = 0;
    return;
  }
  check_int_range(op, "n", n);  // CUB's run-length encoding counts in int
  const int N = static_cast<int>(n);
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);

  // CUB temporary storage: the largest of the three passes (they run one after another).
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, ids, static_cast<RowId*>(nullptr),
                                             static_cast<const int32_t*>(nullptr),
                                             static_cast<int32_t*>(nullptr), N, 0,
                                             int(sizeof(RowId) * 8), stream));
  CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, rle_bytes, static_cast<const RowId*>(nullptr),
                                                out_unique_rows, static_cast<int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), N, stream));
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), N, stream));
  const size_t temp_bytes = std::max({sort_bytes, rle_bytes, scan_bytes, size_t{1}});

  RowId* sorted_ids = nullptr;   // [n] ids in sorted order
  int32_t* pos_in = nullptr;     // [n] 0..n-1
  int32_t* pos_sorted = nullptr; // [n] input positions in id order (equal ids: input order)
  int32_t* run_len = nullptr;    // [n] rows per unique id (first n_unique used)
  int32_t* run_start = nullptr;  // [n] first sorted position of each unique id
  int32_t* num_runs = nullptr;   // [1]
  void* temp = nullptr;
  carve_scratch(r, [&](ScratchLayout& s) {
    sorted_ids = s.take<RowId>(n);
    pos_in = s.take<int32_t>(n);
    pos_sorted = s.take<int32_t>(n);
    run_len = s.take<int32_t>(n);
    run_start = s.take<int32_t>(n);
    num_runs = s.take<int32_t>(1);
    temp = s.take<char>(temp_bytes);
  });

  iota_kernel<<<grid_for(n), kThreads, 0, stream>>>(pos_in, n);
  check_launch(op);
  size_t bytes = temp_bytes;
  // LSD radix sort is stable: equal ids keep their input order.
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, ids, sorted_ids, pos_in, pos_sorted, N, 0,
                                             int(sizeof(RowId) * 8), stream));
  CUDA_CHECK(cudaMemsetAsync(run_len, 0, sizeof(int32_t) * n, stream));  // the scan reads all n
  bytes = temp_bytes;
  CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp, bytes, sorted_ids, out_unique_rows, run_len,
                                                num_runs, N, stream));
  bytes = temp_bytes;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, run_len, run_start, N, stream));

  // The one wait: the unique count is a host value.
  auto* host_runs = static_cast<int32_t*>(r.pinned(sizeof(int32_t)));
  CUDA_CHECK(cudaMemcpyAsync(host_runs, num_runs, sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  sync_and_raise(ctx, r);
  const int64_t U = *host_runs;

  if (D % 4 == 0 && aligned16(grads) && aligned16(out_row_grads))
    reduce_runs_kernel<true><<<grid_for(U * (D / 4)), kThreads, 0, stream>>>(
        grads, pos_sorted, run_start, run_len, out_row_grads, U, D);
  else
    reduce_runs_kernel<false><<<grid_for(U * D), kThreads, 0, stream>>>(
        grads, pos_sorted, run_start, run_len, out_row_grads, U, D);
  check_launch(op);
  *n_unique = U;
}

}  // namespace ncf::cuda
