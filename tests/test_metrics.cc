// HR@K / NDCG@K (model/metrics.h) on hand-worked eval lists: ranks, the K
// boundary, ties (the positive loses), duplicate masks, and thread invariance.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/check.h"
#include "model/metrics.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::cpu;

struct Sums {
  double hr = -1, ndcg = -1;
};

Sums eval(const std::vector<float>& scores, const std::vector<uint8_t>& mask, int64_t U, int L,
          int K, int threads = 1) {
  Sums s;
  hit_ndcg(cpu(threads), scores.data(), mask.empty() ? nullptr : mask.data(), U, L, K, &s.hr,
           &s.ndcg);
  return s;
}

// One user's list of L = 12: the positive's score, then 11 negatives of which
// the first `above` score higher than it and the rest lower.
std::vector<float> list_with_rank(int above, float pos = 0.5f) {
  std::vector<float> s(12, 0.1f);
  s[0] = pos;
  for (int j = 1; j <= above; ++j) s[j] = 0.9f;
  return s;
}

TEST(Metrics, FourUsersHandWorked) {
  // Ranks 0, 1, 2 and 2 (the last reaches 2 through a tie) with K = 10.
  std::vector<float> scores;
  for (int above : {0, 1, 2}) {
    auto l = list_with_rank(above);
    scores.insert(scores.end(), l.begin(), l.end());
  }
  auto tie = list_with_rank(1);
  tie[5] = tie[0];  // equal to the positive: counts against it
  scores.insert(scores.end(), tie.begin(), tie.end());
  Sums s = eval(scores, {}, 4, 12, 10);
  EXPECT_EQ(s.hr / 4, 1.0);
  double want = (1 + std::log(2) / std::log(3) + 2 * std::log(2) / std::log(4)) / 4;
  EXPECT_NEAR(s.ndcg / 4, want, 1e-15);
  EXPECT_NEAR(s.ndcg / 4, (1 + 0.6309297535714575 + 1.0) / 4, 1e-15);
}

// A pass's running sums: each batch's hit and NDCG sums added in batch order, the
// same bits as adding hit_ndcg's results on the host; the sums it starts from stay.
TEST(Metrics, AccumulateAddsEachBatchsSumsToTheRunningOnes) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> score(0, 6);
  double sums[2] = {0.5, 0.25}, want[2] = {0.5, 0.25};
  for (int64_t U : {3, 0, 40}) {
    const int L = 21;
    std::vector<float> scores(size_t(U) * L);
    std::vector<uint8_t> mask(size_t(U) * L);
    for (size_t i = 0; i < scores.size(); ++i) {
      scores[i] = float(score(gen)) / 7.0f;
      mask[i] = i % 5 != 3;
    }
    const Sums s = eval(scores, mask, U, L, 10);
    want[0] += s.hr;
    want[1] += s.ndcg;
    hit_ndcg_accumulate(cpu(2), scores.data(), mask.data(), U, L, 10, sums);
    EXPECT_EQ(sums[0], want[0]) << "U " << U;
    EXPECT_EQ(sums[1], want[1]) << "U " << U;
  }
  EXPECT_GT(want[0], 0.5);
  EXPECT_THROW(hit_ndcg_accumulate(cpu(1), nullptr, nullptr, 2, 21, 10, sums), Error);
  EXPECT_THROW(hit_ndcg_accumulate(cpu(1), nullptr, nullptr, 0, 21, 10, nullptr), Error);
}

TEST(Metrics, RankTenIsAMissRankNineAHit) {
  Sums miss = eval(list_with_rank(10), {}, 1, 12, 10);
  EXPECT_EQ(miss.hr, 0.0);
  EXPECT_EQ(miss.ndcg, 0.0);
  Sums hit = eval(list_with_rank(9), {}, 1, 12, 10);
  EXPECT_EQ(hit.hr, 1.0);
  EXPECT_NEAR(hit.ndcg, std::log(2) / std::log(11), 1e-15);
  // K = 1: only rank 0 hits.
  EXPECT_EQ(eval(list_with_rank(0), {}, 1, 12, 1).hr, 1.0);
  EXPECT_EQ(eval(list_with_rank(1), {}, 1, 12, 1).hr, 0.0);
}

TEST(Metrics, PositiveLosesTies) {
  std::vector<float> all_equal(12, 0.3f);  // 11 negatives tie with the positive
  Sums s = eval(all_equal, {}, 1, 12, 11);
  EXPECT_EQ(s.hr, 0.0);  // rank 11
  s = eval(all_equal, {}, 1, 12, 12);
  EXPECT_EQ(s.hr, 1.0);
  EXPECT_NEAR(s.ndcg, std::log(2) / std::log(13), 1e-15);
}

TEST(Metrics, DuplicateMaskedNegativesDoNotCount) {
  // Positive 0.5; negatives: 0.9 (item a), 0.9 (item a again, masked),
  // 0.5 (the positive's own item among the negatives, masked), rest below.
  std::vector<float> s = list_with_rank(0);
  s[1] = 0.9f;
  s[2] = 0.9f;
  s[3] = 0.5f;
  std::vector<uint8_t> mask(12, 1);
  mask[2] = 0;
  mask[3] = 0;
  Sums masked = eval(s, mask, 1, 12, 10);
  EXPECT_EQ(masked.hr, 1.0);
  EXPECT_NEAR(masked.ndcg, std::log(2) / std::log(3), 1e-15);  // rank 1
  Sums unmasked = eval(s, {}, 1, 12, 10);
  EXPECT_NEAR(unmasked.ndcg, std::log(2) / std::log(5), 1e-15);  // rank 3 without the mask
  // mask[0] is ignored: the positive always takes part.
  mask[0] = 0;
  EXPECT_NEAR(eval(s, mask, 1, 12, 10).ndcg, std::log(2) / std::log(3), 1e-15);
}

TEST(Metrics, NanPositiveIsAMiss) {
  std::vector<float> s = list_with_rank(0, std::nanf(""));
  EXPECT_EQ(eval(s, {}, 1, 12, 10).hr, 0.0);
}

TEST(Metrics, ThreadCountDoesNotChangeTheSums) {
  const int64_t U = 5000;
  const int L = 101;
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> scores(U * L);
  std::vector<uint8_t> mask(U * L);
  for (auto& x : scores) x = dist(gen);
  for (auto& m : mask) m = dist(gen) < 0.95f;
  Sums one = eval(scores, mask, U, L, 10, 1);
  // Naive per-user loop as an independent reference.
  double hr = 0, ndcg = 0;
  for (int64_t u = 0; u < U; ++u) {
    int rank = 0;
    for (int j = 1; j < L; ++j)
      if (mask[u * L + j] && scores[u * L + j] >= scores[u * L]) ++rank;
    if (rank < 10) {
      hr += 1;
      ndcg += std::log(2.0) / std::log(rank + 2.0);
    }
  }
  EXPECT_EQ(one.hr, hr);
  EXPECT_NEAR(one.ndcg, ndcg, 1e-9);
  EXPECT_GT(one.hr, 0.0);
  for (int threads : {2, 3}) {
    Sums many = eval(scores, mask, U, L, 10, threads);
    EXPECT_EQ(many.hr, one.hr);
    EXPECT_EQ(many.ndcg, one.ndcg);  // bit-exact
  }
}

TEST(Metrics, EmptyAndBadArguments) {
  Sums s = eval({}, {}, 0, 12, 10);
  EXPECT_EQ(s.hr, 0.0);
  EXPECT_EQ(s.ndcg, 0.0);
  std::vector<float> one(12);
  EXPECT_THROW(eval(one, {}, 1, 12, 0), Error);
  EXPECT_THROW(eval(one, {}, 1, 0, 10), Error);
}

}  // namespace
}  // namespace ncf
