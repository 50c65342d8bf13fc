// ncf_recommend and the top-K op it selects with.
//  - top_k (model/topk.h) on a hand-worked case and against a full sort of
//    every row (ties by item id, exclusions, rows with fewer than K items left);
//  - the real ncf_recommend on a trained checkpoint, at W = 1 and under
//    mpirun at W = 2, against a brute-force reference computed here from the
//    checkpoint's files with a naive loop: every pair's score, every user's
//    top K by a full sort;
//  - bad input: unknown ids, malformed pairs files, another dataset's
//    checkpoint, a missing checkpoint; each named with its file and line;
//  - original ids in and out: MovieLens integer ids, and string ids of a CSV
//    interaction log (quoted in and out where they hold commas or quotes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>

#include "data/dataset.h"
#include "data/id_map.h"
#include "model/topk.h"
#include "test_util.h"
#include "train/recommend_lists.h"

namespace ncf {
namespace {

using test::bin;
using test::csv_rows;
using test::run;
using test::TempDir;

// ---- the op ---------------------------------------------------------------------

struct TopK {
  std::vector<int32_t> items;
  std::vector<float> scores;
};

TopK cpu_top_k(const std::vector<float>& s, int64_t n, int64_t I, const std::vector<int64_t>* off,
               const std::vector<int32_t>* ex, int K) {
  ExecContext ctx;
  ctx.threads = 2;
  TopK t;
  t.items.resize(size_t(n * K));
  t.scores.resize(size_t(n * K));
  top_k(ctx, s.data(), n, I, off ? off->data() : nullptr, ex ? ex->data() : nullptr, K,
        t.items.data(), t.scores.data());
  return t;
}

TEST(TopKOp, HandWorkedTiesExclusionsAndShortRows) {
  // Row 0: items 1 and 3 tie at 2 (1 first), -0 and +0 tie (item 0 before 4).
  // Row 1: items 0 and 2 excluded; three items left for K = 4.
  const std::vector<float> s = {-0.0f, 2.0f, -1.0f, 2.0f, 0.0f, 5.0f, 1.0f, 9.0f, 3.0f, 1.0f};
  const std::vector<int64_t> off = {0, 0, 2};
  const std::vector<int32_t> ex = {0, 2};
  const TopK t = cpu_top_k(s, 2, 5, &off, &ex, 4);
  EXPECT_EQ(t.items, (std::vector<int32_t>{1, 3, 0, 4, 3, 1, 4, -1}));
  EXPECT_EQ(t.scores[0], 2.0f);
  EXPECT_EQ(t.scores[2], 0.0f);
  EXPECT_FALSE(std::signbit(t.scores[2])) << "-0 comes out as +0";
  EXPECT_EQ(t.scores[4], 3.0f);
  EXPECT_EQ(t.scores[5], 1.0f);
  EXPECT_TRUE(std::isinf(t.scores[7]) && t.scores[7] < 0);
  // Without exclusions row 1 is 9 (item 2), 5 (0), 3 (3), then 1 and 1 (1 before 4).
  const TopK all = cpu_top_k(s, 2, 5, nullptr, nullptr, 5);
  EXPECT_EQ(std::vector<int32_t>(all.items.begin() + 5, all.items.end()),
            (std::vector<int32_t>{2, 0, 3, 1, 4}));
}

TEST(TopKOp, EqualsAFullSortOfEveryRow) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> level(-20, 20);  // many ties
  const int64_t n = 57, I = 301;
  std::vector<float> s(size_t(n * I));
  for (float& x : s) x = float(level(gen)) * 0.25f;
  std::vector<int64_t> off(1, 0);
  std::vector<int32_t> ex;
  for (int64_t u = 0; u < n; ++u) {
    for (int32_t j = 0; j < I; ++j)
      if ((j * 7 + u) % (u % 9 + 2) == 0 || u == 5) ex.push_back(j);  // row 5: all excluded
    off.push_back(int64_t(ex.size()));
  }
  for (int K : {1, 10, 400}) {
    const TopK t = cpu_top_k(s, n, I, &off, &ex, K);
    for (int64_t u = 0; u < n; ++u) {
      std::vector<int32_t> order;
      for (int32_t j = 0; j < I; ++j)
        if (!std::binary_search(ex.begin() + off[u], ex.begin() + off[u + 1], j))
          order.push_back(j);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return s[u * I + a] > s[u * I + b]; });
      for (int r = 0; r < K; ++r) {
        const int32_t want = r < int(order.size()) ? order[size_t(r)] : -1;
        ASSERT_EQ(t.items[size_t(u * K + r)], want) << "K " << K << " user " << u << " rank " << r;
        if (want >= 0) {
          ASSERT_EQ(t.scores[size_t(u * K + r)], s[u * I + want]);
        }
      }
    }
  }
}

// ---- the program ------------------------------------------------------------------

// Reads a checkpoint's files and scores with a naive double-precision loop.
struct Reference {
  int mf = 0, D = 0;
  std::vector<int> layers;
  std::vector<float> tower, users, items;
  int64_t U = 0, I = 0;

  explicit Reference(const std::string& ck) {
    const nlohmann::json m = nlohmann::json::parse(test::read_file(ck + "/manifest.json"));
    mf = m["config"]["num_factors"];
    layers = m["config"]["layers"].get<std::vector<int>>();
    D = mf + layers[0] / 2;
    auto floats = [&](const std::string& name) {
      const std::string b = test::read_file(ck + "/" + name);
      std::vector<float> v(b.size() / 4);
      std::memcpy(v.data(), b.data(), v.size() * 4);
      return v;
    };
    tower = floats("tower.f32");
    users = floats("user.rows.f32");
    items = floats("item.rows.f32");
    U = int64_t(users.size()) / D;
    I = int64_t(items.size()) / D;
  }

  double logit(int64_t u, int64_t i) const {
    const float* pu = &users[size_t(u * D)];
    const float* pi = &items[size_t(i * D)];
    const int h = layers[0] / 2;
    std::vector<double> x(static_cast<size_t>(layers[0]));
    for (int k = 0; k < h; ++k) x[size_t(k)] = pu[mf + k], x[size_t(h + k)] = pi[mf + k];
    size_t at = 0;
    for (size_t l = 0; l + 1 < layers.size(); ++l) {
      const int in = layers[l], out = layers[l + 1];
      std::vector<double> y(static_cast<size_t>(out));
      for (int o = 0; o < out; ++o) {
        double acc = tower[at + size_t(out * in) + size_t(o)];
        for (int k = 0; k < in; ++k) acc += double(tower[at + size_t(o * in + k)]) * x[size_t(k)];
        y[size_t(o)] = std::max(acc, 0.0);
      }
      at += size_t(out * in + out);
      x = y;
    }
    double z = 0;
    for (int k = 0; k < mf; ++k) z += double(tower[at + size_t(k)]) * pu[k] * pi[k];
    for (size_t k = 0; k < x.size(); ++k) z += double(tower[at + size_t(mf) + k]) * x[k];
    return z + tower[at + size_t(mf) + x.size()];
  }
};

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

class Recommend : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    for (const auto& [name, seed] : {std::pair{"data", 21}, std::pair{"other", 22}}) {
      auto r = run(bin("ncf_prep") +
                   " --synthetic custom --users 157 --items 211 --interactions 5000 "
                   "--eval_negatives 50 --seed " +
                   std::to_string(seed) + " --output " + dir_->file(name) + " --progress off");
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
    auto r = run(bin("ncf_dist") + " --device cpu --data_dir " + data() +
                 " --batch_size 1000 --train_epochs 2 --threads 1 --learning_rate 0.01 "
                 "--progress off --checkpoint_dir " +
                 dir_->file("ck"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (const auto& e : std::filesystem::directory_iterator(dir_->file("ck")))
      ck_ = new std::string(e.path().string());
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete ck_;
  }
  static std::string data() { return dir_->file("data"); }
  static std::string recommend(int W, const std::string& flags) {
    return (W == 1 ? "" : test::mpirun(W) + " ") + bin("ncf_recommend") +
           " --device cpu --checkpoint " + *ck_ + " --data_dir " + data() + " --threads 1 " + flags;
  }
  static TempDir* dir_;
  static std::string* ck_;
};
TempDir* Recommend::dir_ = nullptr;
std::string* Recommend::ck_ = nullptr;

TEST_F(Recommend, TopKEqualsABruteForceRankingOfTheCheckpoint) {
  const Reference ref(*ck_);
  const DatasetMeta meta = DatasetMeta::load(data());
  const PositiveLists pos(data(), meta);
  ASSERT_EQ(ref.U, int64_t(meta.num_users));
  const int K = 7;
  TempDir t;
  std::string first;
  for (int W : {1, 2}) {
    // Small rounds (--batch_size 1000: 4 users a round) cover many rounds.
    const auto r =
        run(recommend(W, "--users all --topk 7 --batch_size 1000 --output " + t.file("top.csv")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string text = test::read_file(t.file("top.csv"));
    if (W == 1) {
      first = text;
      continue;
    }
    // Rows scored in other groups: the same lists, scores within float rounding
    // (two items may swap only at such a near-tie, which the score check bounds).
    const auto a = csv_rows(first), b = csv_rows(text);
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 1; k < a.size(); ++k) {
      ASSERT_EQ(a[k][0], b[k][0]) << "line " << k;
      ASSERT_EQ(a[k][1], b[k][1]) << "line " << k;
      EXPECT_NEAR(std::stod(a[k][3]), std::stod(b[k][3]), 1e-6) << "line " << k;
    }
  }
  const auto rows = csv_rows(first);
  ASSERT_EQ(rows.size(), size_t(1 + ref.U * K));
  EXPECT_EQ(rows[0], (std::vector<std::string>{"user", "rank", "item", "score"}));
  size_t line = 1;
  for (int64_t u = 0; u < ref.U; ++u) {
    std::vector<std::pair<double, int32_t>> all;
    for (int32_t i = 0; i < ref.I; ++i)
      if (!std::binary_search(pos.begin(u), pos.end(u), i)) all.push_back({ref.logit(u, i), i});
    std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    });
    for (int r = 0; r < K; ++r, ++line) {
      const auto& row = rows[line];
      ASSERT_EQ(row.size(), 4u);
      EXPECT_EQ(std::stoll(row[0]), u);
      EXPECT_EQ(std::stoi(row[1]), r + 1);
      const int32_t item = std::stoi(row[2]);
      EXPECT_FALSE(std::binary_search(pos.begin(u), pos.end(u), item)) << "a seen item, user " << u;
      EXPECT_NEAR(std::stod(row[3]), sigmoid(ref.logit(u, item)), 1e-6) << "user " << u;
      // The same item as the full sort, unless the two are within float
      // rounding of a tie.
      if (item != all[size_t(r)].second) {
        EXPECT_NEAR(ref.logit(u, item), all[size_t(r)].first, 1e-5)
            << "user " << u << " rank " << r + 1 << ": item " << item << ", reference "
            << all[size_t(r)].second;
      }
    }
  }
}

TEST_F(Recommend, IncludeSeenAndJsonLines) {
  const DatasetMeta meta = DatasetMeta::load(data());
  const PositiveLists pos(data(), meta);
  TempDir t;
  auto r = run(recommend(1, "--users 3,0,156 --topk 211 --include_seen --format jsonl --output " +
                                t.file("top.jsonl")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::stringstream ss(test::read_file(t.file("top.jsonl")));
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(ss, line)) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 3u * 211u) << "every item, seen ones too";
  EXPECT_EQ(rows[0]["user"], 3);
  EXPECT_EQ(rows[211]["user"], 0);
  EXPECT_EQ(rows[422]["user"], 156);
  EXPECT_EQ(rows[421]["rank"], 211);
  // Without --include_seen, user 3 gets every item but its known ones.
  r = run(recommend(1, "--users 3 --topk 211 --output " + t.file("top.csv")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const size_t seen = size_t(pos.end(3) - pos.begin(3));
  EXPECT_EQ(csv_rows(test::read_file(t.file("top.csv"))).size(), 1 + 211 - seen);
}

// --topk past the catalogue lists every item once, and says it clamped K.
TEST_F(Recommend, TopKPastTheCatalogueIsClampedWithAMessage) {
  TempDir t;
  auto r =
      run(recommend(1, "--users 3,156 --topk 500 --include_seen --output " + t.file("top.csv")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--topk 500 is more than the 211 items"), std::string::npos) << r.output;
  const auto rows = csv_rows(test::read_file(t.file("top.csv")));
  ASSERT_EQ(rows.size(), 1 + 2u * 211u);
  std::set<std::string> items;
  for (size_t k = 1; k <= 211; ++k) items.insert(rows[k][2]);
  EXPECT_EQ(items.size(), 211u) << "every item of user 3 once";
}

TEST_F(Recommend, PairsMatchTheNaiveLoopAtAnyRankCount) {
  const Reference ref(*ck_);
  std::mt19937 gen(3);
  std::string pairs = "user,item\n";
  std::vector<std::pair<int, int>> want;
  for (int k = 0; k < 500; ++k) {
    want.push_back({int(gen() % ref.U), int(gen() % ref.I)});
    pairs += std::to_string(want.back().first) + "," + std::to_string(want.back().second) + "\n";
  }
  TempDir t;
  test::write_file(t.file("pairs.csv"), pairs);
  for (int W : {1, 2}) {
    const auto r = run(recommend(
        W, "--pairs " + t.file("pairs.csv") + " --batch_size 64 " + "--output " + t.file("s.csv")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto rows = csv_rows(test::read_file(t.file("s.csv")));
    ASSERT_EQ(rows.size(), want.size() + 1);
    EXPECT_EQ(rows[0], (std::vector<std::string>{"user", "item", "score"}));
    for (size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ(std::stoi(rows[k + 1][0]), want[k].first);
      EXPECT_EQ(std::stoi(rows[k + 1][1]), want[k].second);
      EXPECT_NEAR(std::stod(rows[k + 1][2]), sigmoid(ref.logit(want[k].first, want[k].second)),
                  1e-6)
          << "W=" << W << " pair " << k;
    }
  }
}

// A MovieLens dataset keeps its ids: users and items go in and come out as
// the file's ids (here dense id d is user 1000 + 7d and movie 5 + 3d).
TEST(RecommendIds, MovieLensIdsInAndOut) {
  TempDir d;
  std::string text;
  std::mt19937 gen(5);
  for (int u = 0; u < 40; ++u)
    for (int k = 0; k < 12; ++k)
      text += std::to_string(1000 + 7 * u) + "\t" + std::to_string(5 + 3 * int(gen() % 60)) +
              "\t4\t" + std::to_string(k) + "\n";
  test::write_file(d.file("u.data"), text);
  auto r = run(bin("ncf_prep") + " --input " + d.file("u.data") + " --eval_negatives 10 " +
               "--output " + d.file("data") + " --progress off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(bin("ncf_dist") + " --device cpu --data_dir " + d.file("data") +
          " --batch_size 100 --train_epochs 1 --threads 1 --progress off --checkpoint_dir " +
          d.file("ck"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string base = bin("ncf_recommend") + " --device cpu --checkpoint " + d.file("ck") +
                           " --data_dir " + d.file("data") + " --threads 1 ";
  r = run(base + "--users 1000,1273 --topk 3 --output " + d.file("top.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto rows = csv_rows(test::read_file(d.file("top.csv")));
  ASSERT_EQ(rows.size(), 7u);
  EXPECT_EQ(rows[1][0], "1000");
  EXPECT_EQ(rows[4][0], "1273");
  for (size_t k = 1; k < rows.size(); ++k) {
    const int item = std::stoi(rows[k][2]);
    EXPECT_EQ((item - 5) % 3, 0) << "not a movie id of the file: " << item;
    EXPECT_TRUE(item >= 5 && item < 5 + 3 * 60) << item;
  }
  // Pairs by the file's ids score as the same pair in the top list.
  test::write_file(d.file("p.csv"), "1000," + rows[1][2] + "\n");
  r = run(base + "--pairs " + d.file("p.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("1000," + rows[1][2] + "," + rows[1][3]), std::string::npos) << r.output;
  // Dense ids are not the file's.
  r = run(base + "--users 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--users entry 1: user 1 is not in the dataset"), std::string::npos)
      << r.output;
}

// RFC 4180 rows of a small text, written here so the check does not lean on
// the reader under test: quoted fields, "" for a quote, line breaks inside quotes.
std::vector<std::vector<std::string>> quoted_csv_rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows(1, std::vector<std::string>(1));
  bool quoted = false;
  for (size_t k = 0; k < text.size(); ++k) {
    const char c = text[k];
    if (quoted) {
      if (c == '"' && k + 1 < text.size() && text[k + 1] == '"') {
        rows.back().back() += '"';
        ++k;
      } else if (c == '"') {
        quoted = false;
      } else {
        rows.back().back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      rows.back().emplace_back();
    } else if (c == '\n') {
      rows.emplace_back(1);
    } else {
      rows.back().back() += c;
    }
  }
  if (rows.back() == std::vector<std::string>(1)) rows.pop_back();
  return rows;
}

// A CSV interaction log keeps its string ids: users and items go in (quoted
// where they hold a comma or a quote) and come out as the file's strings.
TEST(RecommendIds, StringIdsInAndOut) {
  TempDir d;
  auto user = [](int u) {
    return u % 3 == 0 ? "cust," + std::to_string(u) : "c\"" + std::to_string(u) + "\"x";
  };
  auto item = [](int i) {
    return i % 4 == 0 ? "SKU " + std::to_string(i) + ", XL" : "sku-" + std::to_string(i);
  };
  auto quote = [](const std::string& s) {
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  std::string text = "user,item,time\n";
  std::mt19937 gen(9);
  std::set<std::string> items;
  for (int u = 0; u < 30; ++u)
    for (int k = 0; k < 10; ++k) {
      const int i = int(gen() % 50);
      items.insert(item(i));
      text += quote(user(u)) + "," + quote(item(i)) + "," + std::to_string(k) + "\n";
    }
  test::write_file(d.file("log.csv"), text);
  auto r = run(bin("ncf_prep") + " --input " + d.file("log.csv") +
               " --format csv --columns user=user,item=item,timestamp=time --eval_negatives 5 "
               "--output " +
               d.file("data") + " --progress off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(bin("ncf_dist") + " --device cpu --data_dir " + d.file("data") +
          " --batch_size 100 --train_epochs 1 --threads 1 --progress off --checkpoint_dir " +
          d.file("ck"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string base = bin("ncf_recommend") + " --device cpu --checkpoint " + d.file("ck") +
                           " --data_dir " + d.file("data") + " --threads 1 ";
  // --users as a list: the quoted id holds a comma, the other a quote.
  r = run(base + "--users '\"cust,3\",\"c\"\"4\"\"x\"' --topk 3 --output " + d.file("top.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string top = test::read_file(d.file("top.csv"));
  EXPECT_NE(top.find("\"cust,3\",1,"), std::string::npos) << top;
  EXPECT_NE(top.find("\"c\"\"4\"\"x\",1,"), std::string::npos) << top;
  const auto rows = quoted_csv_rows(top);
  ASSERT_EQ(rows.size(), 7u) << top;
  EXPECT_EQ(rows[0], (std::vector<std::string>{"user", "rank", "item", "score"}));
  for (size_t k = 1; k < rows.size(); ++k) {
    ASSERT_EQ(rows[k].size(), 4u) << top;
    EXPECT_EQ(rows[k][0], k <= 3 ? "cust,3" : "c\"4\"x");
    EXPECT_TRUE(items.count(rows[k][2])) << "not an item of the file: " << rows[k][2];
  }
  // A users file (header, quoted ids), and pairs by the file's ids: the pair
  // scores as in the top list.
  test::write_file(d.file("users.txt"), "user\n\"cust,3\"\n");
  r = run(base + "--users " + d.file("users.txt") + " --topk 3 --output " + d.file("top2.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(quoted_csv_rows(test::read_file(d.file("top2.csv"))),
            std::vector<std::vector<std::string>>(rows.begin(), rows.begin() + 4));
  test::write_file(d.file("p.csv"),
                   "user,item\n" + quote(rows[1][0]) + "," + quote(rows[1][2]) + "\n");
  r = run(base + "--pairs " + d.file("p.csv") + " --output " + d.file("s.csv"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto scored = quoted_csv_rows(test::read_file(d.file("s.csv")));
  ASSERT_EQ(scored.size(), 2u);
  EXPECT_EQ(scored[1], (std::vector<std::string>{rows[1][0], rows[1][2], rows[1][3]}));
  // JSON lines carry the ids as JSON strings.
  r = run(base + "--users '\"c\"\"4\"\"x\"' --topk 2 --format jsonl --output " +
          d.file("top.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::stringstream ss(test::read_file(d.file("top.jsonl")));
  std::string line;
  int n = 0;
  while (std::getline(ss, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["user"], "c\"4\"x");
    EXPECT_TRUE(j["item"].is_string() && items.count(j["item"].get<std::string>())) << line;
    ++n;
  }
  EXPECT_EQ(n, 2);
  // Unknown ids and malformed lines are named.
  r = run(base + "--users '\"cust,3\",nobody'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--users entry 2: user nobody is not in the dataset"), std::string::npos)
      << r.output;
  test::write_file(d.file("bad.csv"), "\"cust,3\",sku-1\n\"cust,3\",sku-1,extra\n");
  r = run(base + "--pairs " + d.file("bad.csv"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(d.file("bad.csv") + ":2: expected 'user,item' (two ids)"),
            std::string::npos)
      << r.output;
  test::write_file(d.file("bad2.csv"), "\"cust,3\",nothing\n");
  r = run(base + "--pairs " + d.file("bad2.csv"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find(d.file("bad2.csv") + ":1: item nothing is not in the dataset"),
            std::string::npos)
      << r.output;
}

TEST_F(Recommend, BadInputIsNamedWithItsFileAndLine) {
  TempDir t;
  auto expect_fail = [](const test::RunResult& r, const std::string& text) {
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(text), std::string::npos) << "expected '" << text << "' in\n"
                                                      << r.output;
  };
  expect_fail(run(recommend(1, "--users 5,157")), "--users entry 2: user 157 is not in");
  expect_fail(run(recommend(1, "--users 5,x")), "entry 2 is 'x'");
  test::write_file(t.file("p1.csv"), "user,item\n1,2\n3;4\n");
  expect_fail(run(recommend(1, "--pairs " + t.file("p1.csv"))),
              t.file("p1.csv") + ":3: expected 'user,item'");
  test::write_file(t.file("p2.csv"), "1,2\n\n3,211\n");
  expect_fail(run(recommend(1, "--pairs " + t.file("p2.csv"))),
              t.file("p2.csv") + ":3: item 211 is not in the dataset");
  test::write_file(t.file("u.txt"), "user\n4\n-1\n");
  expect_fail(run(recommend(1, "--users " + t.file("u.txt"))), t.file("u.txt") + ":3: user -1");
  expect_fail(run(recommend(2, "--pairs " + t.file("p2.csv"))), ":3: item 211");
  // Another dataset's checkpoint; a path with no checkpoint.
  expect_fail(run(bin("ncf_recommend") + " --device cpu --checkpoint " + *ck_ + " --data_dir " +
                  dir_->file("other") + " --users all"),
              "belongs to dataset");
  expect_fail(run(bin("ncf_recommend") + " --device cpu --checkpoint " + t.file("none") +
                  " --data_dir " + data() + " --users all"),
              "--checkpoint " + t.file("none") + ": no such checkpoint");
  expect_fail(run(bin("ncf_recommend") + " --device cpu --checkpoint " + t.path() + " --data_dir " +
                  data() + " --users all"),
              "no whole checkpoint");
  expect_fail(run(recommend(1, "")), "give --users or --pairs");
}

// Fuzzing found (fuzz/regressions/recommend_lists/): an inline --users list is
// first looked up as a file, and a list of 256 characters or more (some 60
// ids) made that lookup throw std::filesystem's "File name too long", so
// ncf_recommend stopped naming no flag instead of reading the list.
TEST(RecommendLists, ALongInlineListIsAListNotAFileName) {
  std::string list;
  std::vector<int32_t> want;
  for (int k = 0; k < 150; ++k) {
    list += (k ? "," : "") + std::to_string(k % 7);
    want.push_back(k % 7);
  }
  ASSERT_GT(list.size(), 256u);
  std::vector<int32_t> got;
  try {
    got = read_users(list, "data", IdMap(int64_t(10)));
  } catch (const std::exception& e) {
    FAIL() << e.what();
  }
  EXPECT_EQ(got, want);
  // An id that is not in the dataset is still named by its entry.
  try {
    read_users(list + ",12", "data", IdMap(int64_t(10)));
    ADD_FAILURE() << "user 12 of 10 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--users entry 151: user 12 is not in the dataset data"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ncf
