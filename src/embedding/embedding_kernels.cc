// CPU versions of the exchange helpers (embedding_kernels.h): argument checks,
// the dispatch to the CUDA twins, and plain loops whose orders the CUDA code
// reproduces exactly.
#include "embedding/embedding_kernels.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "common/bf16.h"
#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"

namespace ncf {
namespace {

int64_t row_grain(int D) { return std::max<int64_t>(1, 16384 / std::max(D, 1)); }

void check_rows_op(const char* op, const void* src, const void* idx, const void* out, int64_t n,
                   int D) {
  NCF_CHECK(n >= 0, op, ": negative row count n=", n);
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(n == 0 || (src && idx && out), op, ": an input or output array is null with n=", n);
}

}  // namespace

void ids_to_keys(const ExecContext& ctx, const int32_t* ids, int64_t n, int64_t offset,
                 int64_t bound, int32_t* keys) {
  const char* op = "ids_to_keys";
  NCF_CHECK(n >= 0 && bound >= 0 && offset >= 0, op, ": negative size n=", n, " bound=", bound,
            " offset=", offset);
  NCF_CHECK(offset + bound <= INT32_MAX, op, ": keys up to ", offset + bound,
            " pass the int32 range");
  NCF_CHECK(n == 0 || (ids && keys), op, ": ids or keys is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, ids_to_keys, ctx, ids, n, offset, bound, keys);
  for (int64_t k = 0; k < n; ++k)
    if (ids[k] < 0 || ids[k] >= bound)
      NCF_FAIL("id ", ids[k], " at batch position ", k, " outside the table's rows [0, ", bound,
               ")");
  parallel_for(ctx.threads, n, 1 << 14, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) keys[k] = int32_t(ids[k] + offset);
  });
}

void bucketize_by_owner(const ExecContext& ctx, const int32_t* keys, int64_t n,
                        const KeyLayout& layout, int64_t* out_perm, int32_t* out_rows,
                        int64_t* counts) {
  const char* op = "bucketize_by_owner";
  const int W = layout.W;
  NCF_CHECK(n >= 0, op, ": negative count n=", n);
  NCF_CHECK(W >= 1, op, ": world size W=", W, " must be >= 1");
  NCF_CHECK(layout.T >= 1 && layout.T <= kMaxTables, op, ": ", layout.T, " tables outside [1, ",
            kMaxTables, "]");
  for (int t = 0; t < layout.T; ++t)
    NCF_CHECK(layout.placement[t] != Placement::kTableWise ||
                  (layout.owner[t] >= 0 && layout.owner[t] < W),
              op, ": table ", t, " owner ", layout.owner[t], " outside [0, W=", W, ")");
  NCF_CHECK(counts != nullptr, op, ": counts is null");
  NCF_CHECK(n == 0 || (keys && out_perm && out_rows), op,
            ": an input or output array is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, bucketize_by_owner, ctx, keys, n, layout, out_perm, out_rows, counts);
  // Each key's owner and flat row there, as layout.route() gives them, in one pass that
  // also marks a bad key (owner -1, reported below). Keys are int32, so a row-wise table's
  // division by W is a 32-bit one. Where there are at least as many keys as (table, rank)
  // pairs, each rank's first flat row of each table is worked out once instead of per key.
  const int T = layout.T;
  const int64_t K = layout.num_keys();
  const bool by_table = n >= int64_t(T) * W;
  std::vector<int64_t> first(by_table ? size_t(T) * size_t(W) : 0, 0);  // [t][p]
  for (int t = 1; by_table && t < T; ++t)
    for (int p = 0; p < W; ++p)
      first[size_t(t) * W + p] = first[size_t(t - 1) * W + p] + layout.rows_on(t - 1, p);
  std::vector<int32_t> owner(static_cast<size_t>(n)), row(static_cast<size_t>(n));
  const uint32_t uW = uint32_t(W);
  parallel_for(ctx.threads, n, 1 << 13, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int32_t key = keys[k];
      const int t = layout.table_of(key);
      if (key < 0 || key >= K || layout.placement[t] == Placement::kReplicated) {
        owner[size_t(k)] = -1;
        continue;
      }
      const uint32_t x = uint32_t(key - layout.key_begin[t]);
      const bool rw = layout.placement[t] == Placement::kRowWise;
      const int p = rw ? int(x % uW) : layout.owner[t];
      const int64_t local = rw ? int64_t(x / uW) : int64_t(x);
      row[size_t(k)] =
          int32_t((by_table ? first[size_t(t) * W + p] : layout.begin_on(t, p)) + local);
      owner[size_t(k)] = p;
    }
  });
  bool bad = false;
  for (int64_t k = 0; k < n; ++k) bad |= owner[size_t(k)] < 0;
  if (bad)  // the first bad key, named
    for (int64_t k = 0; k < n; ++k) {
      NCF_CHECK(keys[k] >= 0 && keys[k] < K, op, ": keys[", k, "]=", keys[k], " outside [0, ", K,
                ")");
      NCF_CHECK(layout.placement[layout.table_of(keys[k])] != Placement::kReplicated, op, ": keys[",
                k, "]=", keys[k], " belongs to a replicated table (never routed)");
    }
  // A stable counting sort by owner.
  std::fill(counts, counts + W, int64_t{0});
  for (int64_t k = 0; k < n; ++k) ++counts[owner[size_t(k)]];
  std::vector<int64_t> next(W, 0);
  for (int p = 1; p < W; ++p) next[p] = next[p - 1] + counts[p - 1];
  for (int64_t k = 0; k < n; ++k) {
    const int64_t pos = next[owner[size_t(k)]]++;
    out_perm[pos] = k;
    out_rows[pos] = row[size_t(k)];
  }
}

void unique_ids(const ExecContext& ctx, const int32_t* ids, int64_t n, int32_t* out_unique,
                int64_t* out_inverse, int64_t* n_unique, int64_t bound) {
  const char* op = "unique_ids";
  NCF_CHECK(n >= 0, op, ": negative count n=", n);
  NCF_CHECK(n_unique != nullptr, op, ": n_unique is null");
  NCF_CHECK(n == 0 || (ids && out_unique && out_inverse), op,
            ": an input or output array is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, unique_ids, ctx, ids, n, out_unique, out_inverse, n_unique, bound);
  if (bound > 0)
    for (int64_t k = 0; k < n; ++k)
      NCF_CHECK(ids[k] >= 0 && ids[k] < bound, op, ": ids[", k, "]=", ids[k], " outside [0, ",
                bound, ")");
  std::vector<int32_t> sorted(ids, ids + n);
  std::sort(sorted.begin(), sorted.end());
  const int64_t nu = std::unique(sorted.begin(), sorted.end()) - sorted.begin();
  std::copy_n(sorted.begin(), nu, out_unique);
  parallel_for(ctx.threads, n, 4096, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      out_inverse[k] = std::lower_bound(out_unique, out_unique + nu, ids[k]) - out_unique;
  });
  *n_unique = nu;
}

void permute_rows(const ExecContext& ctx, const float* src, int64_t n_src, const int64_t* idx,
                  float* out, int64_t n, int D) {
  const char* op = "permute_rows";
  check_rows_op(op, src, idx, out, n, D);
  NCF_CHECK(n_src >= 0, op, ": negative source row count n_src=", n_src);
  NCF_DISPATCH_CUDA(ctx, permute_rows, ctx, src, n_src, idx, out, n, D);
  for (int64_t k = 0; k < n; ++k)
    NCF_CHECK(idx[k] >= 0 && idx[k] < n_src, op, ": idx[", k, "]=", idx[k], " outside [0, ", n_src,
              ")");
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) std::copy_n(src + idx[k] * D, D, out + k * D);
  });
}

void unpermute_rows(const ExecContext& ctx, const float* src, const int64_t* perm, float* out,
                    int64_t n, int D) {
  const char* op = "unpermute_rows";
  check_rows_op(op, src, perm, out, n, D);
  NCF_DISPATCH_CUDA(ctx, unpermute_rows, ctx, src, perm, out, n, D);
  std::vector<bool> seen(static_cast<size_t>(n), false);
  for (int64_t k = 0; k < n; ++k) {
    NCF_CHECK(perm[k] >= 0 && perm[k] < n && !seen[perm[k]], op, ": perm[", k, "]=", perm[k],
              " is repeated or outside [0, ", n, "): not a permutation");
    seen[perm[k]] = true;
  }
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) std::copy_n(src + k * D, D, out + perm[k] * D);
  });
}

void scatter_rows_dense(const ExecContext& ctx, const int32_t* rows, const float* grads, int64_t n,
                        int D, int64_t N, float* dense) {
  const char* op = "scatter_rows_dense";
  NCF_CHECK(n >= 0 && N >= 0 && n <= N, op, ": n=", n, " rows into a table of N=", N);
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(N == 0 || dense, op, ": dense is null with N=", N);
  NCF_CHECK(n == 0 || (rows && grads), op, ": rows or grads is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, scatter_rows_dense, ctx, rows, grads, n, D, N, dense);
  for (int64_t k = 0; k < n; ++k)
    NCF_CHECK(rows[k] >= 0 && rows[k] < N && (k == 0 || rows[k] > rows[k - 1]), op, ": rows[", k,
              "]=", rows[k], " outside [0, ", N, ") or not above the previous row");
  const int64_t stride = int64_t(D) + 1;  // D gradient columns, a touch count
  parallel_for(ctx.threads, N, row_grain(D), [&](int64_t r0, int64_t r1) {
    std::fill(dense + r0 * stride, dense + r1 * stride, 0.0f);
  });
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float* row = dense + int64_t(rows[k]) * stride;
      std::copy_n(grads + k * D, D, row);
      row[D] = 1.0f;
    }
  });
}

void compact_touched_rows(const ExecContext& ctx, const float* dense, int64_t N, int D,
                          int32_t* out_rows, float* out_grads, int64_t* n_out) {
  const char* op = "compact_touched_rows";
  NCF_CHECK(N >= 0 && N <= INT32_MAX, op, ": N=", N, " outside [0, 2^31)");
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(n_out != nullptr, op, ": n_out is null");
  NCF_CHECK(N == 0 || (dense && out_rows && out_grads), op, ": an array is null with N=", N);
  NCF_DISPATCH_CUDA(ctx, compact_touched_rows, ctx, dense, N, D, out_rows, out_grads, n_out);
  const int64_t stride = int64_t(D) + 1;  // D gradient columns, a touch count
  int64_t m = 0;
  for (int64_t r = 0; r < N; ++r)
    if (dense[r * stride + D] != 0.0f) out_rows[m++] = int32_t(r);
  parallel_for(ctx.threads, m, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      std::copy_n(dense + int64_t(out_rows[k]) * stride, D, out_grads + k * D);
  });
  *n_out = m;
}

void pack_bf16(const ExecContext& ctx, const float* src, uint16_t* out, int64_t n) {
  NCF_CHECK(n >= 0, "pack_bf16: negative count n=", n);
  NCF_CHECK(n == 0 || (src && out), "pack_bf16: src or out is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, pack_bf16, ctx, src, out, n);
  parallel_for(ctx.threads, n, 1 << 16, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) out[k] = float_to_bf16_bits(src[k]);
  });
}

void unpack_bf16(const ExecContext& ctx, const uint16_t* src, float* out, int64_t n) {
  NCF_CHECK(n >= 0, "unpack_bf16: negative count n=", n);
  NCF_CHECK(n == 0 || (src && out), "unpack_bf16: src or out is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, unpack_bf16, ctx, src, out, n);
  parallel_for(ctx.threads, n, 1 << 16, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) out[k] = bf16_bits_to_float(src[k]);
  });
}

void round_bf16(const ExecContext& ctx, float* x, int64_t n) {
  NCF_CHECK(n >= 0, "round_bf16: negative count n=", n);
  NCF_CHECK(n == 0 || x, "round_bf16: x is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, round_bf16, ctx, x, n);
  parallel_for(ctx.threads, n, 1 << 16, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) x[k] = round_to_bf16(x[k]);
  });
}

}  // namespace ncf
