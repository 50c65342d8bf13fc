// CPU side of ops_runs.h: argument checks, the dispatch to the CUDA twins, and the CPU
// kernels (a counting or stable sort for the runs, parallel_for loops for the rows).
#include "model/ops_runs.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "model/ops_internal.h"

namespace ncf {

void item_runs(const ExecContext& ctx, const int32_t* ids, int64_t B, int64_t bound, int64_t R,
               int32_t* order, int32_t* starts, int32_t* inv, int32_t* first) {
  const char* op = "item_runs";
  check_rows(op, B);
  NCF_CHECK(B <= INT_MAX, op, ": B=", B, " samples exceed the int32 positions");
  NCF_CHECK(bound >= 1 && bound <= int64_t{INT_MAX} + 1, op, ": id bound ", bound,
            " is outside [1, 2^31]");
  NCF_CHECK(R >= std::min(B, bound) && R <= INT_MAX, op, ": R=", R,
            " runs cannot hold the distinct ids of B=", B, " samples below ", bound);
  check_ptr(op, "ids", ids, B);
  check_ptr(op, "order", order, B);
  check_ptr(op, "inv", inv, B);
  NCF_CHECK(starts != nullptr, op, ": starts is null");
  check_ptr(op, "first", first, R);
  NCF_DISPATCH_CUDA(ctx, item_runs, ctx, ids, B, bound, R, order, starts, inv, first);
  check_ids_cpu(op, ids, B, bound);
  // A stable sort of the positions by id: counting where the ids are few against the
  // samples, else std::stable_sort.
  if (bound <= 2 * B + 1024) {
    std::vector<int32_t> at(static_cast<size_t>(bound) + 1, 0);
    for (int64_t b = 0; b < B; ++b) ++at[static_cast<size_t>(ids[b]) + 1];
    for (int64_t k = 0; k < bound; ++k) at[k + 1] += at[k];
    for (int64_t b = 0; b < B; ++b) order[at[ids[b]]++] = static_cast<int32_t>(b);
  } else {
    for (int64_t b = 0; b < B; ++b) order[b] = static_cast<int32_t>(b);
    std::stable_sort(order, order + B, [&](int32_t x, int32_t y) { return ids[x] < ids[y]; });
  }
  int64_t u = -1;
  for (int64_t k = 0; k < B; ++k) {
    const int32_t b = order[k];
    if (k == 0 || ids[b] != ids[order[k - 1]]) {
      ++u;
      starts[u] = static_cast<int32_t>(k);
      first[u] = b;
    }
    inv[b] = static_cast<int32_t>(u);
  }
  for (int64_t v = u + 1; v < R; ++v) {
    starts[v] = static_cast<int32_t>(B);
    first[v] = -1;
  }
  starts[R] = static_cast<int32_t>(B);
}

void gather_run_rows(const ExecContext& ctx, const float* X, int64_t ldx, int w,
                     const int32_t* first, int64_t R, float* Y, const int32_t* ids) {
  const char* op = "gather_run_rows";
  check_rows(op, R);
  check_width(op, "w", w);
  check_ld(op, "ldx", ldx, w);
  check_ptr(op, "first", first, R);
  check_ptr(op, "Y", Y, R);
  NCF_DISPATCH_CUDA(ctx, gather_run_rows, ctx, X, ldx, w, first, R, Y, ids);
  parallel_for(ctx.threads, R, row_grain(w), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      float* y = Y + u * w;
      if (first[u] < 0) {
        std::fill(y, y + w, 0.0f);
      } else {
        const int64_t row = ids != nullptr ? ids[first[u]] : first[u];
        std::copy_n(X + row * ldx, w, y);
      }
    }
  });
}

namespace {

template <typename T>
void run_sums_cpu(const ExecContext& ctx, const T* dZ, const int32_t* order, const int32_t* starts,
                  int64_t R, int out, float* dP) {
  parallel_for(ctx.threads, R, row_grain(out), [&](int64_t u0, int64_t u1) {
    std::vector<double> acc(static_cast<size_t>(out));
    for (int64_t u = u0; u < u1; ++u) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = starts[u]; k < starts[u + 1]; ++k) {
        const T* z = dZ + int64_t{order[k]} * out;
        for (int j = 0; j < out; ++j) acc[j] += static_cast<double>(ld(z[j]));
      }
      for (int j = 0; j < out; ++j) dP[u * out + j] = static_cast<float>(acc[j]);
    }
  });
}

// dZ and order have as many rows as the runs' samples, which only starts[R] knows.
void check_run_sums(const char* op, const int32_t* starts, int64_t R, int out, const float* dP) {
  check_rows(op, R);
  check_width(op, "out", out);
  NCF_CHECK(starts != nullptr, op, ": starts is null");
  check_ptr(op, "dP", dP, R);
}

}  // namespace

void run_sums(const ExecContext& ctx, const float* dZ, const int32_t* order, const int32_t* starts,
              int64_t R, int out, float* dP) {
  check_run_sums("run_sums", starts, R, out, dP);
  NCF_DISPATCH_CUDA(ctx, run_sums, ctx, dZ, order, starts, R, out, dP);
  run_sums_cpu(ctx, dZ, order, starts, R, out, dP);
}

void run_sums_bf16(const ExecContext& ctx, const uint16_t* dZ, const int32_t* order,
                   const int32_t* starts, int64_t R, int out, float* dP) {
  check_run_sums("run_sums_bf16", starts, R, out, dP);
  NCF_DISPATCH_CUDA(ctx, run_sums_bf16, ctx, dZ, order, starts, R, out, dP);
  run_sums_cpu(ctx, dZ, order, starts, R, out, dP);
}

namespace {
// y[0..w) = run u's row: its parts' rows Yr[p·R + u] added in p order (scatter_run_rows,
// put_run_rows).
void run_row(const float* Yr, int64_t R, int parts, int w, int64_t u, float* y) {
  for (int c = 0; c < w; ++c) {
    float s = Yr[u * w + c];
    for (int p = 1; p < parts; ++p) s += Yr[(p * R + u) * w + c];
    y[c] = s;
  }
}
}  // namespace

void scatter_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                      const int32_t* inv, const int32_t* first, int64_t B, float* Y, int64_t ldy) {
  const char* op = "scatter_run_rows";
  check_rows(op, R);
  check_rows(op, B);
  check_width(op, "w", w);
  check_width(op, "parts", parts);
  check_ld(op, "ldy", ldy, w);
  check_ptr(op, "Yr", Yr, R);
  check_ptr(op, "inv", inv, B);
  check_ptr(op, "first", first, R);
  check_ptr(op, "Y", Y, B);
  NCF_DISPATCH_CUDA(ctx, scatter_run_rows, ctx, Yr, R, parts, w, inv, first, B, Y, ldy);
  parallel_for(ctx.threads, B, row_grain(w), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t u = inv[b];
      NCF_CHECK(u >= 0 && u < R, op, ": inv[", b, "] = ", u, " is outside [0, ", R, ")");
      float* y = Y + b * ldy;
      if (first[u] != b)
        std::fill(y, y + w, 0.0f);
      else
        run_row(Yr, R, parts, w, u, y);
    }
  });
}

void put_run_rows(const ExecContext& ctx, const float* Yr, int64_t R, int parts, int w,
                  const int32_t* ids, const int32_t* first, int64_t bound, float* Y, int64_t ldy) {
  const char* op = "put_run_rows";
  check_rows(op, R);
  check_rows(op, bound);
  check_width(op, "w", w);
  check_width(op, "parts", parts);
  check_ld(op, "ldy", ldy, w);
  check_ptr(op, "Yr", Yr, R);
  check_ptr(op, "first", first, R);
  check_ptr(op, "Y", Y, bound);
  NCF_DISPATCH_CUDA(ctx, put_run_rows, ctx, Yr, R, parts, w, ids, first, bound, Y, ldy);
  parallel_for(ctx.threads, R, row_grain(w), [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      if (first[u] < 0) continue;
      const int64_t i = ids[first[u]];
      NCF_CHECK(i >= 0 && i < bound, op, ": ids[", first[u], "] = ", i, " is outside [0, ", bound,
                ")");
      run_row(Yr, R, parts, w, u, Y + i * ldy);
    }
  });
}

}  // namespace ncf
