// CPU side of optim.h: argument checks, dispatch, and the parallel loops that
// apply the shared update rules; the row gather and the sort-and-reduce.
#include "model/optim.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/check.h"
#include "common/parallel.h"
#include "model/dispatch.h"
#include "model/ops.h"

namespace ncf {
namespace {

constexpr int64_t kElemGrain = 1 << 14;  // elements per chunk, at least

int64_t row_grain(int D) { return std::max<int64_t>(1, kElemGrain / std::max(D, 1)); }

void check_dense(const char* op, const float* params, const float* grads, int64_t n) {
  NCF_CHECK(n >= 0, op, ": negative size n=", n);
  NCF_CHECK(n == 0 || (params && grads), op, ": params or grads is null with n=", n);
}

// Shapes of a table update, and the contract on unique_rows: strictly
// increasing and inside [0, R). A violation would corrupt or race silently, so
// it is checked on every call (O(n), small next to the update itself).
void check_table(const char* op, const float* table, const RowId* unique_rows,
                 const float* row_grads, int64_t R, int64_t n, int D) {
  NCF_CHECK(R >= 0 && n >= 0, op, ": negative size R=", R, " n=", n);
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(n <= R, op, ": n=", n, " unique rows exceed the table's R=", R, " rows");
  NCF_CHECK(R == 0 || table, op, ": table is null");
  NCF_CHECK(n == 0 || (unique_rows && row_grads), op, ": unique_rows or row_grads is null");
}

void check_unique_rows(const char* op, const RowId* rows, int64_t R, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    NCF_CHECK(rows[k] >= 0 && rows[k] < R, op, ": unique_rows[", k, "]=", rows[k],
              " outside the table's rows [0, ", R, ")");
    NCF_CHECK(k == 0 || rows[k] > rows[k - 1], op, ": unique_rows not strictly increasing at [",
              k, "]: ", rows[k - 1], " then ", rows[k]);
  }
}

}  // namespace

AdamStepScalars adam_step_scalars(const AdamHyper& h, int64_t t) {
  NCF_CHECK(t >= 1, "Adam step t=", t, " must be >= 1");
  NCF_CHECK(h.beta1 >= 0.0f && h.beta1 < 1.0f, "Adam beta1=", h.beta1, " outside [0, 1)");
  NCF_CHECK(h.beta2 >= 0.0f && h.beta2 < 1.0f, "Adam beta2=", h.beta2, " outside [0, 1)");
  double td = static_cast<double>(t);
  double lr_t = h.lr * std::sqrt(1.0 - std::pow(static_cast<double>(h.beta2), td)) /
                (1.0 - std::pow(static_cast<double>(h.beta1), td));
  return AdamStepScalars{static_cast<float>(lr_t), h.beta1, h.beta2, h.eps, h.l2};
}

void dense_adam_step(const ExecContext& ctx, float* params, const float* grads, float* m,
                     float* v, int64_t n, int64_t t, const AdamHyper& h) {
  const char* op = "dense_adam_step";
  check_dense(op, params, grads, n);
  NCF_CHECK(n == 0 || (m && v), op, ": m or v is null");
  AdamStepScalars s = adam_step_scalars(h, t);
  NCF_DISPATCH_CUDA(ctx, dense_adam_step, ctx, params, grads, m, v, n, t, h);
  parallel_for(ctx.threads, n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) adam_update(&params[i], &m[i], &v[i], grads[i], s);
  });
}

void dense_adagrad_step(const ExecContext& ctx, float* params, const float* grads, float* acc,
                        int64_t n, const AdagradHyper& h) {
  const char* op = "dense_adagrad_step";
  check_dense(op, params, grads, n);
  NCF_CHECK(n == 0 || acc, op, ": acc is null");
  NCF_DISPATCH_CUDA(ctx, dense_adagrad_step, ctx, params, grads, acc, n, h);
  parallel_for(ctx.threads, n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) adagrad_update(&params[i], &acc[i], grads[i], h);
  });
}

void dense_sgd_step(const ExecContext& ctx, float* params, const float* grads, int64_t n,
                    const SgdHyper& h) {
  check_dense("dense_sgd_step", params, grads, n);
  NCF_DISPATCH_CUDA(ctx, dense_sgd_step, ctx, params, grads, n, h);
  parallel_for(ctx.threads, n, kElemGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) sgd_update(&params[i], grads[i], h);
  });
}

void adagrad_init(const ExecContext& ctx, float* acc, int64_t n, const AdagradHyper& h) {
  fill(ctx, acc, n, h.initial_accumulator);
}

void embedding_dense_adam(const ExecContext& ctx, float* table, float* m, float* v,
                          const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                          int D, int64_t t, const AdamHyper& h) {
  const char* op = "embedding_dense_adam";
  check_table(op, table, unique_rows, row_grads, R, n, D);
  NCF_CHECK(R == 0 || (m && v), op, ": m or v is null");
  AdamStepScalars s = adam_step_scalars(h, t);
  NCF_DISPATCH_CUDA(ctx, embedding_dense_adam, ctx, table, m, v, unique_rows, row_grads, R, n, D,
                    t, h);
  check_unique_rows(op, unique_rows, R, n);
  parallel_for(ctx.threads, R, row_grain(D), [&](int64_t r0, int64_t r1) {
    // The first gradient row at or after r0; rows are sorted, so one merge pass.
    int64_t k = std::lower_bound(unique_rows, unique_rows + n, r0) - unique_rows;
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = nullptr;
      if (k < n && unique_rows[k] == r) g = row_grads + k++ * D;
      float* p = table + r * D;
      float* mr = m + r * D;
      float* vr = v + r * D;
      if (g) {
        for (int d = 0; d < D; ++d) adam_update(&p[d], &mr[d], &vr[d], g[d], s);
      } else {
        for (int d = 0; d < D; ++d) adam_update(&p[d], &mr[d], &vr[d], 0.0f, s);
      }
    }
  });
}

void embedding_lazy_adam(const ExecContext& ctx, float* table, float* m, float* v,
                         const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                         int D, int64_t t, const AdamHyper& h) {
  const char* op = "embedding_lazy_adam";
  check_table(op, table, unique_rows, row_grads, R, n, D);
  NCF_CHECK(R == 0 || (m && v), op, ": m or v is null");
  AdamStepScalars s = adam_step_scalars(h, t);
  NCF_DISPATCH_CUDA(ctx, embedding_lazy_adam, ctx, table, m, v, unique_rows, row_grads, R, n, D,
                    t, h);
  check_unique_rows(op, unique_rows, R, n);
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      int64_t off = static_cast<int64_t>(unique_rows[k]) * D;
      const float* g = row_grads + k * D;
      for (int d = 0; d < D; ++d) adam_update(&table[off + d], &m[off + d], &v[off + d], g[d], s);
    }
  });
}

void embedding_sgd(const ExecContext& ctx, float* table, const RowId* unique_rows,
                   const float* row_grads, int64_t R, int64_t n, int D, const SgdHyper& h) {
  const char* op = "embedding_sgd";
  check_table(op, table, unique_rows, row_grads, R, n, D);
  NCF_DISPATCH_CUDA(ctx, embedding_sgd, ctx, table, unique_rows, row_grads, R, n, D, h);
  check_unique_rows(op, unique_rows, R, n);
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float* p = table + static_cast<int64_t>(unique_rows[k]) * D;
      const float* g = row_grads + k * D;
      for (int d = 0; d < D; ++d) sgd_update(&p[d], g[d], h);
    }
  });
}

void embedding_adagrad(const ExecContext& ctx, float* table, float* acc, const RowId* unique_rows,
                       const float* row_grads, int64_t R, int64_t n, int D,
                       const AdagradHyper& h) {
  const char* op = "embedding_adagrad";
  check_table(op, table, unique_rows, row_grads, R, n, D);
  NCF_CHECK(R == 0 || acc, op, ": acc is null");
  NCF_DISPATCH_CUDA(ctx, embedding_adagrad, ctx, table, acc, unique_rows, row_grads, R, n, D, h);
  check_unique_rows(op, unique_rows, R, n);
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      int64_t off = static_cast<int64_t>(unique_rows[k]) * D;
      const float* g = row_grads + k * D;
      for (int d = 0; d < D; ++d) adagrad_update(&table[off + d], &acc[off + d], g[d], h);
    }
  });
}

void gather_rows(const ExecContext& ctx, const float* table, const RowId* ids, float* out,
                 int64_t R, int64_t n, int D) {
  const char* op = "gather_rows";
  NCF_CHECK(R >= 0 && n >= 0, op, ": negative size R=", R, " n=", n);
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(n == 0 || (table && ids && out), op, ": table, ids or out is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, gather_rows, ctx, table, ids, out, R, n, D);
  for (int64_t k = 0; k < n; ++k)
    NCF_CHECK(ids[k] >= 0 && ids[k] < R, op, ": ids[", k, "]=", ids[k],
              " outside the table's rows [0, ", R, ")");
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const float* src = table + static_cast<int64_t>(ids[k]) * D;
      std::copy(src, src + D, out + k * D);
    }
  });
}

void sort_reduce_rows(const ExecContext& ctx, const RowId* ids, const float* grads, int64_t n,
                      int D, RowId* out_unique_rows, float* out_row_grads, int64_t* n_unique) {
  const char* op = "sort_reduce_rows";
  NCF_CHECK(n >= 0, op, ": negative size n=", n);
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(n_unique != nullptr, op, ": n_unique is null");
  NCF_CHECK(n == 0 || (ids && grads && out_unique_rows && out_row_grads), op,
            ": an input or output array is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, sort_reduce_rows, ctx, ids, grads, n, D, out_unique_rows, out_row_grads,
                    n_unique);
  // Positions sorted by id, equal ids in input order.
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::stable_sort(perm.begin(), perm.end(),
                   [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  // Run starts: seg[u] .. seg[u+1] are the positions of the u-th unique id.
  std::vector<int64_t> seg;
  seg.reserve(static_cast<size_t>(n) + 1);
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || ids[perm[k]] != ids[perm[k - 1]]) seg.push_back(k);
  const int64_t U = static_cast<int64_t>(seg.size());
  seg.push_back(n);
  // dst[0..D) = the rows of sorted positions [k0, k1), added left to right.
  auto sum_rows = [&](int64_t k0, int64_t k1, float* dst) {
    const float* first = grads + perm[k0] * D;
    std::copy(first, first + D, dst);
    for (int64_t k = k0 + 1; k < k1; ++k) {
      const float* src = grads + perm[k] * D;
      for (int d = 0; d < D; ++d) dst[d] += src[d];
    }
  };
  parallel_for(ctx.threads, U, row_grain(D), [&](int64_t u0, int64_t u1) {
    std::vector<float> part;  // [D] one sub-run's sum
    for (int64_t u = u0; u < u1; ++u) {
      out_unique_rows[u] = ids[perm[seg[u]]];
      float* dst = out_row_grads + u * D;
      // optim.h's order: sub-runs of kSubRun rows, their sums added in sub-run order.
      const int64_t k0 = seg[u], k1 = seg[u + 1];
      sum_rows(k0, std::min(k1, k0 + kSubRun), dst);
      if (k1 - k0 > kSubRun) part.resize(static_cast<size_t>(D));
      for (int64_t s = k0 + kSubRun; s < k1; s += kSubRun) {
        sum_rows(s, std::min(k1, s + kSubRun), part.data());
        for (int d = 0; d < D; ++d) dst[d] += part[d];
      }
    }
  });
  *n_unique = U;
}

}  // namespace ncf
