// The host tier (--device_table_budget) in real ncf_dist jobs under mpirun: at W = 1, 2
// and 4, a cache of every rank's rows, of 30%, of one window's rows and of the largest
// step's rows gives every bit of the all-on-device run (each epoch's loss, HR and NDCG,
// and the final parameters); with the window held, no row of a window is evicted and no
// step waits; replicated tables too; BF16 rows and lazy Adam too; a checkpoint written at
// one budget resumes at another (and at another W) with the bits of the run that never had
// a budget; dense Adam and a budget below one step's rows are refused with a message, every
// rank ending.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "test_util.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;

class HostTierRuns : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run(bin("ncf_prep") +
                 " --synthetic custom --users 2000 --items 1000 --interactions 44000 "
                 "--eval_negatives 50 --record_rows 300 --num_shards 3 --seed 5 --output " +
                 data());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->file("data"); }
  static TempDir* dir_;

  struct Run {
    std::vector<nlohmann::json> epochs;
    std::string params;
    std::string output;
    int exit_code = 0;
  };

  // 2 epochs of 60 steps of 101 positives (505 samples) each.
  Run train(int W, const std::string& flags, bool expect_ok = true, int epochs = 2) {
    TempDir t;
    const std::string cmd =
        test::mpirun(W) + " " + bin("ncf_dist") + " --device cpu --data_dir " + data() +
        (flags.find("--batch_size") == std::string::npos ? " --batch_size 505" : "") +
        " --train_epochs " + std::to_string(epochs) +
        " --max_steps 60 --threads 1 --learning_rate 0.01 " +
        (flags.find("--embedding_optimizer") == std::string::npos
             ? "--embedding_optimizer rowwise_adagrad "
             : "") +
        flags + " --metrics_json " + t.file("m.jsonl") + " --save_params " + t.file("p.bin");
    return job(cmd, t, expect_ok);
  }
  // cmd, which writes its metrics to t's m.jsonl and its parameters to t's p.bin, run under
  // a timeout of 300 s.
  static Run job(const std::string& cmd, const TempDir& t, bool expect_ok = true) {
    auto r = run("timeout 300 " + cmd);
    Run out;
    out.output = r.output;
    out.exit_code = r.exit_code;
    if (expect_ok) {
      EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    }
    std::ifstream f(t.file("m.jsonl"));
    std::string line;
    while (std::getline(f, line)) out.epochs.push_back(nlohmann::json::parse(line));
    if (r.exit_code == 0) out.params = test::read_file(t.file("p.bin"));
    return out;
  }

  // resumed: b resumed at the end of epoch 1, which it reports without its steps.
  static void expect_same_bits(const Run& a, const Run& b, const std::string& what,
                               bool resumed = false) {
    ASSERT_EQ(a.epochs.size(), b.epochs.size()) << what << "\n" << b.output;
    for (size_t e = resumed ? 1 : 0; e < a.epochs.size(); ++e)
      for (const char* k : {"loss", "hr", "ndcg", "samples"})
        EXPECT_EQ(a.epochs[e][k], b.epochs[e][k]) << what << ": epoch " << e + 1 << " " << k;
    ASSERT_FALSE(a.params.empty()) << what;
    EXPECT_TRUE(a.params == b.params) << what << ": the final parameters differ";
  }
  // The host tier's counters of the last epoch (the most of any rank).
  static nlohmann::json tier(const Run& r) {
    EXPECT_FALSE(r.epochs.empty()) << r.output;
    return r.epochs.empty() ? nlohmann::json()
                            : r.epochs.back().value("host_tier", nlohmann::json());
  }
  static std::string bytes_for_rows(const nlohmann::json& t, int64_t rows) {
    return std::to_string(rows * t["cache_row_bytes"].get<int64_t>());
  }
};
TempDir* HostTierRuns::dir_ = nullptr;

TEST_F(HostTierRuns, EveryBudgetAndWorldSizeGivesTheBitsOfTheAllOnDeviceRun) {
  for (int W : {1, 2, 4}) {
    const std::string w = "W=" + std::to_string(W);
    const Run ref = train(W, "");
    EXPECT_EQ(tier(ref), nlohmann::json()) << "no host tier on CPU ranks by default";
    const Run all = train(W, "--device_table_budget 100%");
    expect_same_bits(ref, all, w + " budget 100%");
    const nlohmann::json t = tier(all);
    ASSERT_TRUE(t.is_object()) << all.output;
    EXPECT_EQ(t["waits"], 0) << w << ": every row fits, all loaded ahead";
    EXPECT_EQ(t["wait_seconds"], 0.0) << w << ": no step waited";
    EXPECT_GT(t["host_seconds"], 0.0) << w << ": every step was announced, on the host clock";
    EXPECT_EQ(t["evictions"], 0) << w;
    // --lookahead_steps auto: with every row cached, k + 1 steps fit 90% of the cache for
    // some k >= 1 (a step touches at most 101 users and 505 items of 3,000 rows).
    EXPECT_GE(t["lookahead_steps"], 1) << w;
    EXPECT_LE(t["lookahead_steps"], 4) << w;
    EXPECT_GT(t["copy_in_gbps"], 0.0) << w;
    EXPECT_GT(t["copy_out_gbps"], 0.0) << w;
    const int64_t window = t["most_window_rows"], step = t["most_step_rows"];
    ASSERT_GT(window, step) << w;
    expect_same_bits(ref, train(W, "--device_table_budget 30%"), w + " budget 30%");
    // A cache that holds every window: rows leave it, none inside its window, no wait.
    const Run held = train(W, "--device_table_budget " + bytes_for_rows(t, window));
    expect_same_bits(ref, held, w + " budget of one window");
    EXPECT_GT(tier(held)["evictions"], 0) << w << ": the window is smaller than the tables";
    EXPECT_EQ(tier(held)["evicted_in_window"], 0) << w;
    EXPECT_EQ(tier(held)["waits"], 0) << w;
    // The smallest budget: the largest step's rows. auto announces no step ahead there;
    // announced 2 ahead, rows of later steps leave and return.
    const Run least_auto = train(W, "--device_table_budget " + bytes_for_rows(t, step));
    expect_same_bits(ref, least_auto, w + " budget of the largest step, lookahead auto");
    EXPECT_EQ(tier(least_auto)["lookahead_steps"], 0) << w;
    EXPECT_EQ(tier(least_auto)["evicted_in_window"], 0) << w;
    const Run least =
        train(W, "--lookahead_steps 2 --device_table_budget " + bytes_for_rows(t, step));
    expect_same_bits(ref, least, w + " budget of the largest step");
    EXPECT_EQ(tier(least)["lookahead_steps"], 2) << w;
    EXPECT_GT(tier(least)["evicted_in_window"], 0) << w;
    EXPECT_GT(tier(least)["waits"], 0) << w;
    EXPECT_GT(tier(least)["wait_seconds"], 0.0) << w << ": the waits' loads were timed";
  }
}

// Replicated tables: every rank's copy takes the update of the rows any rank's batch
// touched, so each rank announces the rows of every rank's ids there. With users sharded by
// row beside replicated items at W = 2, and every table replicated at W = 4: a cache
// of every row, and one of the largest step's rows with ids announced 2 steps ahead (rows
// of later steps leave and return), give the bits of the all-on-device run.
TEST_F(HostTierRuns, ReplicatedTablesKeepTheirBitsAtEveryBudget) {
  const std::pair<int, std::string> cases[] = {{2, "user=row,item=replicated"}, {4, "replicated"}};
  for (const auto& [W, plan] : cases) {
    const std::string w = "W=" + std::to_string(W) + " " + plan;
    const std::string flags = "--shard_plan " + plan;
    const Run ref = train(W, flags);
    const Run all = train(W, flags + " --device_table_budget 100%");
    expect_same_bits(ref, all, w + " budget 100%");
    const nlohmann::json t = tier(all);
    ASSERT_TRUE(t.is_object()) << all.output;
    const Run least = train(W, flags + " --lookahead_steps 2 --device_table_budget " +
                                   bytes_for_rows(t, t["most_step_rows"].get<int64_t>()));
    expect_same_bits(ref, least, w + " budget of the largest step");
    EXPECT_GT(tier(least)["evicted_in_window"], 0) << w;
  }
}

// One rank, FP32 rows, layer 0 by item: without a budget the step reads its item rows' MLP
// columns in place; with a budget of every row the cache mirrors the rows and the step reads
// them there; with a smaller one (60%) it looks them up whole. The same bits each way, with the
// evaluations between the epochs, which read the whole item table.
TEST_F(HostTierRuns, OneRankReadsItsItemRowsInPlaceInAMirroringCache) {
  const std::string f = "--layer0_by_item on --batch_size 2020";
  const Run ref = train(1, f);
  expect_same_bits(ref, train(1, f + " --device_table_budget 100%"), "layer 0 by item, 100%");
  expect_same_bits(ref, train(1, f + " --device_table_budget 60%"), "layer 0 by item, 60%");
}

TEST_F(HostTierRuns, Bf16RowsAndLazyAdamKeepTheirBits) {
  const std::string f = "--table_dtype bf16 --embedding_optimizer lazy_adam --lookahead_steps 1";
  const Run ref = train(2, f);
  expect_same_bits(ref, train(2, f + " --device_table_budget 25%"), "bf16 rows, lazy Adam, 25%");
  const std::string g = "--embedding_optimizer sgd --lookahead_steps 0";
  expect_same_bits(train(2, g), train(2, g + " --device_table_budget 40%"), "sgd, lookahead 0");
}

TEST_F(HostTierRuns, ACheckpointResumesAtAnotherBudgetAndWorldSize) {
  TempDir d;
  const Run whole = train(2, "");
  train(2, "--device_table_budget 30% --checkpoint_dir " + d.file("ck"), true, 1);
  const std::string from = " --allow_changed_flags train_epochs --resume " +
                           d.file("ck/step-000000000060") + " --checkpoint_dir ";
  expect_same_bits(whole, train(2, "--device_table_budget 45%" + from + d.file("a")),
                   "written at 30%, resumed at 45%", true);
  // At another W the trajectory takes another float order: with and without a budget alike.
  expect_same_bits(train(1, from + d.file("b")),
                   train(1, "--device_table_budget 20%" + from + d.file("c")),
                   "resumed by one rank, at 20% and all on the device", true);
}

TEST_F(HostTierRuns, DenseAdamAndABudgetBelowOneStepAreRefused) {
  Run r = train(2, "--embedding_optimizer dense_adam --device_table_budget 30%", false);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dense Adam updates every row"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rowwise_adagrad"), std::string::npos) << r.output;
  r = train(2, "--device_table_budget 2%", false);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("flag --device_table_budget: the cache holds"), std::string::npos)
      << r.output;
  r = train(1, "--device_table_budget 12X", false);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--device_table_budget"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("12X"), std::string::npos) << r.output;
}

// Steps large enough that a rank with 4 threads splits the cache's passes over them (over
// RowCache::kParallelGrain rows a step, among over kParallelSpread times as many rows of
// the rank: about 6,550 users and 32,768 ids of 1,300,000 items a rank's step), at W = 1
// and 2: at 10% (rows leave the cache), at 100%, and at the largest step's rows announced
// 2 ahead (rows of later steps evicted and loaded again), the bits of the run without a
// budget, and of the same budget with the passes on one thread. Narrow rows, so that the
// runs' parameter files stay small.
TEST_F(HostTierRuns, PassesSplitOverThreadsKeepTheBits) {
  TempDir d;
  auto prep = run(bin("ncf_prep") +
                  " --synthetic custom --users 30000 --items 1300000 --interactions 300000 "
                  "--min_per_user 2 --eval_negatives 20 --seed 7 --output " +
                  d.file("data"));
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  for (int W : {1, 2}) {
    const std::string w = "W=" + std::to_string(W);
    auto big = [&](int threads, const std::string& budget) {
      TempDir t;
      const std::string cmd =
          test::mpirun(W) + " " + bin("ncf_dist") + " --device cpu --data_dir " + d.file("data") +
          " --batch_size " + std::to_string(32770 * W) +
          " --train_epochs 1 --max_steps 8 --embedding_optimizer rowwise_adagrad --progress off"
          " --num_factors 4 --layers 8,4"
          " --threads " +
          std::to_string(threads) + " " + budget + " --metrics_json " + t.file("m.jsonl") +
          " --save_params " + t.file("p.bin");
      return job(cmd, t);
    };
    const Run ref = big(4, "");
    const Run split = big(4, "--device_table_budget 10%");
    expect_same_bits(ref, split, w + " 10%, 4 threads");
    EXPECT_GT(tier(split)["split_passes"], 0) << w << ": the passes were split";
    EXPECT_GT(tier(split)["evictions"], 0) << w;
    const Run one = big(1, "--device_table_budget 10%");
    expect_same_bits(ref, one, w + " 10%, 1 thread");
    EXPECT_EQ(tier(one)["split_passes"], 0) << w;
    for (const char* k : {"loads", "evictions", "waits", "most_window_rows"})
      EXPECT_EQ(tier(split)[k], tier(one)[k]) << w << " " << k;
    expect_same_bits(ref, big(4, "--device_table_budget 100%"), w + " 100%, 4 threads");
    const nlohmann::json t = tier(split);
    const Run least = big(4, "--lookahead_steps 2 --device_table_budget " +
                                 bytes_for_rows(t, t["most_step_rows"].get<int64_t>()));
    expect_same_bits(ref, least, w + " the largest step, 4 threads");
    EXPECT_GT(tier(least)["evicted_in_window"], 0) << w;
    EXPECT_GT(tier(least)["split_passes"], 0) << w;
  }
}

}  // namespace
}  // namespace ncf
