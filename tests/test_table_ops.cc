// The table ops (embedding/table_ops.h) on the CPU: the four table optimizers
// against their formulas in double (optim_reference.h); the row gather and the
// sort-and-reduce against naive loops and a map-based reduction (bit-exact:
// both follow table_ops.h's order — input order within sub-runs of kSubRun
// rows, then the sub-run sums in order); and the fused reduce-and-update
// against the three separate steps, bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/check.h"
#include "embedding/table_ops.h"
#include "optim_reference.h"

namespace ncf {
namespace {

using test::cpu;
using test::DVec;
using test::expect_close;
using test::kAtol;
using test::kRtol;
using test::random_vec;
using test::ref_adagrad;
using test::ref_adam;
using test::ref_sgd;
using test::tf_garden_adam;
using test::Vec;

// ---- embedding tables --------------------------------------------------------------

struct SparseStep {
  std::vector<RowId> rows;  // sorted, unique
  uint32_t seed;
};

// R = 10 rows of width D = 5 (not a multiple of 4); three steps touching
// {1, 4, 7}, then {4}, then nothing.
constexpr int kR = 10, kD = 5;
const std::vector<SparseStep> kSteps = {{{1, 4, 7}, 300}, {{4}, 301}, {{}, 302}};

TEST(EmbeddingOptim, DenseAdamMovesUntouchedRowsWithMoments) {
  for (float l2 : {0.0f, 0.01f}) {
    SCOPED_TRACE(::testing::Message() << "l2=" << l2);
    AdamHyper h = tf_garden_adam(l2);
    Vec table = random_vec(kR * kD, 4), m(kR * kD, 0.0f), v(kR * kD, 0.0f);
    DVec td(table.begin(), table.end()), md(kR * kD, 0.0), vd(kR * kD, 0.0);
    Vec before_step2;
    for (size_t s = 0; s < kSteps.size(); ++s) {
      const int t = static_cast<int>(s) + 1;
      const std::vector<RowId>& rows = kSteps[s].rows;
      const int64_t n = static_cast<int64_t>(rows.size());
      Vec g = random_vec(rows.size() * kD, kSteps[s].seed);
      if (t == 2) before_step2 = table;
      embedding_dense_adam(cpu(2), table.data(), m.data(), v.data(), rows.data(), g.data(), kR, n,
                           kD, t, h);
      for (int r = 0; r < kR; ++r)
        for (int d = 0; d < kD; ++d) {
          double gr = 0;
          for (size_t k = 0; k < rows.size(); ++k)
            if (rows[k] == r) gr = g[k * kD + d];
          ref_adam(td[r * kD + d], md[r * kD + d], vd[r * kD + d], gr, t, h);
        }
    }
    expect_close(table, td, kAtol, kRtol, "table");
    expect_close(m, md, kAtol, kRtol, "m");
    expect_close(v, vd, 1e-9, kRtol, "v");
    // Row 1 got a gradient only at step 1, yet moved at step 2 (momentum).
    for (int d = 0; d < kD; ++d) EXPECT_NE(table[1 * kD + d], before_step2[1 * kD + d]);
    if (l2 == 0.0f) {  // row 0 never had a gradient: zero moments, no motion
      Vec fresh = random_vec(kR * kD, 4);
      for (int d = 0; d < kD; ++d) EXPECT_EQ(table[0 * kD + d], fresh[0 * kD + d]);
    }
  }
}

TEST(EmbeddingOptim, LazyAdamLeavesUntouchedRowsAndMomentsAlone) {
  AdamHyper h = tf_garden_adam(0.01f);
  Vec table = random_vec(kR * kD, 5), m(kR * kD, 0.0f), v(kR * kD, 0.0f);
  DVec td(table.begin(), table.end()), md(kR * kD, 0.0), vd(kR * kD, 0.0);
  for (size_t s = 0; s < kSteps.size(); ++s) {
    const int t = static_cast<int>(s) + 1;
    const std::vector<RowId>& rows = kSteps[s].rows;
    Vec g = random_vec(rows.size() * kD, kSteps[s].seed);
    Vec t_before = table, m_before = m, v_before = v;
    embedding_lazy_adam(cpu(2), table.data(), m.data(), v.data(), rows.data(), g.data(), kR,
                        static_cast<int64_t>(rows.size()), kD, t, h);
    for (size_t k = 0; k < rows.size(); ++k)
      for (int d = 0; d < kD; ++d) {
        size_t i = rows[k] * kD + d;
        ref_adam(td[i], md[i], vd[i], g[k * kD + d], t, h);
      }
    for (int r = 0; r < kR; ++r) {
      bool touched = false;
      for (RowId x : rows) touched |= x == r;
      if (touched) continue;
      EXPECT_EQ(std::memcmp(&table[r * kD], &t_before[r * kD], kD * sizeof(float)), 0) << r;
      EXPECT_EQ(std::memcmp(&m[r * kD], &m_before[r * kD], kD * sizeof(float)), 0) << r;
      EXPECT_EQ(std::memcmp(&v[r * kD], &v_before[r * kD], kD * sizeof(float)), 0) << r;
    }
  }
  expect_close(table, td, kAtol, kRtol, "table");
  expect_close(m, md, kAtol, kRtol, "m");
}

TEST(EmbeddingOptim, SgdAndAdagradTouchListedRowsOnly) {
  SgdHyper hs;
  hs.lr = 0.1f;
  hs.l2 = 0.05f;
  AdagradHyper ha;
  ha.lr = 0.2f;
  ha.l2 = 0.05f;
  Vec ts = random_vec(kR * kD, 6), ta = random_vec(kR * kD, 7), acc(kR * kD);
  std::fill(acc.begin(), acc.end(), ha.initial_accumulator);
  DVec tsd(ts.begin(), ts.end()), tad(ta.begin(), ta.end()), accd(kR * kD, 0.1);
  for (const SparseStep& s : kSteps) {
    Vec g = random_vec(s.rows.size() * kD, s.seed);
    int64_t n = static_cast<int64_t>(s.rows.size());
    embedding_sgd(cpu(2), ts.data(), s.rows.data(), g.data(), kR, n, kD, hs);
    embedding_adagrad(cpu(2), ta.data(), acc.data(), s.rows.data(), g.data(), kR, n, kD, ha);
    for (size_t k = 0; k < s.rows.size(); ++k)
      for (int d = 0; d < kD; ++d) {
        size_t i = s.rows[k] * kD + d;
        ref_sgd(tsd[i], g[k * kD + d], hs);
        ref_adagrad(tad[i], accd[i], g[k * kD + d], ha);
      }
  }
  // The reference skips untouched rows, so exact agreement there proves "touched only".
  expect_close(ts, tsd, kAtol, kRtol, "sgd table");
  expect_close(ta, tad, kAtol, kRtol, "adagrad table");
  expect_close(acc, accd, kAtol, kRtol, "adagrad acc");
}

// One accumulator per row, exactly R of them: a touched row's grows by the
// mean of the squared gradient (with L2) and scales the whole row's step; an
// untouched row and its accumulator stay. Against a double loop, and unlike
// per-element Adagrad on the same steps.
TEST(EmbeddingOptim, RowwiseAdagradKeepsOneAccumulatorPerRow) {
  AdagradHyper h;
  h.lr = 0.2f;
  h.l2 = 0.05f;
  const Vec t0 = random_vec(kR * kD, 8);
  Vec t = t0, acc(kR, h.initial_accumulator);  // [R]: one float per row
  Vec te = t0, acce(kR * kD, h.initial_accumulator);
  DVec td(t0.begin(), t0.end()), accd(kR, double(h.initial_accumulator));
  for (const SparseStep& s : kSteps) {
    Vec g = random_vec(s.rows.size() * kD, s.seed);
    const int64_t n = static_cast<int64_t>(s.rows.size());
    embedding_rowwise_adagrad(cpu(2), t.data(), acc.data(), s.rows.data(), g.data(), kR, n, kD, h);
    embedding_adagrad(cpu(1), te.data(), acce.data(), s.rows.data(), g.data(), kR, n, kD, h);
    for (size_t k = 0; k < s.rows.size(); ++k)
      test::ref_rowwise_adagrad(&td[size_t(s.rows[k]) * kD], accd[size_t(s.rows[k])], &g[k * kD],
                                kD, h);
  }
  expect_close(t, td, kAtol, kRtol, "rowwise adagrad table");
  expect_close(acc, accd, kAtol, kRtol, "rowwise adagrad accumulators");
  for (int r : {0, 2, 9}) {  // never touched
    EXPECT_EQ(acc[size_t(r)], h.initial_accumulator) << r;
    EXPECT_EQ(std::memcmp(&t[size_t(r) * kD], &t0[size_t(r) * kD], kD * 4), 0) << r;
  }
  EXPECT_GT(acc[4], acc[1]) << "row 4 was touched twice, row 1 once";
  double apart = 0;
  for (size_t i = 0; i < t.size(); ++i) apart = std::max(apart, std::fabs(double(t[i]) - te[i]));
  EXPECT_GT(apart, 1e-3) << "row-wise Adagrad stepped like per-element Adagrad";
}

// Columns given directly (GivenColumns) against the same update over gradient rows that carry
// them on each row's first gradient row and zeros on its others: the same bits, −0 included,
// for rows with one gradient row, a few, and more than one sub-run (kSubRun). The given
// columns of the gradient rows are never read (NaN there changes nothing); rows outside the
// given range sum all their columns.
TEST(EmbeddingOptim, GivenColumnsAreTheSumOfAFirstRowAndZeros) {
  const int64_t R = 40, lo = 10, hi = 35;
  const int D = 9, col = 4, w = D - col;
  std::mt19937 gen(8);
  std::vector<RowId> rows;
  for (int k = 0; k < 150; ++k) rows.push_back(RowId(12));  // past two sub-runs
  for (int k = 0; k < 400; ++k) rows.push_back(RowId(gen() % R));
  rows.push_back(RowId(33));  // one more of row 33; row 34 stays absent or rare
  std::shuffle(rows.begin(), rows.end(), gen);
  const int64_t n = int64_t(rows.size());
  Vec given = random_vec(size_t(hi - lo) * w, 21);
  given[0] = -0.0f;
  given[size_t(12 - lo) * w + 1] = -0.0f;
  given[size_t(33 - lo) * w + 2] = -0.0f;
  Vec grads = random_vec(size_t(n) * D, 22), full = grads;
  std::vector<bool> seen(size_t(R), false);
  for (int64_t k = 0; k < n; ++k) {
    const RowId r = rows[size_t(k)];
    if (r < lo || r >= hi) continue;
    for (int d = col; d < D; ++d) {
      full[size_t(k) * D + d] = seen[size_t(r)] ? 0.0f : given[size_t(r - lo) * w + d - col];
      grads[size_t(k) * D + d] = std::nanf("");
    }
    seen[size_t(r)] = true;
  }
  EmbeddingOptimizerConfig opt;
  opt.kind = EmbeddingOptimizer::kDenseAdam;
  opt.adam = tf_garden_adam(0.0f);
  const Vec start = random_vec(size_t(R) * D, 23);
  Vec tab[2] = {start, start}, m[2], v[2];
  for (int i = 0; i < 2; ++i) {
    m[i].assign(size_t(R) * D, 0.0f);
    v[i].assign(size_t(R) * D, 0.0f);
  }
  for (int64_t t = 1; t <= 2; ++t) {
    reduce_update_rows(cpu(2), rows.data(), full.data(), n,
                       TableRows{tab[0].data(), m[0].data(), v[0].data(), R, D}, opt, t);
    reduce_update_rows(cpu(2), rows.data(), grads.data(), n,
                       TableRows{tab[1].data(), m[1].data(), v[1].data(), R, D}, opt, t, nullptr,
                       GivenColumns{given.data(), lo, hi, col});
  }
  EXPECT_EQ(0, std::memcmp(tab[0].data(), tab[1].data(), tab[0].size() * 4)) << "rows";
  EXPECT_EQ(0, std::memcmp(m[0].data(), m[1].data(), m[0].size() * 4)) << "first moments";
  EXPECT_EQ(0, std::memcmp(v[0].data(), v[1].data(), v[0].size() * 4)) << "second moments";
  // Only dense Adam takes them.
  opt.kind = EmbeddingOptimizer::kLazyAdam;
  EXPECT_THROW(reduce_update_rows(cpu(1), rows.data(), full.data(), n,
                                  TableRows{tab[0].data(), m[0].data(), v[0].data(), R, D}, opt, 3,
                                  nullptr, GivenColumns{given.data(), lo, hi, col}),
               Error);
}

TEST(EmbeddingOptim, RejectsUnsortedOrOutOfRangeRows) {
  Vec table(kR * kD), m(kR * kD), v(kR * kD), g(2 * kD);
  std::vector<RowId> unsorted = {4, 2}, dup = {3, 3}, out_of_range = {2, kR};
  for (const auto* rows : {&unsorted, &dup, &out_of_range})
    EXPECT_THROW(embedding_lazy_adam(cpu(1), table.data(), m.data(), v.data(), rows->data(),
                                     g.data(), kR, 2, kD, 1, AdamHyper{}),
                 Error);
  try {
    embedding_sgd(cpu(1), table.data(), out_of_range.data(), g.data(), kR, 2, kD, SgdHyper{});
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unique_rows[1]=10"), std::string::npos) << e.what();
  }
}

// ---- gather and sort-reduce ------------------------------------------------------

// BF16 rows: the gather widens, the store rounds each element with its own
// word of the stream (seed, table rounding, tag << 40 | global row) at t·D + d
// (written out here from CounterRng), the global row coming from the key's
// layout (row-wise over W = 3 on rank 1: flat row k is id 3k + 1); scatter and
// offset move rows as loops do.
TEST(Rows, Bf16RowsGatherAndStochasticStoreFollowTheirKeys) {
  const int D = 5;
  const int64_t R = 40, n = 7;
  RowRounding key;
  key.seed = 77;
  key.step = 12;
  key.first = 3;
  key.rank = 1;
  key.layout.W = 3;
  key.layout.T = 1;
  key.layout.key_begin[1] = 3 * (R + 3);
  key.layout.placement[0] = Placement::kRowWise;
  key.tag[0] = 2;
  const Vec src = random_vec(size_t(n) * D, 31);
  const std::vector<RowId> rows = {0, 4, 5, 11, 20, 33, 39};
  std::vector<uint16_t> table(size_t(R) * D, 0x1234), want = table;
  for (int threads : {1, 3}) {
    std::vector<uint16_t> got = table;
    store_rows_bf16(cpu(threads), src.data(), rows.data(), got.data(), R, n, D, key);
    for (int64_t k = 0; k < n; ++k)
      for (int d = 0; d < D; ++d) {
        const uint64_t id = uint64_t(3 + rows[size_t(k)]) * 3 + 1;
        const CounterRng rng{77, kStreamTableRounding, (uint64_t{2} << 40) | id};
        want[size_t(rows[size_t(k)]) * D + d] =
            float_to_bf16_bits_stochastic(src[size_t(k) * D + d], rng.u32(uint64_t(12 * D + d)));
      }
    EXPECT_EQ(got, want) << threads << " threads";
  }
  int moved_up = 0;  // the draws are not all one way
  for (int64_t k = 0; k < n; ++k)
    for (int d = 0; d < D; ++d) {
      const float x = src[size_t(k) * D + d];
      const float y = bf16_bits_to_float(want[size_t(rows[size_t(k)]) * D + d]);
      EXPECT_LT(std::fabs(double(y) - x), std::ldexp(std::fabs(double(x)), -7));
      moved_up += std::fabs(y) > std::fabs(x);
    }
  EXPECT_GT(moved_up, 3);
  EXPECT_LT(moved_up, n * D - 3);
  Vec back(size_t(n) * D);
  gather_rows_bf16(cpu(2), want.data(), rows.data(), back.data(), R, n, D);
  for (int64_t k = 0; k < n; ++k)
    for (int d = 0; d < D; ++d)
      EXPECT_EQ(back[size_t(k) * D + d], bf16_bits_to_float(want[size_t(rows[size_t(k)]) * D + d]));
  Vec dense(size_t(R) * D, -1.0f);
  scatter_rows(cpu(2), src.data(), rows.data(), dense.data(), R, n, D);
  for (int64_t k = 0; k < n; ++k)
    EXPECT_EQ(std::memcmp(&dense[size_t(rows[size_t(k)]) * D], &src[size_t(k) * D], D * 4), 0);
  EXPECT_EQ(dense[size_t(1) * D], -1.0f);
  std::vector<RowId> shifted(static_cast<size_t>(n)), iota(static_cast<size_t>(n));
  offset_rows(cpu(1), rows.data(), n, -4, shifted.data());
  offset_rows(cpu(1), nullptr, n, 0, iota.data());
  for (int64_t k = 0; k < n; ++k) {
    EXPECT_EQ(shifted[size_t(k)], rows[size_t(k)] - 4);
    EXPECT_EQ(iota[size_t(k)], k);
  }
  const std::vector<RowId> repeated = {3, 3};
  EXPECT_THROW(scatter_rows(cpu(1), src.data(), repeated.data(), dense.data(), R, 2, D), Error);
  const std::vector<RowId> outside = {0, int32_t(R)};
  EXPECT_THROW(gather_rows_bf16(cpu(1), want.data(), outside.data(), back.data(), R, 2, D), Error);
}

TEST(Rows, GatherMatchesLoop) {
  for (int D : {1, 3, 8, 13}) {
    const int R = 17, n = 40;
    Vec table = random_vec(R * D, 8);
    std::vector<RowId> ids(n);
    std::mt19937 gen(9);
    for (RowId& id : ids) id = static_cast<RowId>(gen() % R);
    Vec out(n * D, -1.0f);
    gather_rows(cpu(2), table.data(), ids.data(), out.data(), R, n, D);
    for (int k = 0; k < n; ++k)
      for (int d = 0; d < D; ++d) ASSERT_EQ(out[k * D + d], table[ids[k] * D + d]) << k;
  }
  Vec table(4), out(2);
  std::vector<RowId> bad = {1, 4};
  try {
    gather_rows(cpu(1), table.data(), bad.data(), out.data(), 4, 2, 1);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids[1]=4"), std::string::npos) << e.what();
  }
  gather_rows(cpu(1), nullptr, nullptr, nullptr, 0, 0, 3);  // empty is fine
}

// Naive reduction: a map from id to its sub-run sums (a new one every kSubRun
// occurrences, each summed in input order), added in sub-run order at the end.
void check_sort_reduce(const std::vector<RowId>& ids, int D, int threads) {
  SCOPED_TRACE(::testing::Message() << "n=" << ids.size() << " D=" << D << " threads=" << threads);
  const int64_t n = static_cast<int64_t>(ids.size());
  Vec grads = random_vec(ids.size() * D, 10 + D);
  std::map<RowId, std::pair<int64_t, std::vector<Vec>>> subs;  // id → (count, sub-run sums)
  for (int64_t k = 0; k < n; ++k) {
    auto& [count, parts] = subs[ids[k]];
    const float* g = &grads[k * D];
    if (count++ % kSubRun == 0)
      parts.emplace_back(g, g + D);
    else
      for (int d = 0; d < D; ++d) parts.back()[d] += g[d];
  }
  std::map<RowId, Vec> want;
  for (const auto& [id, entry] : subs) {
    Vec sum = entry.second[0];
    for (size_t s = 1; s < entry.second.size(); ++s)
      for (int d = 0; d < D; ++d) sum[d] += entry.second[s][d];
    want.emplace(id, sum);
  }
  std::vector<RowId> rows(n + 1, -1);
  Vec out((n + 1) * D, 7.0f);
  int64_t n_unique = -1;
  sort_reduce_rows(cpu(threads), ids.data(), grads.data(), n, D, rows.data(), out.data(),
                   &n_unique);
  ASSERT_EQ(n_unique, static_cast<int64_t>(want.size()));
  int64_t u = 0;
  for (const auto& [id, sum] : want) {
    EXPECT_EQ(rows[u], id) << "unique row " << u;
    for (int d = 0; d < D; ++d)
      EXPECT_EQ(out[u * D + d], sum[d]) << "row " << id << " col " << d;  // bit-exact
    ++u;
  }
  EXPECT_EQ(rows[n_unique], -1) << "wrote past n_unique";
}

TEST(Rows, SortReduceMatchesMapReduction) {
  std::mt19937 gen(11);
  std::vector<RowId> many(3000);
  for (RowId& id : many) id = static_cast<RowId>(gen() % 50);  // many duplicates
  std::vector<RowId> spread(500);
  for (RowId& id : spread) id = static_cast<RowId>(gen() % 100000);
  for (int D : {1, 3, 5, 8}) {
    for (int threads : {1, 2}) {
      check_sort_reduce(many, D, threads);
      check_sort_reduce(spread, D, threads);
      check_sort_reduce({}, D, threads);
      check_sort_reduce({42}, D, threads);
      check_sort_reduce({9, 3, 9, 0, 3, 9}, D, threads);
    }
  }
}

// A hot id (as under Zipf item popularity) next to runs of exactly kSubRun,
// kSubRun + 1 and 1 rows, the ids shuffled. Checked bit for bit against the
// documented order written out as a plain loop over each run's input positions,
// within a bound against the exact (double) sum, and for equality at 1 and 2
// threads.
TEST(Rows, SortReduceHotIdFollowsSubRunOrder) {
  constexpr int64_t kHot = 10000;
  const RowId hot = 5, at_sub = 77, past_sub = 3, single = 1000;
  std::vector<RowId> ids;
  ids.insert(ids.end(), kHot, hot);
  ids.insert(ids.end(), kSubRun, at_sub);
  ids.insert(ids.end(), kSubRun + 1, past_sub);
  ids.push_back(single);
  std::mt19937 gen(12);
  for (int k = 0; k < 2000; ++k) ids.push_back(static_cast<RowId>(2000 + gen() % 500));
  std::shuffle(ids.begin(), ids.end(), gen);
  const int64_t n = static_cast<int64_t>(ids.size());

  for (int D : {1, 7, 8}) {
    SCOPED_TRACE(::testing::Message() << "D=" << D);
    // Gradients of one sign in part (0.5 .. 1.5): a long sum's rounding shows.
    Vec grads = random_vec(size_t(n) * D, 20 + D, -0.5f, 1.5f);
    std::vector<Vec> outs;
    std::vector<RowId> rows;
    int64_t n_unique = -1;
    for (int threads : {1, 2}) {
      rows.assign(n, -1);
      outs.emplace_back(size_t(n) * D, 7.0f);
      sort_reduce_rows(cpu(threads), ids.data(), grads.data(), n, D, rows.data(),
                       outs.back().data(), &n_unique);
    }
    ASSERT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size() * sizeof(float)), 0)
        << "1 and 2 threads differ";
    const Vec& out = outs[0];

    // Unique ids ascending, each run's input positions in order.
    std::map<RowId, std::vector<int64_t>> runs;
    for (int64_t k = 0; k < n; ++k) runs[ids[k]].push_back(k);
    ASSERT_EQ(n_unique, static_cast<int64_t>(runs.size()));
    EXPECT_EQ(runs[hot].size(), size_t(kHot));
    int64_t u = 0;
    for (const auto& [id, at] : runs) {
      ASSERT_EQ(rows[u], id) << "unique row " << u;
      const int64_t L = static_cast<int64_t>(at.size());
      for (int d = 0; d < D; ++d) {
        // The documented order: p_s = g[at[s·kSubRun]] + … (left to right), then
        // total = p_0 + p_1 + … (left to right).
        float total = 0.0f;
        double exact = 0.0, abs_sum = 0.0;
        for (int64_t s0 = 0; s0 < L; s0 += kSubRun) {
          float p = grads[at[s0] * D + d];
          for (int64_t j = s0 + 1; j < std::min(L, s0 + kSubRun); ++j) p += grads[at[j] * D + d];
          total = s0 == 0 ? p : total + p;
        }
        for (int64_t k : at) {
          exact += grads[k * D + d];
          abs_sum += std::fabs(grads[k * D + d]);
        }
        const float got = out[u * D + d];
        ASSERT_EQ(std::memcmp(&got, &total, sizeof(float)), 0)
            << "row " << id << " (" << L << " rows) col " << d << ": " << got << " vs " << total;
        // Float rounding of at most kSubRun + L / kSubRun additions in sequence,
        // each off by ≤ 2^-24 of a partial sum ≤ Σ|g|: the bound (kSubRun + L /
        // kSubRun)·2^-24·Σ|g| (a plain left-to-right sum would need L·2^-24·Σ|g|).
        const double tol = double(kSubRun + L / kSubRun + 1) * 0x1.0p-24 * abs_sum;
        EXPECT_LE(std::fabs(double(got) - exact), tol) << "row " << id << " col " << d;
      }
      ++u;
    }
  }
}

// ---- the fused reduce-and-update ---------------------------------------------------

struct TableCopy {
  Vec table, m, v;
  TableRows rows(int64_t R, int D) { return TableRows{table.data(), m.data(), v.data(), R, D}; }
};

TableCopy random_table(int64_t R, int D, uint32_t seed) {
  TableCopy c;
  c.table = random_vec(size_t(R) * D, seed);
  c.m = random_vec(size_t(R) * D, seed + 1, -0.1f, 0.1f);
  c.v = random_vec(size_t(R) * D, seed + 2, 0.0f, 0.01f);  // second moment / accumulator >= 0
  return c;
}

EmbeddingOptimizerConfig config_of(EmbeddingOptimizer kind) {
  EmbeddingOptimizerConfig o;
  o.kind = kind;
  o.adam = tf_garden_adam(0.01f);
  o.adagrad = AdagradHyper{0.05f, 0.1f, 1e-7f, 0.01f};
  o.sgd = SgdHyper{0.3f, 0.01f};
  return o;
}

bool same_bits(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// ids: duplicates everywhere, one hot row repeated past two sub-runs, rows at
// both ends of the table.
std::vector<RowId> fused_ids(int64_t n, int64_t R, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int64_t> any(0, R - 1);
  std::vector<RowId> ids(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    const int64_t pick = k % 7;
    ids[size_t(k)] = RowId(pick == 0 ? R / 2 : pick == 1 ? 0 : pick == 2 ? R - 1 : any(gen));
  }
  return ids;
}

TEST(FusedUpdate, EqualsSortReduceThenOptimizerBitForBit) {
  for (EmbeddingOptimizer kind :
       {EmbeddingOptimizer::kDenseAdam, EmbeddingOptimizer::kLazyAdam, EmbeddingOptimizer::kSgd,
        EmbeddingOptimizer::kAdagrad, EmbeddingOptimizer::kRowwiseAdagrad}) {
    const EmbeddingOptimizerConfig opt = config_of(kind);
    for (int D : {1, 5, 8}) {
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{37}, int64_t{1000}}) {
        for (int64_t R : {int64_t{3}, int64_t{300}, int64_t{70001}}) {
          SCOPED_TRACE(::testing::Message()
                       << optimizer_name(kind) << " D=" << D << " n=" << n << " R=" << R);
          const std::vector<RowId> ids = fused_ids(n, R, uint32_t(n + R + D));
          const Vec grads = random_vec(size_t(n) * D, 7);
          // Three separate steps, one thread.
          TableCopy want = random_table(R, D, 11);
          std::vector<RowId> urows(static_cast<size_t>(n));
          Vec ugrads(size_t(n) * D);
          int64_t nu = -1;
          sort_reduce_rows(cpu(1), ids.data(), grads.data(), n, D, urows.data(), ugrads.data(),
                           &nu);
          apply_table_optimizer(cpu(1), want.rows(R, D), urows.data(), ugrads.data(), nu, opt, 3);
          for (int threads : {1, 2, 3}) {
            TableCopy got = random_table(R, D, 11);
            int64_t fused_nu = -1;
            reduce_update_rows(cpu(threads), ids.data(), grads.data(), n, got.rows(R, D), opt, 3,
                               &fused_nu);
            EXPECT_EQ(fused_nu, nu) << threads << " threads";
            EXPECT_TRUE(same_bits(got.table, want.table)) << threads << " threads: table";
            EXPECT_TRUE(same_bits(got.m, want.m)) << threads << " threads: first state";
            EXPECT_TRUE(same_bits(got.v, want.v)) << threads << " threads: second state";
          }
        }
      }
    }
  }
}

// The update is not a no-op: a touched row moves, and only dense Adam moves an
// untouched row (with a nonzero moment).
TEST(FusedUpdate, MovesTouchedRowsAndDenseAdamDecaysTheRest) {
  const int D = 4;
  const int64_t R = 6;
  const std::vector<RowId> ids = {2, 2, 5};
  const Vec grads = random_vec(ids.size() * D, 3);
  for (EmbeddingOptimizer kind : {EmbeddingOptimizer::kDenseAdam, EmbeddingOptimizer::kSgd}) {
    TableCopy before = random_table(R, D, 5), after = before;
    reduce_update_rows(cpu(2), ids.data(), grads.data(), int64_t(ids.size()), after.rows(R, D),
                       config_of(kind), 1);
    for (int64_t r = 0; r < R; ++r) {
      const bool touched = r == 2 || r == 5;
      const bool moved =
          !std::equal(&before.table[r * D], &before.table[r * D] + D, &after.table[r * D]);
      EXPECT_EQ(moved, touched || kind == EmbeddingOptimizer::kDenseAdam)
          << optimizer_name(kind) << " row " << r;
    }
  }
}

TEST(FusedUpdate, RowOutsideTheTableIsNamed) {
  TableCopy c = random_table(4, 2, 1);
  const std::vector<RowId> ids = {1, 4};
  const Vec grads(4, 1.0f);
  try {
    reduce_update_rows(cpu(1), ids.data(), grads.data(), 2, c.rows(4, 2),
                       config_of(EmbeddingOptimizer::kSgd), 1);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rows[1]=4 outside the table's rows [0, 4)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ncf
