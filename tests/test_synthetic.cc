// Synthetic generator: exact counts for the named shapes, the activity solve and
// its errors, determinism across runs and thread counts, the content rules
// (distinct items, test item = last draw, eval negatives outside the positives),
// the draw law against PlantedModel (chi-square on first and last draws), and
// that the planted taste is learnable: it ranks held-out items far better than
// popularity does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "common/check.h"
#include "data/dataset.h"
#include "data/reader.h"
#include "data/synthetic.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::TempDir;

SyntheticParams custom(uint64_t U, uint64_t I, uint64_t N) {
  SyntheticParams p;
  p.shape = {"custom", U, I, N};
  return p;
}

PrepOptions options(uint32_t E, int threads = 2, uint64_t seed = 1) {
  PrepOptions o;
  o.eval_negatives = E;
  o.threads = threads;
  o.seed = seed;
  o.record_rows = 1000;
  o.num_shards = 3;
  return o;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected ncf::Error";
  return "";
}

bool has(const std::string& msg, const std::string& part) {
  return msg.find(part) != std::string::npos;
}

// What a dataset directory holds, read back through the project's readers.
struct Contents {
  DatasetMeta meta;
  std::vector<std::vector<int32_t>> positives;  // per user, as stored
  std::vector<std::vector<int32_t>> eval;       // per user: 1 + E items
  std::vector<std::vector<int32_t>> train;      // per user, sorted
};

Contents read_back(const std::string& dir) {
  Contents c;
  c.meta = DatasetMeta::load(dir);
  const uint64_t U = c.meta.num_users;
  const uint32_t L = c.meta.eval_negatives + 1;
  PositiveLists pl(dir, c.meta);
  for (uint64_t u = 0; u < U; ++u) c.positives.emplace_back(pl.begin(u), pl.end(u));
  c.eval.resize(U);
  EvalReader er(dir, c.meta, 0, 1, 256);
  er.start();
  EvalBatch eb;
  while (er.next(&eb))
    for (int64_t k = 0; k < eb.num_users; ++k)
      c.eval[eb.first_record + k].assign(eb.items.begin() + k * L, eb.items.begin() + (k + 1) * L);
  c.train.resize(U);
  TrainReader tr(dir, c.meta, 0, 1, 1 << 16, 1, false);
  tr.start_epoch(0);
  TrainBatch tb;
  while (tr.next(&tb))
    for (size_t k = 0; k < tb.users.size(); ++k) c.train[tb.users[k]].push_back(tb.items[k]);
  for (auto& t : c.train) std::sort(t.begin(), t.end());
  return c;
}

// The dataset rules every generated user must satisfy.
void check_contents(const Contents& c, const std::vector<uint32_t>& counts, uint32_t min_per_user) {
  const uint64_t U = c.meta.num_users;
  const int32_t I = static_cast<int32_t>(c.meta.num_items);
  ASSERT_EQ(counts.size(), U);
  for (uint64_t u = 0; u < U; ++u) {
    const auto& pos = c.positives[u];
    ASSERT_EQ(pos.size(), counts[u]) << "user " << u;
    ASSERT_GE(pos.size(), min_per_user) << "user " << u;
    for (size_t k = 0; k < pos.size(); ++k) {
      ASSERT_TRUE(pos[k] >= 0 && pos[k] < I) << "user " << u;
      if (k) {
        ASSERT_LT(pos[k - 1], pos[k]) << "user " << u << ": items not distinct";
      }
    }
    const auto& ev = c.eval[u];
    ASSERT_EQ(ev.size(), c.meta.eval_negatives + 1u) << "user " << u;
    ASSERT_TRUE(std::binary_search(pos.begin(), pos.end(), ev[0])) << "user " << u;
    std::set<int32_t> negs;
    for (size_t j = 1; j < ev.size(); ++j) {
      ASSERT_FALSE(std::binary_search(pos.begin(), pos.end(), ev[j])) << "user " << u;
      negs.insert(ev[j]);
    }
    ASSERT_EQ(negs.size(), ev.size() - 1) << "user " << u << ": eval negatives repeat";
    // train = positives minus the held-out item
    std::vector<int32_t> expect;
    for (int32_t i : pos)
      if (i != ev[0]) expect.push_back(i);
    ASSERT_EQ(c.train[u], expect) << "user " << u;
  }
}

// Pearson chi-square of observed against expected counts, pooling the bins whose
// expectation is below 5 into one.
double chi_square(const std::vector<double>& observed, const std::vector<double>& expected,
                  int* dof) {
  double chi = 0, pooled_o = 0, pooled_e = 0;
  int bins = 0;
  for (size_t i = 0; i < observed.size(); ++i) {
    if (expected[i] < 5) {
      pooled_o += observed[i];
      pooled_e += expected[i];
      continue;
    }
    chi += (observed[i] - expected[i]) * (observed[i] - expected[i]) / expected[i];
    ++bins;
  }
  if (pooled_e > 0) {
    chi += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
    ++bins;
  } else if (pooled_o > 0) {
    chi = INFINITY;  // something was drawn that had no probability at all
  }
  *dof = bins - 1;
  return chi;
}

// ------------------------------------------------------------------ shapes ---

TEST(SyntheticShape, NamedShapesMatchTheRealSets) {
  SyntheticShape a = synthetic_shape("ml-1m");
  EXPECT_EQ(a.num_users, 6040u);
  EXPECT_EQ(a.num_items, 3706u);
  EXPECT_EQ(a.num_interactions, 1000209u);
  SyntheticShape b = synthetic_shape("ml-20m");
  EXPECT_EQ(b.num_users, 138493u);
  EXPECT_EQ(b.num_items, 26744u);
  EXPECT_EQ(b.num_interactions, 20000263u);
  SyntheticShape s = synthetic_shape("small");
  EXPECT_EQ(s.num_users, 2000u);
  EXPECT_EQ(s.num_items, 1000u);
  EXPECT_EQ(s.num_interactions, 100000u);
  EXPECT_TRUE(has(error_of([] { synthetic_shape("ml-2m"); }), "'ml-2m'"));
}

TEST(SyntheticCounts, SumExactlyWithHeavyTailForNamedShapes) {
  for (const char* name : {"ml-1m", "ml-20m", "small"}) {
    SyntheticParams p;
    p.shape = synthetic_shape(name);
    const uint32_t E = std::string(name) == "small" ? 99 : 999;
    const uint32_t cap = synthetic_max_per_user(p, E);
    std::vector<uint32_t> c = synthetic_user_counts(p, E, 1, 2);
    ASSERT_EQ(c.size(), p.shape.num_users) << name;
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), uint64_t{0}), p.shape.num_interactions) << name;
    std::vector<uint32_t> sorted = c;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_GE(sorted.front(), 20u) << name;
    EXPECT_LE(sorted.back(), cap) << name;
    // Heavy tail: the busiest 1% of users are several times the median user.
    const double median = sorted[sorted.size() / 2];
    const double p99 = sorted[sorted.size() * 99 / 100];
    EXPECT_GT(p99, 5 * median) << name << ": median " << median << ", p99 " << p99;
    EXPECT_LT(median, 0.8 * double(p.shape.num_interactions) / p.shape.num_users) << name;
    // Same counts whatever the thread count.
    EXPECT_EQ(c, synthetic_user_counts(p, E, 1, 1)) << name;
  }
}

TEST(SyntheticCounts, EdgesOfTheFeasibleRange) {
  // I = 100: cap 50 per user.
  SyntheticParams p = custom(1000, 100, 20 * 1000);
  auto c = synthetic_user_counts(p, 10, 3, 2);
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](uint32_t n) { return n == 20; }));
  p.shape.num_interactions = 50 * 1000;
  c = synthetic_user_counts(p, 10, 3, 2);
  EXPECT_TRUE(std::all_of(c.begin(), c.end(), [](uint32_t n) { return n == 50; }));
  for (uint64_t N : {20001ull, 20999ull, 21000ull, 34567ull, 49999ull}) {
    p.shape.num_interactions = N;
    c = synthetic_user_counts(p, 10, 3, 2);
    EXPECT_EQ(std::accumulate(c.begin(), c.end(), uint64_t{0}), N);
    EXPECT_GE(*std::min_element(c.begin(), c.end()), 20u);
    EXPECT_LE(*std::max_element(c.begin(), c.end()), 50u);
  }
}

TEST(SyntheticCounts, InfeasibleSizesNameTheNumbers) {
  SyntheticParams p = custom(1000, 100, 19999);
  std::string e = error_of([&] { synthetic_user_counts(p, 10, 1); });
  EXPECT_TRUE(has(e, "num_interactions 19999")) << e;
  EXPECT_TRUE(has(e, "min_per_user 20")) << e;
  EXPECT_TRUE(has(e, "20000")) << e;
  p.shape.num_interactions = 50001;
  e = error_of([&] { synthetic_user_counts(p, 10, 1); });
  EXPECT_TRUE(has(e, "num_interactions 50001")) << e;
  EXPECT_TRUE(has(e, "50000")) << e;
  // Generation checks before writing anything.
  TempDir d;
  EXPECT_THROW(generate_synthetic(p, d.path() + "/x", options(10)), Error);
  EXPECT_FALSE(std::filesystem::exists(d.path() + "/x"));

  // The cap: num_items / 2, or num_items - E when that is smaller.
  SyntheticParams s;
  s.shape = synthetic_shape("small");
  EXPECT_EQ(synthetic_max_per_user(s, 99), 500u);
  EXPECT_EQ(synthetic_max_per_user(s, 600), 400u);
  e = error_of([&] { synthetic_max_per_user(s, 999); });
  EXPECT_TRUE(has(e, "min_per_user 20")) << e;
  EXPECT_TRUE(has(e, "num_items 1000")) << e;

  SyntheticParams bad = custom(10, 100, 500);
  bad.preference = 1.0;
  EXPECT_TRUE(has(error_of([&] { synthetic_user_counts(bad, 10, 1); }), "preference 1"));
  bad.preference = 0.5;
  bad.rank = 0;
  EXPECT_TRUE(has(error_of([&] { synthetic_user_counts(bad, 10, 1); }), "rank 0"));
  bad.rank = 4;
  bad.min_per_user = 1;
  EXPECT_TRUE(has(error_of([&] { synthetic_user_counts(bad, 10, 1); }), "min_per_user 1"));
}

// ------------------------------------------------------------ PlantedModel ---

TEST(PlantedModel, PopularityFactorsTasteAndScoresAreWellFormed) {
  SyntheticParams p = custom(100, 300, 5000);
  p.zipf_s = 1.2;
  p.rank = 8;
  PlantedModel m(p, 7);
  // Popularity is a permutation of 1 / r^s.
  std::vector<double> pop;
  for (uint64_t i = 0; i < 300; ++i) pop.push_back(m.popularity(i));
  std::sort(pop.rbegin(), pop.rend());
  for (size_t r = 0; r < pop.size(); ++r)
    ASSERT_DOUBLE_EQ(pop[r], std::pow(double(r + 1), -1.2)) << "rank " << r + 1;
  // A different seed permutes differently.
  PlantedModel m2(p, 8);
  int moved = 0;
  for (uint64_t i = 0; i < 300; ++i) moved += m.popularity(i) != m2.popularity(i);
  EXPECT_GT(moved, 250);
  // Item factors: one or two topics, summing to 1; user taste: 1 to 3 topics.
  for (uint64_t i = 0; i < 300; ++i) {
    double sum = 0;
    int nz = 0;
    for (uint32_t t = 0; t < 8; ++t) {
      sum += m.item_factor(i, t);
      nz += m.item_factor(i, t) > 0;
    }
    ASSERT_NEAR(sum, 1.0, 1e-6);
    ASSERT_TRUE(nz == 1 || nz == 2);
  }
  for (uint64_t u = 0; u < 100; ++u) {
    double sum = 0;
    int nz = 0;
    for (uint32_t t = 0; t < 8; ++t) {
      sum += m.user_taste(u, t);
      nz += m.user_taste(u, t) > 0;
    }
    ASSERT_NEAR(sum, 1.0, 1e-9);
    ASSERT_TRUE(nz >= 1 && nz <= 3);
  }
  // exp(score) is a distribution over the items, and it is popularity mixed with
  // the taste: pop(i) ((1 - rho) / sum pop + rho sum_t taste(t) v_i(t) / Z_t).
  std::vector<double> Z(8, 0.0);
  double P = 0;
  for (uint64_t i = 0; i < 300; ++i) {
    P += m.popularity(i);
    for (uint32_t t = 0; t < 8; ++t) Z[t] += m.item_factor(i, t) * m.popularity(i);
  }
  for (uint64_t u : {0ull, 1ull, 57ull, 99ull}) {
    double total = 0;
    for (uint64_t i = 0; i < 300; ++i) {
      double topic = 0;
      for (uint32_t t = 0; t < 8; ++t) topic += m.user_taste(u, t) * m.item_factor(i, t) / Z[t];
      const double want = m.popularity(i) * (0.2 / P + 0.8 * topic);
      ASSERT_NEAR(std::exp(m.score(u, i)), want, 1e-8 * want) << u << " " << i;
      total += std::exp(m.score(u, i));
    }
    EXPECT_NEAR(total, 1.0, 1e-9);
  }
  EXPECT_THROW(m.score(0, 300), Error);
}

// ------------------------------------------------------------- generation ---

TEST(Synthetic, DeterministicBySeedAndThreadCount) {
  SyntheticParams p = custom(300, 400, 15000);
  TempDir a, b, c;
  PrepOptions o1 = options(50, 1);
  o1.shuffle_buffer_bytes = 16 << 10;  // several shuffle buckets
  PrepOptions o2 = o1;
  o2.threads = 2;
  PrepOptions o3 = o2;
  o3.seed = 2;
  generate_synthetic(p, a.path(), o1);
  generate_synthetic(p, b.path(), o2);
  generate_synthetic(p, c.path(), o3);
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(a.path()))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  // 3 train and 3 eval shards, metadata.json, positives.bin (and whatever else
  // the writer adds: every file must match).
  ASSERT_GE(names.size(), 8u);
  for (const auto& n : names) {
    ASSERT_TRUE(std::filesystem::exists(b.file(n))) << n;
    EXPECT_EQ(test::read_file(a.file(n)), test::read_file(b.file(n))) << n;
  }
  for (const char* n : {"positives.bin", "eval-00000-of-00003.tfrecord"})
    EXPECT_NE(test::read_file(a.file(n)), test::read_file(c.file(n))) << n;
}

TEST(Synthetic, Ml1mShapeCountsAndContents) {
  SyntheticParams p;
  p.shape = synthetic_shape("ml-1m");
  TempDir d;
  PrepOptions o = options(99, 0);
  o.record_rows = 65536;
  o.num_shards = 2;
  DatasetMeta m = generate_synthetic(p, d.path(), o);
  EXPECT_EQ(m.num_users, 6040u);
  EXPECT_EQ(m.num_items, 3706u);
  EXPECT_EQ(m.num_positives, 1000209u);
  EXPECT_EQ(m.num_train, 1000209u - 6040u);
  EXPECT_EQ(m.num_eval_users, 6040u);
  EXPECT_EQ(m.eval_negatives, 99u);
  EXPECT_EQ(m.dropped_users, 0u);
  EXPECT_EQ(m.source, "synthetic:ml-1m");
  EXPECT_EQ(m.generator.at("shape"), "ml-1m");
  EXPECT_EQ(m.generator.at("rank"), 16);
  EXPECT_EQ(m.generator.at("min_per_user"), 20);
  DatasetMeta loaded = DatasetMeta::load(d.path());
  EXPECT_EQ(loaded.num_positives, 1000209u);
  EXPECT_EQ(loaded.generator, m.generator);

  // positives.bin holds the planned counts, each user's items distinct.
  PositiveLists pl(d.path(), loaded);
  std::vector<uint32_t> counts = synthetic_user_counts(p, 99, 1, 1);
  for (uint64_t u = 0; u < 6040; ++u) {
    ASSERT_EQ(uint64_t(pl.end(u) - pl.begin(u)), counts[u]) << "user " << u;
    ASSERT_GE(counts[u], 20u);
    ASSERT_TRUE(std::adjacent_find(pl.begin(u), pl.end(u),
                                   [](int32_t x, int32_t y) { return x >= y; }) == pl.end(u))
        << "user " << u;
  }
}

TEST(Synthetic, EveryUserFollowsTheDatasetRules) {
  // Ordinary users, and heavy users at the cap (half the items each), whose
  // draws run out of budget and finish on the dense path.
  struct Case {
    SyntheticParams p;
    uint32_t E;
  };
  std::vector<Case> cases;
  cases.push_back({custom(400, 500, 30000), 50});
  {
    SyntheticParams heavy = custom(60, 200, 60 * 97);
    heavy.rank = 4;
    heavy.preference = 0.95;
    cases.push_back({heavy, 60});
  }
  for (const Case& k : cases) {
    TempDir d;
    generate_synthetic(k.p, d.path(), options(k.E));
    verify_dataset(d.path());
    Contents c = read_back(d.path());
    EXPECT_EQ(c.meta.num_positives, k.p.shape.num_interactions);
    check_contents(c, synthetic_user_counts(k.p, k.E, 1), k.p.min_per_user);
  }
}

// Two interactions per user: the train item is the first draw, a draw from p_u;
// the test item is the second, from p_u without the first. Pooled over 20,000
// users, the counts per item must match PlantedModel's probabilities.
TEST(Synthetic, FirstAndSecondDrawsFollowThePlantedLaw) {
  SyntheticParams p = custom(20000, 60, 40000);
  p.min_per_user = 2;
  p.rank = 4;
  TempDir d;
  generate_synthetic(p, d.path(), options(10));
  Contents c = read_back(d.path());
  PlantedModel model(p, 1);
  const uint64_t I = 60;
  std::vector<double> first_obs(I), first_exp(I), second_obs(I), second_exp(I), pop_exp(I);
  double pop_total = 0;
  for (uint64_t i = 0; i < I; ++i) pop_total += model.popularity(i);
  std::vector<double> prob(I);
  for (uint64_t u = 0; u < 20000; ++u) {
    ASSERT_EQ(c.train[u].size(), 1u);
    const int32_t f = c.train[u][0], t = c.eval[u][0];
    ASSERT_NE(f, t);
    for (uint64_t i = 0; i < I; ++i) prob[i] = std::exp(model.score(u, i));
    first_obs[f] += 1;
    second_obs[t] += 1;
    for (uint64_t i = 0; i < I; ++i) {
      first_exp[i] += prob[i];
      if (int32_t(i) != f) second_exp[i] += prob[i] / (1 - prob[f]);
      pop_exp[i] += model.popularity(i) / pop_total;
    }
  }
  int dof = 0;
  // dof ~ 59: mean 59, sd 11; 130 is beyond the 1e-6 tail.
  const double chi_first = chi_square(first_obs, first_exp, &dof);
  EXPECT_LT(chi_first, 130) << "dof " << dof;
  const double chi_second = chi_square(second_obs, second_exp, &dof);
  EXPECT_LT(chi_second, 130) << "dof " << dof;
  // The test has power: popularity alone does not explain the first draws.
  EXPECT_GT(chi_square(first_obs, pop_exp, &dof), 500);
}

// Every user gets n = 4 = num_items / 2 of 8 items with steep popularity, so many
// users' rejection draws run out and the dense path picks the last items. The
// test (last) item must follow p(i) / (1 - p(first three)) either way.
TEST(Synthetic, DensePathContinuesTheSameLaw) {
  SyntheticParams p = custom(20000, 8, 80000);
  p.min_per_user = 4;
  p.zipf_s = 4;
  p.rank = 2;
  p.preference = 0.5;
  TempDir d;
  generate_synthetic(p, d.path(), options(4));
  Contents c = read_back(d.path());
  PlantedModel model(p, 1);
  std::vector<double> obs(8), expect(8), uniform(8);
  std::vector<double> prob(8);
  for (uint64_t u = 0; u < 20000; ++u) {
    ASSERT_EQ(c.positives[u].size(), 4u);
    const int32_t t = c.eval[u][0];
    for (int i = 0; i < 8; ++i) prob[i] = std::exp(model.score(u, i));
    double rest = 1;
    for (int32_t i : c.train[u]) rest -= prob[i];
    obs[t] += 1;
    for (int i = 0; i < 8; ++i) {
      if (std::binary_search(c.train[u].begin(), c.train[u].end(), i)) continue;
      expect[i] += prob[i] / rest;
      uniform[i] += 0.25;
    }
  }
  int dof = 0;
  const double chi = chi_square(obs, expect, &dof);
  EXPECT_LT(chi, 40) << "dof " << dof;  // dof <= 7: 40 is far in the tail
  EXPECT_GT(chi_square(obs, uniform, &dof), 1000);
}

// The planted taste is learnable: scoring the eval lists with PlantedModel gives
// a clearly higher HR@10 than scoring them by popularity.
TEST(Synthetic, PlantedTasteBeatsPopularityOnHeldOutItems) {
  SyntheticParams p = custom(1000, 500, 50000);
  TempDir d;
  generate_synthetic(p, d.path(), options(99));
  Contents c = read_back(d.path());
  PlantedModel model(p, 1);
  auto hit_at_10 = [](const std::vector<double>& s) {
    int above = 0;  // ties count against the positive
    for (size_t j = 1; j < s.size(); ++j) above += s[j] >= s[0];
    return above < 10;
  };
  int planted_hits = 0, pop_hits = 0;
  std::vector<double> sp(100), pp(100);
  for (uint64_t u = 0; u < 1000; ++u) {
    for (size_t j = 0; j < 100; ++j) {
      sp[j] = model.score(u, c.eval[u][j]);
      pp[j] = model.popularity(c.eval[u][j]);
    }
    planted_hits += hit_at_10(sp);
    pop_hits += hit_at_10(pp);
  }
  const double hr_planted = planted_hits / 1000.0, hr_pop = pop_hits / 1000.0;
  EXPECT_GT(hr_pop, 0.15) << "popularity should beat random (0.10)";
  EXPECT_GE(hr_planted - hr_pop, 0.1) << "planted " << hr_planted << ", popularity " << hr_pop;
}

}  // namespace
}  // namespace ncf
