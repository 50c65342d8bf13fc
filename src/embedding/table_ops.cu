// CUDA twins of table_ops.h: the row gather, the owner-side sort-and-reduce
// (CUB radix sort, run-length encoding, then the sums in table_ops.h's sub-run
// order — the CPU's order, so the sums are bit-identical to it), the table
// optimizers, and the fused update that sums each run in registers and applies
// the rule to its row in the same kernel. A run longer than kSubRun (a hot id:
// ~10^4 repeats per 2^20-row batch under Zipf item popularity) is not walked by
// one thread: one thread per (sub-run, column) writes the sub-run sums to
// scratch first, so no thread adds more than max(kSubRun, sub-runs of the
// longest run) terms.
//
// The update formulas are common/update_rules.cuh's, shared with the dense
// optimizers and the CPU. Table kernels read and write float4s when D % 4 == 0
// and every array is 16-byte aligned, scalars otherwise. Bad rows / ids are
// recorded in the device error record (see common/cuda_context.h); a pending
// record makes the update kernels do nothing, so a table is never half-updated.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "common/cuda_util.cuh"
#include "common/update_rules.cuh"
#include "embedding/table_ops.h"

namespace ncf::cuda {
namespace {

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

// lanes_of on the host: lanes per row of D columns, four columns each when vec.
inline int64_t lanes_for(bool vec, int D) { return vec ? D / 4 : D; }

// The grid for `work` items, where a count on the device (count_dev, when not null) may
// leave fewer: then `work` is only their bound, and the grid no larger than the blocks r's
// GPU holds at once (the kernels' grid-stride loops cover any count; the blocks past the
// count's end leave at once).
inline unsigned grid_for_count(const CudaResources& r, int64_t work, const int32_t* count_dev) {
  const unsigned grid = grid_for(work);
  if (count_dev == nullptr) return grid;
  const int64_t resident = int64_t{std::max(r.sm_count, 1)} * (2048 / kThreads);
  return static_cast<unsigned>(std::min<int64_t>(grid, resident));
}

// The row of flat index i over rows of `lanes` lanes: one 32-bit division when every
// index of the launch fits 32 bits (k32, the usual case: the 64-bit one is a long
// emulated sequence per element), else 64-bit.
template <bool k32>
__device__ __forceinline__ int64_t row_of_lane(int64_t i, int lanes) {
  if (k32) return static_cast<uint32_t>(i) / static_cast<uint32_t>(lanes);
  return i / lanes;
}

// Every row r < R: gradient row map[r], or zero when map[r] < 0.
template <typename Rule, bool kVec>
__global__ void all_rows_kernel(Rule rule, const int32_t* map, const float* grads, int64_t R, int D,
                                const DeviceErrorRecord* err) {
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

// out[k, :w] = table[ids[k], :w] (row stride D); a bad id gives a zero row and an error record.
template <bool kVec, bool k32>
__global__ void gather_rows_kernel(const float* table, const RowId* ids, float* out, int64_t R,
                                   int64_t n, int D, int w, DeviceErrorRecord* err) {
  const int lanes = lanes_of<kVec>(w);
  const int64_t total = n * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = row_of_lane<k32>(i, lanes);
    const int d = static_cast<int>(i - k * lanes) * (kVec ? 4 : 1);
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

// float4 arithmetic of the vectorized (kVec) reduction paths.
__device__ __forceinline__ void add4(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

// Σ grads[pos[j], d..] over sorted positions j ∈ [j0, j1), left to right from
// the first row (kVec: 4 columns at once, each column its own sum).
template <bool kVec>
__device__ __forceinline__ void sum_sorted_rows(const float* grads, const int32_t* pos, int32_t j0,
                                                int32_t j1, int D, int d, float* dst) {
  if constexpr (kVec) {
    float4 acc = *reinterpret_cast<const float4*>(grads + static_cast<int64_t>(pos[j0]) * D + d);
    for (int32_t j = j0 + 1; j < j1; ++j)
      add4(acc, *reinterpret_cast<const float4*>(grads + static_cast<int64_t>(pos[j]) * D + d));
    *reinterpret_cast<float4*>(dst) = acc;
  } else {
    float acc = grads[static_cast<int64_t>(pos[j0]) * D + d];
    for (int32_t j = j0 + 1; j < j1; ++j) acc += grads[static_cast<int64_t>(pos[j]) * D + d];
    *dst = acc;
  }
}

// n_sub[i] = the sub-runs of run i when it is longer than kSubRun, else 0 (its
// sum needs no partials); n_sub[n] = 0, so the exclusive scan's last element is
// the total. run_len is zero past the unique count.
__global__ void count_sub_runs_kernel(const int32_t* run_len, int64_t n, int32_t* n_sub) {
  for (int64_t i = thread_first(); i <= n; i += thread_stride()) {
    const int32_t len = i < n ? run_len[i] : 0;
    n_sub[i] = len > kSubRun ? static_cast<int32_t>((len + kSubRun - 1) / kSubRun) : 0;
  }
}

// A count the host knows (`host`), or the one on the device (`dev`, when not null) that the
// host did not wait for; `host` is then only the launch's bound.
__device__ __forceinline__ int64_t count_of(int64_t host, const int32_t* dev) {
  return dev != nullptr ? static_cast<int64_t>(*dev) : host;
}

// owner[sub_start[u] + k] = u for each of run u's sub-runs (long runs only).
__global__ void sub_run_owner_kernel(const int32_t* n_sub, const int32_t* sub_start, int64_t n_runs,
                                     const int32_t* n_runs_dev, int32_t* owner) {
  n_runs = count_of(n_runs, n_runs_dev);
  for (int64_t u = thread_first(); u < n_runs; u += thread_stride())
    for (int32_t k = 0; k < n_sub[u]; ++k) owner[sub_start[u] + k] = static_cast<int32_t>(u);
}

// partial[s, :] = the sum of sub-run s (of the n_partials sub-runs of the long runs):
// kSubRun rows (fewer for a run's last) in sorted = input order.
// The columns `given` holds for their run's row (id unique[u]) are neither read nor
// summed: their partials are zeros, never used (run_gradient takes the given values).
template <bool kVec>
__global__ void sub_run_sums_kernel(const float* grads, const int32_t* pos, const int32_t* start,
                                    const int32_t* len, const int32_t* sub_start,
                                    const int32_t* owner, float* partial, int64_t n_partials,
                                    const int32_t* n_partials_dev, int D, const RowId* unique,
                                    GivenColumns given) {
  const int lanes = lanes_of<kVec>(D);
  const int64_t total = count_of(n_partials, n_partials_dev) * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t s = i / lanes;
    const int d = static_cast<int>(i % lanes) * (kVec ? 4 : 1);
    const int32_t u = owner[s];
    if (given.rows != nullptr && d >= given.col && unique[u] >= given.begin &&
        unique[u] < given.end) {
#pragma unroll
      for (int l = 0; l < (kVec ? 4 : 1); ++l) partial[s * D + d + l] = 0.0f;
      continue;
    }
    const int32_t j0 = start[u] + static_cast<int32_t>((s - sub_start[u]) * kSubRun);
    const int32_t j1 = min(j0 + static_cast<int32_t>(kSubRun), start[u] + len[u]);
    sum_sorted_rows<kVec>(grads, pos, j0, j1, D, d, partial + s * D + d);
  }
}

// The sum of run u in table_ops.h's order: a run of at most kSubRun rows summed
// here in input order from its first row; a longer one as its sub-run partials
// (sub_run_sums_kernel) added in sub-run order. Columns d..d+3 (kVec) or d.
struct RunList {
  const int32_t* pos = nullptr;        // [n] input positions in id order
  const int32_t* start = nullptr;      // [n_runs] first sorted position of each run
  const int32_t* len = nullptr;        // [n_runs] rows of each run
  const int32_t* n_sub = nullptr;      // [n_runs] sub-runs of a long run, 0 for a short one
  const int32_t* sub_start = nullptr;  // [n_runs] first partial of a long run
  const float* partial = nullptr;      // [sub-runs × D]
  const RowId* unique = nullptr;       // [n_runs] the run's id, ascending
  int32_t* map = nullptr;              // [map_rows] scratch for a row -> run map
  int64_t n_runs = 0;  // the runs; where n_runs_dev is set, only a bound on them (n)
  const int32_t* n_runs_dev = nullptr;  // [1] the runs on the device, when the host did not wait
  bool vec = false;                     // D % 4 == 0 and the row arrays 16-byte aligned
};

__device__ __forceinline__ int64_t run_count(const RunList& runs) {
  return count_of(runs.n_runs, runs.n_runs_dev);
}

template <bool kVec>
__device__ __forceinline__ void run_sum(const float* grads, const RunList& runs, int64_t u, int D,
                                        int d, float* dst) {
  const int32_t subs = runs.n_sub[u];
  if (subs == 0) {
    sum_sorted_rows<kVec>(grads, runs.pos, runs.start[u], runs.start[u] + runs.len[u], D, d, dst);
    return;
  }
  const float* p = runs.partial + static_cast<int64_t>(runs.sub_start[u]) * D + d;
  if constexpr (kVec) {
    float4 acc = *reinterpret_cast<const float4*>(p);
    for (int32_t k = 1; k < subs; ++k)
      add4(acc, *reinterpret_cast<const float4*>(p + static_cast<int64_t>(k) * D));
    *reinterpret_cast<float4*>(dst) = acc;
  } else {
    float acc = p[0];
    for (int32_t k = 1; k < subs; ++k) acc += p[static_cast<int64_t>(k) * D];
    *dst = acc;
  }
}

// out[u, :] = the sum of run u (sort_reduce_rows).
template <bool kVec>
__global__ void reduce_runs_kernel(const float* grads, RunList runs, float* out, int D) {
  const int lanes = lanes_of<kVec>(D);
  const int64_t total = run_count(runs) * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t u = i / lanes;
    const int d = static_cast<int>(i % lanes) * (kVec ? 4 : 1);
    run_sum<kVec>(grads, runs, u, D, d, out + u * D + d);
  }
}

// The fused update of the touched rows: row unique[u] with the sum of run u,
// summed in registers and applied right there.
template <typename Rule, bool kVec>
__global__ void update_runs_kernel(Rule rule, const float* grads, RunList runs, int D,
                                   const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  const int lanes = lanes_of<kVec>(D);
  const int64_t total = run_count(runs) * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t u = i / lanes;
    const int d = static_cast<int>(i % lanes) * (kVec ? 4 : 1);
    const int64_t dst = static_cast<int64_t>(runs.unique[u]) * D + d;
    if constexpr (kVec) {
      float4 g;
      run_sum<true>(grads, runs, u, D, d, reinterpret_cast<float*>(&g));
      rule.apply4(dst, g);
    } else {
      float g;
      run_sum<false>(grads, runs, u, D, d, &g);
      rule.apply(dst, g);
    }
  }
}

// Row-wise Adagrad, one thread per row: the first pass sums the squares of
// g + l2·p over the columns in order (update_rules.h), the second applies the
// row's multiplier. The run sums are recomputed in the second pass (the same
// bits), so no row of D floats is held per thread.
__global__ void rowwise_adagrad_runs_kernel(float* table, float* acc, const float* grads,
                                            RunList runs, int D, AdagradHyper h,
                                            const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  const int64_t n_runs = run_count(runs);
  for (int64_t u = thread_first(); u < n_runs; u += thread_stride()) {
    const int64_t row = runs.unique[u];
    float* p = table + row * D;
    float sq = 0.0f;
    for (int d = 0; d < D; ++d) {
      float g;
      run_sum<false>(grads, runs, u, D, d, &g);
      g += h.l2 * p[d];
      sq += g * g;
    }
    const float mult = rowwise_adagrad_multiplier(acc + row, sq, D, h);
    for (int d = 0; d < D; ++d) {
      float g;
      run_sum<false>(grads, runs, u, D, d, &g);
      g += h.l2 * p[d];
      p[d] -= mult * g;
    }
  }
}

// The same on the output of sort_reduce_rows: gradient row k for table row rows[k].
__global__ void rowwise_adagrad_rows_kernel(float* table, float* acc, const RowId* rows,
                                            const float* grads, int64_t n, int D, AdagradHyper h,
                                            const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  for (int64_t k = thread_first(); k < n; k += thread_stride()) {
    const int64_t row = rows[k];
    float* p = table + row * D;
    const float* g = grads + k * D;
    float sq = 0.0f;
    for (int d = 0; d < D; ++d) {
      const float x = g[d] + h.l2 * p[d];
      sq += x * x;
    }
    const float mult = rowwise_adagrad_multiplier(acc + row, sq, D, h);
    for (int d = 0; d < D; ++d) p[d] -= mult * (g[d] + h.l2 * p[d]);
  }
}

// ---- BF16 rows ---------------------------------------------------------------------------

__global__ void gather_rows_bf16_kernel(const uint16_t* table, const RowId* ids, float* out,
                                        int64_t R, int64_t n, int D, DeviceErrorRecord* err) {
  const int64_t total = n * D;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / D;
    const int d = static_cast<int>(i % D);
    const RowId r = ids[k];
    if (r >= 0 && r < R) {
      out[i] = bf16_bits_to_float(table[static_cast<int64_t>(r) * D + d]);
    } else {
      if (d == 0) record_error(err, DeviceErrorCode::kIndexOutOfRange, k, r, R);
      out[i] = 0.0f;
    }
  }
}

__global__ void scatter_rows_kernel(const float* src, const RowId* rows, float* dst, int64_t n,
                                    int D, const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  const int64_t total = n * D;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / D;
    dst[static_cast<int64_t>(rows[k]) * D + i % D] = src[i];
  }
}

__global__ void store_rows_bf16_kernel(const float* src, const RowId* rows, uint16_t* dst,
                                       int64_t n, int D, RowRounding key,
                                       const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  const int64_t total = n * D;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t k = i / D;
    const int d = static_cast<int>(i % D);
    const int64_t r = rows ? static_cast<int64_t>(rows[k]) : k;
    dst[r * D + d] = float_to_bf16_bits_stochastic(src[i], key.draw(r, d, D));
  }
}

__global__ void offset_rows_kernel(const RowId* in, int64_t n, RowId delta, RowId* out) {
  for (int64_t k = thread_first(); k < n; k += thread_stride())
    out[k] = in ? in[k] + delta : static_cast<RowId>(k);
}

// map[unique[u]] = u for every run. sort_runs checked the rows against R before: with a
// bad one recorded (the host may not have waited for that check) nothing is written.
__global__ void scatter_run_map_kernel(RunList runs, int32_t* map, const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  const int64_t n_runs = run_count(runs);
  for (int64_t u = thread_first(); u < n_runs; u += thread_stride())
    map[runs.unique[u]] = static_cast<int32_t>(u);
}

// The fused dense update: every row r < R, with the sum of run map[r] or 0.
// Run u's (row r's) gradient at columns d..: given (GivenColumns: the value, +0 where the
// run has more than one row), or the run's sum.
template <bool kVec>
__device__ __forceinline__ void run_gradient(const float* grads, const RunList& runs, int64_t u,
                                             int64_t r, int D, int d, const GivenColumns& given,
                                             float* dst) {
  if (given.rows == nullptr || d < given.col || r < given.begin || r >= given.end) {
    run_sum<kVec>(grads, runs, u, D, d, dst);
    return;
  }
  const float* v = given.rows + (r - given.begin) * (D - given.col) + (d - given.col);
  const bool canon = runs.len[u] > 1;
#pragma unroll
  for (int l = 0; l < (kVec ? 4 : 1); ++l) dst[l] = canon ? __fadd_rn(v[l], 0.0f) : v[l];
}

template <typename Rule, bool kVec, bool k32>
__global__ void update_all_rows_kernel(Rule rule, const float* grads, RunList runs,
                                       const int32_t* map, int64_t R, int D, GivenColumns given,
                                       const DeviceErrorRecord* err) {
  if (error_pending(err)) return;
  const int lanes = lanes_of<kVec>(D);
  const int64_t total = R * lanes;
  for (int64_t i = thread_first(); i < total; i += thread_stride()) {
    const int64_t r = row_of_lane<k32>(i, lanes);
    const int d = static_cast<int>(i - r * lanes) * (kVec ? 4 : 1);
    const int32_t u = map[r];
    if constexpr (kVec) {
      float4 g = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (u >= 0) run_gradient<true>(grads, runs, u, r, D, d, given, reinterpret_cast<float*>(&g));
      rule.apply4(r * D + d, g);
    } else {
      float g = 0.0f;
      if (u >= 0) run_gradient<false>(grads, runs, u, r, D, d, given, &g);
      rule.apply(r * D + d, g);
    }
  }
}

template <bool kVec, typename Rule>
void launch_update_all_rows(cudaStream_t stream, const Rule& rule, const float* grads,
                            const RunList& runs, int64_t R, int D, const GivenColumns& given,
                            const DeviceErrorRecord* err) {
  const int64_t total = R * lanes_for(kVec, D);
  if (total <= int64_t{UINT32_MAX})
    update_all_rows_kernel<Rule, kVec, true>
        <<<grid_for(total), kThreads, 0, stream>>>(rule, grads, runs, runs.map, R, D, given, err);
  else
    update_all_rows_kernel<Rule, kVec, false>
        <<<grid_for(total), kThreads, 0, stream>>>(rule, grads, runs, runs.map, R, D, given, err);
}

// Sorts ids[n] with their positions (CUB's LSD radix sort is stable: equal
// ids keep their input order), run-length encodes them into the unique ids
// (at `unique`, or in scratch when it is null) and sums the sub-runs of the
// runs longer than kSubRun. With map_rows > 0 it also carves a [map_rows]
// int32 row map. With bound > 0 the ids must lie in [0, bound): all are
// checked first and the sort reads only the bits below bound. wait: the host
// waits for the unique and sub-run counts (the one wait, which raises a bad id);
// without it they stay on the device (RunList::n_runs_dev), the launches that
// depend on them take bounds, and a bad id is raised by a later check, no row
// updated meanwhile (a pending record stops the update kernels).
RunList sort_runs(const ExecContext& ctx, CudaResources& r, const RowId* ids, const float* grads,
                  int64_t n, int D, RowId* unique, int64_t map_rows, int64_t bound,
                  DeviceErrorCode bad_id, const char* op, const GivenColumns& given = {},
                  bool wait = true) {
  const bool own_unique = unique == nullptr;
  int32_t* map = nullptr;
  check_int_range(op, "n + 1", n + 1);  // CUB counts in int; the sub-run scan takes n + 1
  const int n_int = static_cast<int>(n);
  cudaStream_t stream = stream_of(ctx);
  // Sub-runs of the runs longer than kSubRun: each such run has L > kSubRun rows
  // and ceil(L / kSubRun) < 2·L / kSubRun sub-runs, so there are fewer than
  // 2n / kSubRun in all — the partials' room, fixed before the counts are known.
  const int64_t max_partials = 2 * n / kSubRun + 1;

  const int end_bit = key_end_bit(bound);
  // CUB temporary storage: the largest of the four passes (they run one after another).
  size_t sort_bytes = 0, rle_bytes = 0, scan_bytes = 0, sub_scan_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, ids, static_cast<RowId*>(nullptr), static_cast<const int32_t*>(nullptr),
      static_cast<int32_t*>(nullptr), n_int, 0, end_bit, stream));
  CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(
      nullptr, rle_bytes, static_cast<const RowId*>(nullptr), unique,
      static_cast<int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n_int, stream));
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes,
                                           static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), n_int, stream));
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, sub_scan_bytes,
                                           static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), n_int + 1, stream));
  const size_t temp_bytes =
      std::max({sort_bytes, rle_bytes, scan_bytes, sub_scan_bytes, size_t{1}});

  RowId* sorted_ids = nullptr;    // [n] ids in sorted order
  int32_t* pos_in = nullptr;      // [n] 0..n-1
  int32_t* pos_sorted = nullptr;  // [n] input positions in id order (equal ids: input order)
  int32_t* run_len = nullptr;     // [n] rows per unique id (first n_unique used)
  int32_t* run_start = nullptr;   // [n] first sorted position of each unique id
  int32_t* n_sub = nullptr;       // [n+1] sub-runs of each long run (0: short run, or unused)
  int32_t* sub_start =
      nullptr;                  // [n+1] first partial of each long run; [n] = n_partials, the total
  int32_t* owner = nullptr;     // [max_partials] the run of each partial
  float* partial = nullptr;     // [max_partials×D] sub-run sums of the long runs
  int32_t* num_runs = nullptr;  // [1]
  void* temp = nullptr;
  carve_scratch(r, [&](ScratchLayout& s) {
    sorted_ids = s.take<RowId>(n);
    pos_in = s.take<int32_t>(n);
    pos_sorted = s.take<int32_t>(n);
    run_len = s.take<int32_t>(n);
    run_start = s.take<int32_t>(n);
    n_sub = s.take<int32_t>(n + 1);
    sub_start = s.take<int32_t>(n + 1);
    owner = s.take<int32_t>(max_partials);
    partial = s.take<float>(static_cast<size_t>(max_partials) * D);
    num_runs = s.take<int32_t>(1);
    temp = s.take<char>(temp_bytes);
    if (own_unique) unique = s.take<RowId>(n);
    if (map_rows > 0) map = s.take<int32_t>(static_cast<size_t>(map_rows));
  });

  if (bound > 0)
    check_ids_kernel<<<grid_for(n), kThreads, 0, stream>>>(ids, n, bound, bad_id, r.error_dev);
  iota_kernel<<<grid_for(n), kThreads, 0, stream>>>(pos_in, n);
  check_launch(op);
  size_t bytes = temp_bytes;
  // LSD radix sort is stable: equal ids keep their input order. Without a
  // bound, all 32 bits: CUB orders signed keys, negative ones first.
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, ids, sorted_ids, pos_in, pos_sorted,
                                             n_int, 0, end_bit, stream));
  CUDA_CHECK(cudaMemsetAsync(run_len, 0, sizeof(int32_t) * n, stream));  // the scans read all n
  bytes = temp_bytes;
  CUDA_CHECK(cub::DeviceRunLengthEncode::Encode(temp, bytes, sorted_ids, unique, run_len, num_runs,
                                                n_int, stream));
  bytes = temp_bytes;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, run_len, run_start, n_int, stream));
  count_sub_runs_kernel<<<grid_for(n + 1), kThreads, 0, stream>>>(run_len, n, n_sub);
  check_launch(op);
  bytes = temp_bytes;
  CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, n_sub, sub_start, n_int + 1, stream));

  // The unique count and the partial count: host values after the one wait, or
  // device values (the bounds n and max_partials on the host, the grids sized by them).
  int64_t n_runs = n, n_partials = max_partials;
  const int32_t* n_runs_dev = num_runs;
  const int32_t* n_partials_dev = sub_start + n;
  if (wait) {
    auto* host_counts = static_cast<int32_t*>(r.pinned(2 * sizeof(int32_t)));
    CUDA_CHECK(
        cudaMemcpyAsync(host_counts, num_runs, sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaMemcpyAsync(host_counts + 1, sub_start + n, sizeof(int32_t),
                               cudaMemcpyDeviceToHost, stream));
    sync_and_raise(ctx, r);
    n_runs = host_counts[0];
    n_partials = host_counts[1];
    n_runs_dev = n_partials_dev = nullptr;
    NCF_CHECK(n_partials >= 0 && n_partials <= max_partials, op, ": ", n_partials,
              " sub-runs exceed the bound ", max_partials);
  }
  RunList out;

  // Given columns split a row's four-column lanes only at a multiple of four.
  const bool vec = D % 4 == 0 && aligned16(grads) && aligned16(partial) &&
                   (given.rows == nullptr || (given.col % 4 == 0 && aligned16(given.rows)));
  if (n_partials > 0) {
    sub_run_owner_kernel<<<grid_for_count(r, n_runs, n_runs_dev), kThreads, 0, stream>>>(
        n_sub, sub_start, n_runs, n_runs_dev, owner);
    const int64_t lanes = lanes_for(vec, D);
    const unsigned grid = grid_for_count(r, n_partials * lanes, n_partials_dev);
    if (vec)
      sub_run_sums_kernel<true>
          <<<grid, kThreads, 0, stream>>>(grads, pos_sorted, run_start, run_len, sub_start, owner,
                                          partial, n_partials, n_partials_dev, D, unique, given);
    else
      sub_run_sums_kernel<false>
          <<<grid, kThreads, 0, stream>>>(grads, pos_sorted, run_start, run_len, sub_start, owner,
                                          partial, n_partials, n_partials_dev, D, unique, given);
    check_launch(op);
  }
  out.pos = pos_sorted;
  out.start = run_start;
  out.len = run_len;
  out.n_sub = n_sub;
  out.sub_start = sub_start;
  out.partial = partial;
  out.unique = unique;
  out.map = map;
  out.n_runs = n_runs;
  out.n_runs_dev = n_runs_dev;
  out.vec = vec;
  return out;
}

// Validates unique_rows, then applies `rule` to the n listed rows.
template <typename Rule>
void launch_touched(const ExecContext& ctx, const Rule& rule, const RowId* rows, const float* grads,
                    int64_t R, int64_t n, int D, const char* op) {
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

template <typename Rule>
void launch_update_runs(const ExecContext& ctx, CudaResources& r, const Rule& rule,
                        const float* grads, const RunList& runs, int D, const char* op) {
  if (runs.n_runs == 0) return;
  cudaStream_t stream = stream_of(ctx);
  if (runs.vec && rule.aligned())
    update_runs_kernel<Rule, true>
        <<<grid_for_count(r, runs.n_runs * (D / 4), runs.n_runs_dev), kThreads, 0, stream>>>(
            rule, grads, runs, D, r.error_dev);
  else
    update_runs_kernel<Rule, false>
        <<<grid_for_count(r, runs.n_runs * D, runs.n_runs_dev), kThreads, 0, stream>>>(
            rule, grads, runs, D, r.error_dev);
  check_launch(op);
}

}  // namespace

void reduce_update_rows(const ExecContext& ctx, const RowId* rows, const float* grads, int64_t n,
                        const TableRows& tab, const EmbeddingOptimizerConfig& opt, int64_t t,
                        int64_t* n_unique, const GivenColumns& given) {
  const char* op = "reduce_update_rows";
  const int D = tab.D;
  const int64_t R = tab.R;
  const bool dense = opt.kind == EmbeddingOptimizer::kDenseAdam;
  if (R == 0 || (n == 0 && !dense)) {
    if (n_unique) *n_unique = 0;
    return;
  }
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  RunList runs;
  if (n > 0) {
    // Every row is checked before any is updated (the CPU twin's contract): a
    // bad row is recorded and no update kernel runs, so the table is left as
    // it was; it throws here when the host waits for the unique count, else at
    // the next check. Without that wait the update is enqueued whole (no host
    // wait in a step: it can be captured in a CUDA graph).
    runs = sort_runs(ctx, r, rows, grads, n, D, nullptr, dense ? R : 0, R,
                     DeviceErrorCode::kUniqueRowOutOfRange, op, given, n_unique != nullptr);
  } else {
    int32_t* map = nullptr;
    carve_scratch(r, [&](ScratchLayout& s) { map = s.take<int32_t>(static_cast<size_t>(R)); });
    runs.map = map;
    runs.vec = D % 4 == 0 && (given.rows == nullptr || given.col % 4 == 0);
  }
  if (n_unique) *n_unique = runs.n_runs;
  switch (opt.kind) {
    case EmbeddingOptimizer::kDenseAdam: {
      const AdamRule rule{tab.table, tab.m, tab.v, adam_step_scalars(opt.adam, t)};
      fill_int_kernel<<<grid_for(R), kThreads, 0, stream>>>(runs.map, R, -1);
      if (runs.n_runs > 0)
        scatter_run_map_kernel<<<grid_for_count(r, runs.n_runs, runs.n_runs_dev), kThreads, 0,
                                 stream>>>(runs, runs.map, r.error_dev);
      if (runs.vec && rule.aligned())
        launch_update_all_rows<true>(stream, rule, grads, runs, R, D, given, r.error_dev);
      else
        launch_update_all_rows<false>(stream, rule, grads, runs, R, D, given, r.error_dev);
      check_launch(op);
      return;
    }
    case EmbeddingOptimizer::kLazyAdam:
      launch_update_runs(ctx, r, AdamRule{tab.table, tab.m, tab.v, adam_step_scalars(opt.adam, t)},
                         grads, runs, D, op);
      return;
    case EmbeddingOptimizer::kSgd:
      launch_update_runs(ctx, r, SgdRule{tab.table, opt.sgd}, grads, runs, D, op);
      return;
    case EmbeddingOptimizer::kAdagrad:
      launch_update_runs(ctx, r, AdagradRule{tab.table, tab.m, opt.adagrad}, grads, runs, D, op);
      return;
    case EmbeddingOptimizer::kRowwiseAdagrad:
      if (runs.n_runs == 0) return;
      rowwise_adagrad_runs_kernel<<<grid_for_count(r, runs.n_runs, runs.n_runs_dev), kThreads, 0,
                                    stream>>>(tab.table, tab.m, grads, runs, D, opt.adagrad,
                                              r.error_dev);
      check_launch(op);
      return;
  }
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
                       const float* row_grads, int64_t R, int64_t n, int D, const AdagradHyper& h) {
  launch_touched(ctx, AdagradRule{table, acc, h}, unique_rows, row_grads, R, n, D,
                 "embedding_adagrad");
}

void embedding_rowwise_adagrad(const ExecContext& ctx, float* table, float* acc,
                               const RowId* unique_rows, const float* row_grads, int64_t R,
                               int64_t n, int D, const AdagradHyper& h) {
  const char* op = "embedding_rowwise_adagrad";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  check_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(unique_rows, R, n, r.error_dev);
  rowwise_adagrad_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(
      table, acc, unique_rows, row_grads, n, D, h, r.error_dev);
  check_launch(op);
}

void gather_rows(const ExecContext& ctx, const float* table, const RowId* ids, float* out,
                 int64_t R, int64_t n, int D, int width) {
  const char* op = "gather_rows";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  const bool vec = D % 4 == 0 && width % 4 == 0 && aligned16(table) && aligned16(out);
  const int64_t total = n * lanes_for(vec, width);
  const bool k32 = total <= int64_t{UINT32_MAX};
  const unsigned grid = grid_for(total);
  if (vec && k32)
    gather_rows_kernel<true, true>
        <<<grid, kThreads, 0, stream>>>(table, ids, out, R, n, D, width, r.error_dev);
  else if (vec)
    gather_rows_kernel<true, false>
        <<<grid, kThreads, 0, stream>>>(table, ids, out, R, n, D, width, r.error_dev);
  else if (k32)
    gather_rows_kernel<false, true>
        <<<grid, kThreads, 0, stream>>>(table, ids, out, R, n, D, width, r.error_dev);
  else
    gather_rows_kernel<false, false>
        <<<grid, kThreads, 0, stream>>>(table, ids, out, R, n, D, width, r.error_dev);
  check_launch(op);
}

void sort_reduce_rows(const ExecContext& ctx, const RowId* ids, const float* grads, int64_t n,
                      int D, RowId* out_unique_rows, float* out_row_grads, int64_t* n_unique,
                      int64_t bound) {
  const char* op = "sort_reduce_rows";
  if (n == 0) {
    *n_unique = 0;
    return;
  }
  CudaResources& r = cuda_resources(ctx, op);
  const RunList runs = sort_runs(ctx, r, ids, grads, n, D, out_unique_rows, 0, bound,
                                 DeviceErrorCode::kSortIdOutOfRange, op);
  cudaStream_t stream = stream_of(ctx);
  if (runs.vec && aligned16(out_row_grads))
    reduce_runs_kernel<true>
        <<<grid_for(runs.n_runs * (D / 4)), kThreads, 0, stream>>>(grads, runs, out_row_grads, D);
  else
    reduce_runs_kernel<false>
        <<<grid_for(runs.n_runs * D), kThreads, 0, stream>>>(grads, runs, out_row_grads, D);
  check_launch(op);
  *n_unique = runs.n_runs;
}

void gather_rows_bf16(const ExecContext& ctx, const uint16_t* table, const RowId* ids, float* out,
                      int64_t R, int64_t n, int D) {
  const char* op = "gather_rows_bf16";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  gather_rows_bf16_kernel<<<grid_for(n * D), kThreads, 0, stream_of(ctx)>>>(table, ids, out, R, n,
                                                                            D, r.error_dev);
  check_launch(op);
}

void scatter_rows(const ExecContext& ctx, const float* src, const RowId* rows, float* dst,
                  int64_t R, int64_t n, int D) {
  const char* op = "scatter_rows";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  check_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(rows, R, n, r.error_dev);
  scatter_rows_kernel<<<grid_for(n * D), kThreads, 0, stream>>>(src, rows, dst, n, D, r.error_dev);
  check_launch(op);
}

void store_rows_bf16(const ExecContext& ctx, const float* src, const RowId* rows, uint16_t* dst,
                     int64_t R, int64_t n, int D, const RowRounding& key) {
  const char* op = "store_rows_bf16";
  if (n == 0) return;
  CudaResources& r = cuda_resources(ctx, op);
  cudaStream_t stream = stream_of(ctx);
  if (rows) check_rows_kernel<<<grid_for(n), kThreads, 0, stream>>>(rows, R, n, r.error_dev);
  store_rows_bf16_kernel<<<grid_for(n * D), kThreads, 0, stream>>>(src, rows, dst, n, D, key,
                                                                   r.error_dev);
  check_launch(op);
}

void offset_rows(const ExecContext& ctx, const RowId* in, int64_t n, RowId delta, RowId* out) {
  if (n == 0) return;
  offset_rows_kernel<<<grid_for(n), kThreads, 0, stream_of(ctx)>>>(in, n, delta, out);
  check_launch("offset_rows");
}

}  // namespace ncf::cuda
