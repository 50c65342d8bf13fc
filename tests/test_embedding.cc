// ShardedEmbedding in one process at W = 1, where it does no routing: the lookup
// against the table read back, the update against a written-out SGD loop, --dedup
// against no dedup, the initial values against the documented draw (and the
// same at 1 and 2 threads), and the memory guard's buffer estimate against the
// buffers the table really holds. The W > 1 paths are proved against this one in
// test_distributed (real mpirun jobs).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "comm/single_communicator.h"
#include "common/philox.h"
#include "embedding/embedding.h"

namespace ncf {
namespace {

TableSpec spec(Placement p, int64_t N = 97, int D = 6) {
  TableSpec t;
  t.name = "item";
  t.num_rows = N;
  t.D = D;
  t.placement = p;
  t.init_tag = 2;
  return t;
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

TEST(EmbeddingOneRank, LookupReturnsTheTableRowsInBatchOrder) {
  SingleCommunicator comm;
  ExecContext ctx;
  for (Placement p : {Placement::kRowWise, Placement::kTableWise, Placement::kReplicated}) {
    ShardedEmbedding e(spec(p), comm, ctx, sgd(0.1f), false);
    e.init(7);
    const std::vector<float> table = e.gather_full();
    const std::vector<int32_t> ids = random_ids(500, 97, 3);
    std::vector<float> out(ids.size() * 6, -1.0f);
    e.lookup(ids.data(), int64_t(ids.size()), out.data());
    for (size_t k = 0; k < ids.size(); ++k)
      for (int d = 0; d < 6; ++d)
        ASSERT_EQ(out[k * 6 + d], table[size_t(ids[k]) * 6 + d])
            << placement_name(p) << " k=" << k << " d=" << d;
    EXPECT_EQ(e.last_stats().bytes_sent, 0) << placement_name(p);
  }
}

TEST(EmbeddingOneRank, SgdUpdateSubtractsTheSummedGradientOfEachRow) {
  SingleCommunicator comm;
  ExecContext ctx;
  ctx.threads = 2;
  ShardedEmbedding e(spec(Placement::kRowWise), comm, ctx, sgd(0.5f), false);
  e.init(11);
  const std::vector<float> before = e.gather_full();
  const std::vector<int32_t> ids = random_ids(300, 97, 5);
  std::vector<float> out(ids.size() * 6), grads(ids.size() * 6);
  std::mt19937 g(9);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : grads) x = u(g);
  e.lookup(ids.data(), int64_t(ids.size()), out.data());
  e.apply_gradients(grads.data(), 1);
  const std::vector<float> after = e.gather_full();
  // Written-out: each row's gradient summed in double, then p - lr * g.
  std::vector<double> sum(before.size(), 0.0);
  for (size_t k = 0; k < ids.size(); ++k)
    for (int d = 0; d < 6; ++d) sum[size_t(ids[k]) * 6 + d] += grads[k * 6 + d];
  for (size_t i = 0; i < before.size(); ++i) {
    const double want = double(before[i]) - 0.5 * sum[i];
    ASSERT_NEAR(after[i], want, 1e-5 * (1 + std::fabs(sum[i]))) << "element " << i;
  }
}

// --dedup changes what would travel, not the numbers: at W = 1 both runs agree
// bit for bit (lazy Adam, so the update depends on the exact summed gradient).
TEST(EmbeddingOneRank, DedupGivesTheSameBitsAsNoDedup) {
  SingleCommunicator comm;
  ExecContext ctx;
  EmbeddingOptimizerConfig o;
  o.kind = EmbeddingOptimizer::kLazyAdam;
  std::vector<float> result[2];
  for (int dedup = 0; dedup < 2; ++dedup) {
    ShardedEmbedding e(spec(Placement::kRowWise), comm, ctx, o, dedup == 1);
    e.init(5);
    for (int64_t t = 1; t <= 3; ++t) {
      const std::vector<int32_t> ids = random_ids(257, 97, uint32_t(t));
      std::vector<float> out(ids.size() * 6), grads(ids.size() * 6);
      e.lookup(ids.data(), int64_t(ids.size()), out.data());
      for (size_t i = 0; i < grads.size(); ++i) grads[i] = out[i] * 3.0f - 0.01f * float(i % 7);
      e.apply_gradients(grads.data(), t);
    }
    result[dedup] = e.gather_full();
  }
  ASSERT_EQ(result[0].size(), result[1].size());
  for (size_t i = 0; i < result[0].size(); ++i) ASSERT_EQ(result[0][i], result[1][i]) << i;
}

// The documented draw: row r's pair (j, j+1) is Box-Muller on the 53-bit
// uniforms j and j+1 of the counter stream (seed, init, tag << 40 | r).
TEST(EmbeddingOneRank, InitIsTheDocumentedDrawAtAnyThreadCount) {
  SingleCommunicator comm;
  const TableSpec t = spec(Placement::kRowWise, 5003, 7);
  std::vector<float> got[2];
  for (int threads : {1, 2}) {
    ExecContext ctx;
    ctx.threads = threads;
    ShardedEmbedding e(t, comm, ctx, sgd(0.1f), false);
    e.init(42);
    got[threads - 1] = e.gather_full();
  }
  ASSERT_EQ(got[0], got[1]);
  for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{2500}, int64_t{5002}}) {
    CounterRng rng{42, kStreamInit, (uint64_t{2} << 40) | uint64_t(r)};
    for (int j = 0; j < 7; j += 2) {
      const double rad = std::sqrt(-2.0 * std::log(1.0 - rng.uniform_double(uint64_t(j))));
      const double ang = 2 * M_PI * rng.uniform_double(uint64_t(j) + 1);
      EXPECT_EQ(got[0][size_t(r) * 7 + j], float(0.01f * rad * std::cos(ang))) << r << "," << j;
      if (j + 1 < 7) {
        EXPECT_EQ(got[0][size_t(r) * 7 + j + 1], float(0.01f * rad * std::sin(ang))) << r << "," << j;
      }
    }
  }
  double sq = 0;
  for (float x : got[0]) sq += double(x) * x;
  EXPECT_NEAR(std::sqrt(sq / double(got[0].size())), 0.01, 0.0005);  // N(0, 0.01²)
}

// The memory guard counts at least what a step's lookup and update allocate.
TEST(EmbeddingOneRank, ExchangeEstimateCoversTheBuffersHeld) {
  SingleCommunicator comm;
  ExecContext ctx;
  for (Placement p : {Placement::kRowWise, Placement::kReplicated})
    for (bool dedup : {false, true}) {
      const TableSpec t = spec(p, 97, 8);
      ShardedEmbedding e(t, comm, ctx, sgd(0.1f), dedup);
      e.init(1);
      const std::vector<int32_t> ids = random_ids(1000, 97, 8);
      std::vector<float> out(ids.size() * 8), grads(ids.size() * 8, 0.25f);
      e.lookup(ids.data(), int64_t(ids.size()), out.data());
      e.apply_gradients(grads.data(), 1);
      const int64_t held = e.step_buffer_bytes();
      const int64_t est = table_exchange_bytes(t, int64_t(ids.size()), 1, dedup);
      EXPECT_GE(est, held) << placement_name(p) << " dedup " << dedup;
      EXPECT_LE(est, 3 * held) << placement_name(p) << " dedup " << dedup;
      // More ranks add the routing buffers and the exchanged rows.
      EXPECT_GT(table_exchange_bytes(spec(Placement::kRowWise, 97, 8), 1000, 2, dedup), est);
    }
}

}  // namespace
}  // namespace ncf
