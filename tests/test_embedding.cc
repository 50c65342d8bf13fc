// The embedding collection in one process at W = 1, where it routes nothing:
// the lookup of two tables against the tables read back, the fused update
// against a written-out SGD loop, --dedup against no dedup, the initial values
// against the documented draw (and the same at 1 and 2 threads), and the
// memory estimate against the buffers the collection really holds. The W > 1
// paths are proved against this one in test_distributed (real mpirun jobs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "comm/single_communicator.h"
#include "common/bf16.h"
#include "common/check.h"
#include "common/philox.h"
#include "embedding/collection.h"

namespace ncf {
namespace {

constexpr int64_t kUsers = 61, kItems = 97;

EmbeddingPlan two_tables(Placement p, int D = 6, int64_t users = kUsers, int64_t items = kItems) {
  EmbeddingPlan plan;
  plan.D = D;
  plan.W = 1;
  plan.tables = {{"user", users, p, 0, 1, 0.01f}, {"item", items, p, 0, 2, 0.01f}};
  return plan;
}

EmbeddingOptimizerConfig sgd(float lr) {
  EmbeddingOptimizerConfig o;
  o.kind = EmbeddingOptimizer::kSgd;
  o.sgd = {lr, 0.0f};
  return o;
}

std::vector<int32_t> random_ids(int64_t n, int64_t N, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& x : ids) x = static_cast<int32_t>(g() % (g() % 3 == 0 ? 5 : N));  // hot ids 0..4
  return ids;
}

TEST(CollectionOneRank, LookupReturnsEachTablesRowsInBatchOrder) {
  SingleCommunicator comm;
  ExecContext ctx;
  for (Placement p : {Placement::kRowWise, Placement::kTableWise, Placement::kReplicated}) {
    EmbeddingCollection e(two_tables(p), comm, ctx, sgd(0.1f), false);
    e.init(7);
    const std::vector<float> tables[2] = {e.gather_table(0), e.gather_table(1)};
    ASSERT_EQ(tables[0].size(), size_t(kUsers) * 6);
    ASSERT_EQ(tables[1].size(), size_t(kItems) * 6);
    const std::vector<int32_t> ids[2] = {random_ids(300, kUsers, 4), random_ids(500, kItems, 3)};
    e.lookup({{ids[0].data(), 300}, {ids[1].data(), 500}});
    for (int t = 0; t < 2; ++t)
      for (size_t k = 0; k < ids[t].size(); ++k)
        for (int d = 0; d < 6; ++d)
          ASSERT_EQ(e.rows(t)[k * 6 + d], tables[t][size_t(ids[t][k]) * 6 + d])
              << placement_name(p) << " table " << t << " k=" << k << " d=" << d;
    EXPECT_EQ(comm.counters().total_calls(), 0)
        << placement_name(p) << ": one rank exchanges nothing";
    EXPECT_EQ(e.replicated_grad_floats(), 0) << "one rank has nothing to allreduce";
  }
}

// A lookup of part of the item rows (the step's, where layer 0 reads the rest from the table)
// writes their first columns and leaves the others as the lookup before wrote them;
// local_rows is the table in row order. A BF16 wire, or a width past D, is refused.
TEST(CollectionOneRank, ANarrowLookupWritesTheFirstColumnsOnly) {
  SingleCommunicator comm;
  ExecContext ctx;
  EmbeddingCollection e(two_tables(Placement::kRowWise), comm, ctx, sgd(0.1f), false);
  e.init(7);
  ASSERT_TRUE(e.narrow_lookups());
  const std::vector<float> items = e.gather_table(1);
  ASSERT_EQ(std::vector<float>(e.local_rows(1), e.local_rows(1) + items.size()), items);
  const std::vector<int32_t> users = random_ids(30, kUsers, 4), a = random_ids(50, kItems, 3),
                             b = random_ids(50, kItems, 5);
  e.lookup({{users.data(), 30}, {a.data(), 50}});
  for (int w : {2, 1}) {
    e.lookup({{users.data(), 30}, {b.data(), 50, w}});
    for (size_t k = 0; k < b.size(); ++k)
      for (int d = 0; d < 6; ++d)
        ASSERT_EQ(e.rows(1)[k * 6 + d], items[size_t(d < w ? b[k] : a[k]) * 6 + d])
            << "width " << w << " k=" << k << " d=" << d;
    e.lookup({{users.data(), 30}, {a.data(), 50}});
  }
  EXPECT_THROW(e.lookup({{users.data(), 30}, {b.data(), 50, 7}}), Error);
  e.set_exchange_dtype(WireDType::kBFloat16);
  EXPECT_FALSE(e.narrow_lookups());
  EXPECT_EQ(e.local_rows(1), nullptr);
  EXPECT_THROW(e.lookup({{users.data(), 30}, {b.data(), 50, 2}}), Error);
}

TEST(CollectionOneRank, AnIdOutsideItsTableNamesTheTable) {
  SingleCommunicator comm;
  ExecContext ctx;
  EmbeddingCollection e(two_tables(Placement::kRowWise), comm, ctx, sgd(0.1f), false);
  // Item 61 would be a valid key of the flat buffer (it lies past the user rows).
  const std::vector<int32_t> users = {0, kUsers}, items = {0, 1};
  try {
    e.lookup({{users.data(), 2}, {items.data(), 2}});
    FAIL() << "no throw";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_EQ(msg.find("table user: "), 0u) << msg;
    EXPECT_NE(msg.find("id 61 at batch position 1 outside the table's rows [0, 61)"),
              std::string::npos)
        << msg;
  }
}

TEST(CollectionOneRank, SgdUpdateSubtractsTheSummedGradientOfEachRow) {
  SingleCommunicator comm;
  ExecContext ctx;
  ctx.threads = 2;
  EmbeddingCollection e(two_tables(Placement::kRowWise), comm, ctx, sgd(0.5f), false);
  e.init(11);
  const std::vector<float> before[2] = {e.gather_table(0), e.gather_table(1)};
  const std::vector<int32_t> ids[2] = {random_ids(200, kUsers, 6), random_ids(300, kItems, 5)};
  e.lookup({{ids[0].data(), 200}, {ids[1].data(), 300}});
  std::mt19937 g(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> grads[2];
  for (int t = 0; t < 2; ++t) {
    grads[t].resize(ids[t].size() * 6);
    for (float& x : grads[t]) x = u(g);
    std::copy(grads[t].begin(), grads[t].end(), e.row_grads(t));
  }
  e.gradients_start(nullptr);
  e.gradients_finish(1);
  for (int t = 0; t < 2; ++t) {
    const std::vector<float> after = e.gather_table(t);
    // Written-out: each row's gradient summed in double, then p - lr * g.
    std::vector<double> sum(before[t].size(), 0.0);
    for (size_t k = 0; k < ids[t].size(); ++k)
      for (int d = 0; d < 6; ++d) sum[size_t(ids[t][k]) * 6 + d] += grads[t][k * 6 + d];
    for (size_t i = 0; i < before[t].size(); ++i) {
      const double want = double(before[t][i]) - 0.5 * sum[i];
      ASSERT_NEAR(after[i], want, 1e-5 * (1 + std::fabs(sum[i]))) << "table " << t << " " << i;
    }
  }
}

// --dedup changes what would travel, not the numbers: at W = 1 both runs agree
// bit for bit (lazy Adam, so the update depends on the exact summed gradient).
TEST(CollectionOneRank, DedupGivesTheSameBitsAsNoDedup) {
  SingleCommunicator comm;
  ExecContext ctx;
  EmbeddingOptimizerConfig o;
  o.kind = EmbeddingOptimizer::kLazyAdam;
  std::vector<float> result[2];
  for (int dedup = 0; dedup < 2; ++dedup) {
    EmbeddingCollection e(two_tables(Placement::kRowWise), comm, ctx, o, dedup == 1);
    e.init(5);
    for (int64_t t = 1; t <= 3; ++t) {
      const std::vector<int32_t> u = random_ids(101, kUsers, uint32_t(t + 10)),
                                 i = random_ids(257, kItems, uint32_t(t));
      e.lookup({{u.data(), 101}, {i.data(), 257}});
      for (int k = 0; k < 2; ++k)
        for (int64_t x = 0; x < (k ? 257 : 101) * 6; ++x)
          e.row_grads(k)[x] = e.rows(k)[x] * 3.0f - 0.01f * float(x % 7);
      e.gradients_start(nullptr);
      e.gradients_finish(t);
    }
    result[dedup] = e.gather_table(1);
  }
  ASSERT_EQ(result[0], result[1]);
}

// The documented draw: row r of the table tagged `tag` has its pair (j, j+1)
// from Box-Muller on the 53-bit uniforms j and j+1 of the counter stream
// (seed, init, tag << 40 | r) — whatever the other tables are.
TEST(CollectionOneRank, InitIsTheDocumentedDrawAtAnyThreadCount) {
  SingleCommunicator comm;
  const EmbeddingPlan plan = two_tables(Placement::kRowWise, 7, 11, 5003);
  std::vector<float> got[2];
  for (int threads : {1, 2}) {
    ExecContext ctx;
    ctx.threads = threads;
    EmbeddingCollection e(plan, comm, ctx, sgd(0.1f), false);
    e.init(42);
    got[threads - 1] = e.gather_table(1);
  }
  ASSERT_EQ(got[0], got[1]);
  for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{2500}, int64_t{5002}}) {
    CounterRng rng{42, kStreamInit, (uint64_t{2} << 40) | uint64_t(r)};
    for (int j = 0; j < 7; j += 2) {
      const double rad = std::sqrt(-2.0 * std::log(1.0 - rng.uniform_double(uint64_t(j))));
      const double ang = 2 * M_PI * rng.uniform_double(uint64_t(j) + 1);
      EXPECT_EQ(got[0][size_t(r) * 7 + j], float(0.01f * rad * std::cos(ang))) << r << "," << j;
      if (j + 1 < 7) {
        EXPECT_EQ(got[0][size_t(r) * 7 + j + 1], float(0.01f * rad * std::sin(ang)))
            << r << "," << j;
      }
    }
  }
  double sq = 0;
  for (float x : got[0]) sq += double(x) * x;
  EXPECT_NEAR(std::sqrt(sq / double(got[0].size())), 0.01, 0.0005);  // N(0, 0.01²)
}

// The memory estimate counts at least what a step's lookup and update allocate.
TEST(CollectionOneRank, ExchangeEstimateCoversTheBuffersHeld) {
  SingleCommunicator comm;
  ExecContext ctx;
  for (Placement p : {Placement::kRowWise, Placement::kReplicated})
    for (bool dedup : {false, true}) {
      const EmbeddingPlan plan = two_tables(p, 8);
      EmbeddingCollection e(plan, comm, ctx, sgd(0.1f), dedup);
      e.init(1);
      const std::vector<int32_t> u = random_ids(400, kUsers, 7), i = random_ids(1000, kItems, 8);
      e.lookup({{u.data(), 400}, {i.data(), 1000}});
      e.gradients_start(nullptr);
      e.gradients_finish(1);
      const int64_t held = e.step_buffer_bytes();
      const int64_t est = exchange_buffer_bytes(plan, {400, 1000}, dedup);
      EXPECT_GE(est, held) << placement_name(p) << " dedup " << dedup;
      EXPECT_LE(est, 3 * held) << placement_name(p) << " dedup " << dedup;
      // More ranks add the routing buffers and the exchanged rows.
      EmbeddingPlan two = two_tables(Placement::kRowWise, 8);
      two.W = 2;
      EXPECT_GT(exchange_buffer_bytes(two, {400, 1000}, dedup), est);
    }
}

// The nearest BF16 written out a second way: 8 significant bits of the
// binary significand, rounded with the FPU's ties-to-even rint.
float nearest_bf16(float x) {
  int e = 0;
  const double m = std::frexp(double(x), &e);  // x = m · 2^e, 0.5 <= |m| < 1
  return float(std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8));
}

// BF16 payloads at W = 1: the lookup hands out the rows rounded as a sender
// would, and the update applies the FP32 sum of the gradients each rounded as
// a sender would (hand-worked: 1 + 2^-8 + 2^-8 is 1.0078125 summed in FP32,
// 1 summed in BF16; 1 + 2^-8 + 2^-10 rounds up to 1 + 2^-7, truncation gives 1),
// while the table keeps its FP32 values and replicated tables are not rounded.
TEST(CollectionOneRank, Bf16PayloadsRoundRowsAndGradientsAndSumInFp32) {
  SingleCommunicator comm;
  ExecContext ctx;
  ctx.threads = 2;
  EmbeddingPlan plan = two_tables(Placement::kRowWise, 4);
  plan.tables[1].placement = Placement::kReplicated;
  EmbeddingCollection e(plan, comm, ctx, sgd(1.0f), false);
  e.set_exchange_dtype(WireDType::kBFloat16);
  e.init(3);
  const std::vector<float> users = e.gather_table(0), items = e.gather_table(1);
  const std::vector<int32_t> u = {5, 5, 5, 9}, it = {2};
  e.lookup({{u.data(), 4}, {it.data(), 1}});
  int rounded_away = 0;
  for (size_t k = 0; k < u.size(); ++k)
    for (int d = 0; d < 4; ++d) {
      const float p = users[size_t(u[k]) * 4 + d];
      ASSERT_EQ(e.rows(0)[k * 4 + d], nearest_bf16(p)) << k << "," << d;
      rounded_away += e.rows(0)[k * 4 + d] != p;
    }
  EXPECT_GT(rounded_away, 0) << "N(0, 0.01²) draws are not BF16 values";
  for (int d = 0; d < 4; ++d) ASSERT_EQ(e.rows(1)[d], items[2 * 4 + d]) << "replicated: FP32";
  const float g[4] = {1.0f, 0x1p-8f, 0x1p-8f, 1.0f + 0x1p-8f + 0x1p-10f};
  for (size_t k = 0; k < u.size(); ++k)
    for (int d = 0; d < 4; ++d) e.row_grads(0)[k * 4 + d] = g[k] * float(d + 1);
  e.row_grads(1)[0] = 0x1p-8f + 0x1p-10f;
  for (int d = 1; d < 4; ++d) e.row_grads(1)[d] = 0.0f;
  e.gradients_start(nullptr);
  e.gradients_finish(1);
  const std::vector<float> after = e.gather_table(0), items_after = e.gather_table(1);
  for (int d = 0; d < 4; ++d) {
    const float s = float(d + 1);
    float sum = 0.0f;  // FP32, in batch order, of the gradients as rounded
    for (int k = 0; k < 3; ++k) sum += nearest_bf16(g[k] * s);
    EXPECT_EQ(after[5 * 4 + d], users[5 * 4 + d] - sum) << "row 5 column " << d;
    EXPECT_EQ(after[9 * 4 + d], users[9 * 4 + d] - nearest_bf16(g[3] * s)) << "row 9 column " << d;
  }
  EXPECT_EQ(after[5 * 4 + 0], users[5 * 4 + 0] - (1.0f + 0x1p-7f)) << "hand-worked FP32 sum";
  EXPECT_EQ(after[9 * 4 + 0], users[9 * 4 + 0] - (1.0f + 0x1p-7f)) << "hand-worked rounding";
  EXPECT_EQ(items_after[2 * 4], items[2 * 4] - (0x1p-8f + 0x1p-10f)) << "replicated: FP32";
}

// BF16 rows at W = 1: a lookup reads the stored rows widened; an update is the
// FP32 rule on the widened row, written back with the rounding stream of
// (seed, table tag, global row) at word t·D + d — written out here from
// CounterRng for SGD (touched rows) and dense Adam (every row, untouched ones
// with a zero gradient); the checkpoint chunks carry the rows exactly.
TEST(CollectionOneRank, Bf16RowsUpdateInFp32AndRoundStochasticallyByKey) {
  SingleCommunicator comm;
  ExecContext ctx;
  ctx.threads = 2;
  const int D = 4;
  auto expected = [&](const std::vector<float>& before, const std::vector<float>& grad_sum,
                      const std::vector<int>& touched, const EmbeddingOptimizerConfig& o,
                      uint32_t tag, int64_t t, std::vector<float> m, std::vector<float> v) {
    std::vector<float> after(before.size());
    const AdamStepScalars sc = adam_step_scalars(o.adam, t);
    for (size_t r = 0; r * D < before.size(); ++r)
      for (int d = 0; d < D; ++d) {
        const size_t i = r * D + size_t(d);
        float p = before[i];
        if (o.kind == EmbeddingOptimizer::kSgd) {
          if (!touched[r]) {
            after[i] = p;
            continue;
          }
          sgd_update(&p, grad_sum[i], o.sgd);
        } else {
          adam_update(&p, &m[i], &v[i], grad_sum[i], sc);
        }
        const CounterRng rng{5, kStreamTableRounding, (uint64_t(tag) << 40) | r};
        after[i] = bf16_bits_to_float(
            float_to_bf16_bits_stochastic(p, rng.u32(uint64_t(t) * D + uint64_t(d))));
      }
    return after;
  };
  for (EmbeddingOptimizer kind : {EmbeddingOptimizer::kSgd, EmbeddingOptimizer::kDenseAdam}) {
    EmbeddingOptimizerConfig o = sgd(0.5f);
    o.kind = kind;
    EmbeddingPlan plan = two_tables(Placement::kRowWise, D);
    plan.table_elem_bytes = 2;
    EmbeddingCollection e(plan, comm, ctx, o, false);
    e.init(5);
    const std::vector<float> users = e.gather_table(0);
    for (float x : users) ASSERT_EQ(x, round_to_bf16(x)) << "stored rows are BF16 values";
    const std::vector<int32_t> u = random_ids(50, kUsers, 21), it = random_ids(30, kItems, 22);
    e.lookup({{u.data(), 50}, {it.data(), 30}});
    for (size_t k = 0; k < u.size(); ++k)
      for (int d = 0; d < D; ++d) ASSERT_EQ(e.rows(0)[k * D + d], users[size_t(u[k]) * D + d]) << k;
    std::vector<float> sum(users.size(), 0.0f);
    std::vector<int> touched(size_t(kUsers), 0);
    for (size_t k = 0; k < u.size(); ++k) {
      touched[size_t(u[k])] = 1;
      for (int d = 0; d < D; ++d) {
        const float g = 0.01f * float((k * 7 + size_t(d)) % 13) - 0.06f;
        e.row_grads(0)[k * D + d] = g;
        sum[size_t(u[k]) * D + d] += g;  // in batch order, as the update sums them
      }
    }
    for (int64_t x = 0; x < 30 * D; ++x) e.row_grads(1)[x] = 0.0f;
    e.gradients_start(nullptr);
    e.gradients_finish(3);
    const std::vector<float> want =
        expected(users, sum, touched, o, 1, 3, std::vector<float>(users.size(), 0.0f),
                 std::vector<float>(users.size(), 0.0f));
    const std::vector<float> got = e.gather_table(0);
    int changed = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << optimizer_name(kind) << " element " << i;
      changed += got[i] != users[i];
    }
    EXPECT_GT(changed, 20) << optimizer_name(kind);
    // Checkpoint chunks: the rows widened, and read back exactly.
    int64_t rows = 0;
    const float* chunk = e.export_chunk(0, 0, 0, &rows);
    ASSERT_EQ(rows, kUsers);
    EXPECT_EQ(std::memcmp(chunk, got.data(), got.size() * 4), 0);
    const std::vector<float> copy(chunk, chunk + rows * D);
    EmbeddingCollection f(plan, comm, ctx, o, false);
    f.init(6);
    f.import_chunk(0, 0, 0, copy.data());
    EXPECT_EQ(f.gather_table(0), got);
    // The memory estimate covers the BF16 update's buffers too.
    EXPECT_GE(exchange_buffer_bytes(plan, {50, 30}, false), e.step_buffer_bytes())
        << optimizer_name(kind);
  }
}

}  // namespace
}  // namespace ncf
