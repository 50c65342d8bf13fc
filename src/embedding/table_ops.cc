// CPU side of table_ops.h: argument checks, dispatch to the CUDA twins, and
// the parallel loops. The sort behind sort_reduce_rows and the fused update is
// a stable LSD radix sort of positions by row (per-chunk digit histograms, one
// prefix, a stable scatter), so it uses every thread and its output, the one
// stable order, does not depend on the chunking.
#include "embedding/table_ops.h"

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "common/dispatch.h"
#include "common/parallel.h"
#include "common/prefetch.h"
#include "common/vector_isa.h"

namespace ncf {

const char* optimizer_name(EmbeddingOptimizer o) {
  switch (o) {
    case EmbeddingOptimizer::kDenseAdam:
      return "dense_adam";
    case EmbeddingOptimizer::kLazyAdam:
      return "lazy_adam";
    case EmbeddingOptimizer::kSgd:
      return "sgd";
    case EmbeddingOptimizer::kAdagrad:
      return "adagrad";
    case EmbeddingOptimizer::kRowwiseAdagrad:
      return "rowwise_adagrad";
  }
  return "?";
}

EmbeddingOptimizer parse_embedding_optimizer(const std::string& s) {
  if (s == "dense_adam") return EmbeddingOptimizer::kDenseAdam;
  if (s == "lazy_adam") return EmbeddingOptimizer::kLazyAdam;
  if (s == "sgd") return EmbeddingOptimizer::kSgd;
  if (s == "adagrad") return EmbeddingOptimizer::kAdagrad;
  if (s == "rowwise_adagrad") return EmbeddingOptimizer::kRowwiseAdagrad;
  NCF_FAIL("unknown embedding optimizer '", s,
           "' (expected dense_adam, lazy_adam, sgd, adagrad, rowwise_adagrad)");
}

int optimizer_state_arrays(EmbeddingOptimizer o) {
  switch (o) {
    case EmbeddingOptimizer::kDenseAdam:
    case EmbeddingOptimizer::kLazyAdam:
      return 2;
    case EmbeddingOptimizer::kAdagrad:
    case EmbeddingOptimizer::kRowwiseAdagrad:
      return 1;
    case EmbeddingOptimizer::kSgd:
      return 0;
  }
  return 0;
}

int64_t optimizer_state_floats_per_row(EmbeddingOptimizer o, int D) {
  return o == EmbeddingOptimizer::kRowwiseAdagrad ? 1 : int64_t(optimizer_state_arrays(o)) * D;
}

namespace {

constexpr int64_t kElemGrain = 1 << 14;  // elements per chunk, at least
constexpr int kDigitBits = 11;           // radix sort digit: 2048 buckets
constexpr int64_t kSortGrain = 1 << 13;  // ids per sort chunk, at least

int64_t row_grain(int D) { return std::max<int64_t>(1, kElemGrain / std::max(D, 1)); }

// Rows asked for (common/prefetch.h) ahead of the one being read: the rows these loops
// read by id or by sorted position are random rows.
constexpr int64_t kRowsAhead = 8;

// Keeps the gradient rows [D] of sorted positions up to kRowsAhead past a run's end asked
// for, across the runs of one thread's share [.., end).
struct SortedRowsAhead {
  const float* grads;
  const int32_t* pos;
  int D;
  int64_t next, end;
  void upto(int64_t k) {
    for (k = std::min(end, k + kRowsAhead); next < k; ++next)
      prefetch_row(grads + int64_t(pos[next]) * D, D);
  }
};

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

// A row gather's arguments (before the dispatch), and its ids on the host.
void check_gather(const char* op, const void* table, const RowId* ids, const void* out, int64_t R,
                  int64_t n, int D) {
  NCF_CHECK(R >= 0 && n >= 0, op, ": negative size R=", R, " n=", n);
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(n == 0 || (table && ids && out), op, ": table, ids or out is null with n=", n);
}
void check_gather_ids(const char* op, const RowId* ids, int64_t R, int64_t n) {
  for (int64_t k = 0; k < n; ++k)
    NCF_CHECK(ids[k] >= 0 && ids[k] < R, op, ": ids[", k, "]=", ids[k],
              " outside the table's rows [0, ", R, ")");
}

void check_unique_rows(const char* op, const RowId* rows, int64_t R, int64_t n) {
  for (int64_t k = 0; k < n; ++k) {
    NCF_CHECK(rows[k] >= 0 && rows[k] < R, op, ": unique_rows[", k, "]=", rows[k],
              " outside the table's rows [0, ", R, ")");
    NCF_CHECK(k == 0 || rows[k] > rows[k - 1], op, ": unique_rows not strictly increasing at [", k,
              "]: ", rows[k - 1], " then ", rows[k]);
  }
}

// Grow-only scratch of the sort and the run list; the ops run on one thread
// at a time per caller, so one set per calling thread.
struct SortScratch {
  std::vector<uint32_t> keys, keys_tmp;
  std::vector<int32_t> pos, pos_tmp;
  std::vector<int64_t> hist;  // [chunks × 2^kDigitBits]
  std::vector<int64_t> run;   // [n_runs + 1] run starts in sorted order, then n
};
SortScratch& scratch() {
  thread_local SortScratch s;
  return s;
}

// s.pos[0..n) = the positions of ids in ascending id order, equal ids in input
// order (a stable LSD radix sort over the bits below max_id); s.run[0..n_runs] the
// starts of the runs of equal ids and n. Returns n_runs.
int64_t sort_runs(int threads, const RowId* ids, int64_t n, RowId max_id, SortScratch& s) {
  NCF_CHECK(n < INT32_MAX, "sort of ", n, " rows: positions are int32");
  s.keys.resize(size_t(n));
  s.pos.resize(size_t(n));
  s.keys_tmp.resize(size_t(n));
  s.pos_tmp.resize(size_t(n));
  int bits = 0;
  while (bits < 32 && (uint64_t(max_id) >> bits) != 0) ++bits;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(threads, n / kSortGrain));
  const int64_t buckets = int64_t{1} << kDigitBits;
  parallel_for(threads, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t k = n * c0 / chunks; k < n * c1 / chunks; ++k) {
      s.keys[k] = uint32_t(ids[k]);
      s.pos[k] = int32_t(k);
    }
  });
  s.hist.resize(size_t(chunks * buckets));
  for (int shift = 0; shift < bits; shift += kDigitBits) {
    auto digit = [&](uint32_t key) { return int64_t((key >> shift) & uint32_t(buckets - 1)); };
    parallel_for(threads, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        int64_t* h = &s.hist[size_t(c * buckets)];
        std::fill(h, h + buckets, 0);
        for (int64_t k = n * c / chunks; k < n * (c + 1) / chunks; ++k) ++h[digit(s.keys[k])];
      }
    });
    // Exclusive offsets in (digit, chunk) order: a stable scatter.
    int64_t sum = 0;
    for (int64_t d = 0; d < buckets; ++d)
      for (int64_t c = 0; c < chunks; ++c) {
        int64_t& h = s.hist[size_t(c * buckets + d)];
        const int64_t count = h;
        h = sum;
        sum += count;
      }
    parallel_for(threads, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        int64_t* h = &s.hist[size_t(c * buckets)];
        for (int64_t k = n * c / chunks; k < n * (c + 1) / chunks; ++k) {
          const int64_t to = h[digit(s.keys[k])]++;
          s.keys_tmp[to] = s.keys[k];
          s.pos_tmp[to] = s.pos[k];
        }
      }
    });
    s.keys.swap(s.keys_tmp);
    s.pos.swap(s.pos_tmp);
  }
  s.run.clear();
  for (int64_t k = 0; k < n; ++k)
    if (k == 0 || s.keys[k] != s.keys[k - 1]) s.run.push_back(k);
  const int64_t n_runs = int64_t(s.run.size());
  s.run.push_back(n);
  return n_runs;
}

// dst[0..w) = columns [0, w) of the gradient rows (stride D) of sorted positions [k0, k1),
// left to right.
void sum_rows(const float* grads, const int32_t* pos, int64_t k0, int64_t k1, int D, int w,
              float* dst) {
  const float* first = grads + int64_t(pos[k0]) * D;
  std::copy(first, first + w, dst);
  for (int64_t k = k0 + 1; k < k1; ++k) {
    const float* src = grads + int64_t(pos[k]) * D;
    for (int d = 0; d < w; ++d) dst[d] += src[d];
  }
}

// dst[0..w) = columns [0, w) (all D by default) of the sum of the sorted run [k0, k1) in
// table_ops.h's order: sub-runs of kSubRun rows, their sums added in sub-run order.
// part: [D].
void sum_run(const float* grads, const int32_t* pos, int64_t k0, int64_t k1, int D, float* dst,
             float* part, int w = -1) {
  if (w < 0) w = D;
  sum_rows(grads, pos, k0, std::min(k1, k0 + kSubRun), D, w, dst);
  for (int64_t s = k0 + kSubRun; s < k1; s += kSubRun) {
    sum_rows(grads, pos, s, std::min(k1, s + kSubRun), D, w, part);
    for (int d = 0; d < w; ++d) dst[d] += part[d];
  }
}

// g[0..D) = the summed gradient of table row r, the sorted run [k0, k1): its columns given
// where `given` holds them (GivenColumns), the rest summed.
void row_gradient(const float* grads, const int32_t* pos, int64_t k0, int64_t k1, int D, int64_t r,
                  const GivenColumns& given, float* g, float* part) {
  if (given.rows == nullptr || r < given.begin || r >= given.end) {
    sum_run(grads, pos, k0, k1, D, g, part);
    return;
  }
  const int c = given.col;
  if (c > 0) sum_run(grads, pos, k0, k1, D, g, part, c);
  const float* v = given.rows + (r - given.begin) * (D - c);
  for (int d = c; d < D; ++d) g[d] = k1 - k0 > 1 ? v[d - c] + 0.0f : v[d - c];
}

// Row-wise Adagrad on one row p[D] (accumulator *acc) with its gradient g[D],
// which becomes g + l2·p.
void rowwise_adagrad_row(float* p, float* acc, float* g, int D, const AdagradHyper& h) {
  float sq = 0.0f;
  for (int d = 0; d < D; ++d) {
    g[d] += h.l2 * p[d];
    sq += g[d] * g[d];
  }
  const float mult = rowwise_adagrad_multiplier(acc, sq, D, h);
  for (int d = 0; d < D; ++d) p[d] -= mult * g[d];
}

RowId max_row(const RowId* ids, int64_t n) {
  RowId m = 0;
  for (int64_t k = 0; k < n; ++k) m = std::max(m, ids[k]);
  return m;
}

}  // namespace

void reduce_update_rows(const ExecContext& ctx, const RowId* rows, const float* grads, int64_t n,
                        const TableRows& tab, const EmbeddingOptimizerConfig& opt, int64_t t,
                        int64_t* n_unique, const GivenColumns& given) {
  const char* op = "reduce_update_rows";
  const int D = tab.D;
  const int64_t R = tab.R;
  NCF_CHECK(n >= 0 && R >= 0, op, ": negative size n=", n, " R=", R);
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(n == 0 || (rows && grads), op, ": rows or grads is null with n=", n);
  NCF_CHECK(R == 0 || tab.table, op, ": table is null");
  const int state = optimizer_state_arrays(opt.kind);
  NCF_CHECK(R == 0 || ((state < 1 || tab.m) && (state < 2 || tab.v)), op, ": ",
            optimizer_name(opt.kind), " state is null");
  AdamStepScalars s{};
  if (opt.kind == EmbeddingOptimizer::kDenseAdam || opt.kind == EmbeddingOptimizer::kLazyAdam)
    s = adam_step_scalars(opt.adam, t);
  NCF_CHECK(given.rows == nullptr ||
                (opt.kind == EmbeddingOptimizer::kDenseAdam && given.col >= 0 && given.col < D &&
                 given.begin >= 0 && given.begin <= given.end && given.end <= R),
            op, ": given columns [", given.col, ", ", D, ") of rows [", given.begin, ", ",
            given.end, ") of ", R, " need dense Adam and to lie in the table");
  NCF_DISPATCH_CUDA(ctx, reduce_update_rows, ctx, rows, grads, n, tab, opt, t, n_unique, given);
  for (int64_t k = 0; k < n; ++k)
    NCF_CHECK(rows[k] >= 0 && rows[k] < R, op, ": rows[", k, "]=", rows[k],
              " outside the table's rows [0, ", R, ")");
  SortScratch& sc = scratch();
  const int64_t n_runs = n ? sort_runs(ctx.threads, rows, n, RowId(R - 1), sc) : 0;
  if (n_unique) *n_unique = n_runs;
  const int32_t* pos = sc.pos.data();
  const int64_t* run = sc.run.data();
  auto row_of = [&](int64_t u) { return int64_t(sc.keys[size_t(run[u])]); };
  float* p = tab.table;
  switch (opt.kind) {
    case EmbeddingOptimizer::kDenseAdam:
      // Every row once: the touched rows with their run's sum (split by runs,
      // so hot rows do not pile onto one thread), then the others with 0.
      parallel_for_wide(ctx.threads, n_runs, row_grain(D), [&](int64_t u0, int64_t u1) {
        std::vector<float> g(size_t(D) * 2);
        SortedRowsAhead ahead{grads, pos, D, run[u0], run[u1]};
        for (int64_t u = u0; u < u1; ++u) {
          ahead.upto(run[u + 1]);
          if (u + 2 < u1) {  // the table row two runs ahead, with its state
            const int64_t r2 = row_of(u + 2) * D;
            prefetch_row(p + r2, D);
            prefetch_row(tab.m + r2, D);
            prefetch_row(tab.v + r2, D);
          }
          row_gradient(grads, pos, run[u], run[u + 1], D, row_of(u), given, g.data(), g.data() + D);
          const int64_t off = row_of(u) * D;
          adam_update_n(p + off, tab.m + off, tab.v + off, g.data(), D, s);
        }
      });
      parallel_for(ctx.threads, R, row_grain(D), [&](int64_t r0, int64_t r1) {
        int64_t lo = 0, hi = n_runs;  // the first run at or after row r0
        while (lo < hi) {
          const int64_t mid = (lo + hi) / 2;
          if (row_of(mid) < r0)
            lo = mid + 1;
          else
            hi = mid;
        }
        // Each stretch of untouched rows between two touched ones in one call.
        for (int64_t r = r0, u = lo; r < r1;) {
          if (u < n_runs && row_of(u) == r) {
            ++r;
            ++u;
            continue;
          }
          const int64_t end = u < n_runs ? std::min(r1, row_of(u)) : r1;
          adam_update_n(p + r * D, tab.m + r * D, tab.v + r * D, nullptr, (end - r) * D, s);
          r = end;
        }
      });
      return;
    case EmbeddingOptimizer::kLazyAdam:
    case EmbeddingOptimizer::kSgd:
    case EmbeddingOptimizer::kAdagrad:
    case EmbeddingOptimizer::kRowwiseAdagrad:
      parallel_for_wide(ctx.threads, n_runs, row_grain(D), [&](int64_t u0, int64_t u1) {
        std::vector<float> g(size_t(D) * 2);
        SortedRowsAhead ahead{grads, pos, D, run[u0], run[u1]};
        for (int64_t u = u0; u < u1; ++u) {
          ahead.upto(run[u + 1]);
          sum_run(grads, pos, run[u], run[u + 1], D, g.data(), g.data() + D);
          const int64_t off = row_of(u) * D;
          if (opt.kind == EmbeddingOptimizer::kLazyAdam)
            adam_update_n(p + off, tab.m + off, tab.v + off, g.data(), D, s);
          else if (opt.kind == EmbeddingOptimizer::kSgd)
            for (int d = 0; d < D; ++d) sgd_update(&p[off + d], g[d], opt.sgd);
          else if (opt.kind == EmbeddingOptimizer::kRowwiseAdagrad)
            rowwise_adagrad_row(&p[off], &tab.m[row_of(u)], g.data(), D, opt.adagrad);
          else
            for (int d = 0; d < D; ++d)
              adagrad_update(&p[off + d], &tab.m[off + d], g[d], opt.adagrad);
        }
      });
      return;
  }
}

void apply_table_optimizer(const ExecContext& ctx, const TableRows& tab, const RowId* unique_rows,
                           const float* row_grads, int64_t n, const EmbeddingOptimizerConfig& opt,
                           int64_t t) {
  switch (opt.kind) {
    case EmbeddingOptimizer::kDenseAdam:
      if (tab.R)
        embedding_dense_adam(ctx, tab.table, tab.m, tab.v, unique_rows, row_grads, tab.R, n, tab.D,
                             t, opt.adam);
      return;
    case EmbeddingOptimizer::kLazyAdam:
      if (n)
        embedding_lazy_adam(ctx, tab.table, tab.m, tab.v, unique_rows, row_grads, tab.R, n, tab.D,
                            t, opt.adam);
      return;
    case EmbeddingOptimizer::kSgd:
      if (n) embedding_sgd(ctx, tab.table, unique_rows, row_grads, tab.R, n, tab.D, opt.sgd);
      return;
    case EmbeddingOptimizer::kAdagrad:
      if (n)
        embedding_adagrad(ctx, tab.table, tab.m, unique_rows, row_grads, tab.R, n, tab.D,
                          opt.adagrad);
      return;
    case EmbeddingOptimizer::kRowwiseAdagrad:
      if (n)
        embedding_rowwise_adagrad(ctx, tab.table, tab.m, unique_rows, row_grads, tab.R, n, tab.D,
                                  opt.adagrad);
      return;
  }
}

void embedding_dense_adam(const ExecContext& ctx, float* table, float* m, float* v,
                          const RowId* unique_rows, const float* row_grads, int64_t R, int64_t n,
                          int D, int64_t t, const AdamHyper& h) {
  const char* op = "embedding_dense_adam";
  check_table(op, table, unique_rows, row_grads, R, n, D);
  NCF_CHECK(R == 0 || (m && v), op, ": m or v is null");
  AdamStepScalars s = adam_step_scalars(h, t);
  NCF_DISPATCH_CUDA(ctx, embedding_dense_adam, ctx, table, m, v, unique_rows, row_grads, R, n, D, t,
                    h);
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
      adam_update_n(p, mr, vr, g, D, s);
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
  NCF_DISPATCH_CUDA(ctx, embedding_lazy_adam, ctx, table, m, v, unique_rows, row_grads, R, n, D, t,
                    h);
  check_unique_rows(op, unique_rows, R, n);
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      int64_t off = static_cast<int64_t>(unique_rows[k]) * D;
      const float* g = row_grads + k * D;
      adam_update_n(table + off, m + off, v + off, g, D, s);
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
                       const float* row_grads, int64_t R, int64_t n, int D, const AdagradHyper& h) {
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

void embedding_rowwise_adagrad(const ExecContext& ctx, float* table, float* acc,
                               const RowId* unique_rows, const float* row_grads, int64_t R,
                               int64_t n, int D, const AdagradHyper& h) {
  const char* op = "embedding_rowwise_adagrad";
  check_table(op, table, unique_rows, row_grads, R, n, D);
  NCF_CHECK(R == 0 || acc, op, ": acc is null");
  NCF_DISPATCH_CUDA(ctx, embedding_rowwise_adagrad, ctx, table, acc, unique_rows, row_grads, R, n,
                    D, h);
  check_unique_rows(op, unique_rows, R, n);
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    std::vector<float> g(static_cast<size_t>(D));
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r = unique_rows[k];
      std::copy(row_grads + k * D, row_grads + (k + 1) * D, g.begin());
      rowwise_adagrad_row(table + r * D, acc + r, g.data(), D, h);
    }
  });
}

void gather_rows(const ExecContext& ctx, const float* table, const RowId* ids, float* out,
                 int64_t R, int64_t n, int D, int width) {
  const char* op = "gather_rows";
  check_gather(op, table, ids, out, R, n, D);
  NCF_CHECK(width >= 0 && width <= D, op, ": width=", width, " outside [0, D=", D, "]");
  const int w = width == 0 ? D : width;
  NCF_DISPATCH_CUDA(ctx, gather_rows, ctx, table, ids, out, R, n, D, w);
  check_gather_ids(op, ids, R, n);
  parallel_for(ctx.threads, n, row_grain(w), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      if (k + kRowsAhead < k1) prefetch_row(table + int64_t(ids[k + kRowsAhead]) * D, w);
      const float* src = table + static_cast<int64_t>(ids[k]) * D;
      std::copy(src, src + w, out + k * D);
    }
  });
}

void sort_reduce_rows(const ExecContext& ctx, const RowId* ids, const float* grads, int64_t n,
                      int D, RowId* out_unique_rows, float* out_row_grads, int64_t* n_unique,
                      int64_t bound) {
  const char* op = "sort_reduce_rows";
  NCF_CHECK(n >= 0, op, ": negative size n=", n);
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(n_unique != nullptr, op, ": n_unique is null");
  NCF_CHECK(n == 0 || (ids && grads && out_unique_rows && out_row_grads), op,
            ": an input or output array is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, sort_reduce_rows, ctx, ids, grads, n, D, out_unique_rows, out_row_grads,
                    n_unique, bound);
  for (int64_t k = 0; k < n; ++k) {
    NCF_CHECK(ids[k] >= 0, op, ": ids[", k, "]=", ids[k], " is negative");
    NCF_CHECK(bound <= 0 || ids[k] < bound, op, ": ids[", k, "]=", ids[k], " outside [0, ", bound,
              ")");
  }
  SortScratch& sc = scratch();
  const RowId max_id = bound > 0 ? RowId(bound - 1) : max_row(ids, n);
  const int64_t n_runs = n ? sort_runs(ctx.threads, ids, n, max_id, sc) : 0;
  const int32_t* pos = sc.pos.data();
  const int64_t* run = sc.run.data();
  parallel_for_wide(ctx.threads, n_runs, row_grain(D), [&](int64_t u0, int64_t u1) {
    std::vector<float> part(static_cast<size_t>(D));
    for (int64_t u = u0; u < u1; ++u) {
      out_unique_rows[u] = RowId(sc.keys[size_t(run[u])]);
      sum_run(grads, pos, run[u], run[u + 1], D, out_row_grads + u * D, part.data());
    }
  });
  *n_unique = n_runs;
}

void gather_rows_bf16(const ExecContext& ctx, const uint16_t* table, const RowId* ids, float* out,
                      int64_t R, int64_t n, int D) {
  const char* op = "gather_rows_bf16";
  check_gather(op, table, ids, out, R, n, D);
  NCF_DISPATCH_CUDA(ctx, gather_rows_bf16, ctx, table, ids, out, R, n, D);
  check_gather_ids(op, ids, R, n);
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      if (k + kRowsAhead < k1) prefetch_row(table + int64_t(ids[k + kRowsAhead]) * D, D);
      const uint16_t* src = table + static_cast<int64_t>(ids[k]) * D;
      for (int d = 0; d < D; ++d) out[k * D + d] = bf16_bits_to_float(src[d]);
    }
  });
}

namespace {
void check_scatter(const char* op, const void* src, const RowId* rows, const void* dst, int64_t R,
                   int64_t n, int D, bool rows_needed) {
  NCF_CHECK(R >= 0 && n >= 0, op, ": negative size R=", R, " n=", n);
  NCF_CHECK(D >= 1, op, ": width D=", D, " must be >= 1");
  NCF_CHECK(n == 0 || (src && dst && (rows || !rows_needed)), op,
            ": src, rows or dst is null with n=", n);
  NCF_CHECK(rows || n <= R, op, ": ", n, " rows for a table of ", R);
}
}  // namespace

void scatter_rows(const ExecContext& ctx, const float* src, const RowId* rows, float* dst,
                  int64_t R, int64_t n, int D) {
  const char* op = "scatter_rows";
  check_scatter(op, src, rows, dst, R, n, D, true);
  NCF_DISPATCH_CUDA(ctx, scatter_rows, ctx, src, rows, dst, R, n, D);
  check_unique_rows(op, rows, R, n);
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      std::copy(src + k * D, src + (k + 1) * D, dst + static_cast<int64_t>(rows[k]) * D);
  });
}

void store_rows_bf16(const ExecContext& ctx, const float* src, const RowId* rows, uint16_t* dst,
                     int64_t R, int64_t n, int D, const RowRounding& key) {
  const char* op = "store_rows_bf16";
  check_scatter(op, src, rows, dst, R, n, D, false);
  NCF_CHECK(key.step >= 0 && uint64_t(key.step + 1) * uint64_t(D) < (uint64_t{1} << 34), op,
            ": step ", key.step, " x width ", D, " passes the rounding stream's 2^34 words");
  NCF_DISPATCH_CUDA(ctx, store_rows_bf16, ctx, src, rows, dst, R, n, D, key);
  if (rows) check_unique_rows(op, rows, R, n);
  parallel_for(ctx.threads, n, row_grain(D), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t r = rows ? rows[k] : k;
      for (int d = 0; d < D; ++d)
        dst[r * D + d] = float_to_bf16_bits_stochastic(src[k * D + d], key.draw(r, d, D));
    }
  });
}

void offset_rows(const ExecContext& ctx, const RowId* in, int64_t n, RowId delta, RowId* out) {
  NCF_CHECK(n >= 0 && (n == 0 || out), "offset_rows: out is null with n=", n);
  NCF_DISPATCH_CUDA(ctx, offset_rows, ctx, in, n, delta, out);
  parallel_for(ctx.threads, n, 1 << 14, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) out[k] = in ? in[k] + delta : RowId(k);
  });
}

}  // namespace ncf
