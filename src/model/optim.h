// Optimizers for the dense parameters and the embedding tables, and the
// owner-side row reduction that precedes a table update.
//
// The scalar update rules are inline NCF_HD functions below, so the CPU loops
// (optim.cc) and the CUDA kernels (optim.cu) apply literally the same formula.
// Every op takes (ctx, arrays…, dims…, step/hyper), checks its arguments and
// dispatches once on ctx.device. Arrays live on ctx.device.
//
// L2 regularisation: every rule first sets g ← g + l2·p (the gradient of
// (l2/2)·‖p‖²). Flags --l2_dense / --l2_embedding set the l2 of the dense and
// the table optimizer.
//
// Letters: n elements (dense) or gradient rows (tables), R table rows,
// D table width, t the 1-based global step.
#pragma once

#include <math.h>

#include <cstdint>

#include "common/device.h"
#include "common/philox.h"  // NCF_HD

namespace ncf {

using RowId = int32_t;  // a row index into one table (a shard's local rows)

// Adam with the TF / Keras epsilon placement ("epsilon hat" of Kingma & Ba):
//   lr_t = lr · sqrt(1 − β2^t) / (1 − β1^t)
//   m ← β1·m + (1 − β1)·g;  v ← β2·v + (1 − β2)·g²;  p ← p − lr_t · m / (sqrt(v) + eps)
// PyTorch adds its eps to sqrt(v)/sqrt(1 − β2^t) instead; the two agree when
// eps_torch = eps / sqrt(1 − β2^t). TF Model Garden's tuned eps (1.45e-7) is
// meant for this placement.
struct AdamHyper {
  float lr = 0.001f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float l2 = 0.0f;
};

// Adagrad as Keras: acc ← acc + g²; p ← p − lr · g / (sqrt(acc) + eps). The
// accumulator starts at initial_accumulator (fill it with adagrad_init).
struct AdagradHyper {
  float lr = 0.01f;
  float initial_accumulator = 0.1f;
  float eps = 1e-7f;
  float l2 = 0.0f;
};

// Plain SGD: p ← p − lr·g.
struct SgdHyper {
  float lr = 0.01f;
  float l2 = 0.0f;
};

// The per-step Adam scalars, computed once on the host in double.
struct AdamStepScalars {
  float lr_t, beta1, beta2, eps, l2;
};
// t >= 1 (the number of updates including this one).
AdamStepScalars adam_step_scalars(const AdamHyper& h, int64_t t);

NCF_HD void adam_update(float* p, float* m, float* v, float g, const AdamStepScalars& s) {
  g += s.l2 * *p;
  *m = s.beta1 * *m + (1.0f - s.beta1) * g;
  *v = s.beta2 * *v + (1.0f - s.beta2) * g * g;
  *p -= s.lr_t * *m / (sqrtf(*v) + s.eps);
}

NCF_HD void adagrad_update(float* p, float* acc, float g, const AdagradHyper& h) {
  g += h.l2 * *p;
  *acc += g * g;
  *p -= h.lr * g / (sqrtf(*acc) + h.eps);
}

NCF_HD void sgd_update(float* p, float g, const SgdHyper& h) {
  g += h.l2 * *p;
  *p -= h.lr * g;
}

// ---- dense parameters (the flat NeuMF buffer), element-wise -----------------

void dense_adam_step(const ExecContext& ctx, float* params, const float* grads, float* m,
                     float* v, int64_t n, int64_t t, const AdamHyper& h);
void dense_adagrad_step(const ExecContext& ctx, float* params, const float* grads, float* acc,
                        int64_t n, const AdagradHyper& h);
void dense_sgd_step(const ExecContext& ctx, float* params, const float* grads, int64_t n,
                    const SgdHyper& h);
// acc[0..n) = h.initial_accumulator (ops.h fill, so no twin of its own).
void adagrad_init(const ExecContext& ctx, float* acc, int64_t n, const AdagradHyper& h);

// ---- embedding tables ---------------------------------------------------------
// A table is row-major [R×D] with state arrays of the same shape. The gradient
// comes as n rows: unique_rows[n] (strictly increasing, in [0, R)) and
// row_grads[n×D] — the output of sort_reduce_rows.

// Dense Adam semantics (TF and PyTorch references): ALL R rows are updated,
// rows not in unique_rows with gradient 0 (plus l2·p), so every row's moments
// decay and rows with nonzero moments keep moving.
void embedding_dense_adam(const ExecContext& ctx, float* table, float* m, float* v,
                          const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                          int D, int64_t t, const AdamHyper& h);
// Lazy Adam: only the n listed rows (and their moments) change; bias correction
// still uses the global step t.
void embedding_lazy_adam(const ExecContext& ctx, float* table, float* m, float* v,
                         const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                         int D, int64_t t, const AdamHyper& h);
// Touched rows only.
void embedding_sgd(const ExecContext& ctx, float* table, const RowId* unique_rows,
                   const float* row_grads, int64_t R, int64_t n, int D, const SgdHyper& h);
void embedding_adagrad(const ExecContext& ctx, float* table, float* acc, const RowId* unique_rows,
                       const float* row_grads, int64_t R, int64_t n, int D,
                       const AdagradHyper& h);

// ---- row gather and reduction ---------------------------------------------

// out[k, :] = table[ids[k], :] for k < n; every id must be in [0, R) (checked,
// the message names the position and the id).
void gather_rows(const ExecContext& ctx, const float* table, const RowId* ids, float* out,
                 int64_t R, int64_t n, int D);

// Rows per sub-run of the duplicate-gradient reduction (sort_reduce_rows).
// Fixed, so the summation order below never depends on the device or the
// thread count; it bounds the serial work of one GPU thread under a hot id.
constexpr int64_t kSubRun = 64;

// The scatter side: sorts ids[n] (a stable sort of positions, so equal ids keep
// their input order) and sums the gradient rows grads[n×D] of equal ids. The
// order, the same on both devices (bit-identical results): a run of L equal ids,
// g_0 … g_{L-1} in input order, is cut into sub-runs of kSubRun consecutive
// rows from its first one, p_s = g_{s·kSubRun} + … + g_{min(L,(s+1)·kSubRun)-1}
// added left to right, and the row's sum is p_0 + p_1 + … left to right. A run
// of L ≤ kSubRun is one plain left-to-right sum. Writes *n_unique (a host value)
// rows: out_unique_rows[*n_unique] strictly increasing and
// out_row_grads[*n_unique×D]; both outputs need room for n rows. Ids are not
// range-checked here (the optimizers do that).
void sort_reduce_rows(const ExecContext& ctx, const RowId* ids, const float* grads, int64_t n,
                      int D, RowId* out_unique_rows, float* out_row_grads, int64_t* n_unique);

#ifdef NCF_WITH_CUDA
// The CUDA twins (optim.cu); called through the dispatch in optim.cc only.
namespace cuda {
void dense_adam_step(const ExecContext& ctx, float* params, const float* grads, float* m,
                     float* v, int64_t n, int64_t t, const AdamHyper& h);
void dense_adagrad_step(const ExecContext& ctx, float* params, const float* grads, float* acc,
                        int64_t n, const AdagradHyper& h);
void dense_sgd_step(const ExecContext& ctx, float* params, const float* grads, int64_t n,
                    const SgdHyper& h);
void embedding_dense_adam(const ExecContext& ctx, float* table, float* m, float* v,
                          const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                          int D, int64_t t, const AdamHyper& h);
void embedding_lazy_adam(const ExecContext& ctx, float* table, float* m, float* v,
                         const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                         int D, int64_t t, const AdamHyper& h);
void embedding_sgd(const ExecContext& ctx, float* table, const RowId* unique_rows,
                   const float* row_grads, int64_t R, int64_t n, int D, const SgdHyper& h);
void embedding_adagrad(const ExecContext& ctx, float* table, float* acc, const RowId* unique_rows,
                       const float* row_grads, int64_t R, int64_t n, int D,
                       const AdagradHyper& h);
void gather_rows(const ExecContext& ctx, const float* table, const RowId* ids, float* out,
                 int64_t R, int64_t n, int D);
void sort_reduce_rows(const ExecContext& ctx, const RowId* ids, const float* grads, int64_t n,
                      int D, RowId* out_unique_rows, float* out_row_grads, int64_t* n_unique);
}  // namespace cuda
#endif

}  // namespace ncf
