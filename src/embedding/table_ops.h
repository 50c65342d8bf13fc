// The table side of an embedding step, on one rank's rows: the row gather, the
// sort-and-reduce of duplicate gradient rows, the four table optimizers, and
// the fused update that does the last two in one pass (sort the rows, sum each
// run of duplicates in a fixed order and apply the optimizer to that row right
// there, with no gradient buffer in between). CPU versions in table_ops.cc,
// CUDA twins with the same names and arguments in table_ops.cu; the update
// formulas are common/update_rules.h's, shared by both.
//
// A table is row-major [R×D] with optimizer state arrays of the same shape,
// except row-wise Adagrad's accumulator: one float per row, [R].
// Letters: R rows the rank holds, D width, n gradient rows or ids, t the
// 1-based global step. Arrays live on ctx.device.
#pragma once

#include <cstdint>
#include <string>

#include "common/bf16.h"
#include "common/device.h"
#include "common/philox.h"
#include "common/update_rules.h"
#include "embedding/embedding_kernels.h"  // KeyLayout

namespace ncf {

using RowId = int32_t;  // a row index into the rows one rank holds

enum class EmbeddingOptimizer { kDenseAdam, kLazyAdam, kSgd, kAdagrad, kRowwiseAdagrad };
const char* optimizer_name(EmbeddingOptimizer o);
EmbeddingOptimizer parse_embedding_optimizer(const std::string& s);
// Optimizer state arrays of a table (Adam 2, Adagrad and row-wise Adagrad 1, SGD 0).
int optimizer_state_arrays(EmbeddingOptimizer o);
// Optimizer state floats per row of width D (Adam 2D, Adagrad D, row-wise Adagrad 1, SGD 0).
int64_t optimizer_state_floats_per_row(EmbeddingOptimizer o, int D);

struct EmbeddingOptimizerConfig {
  EmbeddingOptimizer kind = EmbeddingOptimizer::kDenseAdam;
  AdamHyper adam;
  AdagradHyper adagrad;
  SgdHyper sgd;
};

// Rows and their optimizer state: table[R×D]; m is Adam's first moment or
// Adagrad's accumulator ([R×D]), or row-wise Adagrad's ([R]), v Adam's second
// moment (null where unused).
struct TableRows {
  float* table = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t R = 0;
  int D = 0;
};

// ---- the fused update ----------------------------------------------------------

// Columns of some rows' summed gradient given directly to reduce_update_rows: table rows
// [begin, end) take columns [col, D) of their sum from rows[(r − begin)·(D − col) + d − col]
// instead of adding up those columns of their gradient rows, which are not read (they may
// be unwritten). The value is the sum those gradient rows would have if the row's first
// one (in input order) carried the given columns and its others zeros: the given value,
// plus +0 where the row has more than one gradient row (a −0 comes out +0, as from the
// sum). Only the rows touched by the batch are read. rows null: no columns given.
struct GivenColumns {
  const float* rows = nullptr;
  int64_t begin = 0, end = 0;
  int col = 0;
};

// The owner's whole backward on its rows: rows[n] (each in [0, R), repeats
// allowed, any order) with gradient rows grads[n×D]. Equal rows are summed in
// sort_reduce_rows' order and the optimizer is applied to each touched row
// once; dense Adam also decays every untouched row (gradient 0). The result is
// bit for bit that of sort_reduce_rows followed by the matching embedding_*
// optimizer below. Rows are checked (the message names the position and the
// row); *n_unique (host, may be null) receives the distinct rows. On CUDA the
// host waits for the GPU only when n_unique is asked for; without it the whole
// update is enqueued and a bad row, recorded on the device (no row updated), is
// raised by the next check_device_errors or synchronizing op. given: columns
// given directly (dense Adam only; see GivenColumns).
void reduce_update_rows(const ExecContext& ctx, const RowId* rows, const float* grads, int64_t n,
                        const TableRows& tab, const EmbeddingOptimizerConfig& opt, int64_t t,
                        int64_t* n_unique = nullptr, const GivenColumns& given = {});

// ---- the three steps the fused update joins, and the gather --------------------

// out[k, :] = table[ids[k], :] for k < n; every id must be in [0, R) (checked,
// the message names the position and the id). width in [1, D] (0: D): only the
// first width columns of each row are copied, both arrays keeping the row stride D
// (out's other columns are left as they were).
void gather_rows(const ExecContext& ctx, const float* table, const RowId* ids, float* out,
                 int64_t R, int64_t n, int D, int width = 0);

// Rows per sub-run of the duplicate-gradient reduction (sort_reduce_rows).
// Fixed, so the summation order below never depends on the device or the
// thread count; it bounds the serial work of one GPU thread under a hot id.
constexpr int64_t kSubRun = 64;

// Sorts ids[n] (a stable sort of positions, so equal ids keep their input
// order) and sums the gradient rows grads[n×D] of equal ids. The order, the
// same on both devices (bit-identical results): a run of L equal ids,
// g_0 … g_{L-1} in input order, is cut into sub-runs of kSubRun consecutive
// rows from its first one, p_s = g_{s·kSubRun} + … + g_{min(L,(s+1)·kSubRun)-1}
// added left to right, and the row's sum is p_0 + p_1 + … left to right. A run
// of L ≤ kSubRun is one plain left-to-right sum. Writes *n_unique (a host value)
// rows: out_unique_rows[*n_unique] strictly increasing and
// out_row_grads[*n_unique×D]; both outputs need room for n rows. Ids must be
// >= 0, and below bound when bound > 0 (checked; the sorts then read only the
// bits below bound); the optimizers check them against their table.
void sort_reduce_rows(const ExecContext& ctx, const RowId* ids, const float* grads, int64_t n,
                      int D, RowId* out_unique_rows, float* out_row_grads, int64_t* n_unique,
                      int64_t bound = 0);

// The table optimizers on the output of sort_reduce_rows: unique_rows[n]
// (strictly increasing, in [0, R); checked) and row_grads[n×D].
//
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
                       const float* row_grads, int64_t R, int64_t n, int D, const AdagradHyper& h);
// Touched rows only; acc[R] holds one accumulator per row.
void embedding_rowwise_adagrad(const ExecContext& ctx, float* table, float* acc,
                               const RowId* unique_rows, const float* row_grads, int64_t R,
                               int64_t n, int D, const AdagradHyper& h);
// The optimizer `opt` names, on the output of sort_reduce_rows.
void apply_table_optimizer(const ExecContext& ctx, const TableRows& tab, const RowId* unique_rows,
                           const float* row_grads, int64_t n, const EmbeddingOptimizerConfig& opt,
                           int64_t t);

// ---- BF16 rows (--table_dtype bf16) ------------------------------------------

// The key of the stochastic rounding that writes an updated row back: flat row
// `first + r` of rank `rank` under `layout` is global row id of layout table u,
// and its column d at step t draws word t·D + d of the counter stream (seed,
// kStreamTableRounding, tag[u] << 40 | id). The draw depends on the seed, the
// step, the table, the global row and the column only: not on W, the rank,
// threads or device. A plain struct, passed by value to kernels.
struct RowRounding {
  uint64_t seed = 0;
  int64_t step = 0;
  int64_t first = 0;
  int rank = 0;
  KeyLayout layout;
  uint32_t tag[kMaxTables] = {};

  NCF_HD uint32_t draw(int64_t r, int d, int D) const {
    int u = 0;
    const int64_t id = layout.id_of_row(first + r, rank, &u);
    const CounterRng rng{seed, kStreamTableRounding, (uint64_t(tag[u]) << 40) | uint64_t(id)};
    return rng.u32(uint64_t(step) * uint64_t(D) + uint64_t(d));
  }
};

// out[k, :] = table[ids[k], :] widened to FP32; ids in [0, R) (checked).
void gather_rows_bf16(const ExecContext& ctx, const uint16_t* table, const RowId* ids, float* out,
                      int64_t R, int64_t n, int D);
// dst[rows[k], :] = src[k, :] for k < n; rows strictly increasing in [0, R) (checked).
void scatter_rows(const ExecContext& ctx, const float* src, const RowId* rows, float* dst,
                  int64_t R, int64_t n, int D);
// dst[r, :] = src[k, :] rounded stochastically to BF16 with key.draw(r, d, D),
// where r = rows[k] (strictly increasing in [0, R); checked), or r = k when
// rows is null.
void store_rows_bf16(const ExecContext& ctx, const float* src, const RowId* rows, uint16_t* dst,
                     int64_t R, int64_t n, int D, const RowRounding& key);
// out[k] = in[k] + delta for k < n, or out[k] = k when in is null.
void offset_rows(const ExecContext& ctx, const RowId* in, int64_t n, RowId delta, RowId* out);

#ifdef NCF_WITH_CUDA
// The CUDA twins (table_ops.cu); called through the dispatch in table_ops.cc.
namespace cuda {
void reduce_update_rows(const ExecContext& ctx, const RowId* rows, const float* grads, int64_t n,
                        const TableRows& tab, const EmbeddingOptimizerConfig& opt, int64_t t,
                        int64_t* n_unique, const GivenColumns& given);
void gather_rows(const ExecContext& ctx, const float* table, const RowId* ids, float* out,
                 int64_t R, int64_t n, int D, int width);
void sort_reduce_rows(const ExecContext& ctx, const RowId* ids, const float* grads, int64_t n,
                      int D, RowId* out_unique_rows, float* out_row_grads, int64_t* n_unique,
                      int64_t bound);
void embedding_dense_adam(const ExecContext& ctx, float* table, float* m, float* v,
                          const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                          int D, int64_t t, const AdamHyper& h);
void embedding_lazy_adam(const ExecContext& ctx, float* table, float* m, float* v,
                         const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                         int D, int64_t t, const AdamHyper& h);
void embedding_sgd(const ExecContext& ctx, float* table, const RowId* unique_rows,
                   const float* row_grads, int64_t R, int64_t n, int D, const SgdHyper& h);
void embedding_adagrad(const ExecContext& ctx, float* table, float* acc, const RowId* unique_rows,
                       const float* row_grads, int64_t R, int64_t n, int D, const AdagradHyper& h);
void embedding_rowwise_adagrad(const ExecContext& ctx, float* table, float* acc,
                               const RowId* unique_rows, const float* row_grads, int64_t R,
                               int64_t n, int D, const AdagradHyper& h);
void gather_rows_bf16(const ExecContext& ctx, const uint16_t* table, const RowId* ids, float* out,
                      int64_t R, int64_t n, int D);
void scatter_rows(const ExecContext& ctx, const float* src, const RowId* rows, float* dst,
                  int64_t R, int64_t n, int D);
void store_rows_bf16(const ExecContext& ctx, const float* src, const RowId* rows, uint16_t* dst,
                     int64_t R, int64_t n, int D, const RowRounding& key);
void offset_rows(const ExecContext& ctx, const RowId* in, int64_t n, RowId delta, RowId* out);
}  // namespace cuda
#endif

}  // namespace ncf
