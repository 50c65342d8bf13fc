// Layer 0 by item in training (model/ops.h): a batch's samples in runs of equal items
// (item_runs), the runs' rows (gather_run_rows), their gradients' sums (run_sums,
// run_sums_bf16) and those put back on samples or items (scatter_run_rows,
// put_run_rows). The CPU code is in ops_runs.cc, the CUDA twins in ops_runs.cu.
#pragma once

#include <cstdint>

#include "common/device.h"

namespace ncf {

// ---- layer 0 by item in training --------------------------------------------------
// A batch's samples grouped by item, so that layer 0's items' half is taken once per
// distinct item of the batch (NeuMF, "layer 0 by item"), and its gradient summed per
// item before the weight gradient's product.
//
// item_runs: ids [B] (each in [0, bound); the CPU twin checks them, naming the position
// and the id) → order [B], the samples sorted by id, equal ids in sample order (a stable
// sort); R >= the distinct ids (min(B, bound) always is) runs, the u-th distinct id in
// increasing order owning order[starts[u] .. starts[u + 1]); starts [R + 1], runs past
// the last distinct id empty (starts = B); inv [B], the run of each sample; first [R],
// the first sample of each run (order[starts[u]]), -1 for an empty run. The same arrays
// on both devices; the GPU sorts with CUB's radix sort and waits for nothing.
void item_runs(const ExecContext& ctx, const int32_t* ids, int64_t B, int64_t bound, int64_t R,
               int32_t* order, int32_t* starts, int32_t* inv, int32_t* first);
// Y[u, :w] = X[first[u], :w] (row stride ldx), or zeros where first[u] < 0, u < R: the
// runs' rows, one per distinct item (Y contiguous, [R × w]). With ids (the samples' item
// ids, [B]), X is the item table instead, read at row ids[first[u]]: the same values as
// from the samples' rows gathered from it.
void gather_run_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w,
                     const int32_t* first, int64_t R, float* Y, const int32_t* ids = nullptr);
// dP[u, :] = Σ dZ[order[k], :] over k in [starts[u], starts[u + 1]), added in k order in
// double and stored as FP32 (zeros for an empty run), u < R; dZ [B × out]. The per-item
// sum of layer 0's gradient. run_sums_bf16 reads dZ in BF16.
void run_sums(const ExecContext& ctx, const float* dZ, const int32_t* order, const int32_t* starts,
              int64_t R, int out, float* dP);
void run_sums_bf16(const ExecContext& ctx, const uint16_t* dZ, const int32_t* order,
                   const int32_t* starts, int64_t R, int out, float* dP);
// The runs' rows back onto the samples: Y[b, :w] (row stride ldy) = Σ_p Yr[p·R + inv[b], :w]
// (the parts' rows added in p order, in FP32) where b is its run's first sample
// (first[inv[b]] == b), zeros for the run's other samples, b < B; Yr [parts·R × w]. A run's
// gradient put on one of its samples: each item's sum over its samples is the run's row.
void scatter_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                      const int32_t* inv, const int32_t* first, int64_t B, float* Y, int64_t ldy);
// The runs' rows by item instead: Y[ids[first[u]], :w] (row stride ldy) = Σ_p Yr[p·R + u, :w]
// (added in p order, in FP32: the row scatter_run_rows puts on the run's first sample) for
// every run with a sample (first[u] >= 0); Y's other rows are left as they were. ids: the
// samples' item ids [B], each below Y's rows (the CPU twin checks them).
void put_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                  const int32_t* ids, const int32_t* first, int64_t bound, float* Y, int64_t ldy);

#ifdef NCF_WITH_CUDA
// The CUDA twins (ops_runs.cu); called through the dispatch in ops_runs.cc only.
namespace cuda {
void item_runs(const ExecContext& ctx, const int32_t* ids, int64_t B, int64_t bound, int64_t R,
               int32_t* order, int32_t* starts, int32_t* inv, int32_t* first);
void gather_run_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w,
                     const int32_t* first, int64_t R, float* Y, const int32_t* ids);
void run_sums(const ExecContext& ctx, const float* dZ, const int32_t* order, const int32_t* starts,
              int64_t R, int out, float* dP);
void run_sums_bf16(const ExecContext& ctx, const uint16_t* dZ, const int32_t* order,
                   const int32_t* starts, int64_t R, int out, float* dP);
void scatter_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                      const int32_t* inv, const int32_t* first, int64_t B, float* Y, int64_t ldy);
void put_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                  const int32_t* ids, const int32_t* first, int64_t bound, float* Y, int64_t ldy);
}  // namespace cuda
#endif

}  // namespace ncf
