// The shard planner, its cost model, the key layout and the per-rank bytes
// (embedding/plan.h), in-process: hand-worked byte counts, the decisions they
// imply, forced plans and bad --shard_plan values.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/check.h"
#include "embedding/plan.h"

namespace ncf {
namespace {

PlanRequest request(int W, int64_t users, int64_t items, int64_t lookups,
                    const std::string& forced = "auto") {
  PlanRequest r;
  r.D = 40;
  r.W = W;
  r.tables = {{"user", users, Placement::kRowWise, 0, 1, 0.01f},
              {"item", items, Placement::kRowWise, 0, 2, 0.01f}};
  r.lookups_per_rank = lookups;
  r.forced = forced;
  return r;
}

std::string error_of(const PlanRequest& r) {
  try {
    plan_tables(r);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Plan, CostModelMatchesHandWorkedBytes) {
  // Row-wise at W = 4, 1000 lookups, D = 40: 3/4 of the ids leave, each 4 bytes
  // out and 160 bytes of vector back, plus 160 bytes of gradient out.
  EXPECT_DOUBLE_EQ(step_exchange_bytes(Placement::kRowWise, 5000, 40, 1000, 4),
                   1000 * 0.75 * (4 + 160 + 160));
  // Table-wise: the owner's link carries the other 3 ranks' full shares.
  EXPECT_DOUBLE_EQ(step_exchange_bytes(Placement::kTableWise, 5000, 40, 1000, 4),
                   1000.0 * 3 * (4 + 160 + 160));
  // Replicated: a ring allreduce of N × (D + 1) floats sends 2 (W-1)/W of it.
  EXPECT_DOUBLE_EQ(step_exchange_bytes(Placement::kReplicated, 5000, 40, 1000, 4),
                   2 * 0.75 * 5000 * 41 * 4);
  for (Placement p : {Placement::kRowWise, Placement::kTableWise, Placement::kReplicated})
    EXPECT_EQ(step_exchange_bytes(p, 5000, 40, 1000, 1), 0) << "one rank sends nothing";
}

TEST(Plan, OneRankIsRowWiseEverywhere) {
  const EmbeddingPlan p = plan_tables(request(1, 100, 50, 65536));
  ASSERT_EQ(p.tables.size(), 2u);
  for (const TableSpec& t : p.tables) EXPECT_EQ(t.placement, Placement::kRowWise) << t.name;
  EXPECT_NE(p.reason.find("user: row-wise (one rank, nothing to exchange)"), std::string::npos)
      << p.reason;
}

TEST(Plan, ReplicatesASmallTableWhoseAllreduceIsCheaper) {
  // 16384 lookups per rank: the row-wise exchange is 16384 · 0.75 · 324 ≈ 4.0 MB;
  // 3706 items replicated allreduce 2 · 0.75 · 3706 · 41 · 4 ≈ 0.9 MB: replicate.
  // 1,000,000 users replicated would be ≈ 246 MB a step: row-wise.
  const EmbeddingPlan p = plan_tables(request(4, 1000000, 3706, 16384));
  EXPECT_EQ(p.tables[0].placement, Placement::kRowWise);
  EXPECT_EQ(p.tables[1].placement, Placement::kReplicated);
  EXPECT_NE(p.reason.find("item: replicated (allreduce"), std::string::npos) << p.reason;
  // The same item table with few lookups: the exchange is cheaper.
  EXPECT_EQ(plan_tables(request(4, 1000000, 3706, 100)).tables[1].placement, Placement::kRowWise);
  // Cheaper to allreduce but larger than the replicated limit: row-wise.
  PlanRequest big = request(4, 1000000, 3706, 16384);
  big.replicated_limit_bytes = 1 << 20;
  EXPECT_EQ(plan_tables(big).tables[1].placement, Placement::kRowWise);
}

TEST(Plan, ForcedPlansAndTableWiseOwnersOnDifferentRanks) {
  const EmbeddingPlan t = plan_tables(request(3, 100, 50, 1000, "table"));
  EXPECT_EQ(t.tables[0].placement, Placement::kTableWise);
  EXPECT_EQ(t.tables[1].placement, Placement::kTableWise);
  EXPECT_NE(t.tables[0].owner, t.tables[1].owner) << "the two tables on different ranks";
  EXPECT_EQ(table_rank_rows(t.tables[0], t.tables[0].owner, 3), 100);
  EXPECT_EQ(table_rank_rows(t.tables[0], t.tables[1].owner, 3), 0);
  const EmbeddingPlan m = plan_tables(request(2, 100, 50, 1000, "user=row,item=replicated"));
  EXPECT_EQ(m.tables[0].placement, Placement::kRowWise);
  EXPECT_EQ(m.tables[1].placement, Placement::kReplicated);
  EXPECT_NE(m.reason.find("item: forced"), std::string::npos) << m.reason;
}

TEST(Plan, BadShardPlanNamesTheFlagAndTheValue) {
  EXPECT_NE(error_of(request(2, 10, 10, 10, "diagonal"))
                .find("flag --shard_plan: unknown placement 'diagonal' for table user"),
            std::string::npos);
  EXPECT_NE(error_of(request(2, 10, 10, 10, "movie=row"))
                .find("flag --shard_plan: unknown table 'movie' (expected user or item)"),
            std::string::npos);
  EXPECT_NE(error_of(request(2, 10, 10, 10, "user=row,item"))
                .find("flag --shard_plan: 'item' is not TABLE=PLACEMENT"),
            std::string::npos);
}

TEST(Plan, RowWiseRowsAndBytesAddUpOverRanks) {
  for (int W : {1, 2, 3, 7}) {
    const TableSpec t{"user", 1001, Placement::kRowWise, 0, 1, 0.01f};
    int64_t rows = 0;
    for (int r = 0; r < W; ++r) {
      rows += table_rank_rows(t, r, W);
      // Rows, then Adam's two moments: 3 floats per element.
      EXPECT_EQ(table_rank_bytes(t, 8, r, W, EmbeddingOptimizer::kDenseAdam),
                table_rank_rows(t, r, W) * 8 * 4 * 3);
      EXPECT_EQ(table_rank_bytes(t, 8, r, W, EmbeddingOptimizer::kSgd),
                table_rank_rows(t, r, W) * 8 * 4);
    }
    EXPECT_EQ(rows, 1001) << "W=" << W;
  }
  // A replicated table at W > 1 also holds its dense gradient for the allreduce.
  const TableSpec rep{"item", 100, Placement::kReplicated, 0, 2, 0.01f};
  EXPECT_EQ(table_rank_bytes(rep, 8, 1, 4, EmbeddingOptimizer::kSgd), 100 * 8 * 4 + 100 * 9 * 4);
}

TEST(Plan, KeyLayoutPutsRoutedTablesFirst) {
  const EmbeddingPlan p = plan_tables(request(2, 100, 50, 1000, "user=replicated,item=row"));
  std::vector<int> index;
  const KeyLayout l = make_key_layout(p, &index);
  EXPECT_EQ(index, (std::vector<int>{1, 0}));
  EXPECT_EQ(l.placement[0], Placement::kRowWise);
  EXPECT_EQ(l.key_begin[1], 50);
  EXPECT_EQ(l.key_begin[2], 150);
  EXPECT_EQ(l.total_rows_on(0), 25 + 100);
  EXPECT_EQ(l.total_rows_on(1), 25 + 100);
}

TEST(Plan, PrintoutNamesEachTablePlacementAndSize) {
  const EmbeddingPlan p = plan_tables(request(2, 100, 50, 1000, "table"));
  EXPECT_EQ(describe_rank_tables(p, {3 << 20, 0}),
            "user table table (3.0 MiB), item table table (0.0 MiB)");
}

// expected_unique against the exact count for tiny cases (hand-worked) and a
// seeded simulation; the auto decision on both sides of kDedupAutoShare.
TEST(Plan, DedupAutoFollowsTheExpectedShareOfUniqueIds) {
  EXPECT_DOUBLE_EQ(expected_unique(1, 5), 1.0);     // one row: always 1
  EXPECT_NEAR(expected_unique(2, 2), 1.5, 1e-12);   // {0,0},{0,1},{1,0},{1,1}: 6/4
  EXPECT_NEAR(expected_unique(10, 1), 1.0, 1e-12);  // one draw
  EXPECT_NEAR(expected_unique(3, 3), 3 * (1 - 8.0 / 27), 1e-12);
  std::mt19937_64 rng(5);
  const int64_t N = 1000, n = 1500;
  double sum = 0;
  for (int rep = 0; rep < 200; ++rep) {
    std::vector<char> seen(N, 0);
    int64_t u = 0;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t x = int64_t(rng() % N);
      u += !seen[x];
      seen[x] = 1;
    }
    sum += double(u);
  }
  EXPECT_NEAR(sum / 200, expected_unique(N, n), 3.0);  // ~777.7; sd of the mean ~0.9

  // Row-wise at W = 2: 2000 lookups of 1000-row tables are ~43% unique (on);
  // of 100k-row tables ~99% (off). Replicated tables have nothing to route.
  PlanRequest req = request(2, 1000, 1000, 2000, "row");
  EmbeddingPlan p = plan_tables(req);
  EXPECT_TRUE(p.dedup) << p.reason;
  EXPECT_NE(p.reason.find("dedup on (about 43% of the routed ids"), std::string::npos) << p.reason;
  req = request(2, 100000, 100000, 2000, "row");
  p = plan_tables(req);
  EXPECT_FALSE(p.dedup) << p.reason;
  req.dedup = "on";
  EXPECT_TRUE(plan_tables(req).dedup);
  req = request(2, 1000, 1000, 2000, "row");
  req.dedup = "off";
  EXPECT_FALSE(plan_tables(req).dedup);
  req = request(2, 1000, 1000, 2000, "replicated");
  EXPECT_FALSE(plan_tables(req).dedup);
  req = request(1, 1000, 1000, 2000, "auto");
  EXPECT_FALSE(plan_tables(req).dedup);  // W = 1: nothing travels
  req.dedup = "maybe";
  try {
    plan_tables(req);
    ADD_FAILURE() << "--dedup maybe accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flag --dedup: 'maybe'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ncf
