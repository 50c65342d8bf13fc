// CUDA twins of the item-run ops in ops_runs.h (same names and arguments; the CPU
// functions check the arguments and forward here when ctx.device is kCuda): the runs from
// CUB's radix sort (id_runs.cuh), their rows, sums and scatters. Everything runs on
// ctx.stream.

#include "common/bf16.h"
#include "common/cuda_util.cuh"
#include "common/id_runs.cuh"
#include "model/ops_internal.cuh"

namespace ncf::cuda {

namespace {

// ---- layer 0 by item: the batch's runs of equal items -----------------------------

// Runs past the last distinct id: empty (starts = B) with no first sample; starts[R] = B.
__global__ void empty_runs_kernel(int32_t* __restrict__ starts, int32_t* __restrict__ first,
                                  int64_t R, int32_t B) {
  for (int64_t u = thread_first(); u <= R; u += thread_stride()) {
    starts[u] = B;
    if (u < R) first[u] = -1;
  }
}

// From the inclusive scan of the heads (run[k] = 1 + the run of sorted position k):
// each sample's run, and each run's start and first sample (runs below R only).
__global__ void run_index_kernel(const int32_t* __restrict__ sorted,
                                 const int32_t* __restrict__ order, const int32_t* __restrict__ run,
                                 int64_t B, int64_t R, int32_t* __restrict__ starts,
                                 int32_t* __restrict__ inv, int32_t* __restrict__ first) {
  for (int64_t k = thread_first(); k < B; k += thread_stride()) {
    const int32_t u = run[k] - 1;
    const int32_t b = order[k];
    inv[b] = u;
    if ((k == 0 || sorted[k] != sorted[k - 1]) && u < R) {
      starts[u] = static_cast<int32_t>(k);
      first[u] = b;
    }
  }
}

// Y[u, c] = X[first[u], c] (zeros for first[u] < 0), one element per thread.
__global__ void gather_run_rows_kernel(const float* __restrict__ X, int64_t ldx, int w,
                                       const int32_t* __restrict__ first, int64_t R,
                                       float* __restrict__ Y, const int32_t* __restrict__ ids) {
  for (int64_t i = thread_first(); i < R * w; i += thread_stride()) {
    const int64_t u = i / w;
    const int c = static_cast<int>(i - u * w);
    const int32_t f = first[u];
    Y[i] = f < 0 ? 0.0f : X[int64_t{ids != nullptr ? ids[f] : f} * ldx + c];
  }
}

// scatter_run_rows: one thread per (sample b, L columns): the run's parts added in p order
// on its first sample, zeros on the others (full stores, float4 where L = 4).
template <int L>
__global__ void __launch_bounds__(kThreads)
    scatter_run_rows_kernel(const float* __restrict__ Yr, int64_t R, int parts, int w,
                            const int32_t* __restrict__ inv, const int32_t* __restrict__ first,
                            int64_t B, float* __restrict__ Y, int64_t ldy) {
  const int per_row = w / L;
  for (int64_t x = thread_first(); x < B * per_row; x += thread_stride()) {
    const int64_t b = x / per_row;
    const int c = static_cast<int>(x - b * per_row) * L;
    const int64_t u = inv[b];
    Lanes<L> v;
#pragma unroll
    for (int l = 0; l < L; ++l) v.v[l] = 0.0f;
    if (first[u] == b) {
      v = load_lanes<L>(Yr + u * w + c);
      for (int p = 1; p < parts; ++p) {
        const Lanes<L> t = load_lanes<L>(Yr + (p * R + u) * w + c);
#pragma unroll
        for (int l = 0; l < L; ++l) v.v[l] = __fadd_rn(v.v[l], t.v[l]);
      }
    }
    store_lanes<L>(Y + b * ldy + c, v);
  }
}

// Rows of a run loaded before the first add: a hot item's run (on ml-20m's popularity about
// 1,200 of a million samples) is one thread's serial chain of rounds, each a load of its
// rows' indices and then of the rows, so the rounds are long. Eight bytes a row per thread
// (BF16 four columns, FP32 four) keep the registers at three or two blocks per SM.
constexpr int kRunRowsInFlight = 16;

// L consecutive elements of a row, kept as stored (FP32, or BF16 bits) until used.
template <typename T, int L>
struct RawLanes;
template <>
struct RawLanes<float, 4> {
  float4 v;
  __device__ __forceinline__ void load(const float* __restrict__ p) {
    v = *reinterpret_cast<const float4*>(p);
  }
  __device__ __forceinline__ float at(int l) const { return (&v.x)[l]; }
};
template <>
struct RawLanes<uint16_t, 4> {
  uint2 v;
  __device__ __forceinline__ void load(const uint16_t* __restrict__ p) {
    v = *reinterpret_cast<const uint2*>(p);
  }
  __device__ __forceinline__ float at(int l) const { return lane_value((&v.x)[l >> 1], l & 1); }
};
template <typename T>
struct RawLanes<T, 1> {
  T v;
  __device__ __forceinline__ void load(const T* __restrict__ p) { v = *p; }
  __device__ __forceinline__ float at(int) const { return element_value(v); }
};

// put_run_rows: one thread per (run u, column c): the run's parts added in p order, stored
// at its item's row.
__global__ void put_run_rows_kernel(const float* __restrict__ Yr, int64_t R, int parts, int w,
                                    const int32_t* __restrict__ ids,
                                    const int32_t* __restrict__ first, float* __restrict__ Y,
                                    int64_t ldy) {
  for (int64_t x = thread_first(); x < R * w; x += thread_stride()) {
    const int64_t u = x / w;
    const int c = static_cast<int>(x - u * w);
    const int32_t f = first[u];
    if (f < 0) continue;
    float v = Yr[u * w + c];
    for (int p = 1; p < parts; ++p) v = __fadd_rn(v, Yr[(p * R + u) * w + c]);
    Y[int64_t{ids[f]} * ldy + c] = v;
  }
}

// scatter_run_rows_kernel with kSamples consecutive samples per thread (a warp's threads on
// the same samples when w / L is a multiple of 32): their runs, then their first samples,
// then their parts' rows are loaded together, so a thread waits for each of the three
// once for kSamples stores instead of once per store; the stores stream past L2 (the
// array is read again by the embedding update, not by this kernel). The same adds in the
// same order: the same bits.
template <int L, int kSamples>
__global__ void __launch_bounds__(kThreads)
    scatter_run_rows_many_kernel(const float* __restrict__ Yr, int64_t R, int parts, int w,
                                 const int32_t* __restrict__ inv, const int32_t* __restrict__ first,
                                 int64_t B, float* __restrict__ Y, int64_t ldy) {
  const int per_row = w / L;
  const int64_t groups = (B + kSamples - 1) / kSamples;
  for (int64_t x = thread_first(); x < groups * per_row; x += thread_stride()) {
    const int64_t g = x / per_row;
    const int c = static_cast<int>(x - g * per_row) * L;
    int64_t u[kSamples];
#pragma unroll
    for (int s = 0; s < kSamples; ++s) {
      const int64_t b = g * kSamples + s;
      u[s] = b < B ? inv[b] : 0;
    }
    bool head[kSamples];
#pragma unroll
    for (int s = 0; s < kSamples; ++s) {
      const int64_t b = g * kSamples + s;
      head[s] = b < B && first[u[s]] == b;
    }
    Lanes<L> v[kSamples];
#pragma unroll
    for (int s = 0; s < kSamples; ++s) {
#pragma unroll
      for (int l = 0; l < L; ++l) v[s].v[l] = 0.0f;
      if (head[s]) v[s] = load_lanes<L>(Yr + u[s] * w + c);
    }
    for (int p = 1; p < parts; ++p) {
#pragma unroll
      for (int s = 0; s < kSamples; ++s) {
        if (head[s]) {
          const Lanes<L> t = load_lanes<L>(Yr + (p * R + u[s]) * w + c);
#pragma unroll
          for (int l = 0; l < L; ++l) v[s].v[l] = __fadd_rn(v[s].v[l], t.v[l]);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < kSamples; ++s) {
      const int64_t b = g * kSamples + s;
      if (b < B) store_lanes_cs<L>(Y + b * ldy + c, v[s]);
    }
  }
}

// acc[l] += the first m of z's rows, in row order, in double (run_sums, run_sums_warp).
template <typename T, int L, int kRows>
__device__ __forceinline__ void add_loaded_rows(double (&acc)[L], const RawLanes<T, L> (&z)[kRows],
                                                int m) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    if (i < m) {
#pragma unroll
      for (int l = 0; l < L; ++l) acc[l] += static_cast<double>(z[i].at(l));
    }
  }
}

// run_sums: one thread per (run u, L columns from j) adds the run's rows in k order in
// double, kRunRowsInFlight rows loaded (as stored) before their adds; one FP32 store of
// each column. The same sums in the same order as the CPU twin: the same bits.
// kRows: the rows in flight; kMinBlocks: blocks per SM for __launch_bounds__ (0: none).
// With FP32 four columns, 16 rows take 96 registers and 2 blocks per SM: on an H200 the
// kernel ran at 30% of HBM peak, its SMs busy 72% of its time
// (the GPU kit's step_ncu_tf32 stage, 2026-11-27); 12 rows fit 80 registers
// without a spill (sm_90, ptxas -v) and 3 blocks, 24 warps and 12% more bytes in flight
// per SM (at 16 rows and 2 blocks it ran slower: the GPU kit's step_*_2blocks stages at ddeff27).
// kRows does not change any sum's order: the same bits.
template <typename T, int L, int kRows = kRunRowsInFlight, int kMinBlocks = 0>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    run_sums_kernel(const T* __restrict__ dZ, const int32_t* __restrict__ order,
                    const int32_t* __restrict__ starts, int64_t R, int out,
                    float* __restrict__ dP) {
  const int per_row = out / L;
  const int64_t total = R * per_row;
  for (int64_t x = thread_first(); x < total; x += thread_stride()) {
    const int64_t u = x / per_row;
    const int j = static_cast<int>(x - u * per_row) * L;
    double acc[L];
#pragma unroll
    for (int l = 0; l < L; ++l) acc[l] = 0.0;
    const int k1 = starts[u + 1];
    for (int k0 = starts[u]; k0 < k1; k0 += kRows) {
      const int m = k1 - k0 < kRows ? k1 - k0 : kRows;
      RawLanes<T, L> z[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        if (i < m) z[i].load(dZ + int64_t{order[k0 + i]} * out + j);
      add_loaded_rows<T, L, kRows>(acc, z, m);
    }
#pragma unroll
    for (int l = 0; l < L; ++l) dP[u * out + j + l] = static_cast<float>(acc[l]);
  }
}

// run_sums_warp: run_sums where a run's row is whole warps (out / L a multiple of 32), so
// the 32 threads of a warp share the run u. The run's indices come 32 at a time, lane i
// loading order[c + i] (one coalesced load), and reach the warp's threads by shuffles; the
// next 32 are loaded while this chunk's rows are added, so a round of kRows rows waits for
// its rows only, not for their indices first. The same rows added in the same order into
// the same doubles as run_sums_kernel: the same bits.
template <typename T, int L, int kRows, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    run_sums_warp_kernel(const T* __restrict__ dZ, const int32_t* __restrict__ order,
                         const int32_t* __restrict__ starts, int64_t R, int out,
                         float* __restrict__ dP) {
  const int per_row = out / L;
  const int64_t total = R * per_row;
  const int lane = static_cast<int>(threadIdx.x & 31);
  for (int64_t x = thread_first(); x < total; x += thread_stride()) {
    const int64_t u = x / per_row;
    const int j = static_cast<int>(x - u * per_row) * L;
    double acc[L];
#pragma unroll
    for (int l = 0; l < L; ++l) acc[l] = 0.0;
    const int k0 = starts[u], k1 = starts[u + 1];
    int32_t next = k0 + lane < k1 ? order[k0 + lane] : 0;
    for (int c = k0; c < k1; c += 32) {
      const int32_t mine = next;
      if (c + 32 + lane < k1) next = order[c + 32 + lane];
      const int mc = k1 - c < 32 ? k1 - c : 32;
      for (int i0 = 0; i0 < mc; i0 += kRows) {
        const int m = mc - i0 < kRows ? mc - i0 : kRows;
        RawLanes<T, L> z[kRows];
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          if (i < m) {
            const int32_t row = __shfl_sync(0xffffffffu, mine, i0 + i);
            z[i].load(dZ + int64_t{row} * out + j);
          }
        }
        add_loaded_rows<T, L, kRows>(acc, z, m);
      }
    }
#pragma unroll
    for (int l = 0; l < L; ++l) dP[u * out + j + l] = static_cast<float>(acc[l]);
  }
}

template <typename T, int L>
void launch_run_sums(cudaStream_t stream, const T* dZ, const int32_t* order, const int32_t* starts,
                     int64_t R, int out, float* dP) {
  // FP32 four columns a thread at 12 rows and 3 blocks per SM; the warp kernel, where it
  // applies: FP32 at 12 rows and 3 blocks per SM (78 registers on sm_90), BF16 at 16 rows
  // (71, 3 blocks).
  constexpr bool fp32 = std::is_same<T, float>::value;
  auto kernel = run_sums_kernel<T, L>;
  if constexpr (fp32 && L == 4) kernel = run_sums_kernel<T, L, 12, 3>;
  if constexpr (L == 4)
    if ((out / L) % 32 == 0)
      kernel = fp32 ? run_sums_warp_kernel<T, L, 12, 3> : run_sums_warp_kernel<T, L, 16, 0>;
  kernel<<<grid_for(R * (out / L)), kThreads, 0, stream>>>(dZ, order, starts, R, out, dP);
}

}  // namespace

// The runs of the ids (IdRuns: the positions sorted by id into order, the runs numbered),
// then each sample's run and each run's start and first sample. No host wait: the runs
// past the last distinct id are made empty first. A bad id is recorded (IdRuns checks
// them against the bound) and raised at the op's caller's next wait.
void item_runs(const ExecContext& ctx, const int32_t* ids, int64_t B, int64_t bound, int64_t R,
               int32_t* order, int32_t* starts, int32_t* inv, int32_t* first) {
  const char* op = "item_runs";
  cudaStream_t stream = stream_of(ctx);
  CudaResources& r = cuda_resources(ctx, op);
  check_int_range(op, "B", B);
  check_int_range(op, "R", R);
  empty_runs_kernel<<<grid_for(R + 1), kThreads, 0, stream>>>(starts, first, R,
                                                              static_cast<int32_t>(B));
  check_launch(op);
  if (B == 0) return;
  IdRuns runs(B, bound, stream, order);
  carve_scratch(r, [&](ScratchLayout& s) { runs.take(s); });
  runs.launch(ids, r.error_dev, op);
  run_index_kernel<<<grid_for(B), kThreads, 0, stream>>>(runs.sorted, order, runs.run, B, R, starts,
                                                         inv, first);
  check_launch(op);
}

void gather_run_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w,
                     const int32_t* first, int64_t R, float* Y, const int32_t* ids) {
  if (R == 0) return;
  gather_run_rows_kernel<<<grid_for(R * w), kThreads, 0, stream_of(ctx)>>>(X, ldx, w, first, R, Y,
                                                                           ids);
  check_launch("gather_run_rows");
}

void run_sums(const ExecContext& ctx, const float* dZ, const int32_t* order, const int32_t* starts,
              int64_t R, int out, float* dP) {
  if (R == 0) return;
  if (out % 4 == 0 && aligned16(dZ) && aligned16(dP)) {
    launch_run_sums<float, 4>(stream_of(ctx), dZ, order, starts, R, out, dP);
  } else {
    launch_run_sums<float, 1>(stream_of(ctx), dZ, order, starts, R, out, dP);
  }
  check_launch("run_sums");
}

void scatter_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                      const int32_t* inv, const int32_t* first, int64_t B, float* Y, int64_t ldy) {
  if (B == 0) return;
  if (w % 4 == 0 && ldy % 4 == 0 && aligned16(Yr) && aligned16(Y)) {
    constexpr int kSamples = 4;
    scatter_run_rows_many_kernel<4, kSamples>
        <<<grid_for((B + kSamples - 1) / kSamples * (w / 4)), kThreads, 0, stream_of(ctx)>>>(
            Yr, R, parts, w, inv, first, B, Y, ldy);
  } else {
    scatter_run_rows_kernel<1>
        <<<grid_for(B * w), kThreads, 0, stream_of(ctx)>>>(Yr, R, parts, w, inv, first, B, Y, ldy);
  }
  check_launch("scatter_run_rows");
}

void put_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                  const int32_t* ids, const int32_t* first, int64_t bound, float* Y, int64_t ldy) {
  if (R == 0) return;
  put_run_rows_kernel<<<grid_for(R * w), kThreads, 0, stream_of(ctx)>>>(Yr, R, parts, w, ids, first,
                                                                        Y, ldy);
  check_launch("put_run_rows");
}

void run_sums_bf16(const ExecContext& ctx, const uint16_t* dZ, const int32_t* order,
                   const int32_t* starts, int64_t R, int out, float* dP) {
  if (R == 0) return;
  if (out % 4 == 0 && (reinterpret_cast<uintptr_t>(dZ) & 7u) == 0) {  // 8-byte rows
    launch_run_sums<uint16_t, 4>(stream_of(ctx), dZ, order, starts, R, out, dP);
  } else {
    launch_run_sums<uint16_t, 1>(stream_of(ctx), dZ, order, starts, R, out, dP);
  }
  check_launch("run_sums_bf16");
}

}  // namespace ncf::cuda
