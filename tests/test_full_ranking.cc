// Full-catalogue evaluation: the rank count against a hand-worked case, and
// ncf_dist --eval_only --eval_full_ranking on a real checkpoint against a
// brute-force evaluation written out here (NeuMF in double loops over the
// checkpoint's files, every item, the user's positives excluded), at W = 1
// and W = 2; full-ranking HR@10 never exceeds the sampled HR@10 of the same
// model; --eval_users picks the same fixed subset at any W.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/check.h"
#include "data/dataset.h"
#include "data/reader.h"
#include "model/metrics.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;

TEST(FullRanking, HandWorkedRanksWithTiesAndExclusions) {
  // User 0: test item 2 (0.5). Item 1 is a training positive (excluded) and
  // the test item is listed among the positives too; of the rest, item 3 ties
  // (counts against it) and item 5 is above: rank 2. User 1: its test item
  // 4 is alone at the top: rank 0.
  const float scores[12] = {0.1f, 0.9f, 0.5f, 0.5f, 0.2f, 0.7f,  // user 0
                            0.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f};
  const int32_t test[2] = {2, 4};
  const int64_t offsets[3] = {0, 2, 2};
  const int32_t excluded[2] = {1, 2};
  double hr = 0, ndcg = 0;
  full_ranking_hit_ndcg(1, scores, 2, 6, test, offsets, excluded, 3, &hr, &ndcg);
  EXPECT_DOUBLE_EQ(hr, 2.0);
  EXPECT_DOUBLE_EQ(ndcg, 1.0 + 1.0 / std::log2(4.0));  // rank 2: log 2 / log 4
  full_ranking_hit_ndcg(3, scores, 2, 6, test, offsets, excluded, 2, &hr, &ndcg);
  EXPECT_DOUBLE_EQ(hr, 1.0);
  EXPECT_DOUBLE_EQ(ndcg, 1.0);
  // Without the exclusion item 1 (0.9) counts too: rank 3.
  const int64_t none[3] = {0, 0, 0};
  full_ranking_hit_ndcg(1, scores, 2, 6, test, none, excluded, 3, &hr, &ndcg);
  EXPECT_DOUBLE_EQ(hr, 1.0);
  const int32_t bad[2] = {6, 4};
  EXPECT_THROW(full_ranking_hit_ndcg(1, scores, 2, 6, bad, offsets, excluded, 3, &hr, &ndcg),
               Error);
}

std::vector<float> read_floats(const std::string& path) {
  const std::string bytes = test::read_file(path);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// NeuMF's logit in double loops from the checkpoint's arrays (the layout of
// model/neumf.h: per layer W [out×in] then b [out], then the head w [F], c).
struct NaiveNeuMF {
  int mf = 0;
  std::vector<int> layers;
  std::vector<float> tower, users, items;
  int D() const { return mf + layers[0] / 2; }
  double logit(int64_t u, int64_t i) const {
    const float* ur = &users[size_t(u) * D()];
    const float* ir = &items[size_t(i) * D()];
    const int h = layers[0] / 2;
    std::vector<double> x(static_cast<size_t>(layers[0]));
    for (int k = 0; k < h; ++k) x[size_t(k)] = ur[mf + k], x[size_t(h + k)] = ir[mf + k];
    size_t off = 0;
    for (size_t l = 0; l + 1 < layers.size(); ++l) {
      const int in = layers[l], out = layers[l + 1];
      std::vector<double> y(static_cast<size_t>(out));
      for (int j = 0; j < out; ++j) {
        double s = tower[off + size_t(in) * out + j];  // bias
        for (int k = 0; k < in; ++k) s += double(tower[off + size_t(j) * in + k]) * x[size_t(k)];
        y[size_t(j)] = s > 0 ? s : 0;
      }
      off += size_t(in) * out + out;
      x = y;
    }
    double z = 0;
    for (int k = 0; k < mf; ++k) z += double(tower[off + k]) * ur[k] * ir[k];
    for (size_t k = 0; k < x.size(); ++k) z += double(tower[off + mf + k]) * x[k];
    return z + tower[off + mf + x.size()];
  }
};

class FullRankingRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run(bin("ncf_prep") +
                 " --synthetic custom --users 257 --items 131 --interactions 9000 "
                 "--eval_negatives 50 --record_rows 300 --num_shards 3 --seed 11 --output " +
                 data() + " --progress off");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run(bin("ncf_dist") + " --device cpu --data_dir " + data() +
            " --batch_size 1005 --train_epochs 3 --threads 1 --learning_rate 0.01 --no_eval "
            "--progress off --checkpoint_dir " +
            dir_->file("ck"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->file("data"); }
  static std::string checkpoint() {
    for (const auto& e : std::filesystem::directory_iterator(dir_->file("ck")))
      if (e.path().filename().string().rfind("step-", 0) == 0) return e.path().string();
    return "";
  }
  static nlohmann::json eval_only(int W, const std::string& flags) {
    TempDir t;
    const std::string launch = W == 1 ? "" : test::mpirun(W) + " ";
    // The training flags (batch size, learning rate, epochs) are not given:
    // evaluating needs only the model's shape to match.
    const std::string cmd = launch + bin("ncf_dist") + " --device cpu --data_dir " + data() +
                            " --threads 1 --progress off --eval_only --resume " + checkpoint() +
                            " --metrics_json " + t.file("m.jsonl") + " " + flags;
    const auto r = run("timeout 300 " + cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    std::ifstream f(t.file("m.jsonl"));
    std::string line;
    std::getline(f, line);
    return line.empty() ? nlohmann::json() : nlohmann::json::parse(line);
  }
  static TempDir* dir_;
};
TempDir* FullRankingRun::dir_ = nullptr;

TEST_F(FullRankingRun, MatchesABruteForceEvaluationOfTheCheckpoint) {
  const std::string ck = checkpoint();
  ASSERT_FALSE(ck.empty());
  NaiveNeuMF m;
  const nlohmann::json manifest = nlohmann::json::parse(test::read_file(ck + "/manifest.json"));
  m.mf = manifest["config"]["num_factors"];
  m.layers = manifest["config"]["layers"].get<std::vector<int>>();
  m.tower = read_floats(ck + "/tower.f32");
  m.tower.resize(m.tower.size() / 3);  // the parameters; the Adam moments follow
  m.users = read_floats(ck + "/user.rows.f32");
  m.items = read_floats(ck + "/item.rows.f32");
  const DatasetMeta meta = DatasetMeta::load(data());
  const PositiveLists positives(data(), meta);
  EvalReader reader(data(), meta, 0, 1, 1000);
  reader.start();
  EvalBatch b;
  const int64_t L = meta.eval_negatives + 1, I = int64_t(meta.num_items);
  double hits = 0, ndcg = 0, sampled_hits = 0;
  int64_t users = 0;
  while (reader.next(&b)) {
    for (int64_t x = 0; x < b.num_users; ++x, ++users) {
      const int64_t u = b.users[size_t(x)];
      const int32_t test = b.items[size_t(x * L)];
      const double pos = m.logit(u, test);
      std::vector<char> skip(static_cast<size_t>(I), 0);
      for (int64_t k = positives.offsets()[u]; k < positives.offsets()[u + 1]; ++k)
        skip[size_t(positives.items()[k])] = 1;
      int64_t rank = 0;
      for (int64_t i = 0; i < I; ++i)
        if (!skip[size_t(i)] && m.logit(u, i) >= pos) ++rank;
      if (rank < 10) hits += 1, ndcg += 1.0 / std::log2(double(rank) + 2.0);
      int64_t srank = 0;
      for (int64_t j = 1; j < L; ++j)
        if (b.mask[size_t(x * L + j)] && m.logit(u, b.items[size_t(x * L + j)]) >= pos) ++srank;
      sampled_hits += srank < 10;
    }
  }
  ASSERT_EQ(users, 257);
  for (int W : {1, 2}) {
    const nlohmann::json got = eval_only(W, "--eval_full_ranking");
    ASSERT_TRUE(got.contains("full_hr")) << got.dump();
    // A float-rounding flip of one user's rank at most.
    EXPECT_NEAR(double(got["full_hr"]), hits / 257, 1.01 / 257) << "W=" << W;
    EXPECT_NEAR(double(got["full_ndcg"]), ndcg / 257, 1.01 / 257) << "W=" << W;
    EXPECT_NEAR(double(got["hr"]), sampled_hits / 257, 1.01 / 257) << "W=" << W;
    EXPECT_LE(double(got["full_hr"]), double(got["hr"])) << "W=" << W;
    EXPECT_EQ(got["users"], 257);
  }
  // The test would be empty if nothing were ranked below 10 or everything above.
  EXPECT_GT(hits, 0);
  EXPECT_LT(hits, 257);
}

TEST_F(FullRankingRun, EvalUsersIsTheSameFixedSubsetAtAnyWorldSize) {
  const nlohmann::json one = eval_only(1, "--eval_full_ranking --eval_users 100");
  const nlohmann::json two = eval_only(2, "--eval_full_ranking --eval_users 100");
  ASSERT_TRUE(one.contains("users")) << one.dump();
  EXPECT_EQ(one["users"], 100);
  EXPECT_EQ(two["users"], 100);
  EXPECT_NEAR(double(one["hr"]), double(two["hr"]), 1.01 / 100);
  EXPECT_NEAR(double(one["full_hr"]), double(two["full_hr"]), 1.01 / 100);
}

TEST_F(FullRankingRun, EvalOnlyNeedsACheckpoint) {
  const auto r = run(bin("ncf_dist") + " --device cpu --data_dir " + data() + " --eval_only");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("flag --eval_only needs a checkpoint"), std::string::npos) << r.output;
}

// Evaluating a checkpoint needs the tables' rows, not the optimizer state they
// were trained with: a 100,000-user table of width 40 is 16,000,000 bytes of
// rows, 48,000,000 with dense Adam's m and v. Under a limit of twice the rows
// training is refused and --eval_only runs, with the numbers it gives without
// a limit; under half the rows it is refused too, naming the table.
TEST(EvalOnlyMemory, HoldsTheRowsWithoutTheOptimizerState) {
  TempDir t;
  const std::string data = t.file("data"), ck = t.file("ck");
  auto r = run(bin("ncf_prep") +
               " --synthetic custom --users 100000 --items 50 --interactions 300000 "
               "--min_per_user 3 --eval_negatives 20 --seed 3 --progress off --output " +
               data);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string train = bin("ncf_dist") + " --device cpu --data_dir " + data +
                            " --batch_size 20000 --train_epochs 1 --threads 1 --no_eval "
                            "--progress off --embedding_optimizer dense_adam --checkpoint_dir " +
                            ck;
  r = run(train);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double rows_gib = 100000.0 * 40 * 4 / double(1ull << 30);
  auto limit = [](double gib) { return " --memory_limit_gb " + std::to_string(gib); };
  r = run(train + limit(2 * rows_gib));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("for table user alone (100000 rows x 40, row, with dense_adam state)"),
            std::string::npos)
      << r.output;

  auto eval_only = [&](int W, const std::string& flags, nlohmann::json* metrics) {
    TempDir m;
    const std::string launch = W == 1 ? "" : test::mpirun(W) + " ";
    const auto e =
        run("timeout 300 " + launch + bin("ncf_dist") + " --device cpu --data_dir " + data +
            " --threads 1 --progress off --eval_only --resume auto --checkpoint_dir " + ck +
            " --eval_batch_size 2100 --metrics_json " + m.file("m.jsonl") + flags);
    std::ifstream f(m.file("m.jsonl"));
    std::string line;
    if (std::getline(f, line)) *metrics = nlohmann::json::parse(line);
    return e;
  };
  for (int W : {1, 2}) {
    nlohmann::json free, limited, none;
    r = eval_only(W, "", &free);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = eval_only(W, limit(2 * rows_gib / W), &limited);
    ASSERT_EQ(r.exit_code, 0) << "W=" << W << "\n" << r.output;
    EXPECT_EQ(limited["hr"], free["hr"]) << "W=" << W;
    EXPECT_EQ(limited["ndcg"], free["ndcg"]) << "W=" << W;
    EXPECT_EQ(limited["users"], 100000);
    r = eval_only(W, limit(0.5 * rows_gib / W), &none);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "the job hung:\n" << r.output;
    EXPECT_NE(r.output.find("rows x 40, row, rows only)"), std::string::npos) << r.output;
    EXPECT_TRUE(none.is_null()) << none.dump();
  }
}

}  // namespace
}  // namespace ncf
