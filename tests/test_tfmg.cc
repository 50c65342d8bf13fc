// `ncf_prep --format tfmg` (data/source_tfmg.h) against TF Model Garden shards
// written by an independent encoder, tests/tfmg/make_tfmg.py (Python protobuf
// from the same tf_example.proto, its own TFRecord framing and CRC-32C), which
// also writes the truth: every user's training items, true item, and eval
// candidates and mask as they are in the shards. The prepared dataset is read
// back straight from its protobuf records, not through ncf_prep's decoders.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/device.h"
#include "data/dataset.h"
#include "data/format.h"
#include "data/ncf_record.pb.h"
#include "data/source_tfmg.h"
#include "data/tf_example.pb.h"
#include "model/metrics.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;
namespace fs = std::filesystem;

// The tests' interpreter (Debian's where there is one): the protobuf runtime, crcmod and
// numpy are its packages (scripts/setup.sh), whatever python3 comes first on PATH.
const std::string kPython = test::python3();

// Why the independent encoder cannot run here ("" when it can): its Python
// modules are Debian packages that scripts/setup.sh installs, which a bare
// machine (the GPU kit's) does not have. Missing modules skip the tests that
// need them; with the modules present, any failure of make_tfmg.py fails them.
const std::string& tfmg_tools_missing() {
  static const std::string why = [] {
    const auto r = run(kPython + " -c 'import google.protobuf, crcmod, numpy'");
    return r.exit_code == 0
               ? std::string()
               : kPython +
                     " lacks python3-protobuf, python3-crcmod or python3-numpy (scripts/setup.sh "
                     "installs them): " +
                     r.output;
  }();
  return why;
}

// Runs make_tfmg.py; returns its truth file, parsed.
nlohmann::json make_tfmg(const std::string& ratings, const std::string& out,
                         const std::string& truth, const std::string& flags = "") {
  const std::string src = NCF_SOURCE_DIR;
  const auto r = run(kPython + " " + src + "/tests/tfmg/make_tfmg.py --proto " + src +
                     "/src/data/tf_example.proto --ratings " + ratings + " --out " + out +
                     " --truth " + truth + " " + flags);
  if (r.exit_code != 0)
    throw std::runtime_error(
        "make_tfmg.py failed (scripts/setup.sh installs python3-protobuf, "
        "python3-crcmod and python3-numpy):\n" +
        r.output);
  return nlohmann::json::parse(test::read_file(truth));
}

// A u.data-like ratings file: `users` users with raw ids 7 + 5u, 8 .. 40
// distinct items each out of 1 .. items, timestamps from a small range (ties
// are broken by the later line, in ncf_prep and in make_tfmg.py alike).
void write_random_ratings(const std::string& path, int users, int items, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string text;
  std::vector<int> pool(static_cast<size_t>(items));
  std::iota(pool.begin(), pool.end(), 1);
  for (int u = 0; u < users; ++u) {
    std::shuffle(pool.begin(), pool.end(), rng);
    const int n = 8 + static_cast<int>(rng() % 33);
    for (int k = 0; k < n; ++k)
      text += std::to_string(7 + 5 * u) + "\t" + std::to_string(pool[static_cast<size_t>(k)]) +
              "\t4\t" + std::to_string(1 + rng() % 30) + "\n";
  }
  test::write_file(path, text);
}

// ------------------------------------------------------ the dataset, read raw ---

struct RawEval {
  std::vector<int32_t> items;  // U x L
  std::vector<uint8_t> mask;   // U x L
};

RawEval read_eval(const std::string& dir, const DatasetMeta& meta) {
  const uint64_t L = meta.eval_negatives + 1;
  RawEval e;
  const auto shards = meta.shards_of("eval");
  for (uint32_t s = 0; s < shards.size(); ++s) {
    ShardCursor cur(dir, meta, "eval", s);
    std::string payload;
    uint64_t off;
    while (cur.next(&payload, &off)) {
      proto::EvalRecord r;
      EXPECT_TRUE(r.ParseFromString(payload));
      EXPECT_EQ(r.user(), e.items.size() / L);
      const size_t at = e.items.size();
      e.items.resize(at + L);
      std::memcpy(&e.items[at], r.items().data(), L * 4);
      for (uint64_t j = 0; j < L; ++j)
        e.mask.push_back((static_cast<unsigned char>(r.dup_mask()[j / 8]) >> (j % 8)) & 1);
    }
  }
  return e;
}

// Every (user, item) train pair of the dataset, sorted.
std::vector<std::pair<int32_t, int32_t>> read_train_pairs(const std::string& dir,
                                                          const DatasetMeta& meta) {
  std::vector<std::pair<int32_t, int32_t>> pairs;
  const auto shards = meta.shards_of("train");
  for (uint32_t s = 0; s < shards.size(); ++s) {
    ShardCursor cur(dir, meta, "train", s);
    std::string payload;
    uint64_t off;
    while (cur.next(&payload, &off)) {
      proto::TrainRecord r;
      EXPECT_TRUE(r.ParseFromString(payload));
      std::vector<int32_t> u(r.num_valid()), i(r.num_valid());
      std::memcpy(u.data(), r.users().data(), u.size() * 4);
      std::memcpy(i.data(), r.items().data(), i.size() * 4);
      for (size_t k = 0; k < u.size(); ++k) pairs.emplace_back(u[k], i[k]);
    }
  }
  std::sort(pairs.begin(), pairs.end());
  return pairs;
}

// A score that depends on (user, item) only, on 64 levels so that ties are
// common; the user's true item sits on one of the top 4 levels, so that some
// users are hits at K = 10 and some are not.
float score_of(int64_t u, int32_t item, int32_t true_item) {
  if (item == true_item) return float(63 - u % 4) / 64.0f;
  uint64_t x =
      uint64_t(u) * 0x9e3779b97f4a7c15ull ^ uint64_t(uint32_t(item)) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 32;
  return float(x % 64) / 64.0f;
}

// ---------------------------------------------------------------- tests ---

class TfmgTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!tfmg_tools_missing().empty()) return;
    dir_ = new TempDir;
    write_random_ratings(dir_->file("ratings.tsv"), 120, 400, 11);
    // E = 999 candidates drawn with replacement from ~380 items: many repeats.
    // 7 users per eval batch: 120 users need 18 batches, the last with 6 padding users.
    truth_ = new nlohmann::json(make_tfmg(dir_->file("ratings.tsv"), dir_->file("tf"),
                                          dir_->file("truth.json"),
                                          "--epochs 3 --train_batch 512 --eval_users_per_batch 7"));
  }
  void SetUp() override {
    if (!tfmg_tools_missing().empty()) GTEST_SKIP() << tfmg_tools_missing();
  }
  static void TearDownTestSuite() {
    delete truth_;
    delete dir_;
  }
  static TempDir* dir_;
  static nlohmann::json* truth_;
};
TempDir* TfmgTest::dir_ = nullptr;
nlohmann::json* TfmgTest::truth_ = nullptr;

TEST_F(TfmgTest, ConvertsPositivesEvalListsAndMasksExactly) {
  const nlohmann::json& t = *truth_;
  const std::string out = dir_->file("out");
  auto r = run(bin("ncf_prep") + " --input " + dir_->file("tf") +
               " --format tfmg --record_rows 256 --num_shards 3 --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(bin("ncf_prep") + " --verify " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("OK"), std::string::npos) << r.output;

  const DatasetMeta m = DatasetMeta::load(out);
  const uint64_t U = t["num_users"], E = t["eval_negatives"], L = E + 1;
  ASSERT_EQ(m.num_users, U);
  EXPECT_EQ(m.num_items, t["num_items"].get<uint64_t>());
  EXPECT_EQ(m.num_train, t["num_train"].get<uint64_t>());
  EXPECT_EQ(m.num_eval_users, U);
  EXPECT_EQ(m.eval_negatives, E);
  EXPECT_TRUE(m.eval_masks_given);
  EXPECT_EQ(m.eval_sampling, "given");
  EXPECT_EQ(m.source.rfind("tfmg:", 0), 0u) << m.source;
  EXPECT_EQ(m.generator["padding_eval_users"], t["padding_users"]);
  EXPECT_GT(t["padding_users"].get<int>(), 0) << "the fixture should exercise padding users";
  EXPECT_TRUE(m.id_maps.empty());

  // Positives: training items ∪ the true item; train pairs: the training items.
  PositiveLists pos(out, m);
  std::vector<std::pair<int32_t, int32_t>> want_pairs;
  for (uint64_t u = 0; u < U; ++u) {
    std::vector<int32_t> train = t["train"][u].get<std::vector<int32_t>>();
    for (int32_t i : train) want_pairs.emplace_back(int32_t(u), i);
    std::vector<int32_t> want = train;
    want.push_back(t["test"][u].get<int32_t>());
    std::sort(want.begin(), want.end());
    want.erase(std::unique(want.begin(), want.end()), want.end());
    EXPECT_EQ(std::vector<int32_t>(pos.begin(u), pos.end(u)), want) << "user " << u;
  }
  std::sort(want_pairs.begin(), want_pairs.end());
  EXPECT_EQ(read_train_pairs(out, m), want_pairs);

  // Eval: ours = [true item (TF-MG's last), TF-MG candidates 0 .. L-2], mask inverted.
  const RawEval ev = read_eval(out, m);
  ASSERT_EQ(ev.items.size(), U * L);
  uint64_t repeats = 0;
  for (uint64_t u = 0; u < U; ++u) {
    const auto tf_items = t["eval_items"][u].get<std::vector<int32_t>>();
    const auto tf_mask = t["eval_mask"][u].get<std::vector<int>>();
    ASSERT_EQ(tf_items.size(), L);
    std::vector<int32_t> want_items{tf_items[L - 1]};
    std::vector<uint8_t> want_mask{1};
    for (uint64_t j = 0; j + 1 < L; ++j) {
      want_items.push_back(tf_items[j]);
      want_mask.push_back(uint8_t(1 - tf_mask[j]));
      repeats += uint64_t(tf_mask[j]);
    }
    EXPECT_EQ(want_items[0], t["test"][u].get<int32_t>()) << "user " << u;
    EXPECT_EQ(
        std::vector<int32_t>(ev.items.begin() + long(u * L), ev.items.begin() + long(u * L + L)),
        want_items)
        << "user " << u;
    EXPECT_EQ(
        std::vector<uint8_t>(ev.mask.begin() + long(u * L), ev.mask.begin() + long(u * L + L)),
        want_mask)
        << "user " << u;
  }
  EXPECT_GT(repeats, U * 100) << "the fixture should have many repeated candidates";
  EXPECT_EQ(m.generator["masked_negatives"].get<uint64_t>(), repeats);

  // The same data found without --format, and with --tfmg_cycles first: the
  // same positives and eval shards byte for byte.
  r = run(bin("ncf_prep") + " --input " + dir_->file("tf") +
          " --record_rows 256 --num_shards 3 --output " + dir_->file("auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(bin("ncf_prep") + " --input " + dir_->file("tf") +
          " --format tfmg --tfmg_cycles first --record_rows 256 --num_shards 3 --output " +
          dir_->file("first"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string other : {"auto", "first"}) {
    EXPECT_EQ(test::read_file(dir_->file(other) + "/positives.bin"),
              test::read_file(out + "/positives.bin"))
        << other;
    const DatasetMeta mo = DatasetMeta::load(dir_->file(other));
    EXPECT_EQ(read_eval(dir_->file(other), mo).mask, ev.mask) << other;
    EXPECT_EQ(read_train_pairs(dir_->file(other), mo), want_pairs) << other;
  }
}

// Our HR/NDCG on the converted lists equal TF Model Garden's metric
// (match_mlperf) on its own lists: masked candidates' logits set to the lowest
// float, a stable descending sort, the true item (last) ranked where it lands,
// so it loses every tie. Scores on 7 levels make ties common.
TEST_F(TfmgTest, MetricEqualsTfModelGardensOnTheSameLists) {
  const nlohmann::json& t = *truth_;
  const std::string out = dir_->file("metric");
  auto r = run(bin("ncf_prep") + " --input " + dir_->file("tf") + " --format tfmg --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const DatasetMeta m = DatasetMeta::load(out);
  const RawEval ev = read_eval(out, m);
  const int64_t U = int64_t(m.num_users), L = int64_t(m.eval_negatives) + 1;
  for (int K : {1, 10, 50}) {
    double tf_hr = 0, tf_ndcg = 0;
    for (int64_t u = 0; u < U; ++u) {
      const auto items = t["eval_items"][u].get<std::vector<int32_t>>();
      const auto mask = t["eval_mask"][u].get<std::vector<int>>();
      std::vector<float> logit(static_cast<size_t>(L));
      for (int64_t j = 0; j < L; ++j)
        logit[size_t(j)] = mask[size_t(j)] ? std::numeric_limits<float>::lowest()
                                           : score_of(u, items[size_t(j)], items[size_t(L - 1)]);
      std::vector<int64_t> order(static_cast<size_t>(L));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return logit[size_t(a)] > logit[size_t(b)]; });
      const int64_t position = std::find(order.begin(), order.end(), L - 1) - order.begin();
      if (position < K) {
        tf_hr += 1;
        tf_ndcg += std::log(2.0) / std::log(double(position) + 2);
      }
    }
    std::vector<float> scores(static_cast<size_t>(U * L));
    for (int64_t u = 0; u < U; ++u)
      for (int64_t j = 0; j < L; ++j)
        scores[size_t(u * L + j)] =
            score_of(u, ev.items[size_t(u * L + j)], ev.items[size_t(u * L)]);
    ExecContext cpu;
    double hr = -1, ndcg = -1;
    hit_ndcg(cpu, scores.data(), ev.mask.data(), U, int(L), K, &hr, &ndcg);
    EXPECT_EQ(hr, tf_hr) << "K " << K;
    EXPECT_NEAR(ndcg, tf_ndcg, 1e-9) << "K " << K;
    if (K == 10) {  // both hits and misses, so the comparison has teeth
      EXPECT_GT(hr, 0.1 * double(U));
      EXPECT_LT(hr, 0.9 * double(U));
    }
  }
}

// Given masks (TF-MG's) are held to consistency, not to duplicate_mask():
// which copy of a repeated negative counts may differ, nothing else may.
TEST(Tfmg, GivenMasksAreCheckedForConsistency) {
  const std::vector<int32_t> items = {5, 7, 9, 7, 5, 9, 2};  // positive 5; 7, 9 repeat; 5 again
  const std::vector<uint8_t> first = {1, 1, 1, 0, 0, 0, 1};  // duplicate_mask's
  const std::vector<uint8_t> later = {1, 0, 0, 1, 0, 1, 1};  // TF-MG may keep other copies
  std::vector<uint8_t> dm(items.size());
  duplicate_mask(items.data(), items.size(), dm.data());
  EXPECT_EQ(dm, first);
  const size_t n = items.size();
  EXPECT_EQ(given_mask_mismatch(items.data(), n, first.data()), n);
  EXPECT_EQ(given_mask_mismatch(items.data(), n, later.data()), n);
  struct Bad {
    std::vector<uint8_t> mask;
    size_t at;
  };
  const std::vector<Bad> bad = {
      {{0, 1, 1, 0, 1, 0, 1}, 0},  // the positive does not count
      {{1, 1, 1, 1, 0, 0, 1}, 3},  // 7 counts twice
      {{1, 0, 1, 0, 0, 0, 1}, 1},  // 7 never counts
      {{1, 1, 1, 0, 1, 0, 1}, 4},  // a negative equal to the positive counts
      {{1, 1, 1, 0, 0, 0, 0}, 6},  // 2 never counts
      {{1, 1, 2, 0, 0, 0, 1}, 2},  // not a bit
  };
  for (const Bad& b : bad)
    EXPECT_EQ(given_mask_mismatch(items.data(), n, b.mask.data()), b.at) << int(b.at);

  // The decoder applies the rule the metadata names: a dataset with computed
  // masks still refuses any mask but duplicate_mask's.
  DatasetMeta meta;
  meta.num_users = 1;
  meta.num_items = 10;
  meta.eval_negatives = uint32_t(n - 1);
  std::string payload;
  encode_eval_record(0, items.data(), n, &payload, later.data());
  std::vector<int32_t> got(n);
  std::vector<uint8_t> mask(n);
  EXPECT_THROW(decode_eval_record(payload, meta, 0, -1, "f", 7, got.data(), mask.data()), Error);
  meta.eval_masks_given = true;
  decode_eval_record(payload, meta, 0, -1, "f", 7, got.data(), mask.data());
  EXPECT_EQ(mask, later);
  encode_eval_record(0, items.data(), n, &payload, bad[1].mask.data());
  try {
    decode_eval_record(payload, meta, 0, -1, "f", 7, got.data(), mask.data());
    ADD_FAILURE() << "an inconsistent given mask was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f at byte offset 7"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("position 3"), std::string::npos) << e.what();
  }
  // metadata.json says so, and nothing but "given" is read.
  nlohmann::json j = meta.to_json();
  EXPECT_EQ(j["eval_masks"], "given");
  j["num_users"] = 1;
  j["shards"] = nlohmann::json::array();
  j["num_train"] = 0;
  j["num_eval_users"] = 0;  // no eval shards: only version 3 evaluates fewer users than it has
  j["format_version"] = kFormatVersion;
  j["train_record_rows"] = 1;
  EXPECT_TRUE(DatasetMeta::from_json(j, "m.json").eval_masks_given);
  j["eval_masks"] = "mine";
  EXPECT_THROW(DatasetMeta::from_json(j, "m.json"), Error);
  j.erase("eval_masks");
  EXPECT_FALSE(DatasetMeta::from_json(j, "m.json").eval_masks_given);
}

struct Fault {
  std::string name;
  std::vector<std::string> message;  // besides the file (and offset) from the truth
  bool record = true;                // the truth names a record: file and byte offset
};

TEST(Tfmg, EveryFaultIsRefusedNamingTheFile) {
  if (!tfmg_tools_missing().empty()) GTEST_SKIP() << tfmg_tools_missing();
  TempDir t;
  write_random_ratings(t.file("ratings.tsv"), 60, 300, 5);
  const std::vector<Fault> faults = {
      {"bad_crc", {"bad payload CRC"}},
      {"feature_name", {"unknown feature 'label'"}},
      {"wrong_length", {"feature 'item_id' holds 511 values, expected 512"}},
      {"bytes_list", {"BytesList", "pre-2019"}},
      {"missing_cycle", {"directory is missing"}, false},
      {"missing_shard", {"missing"}, false},
      {"meta_train_elements", {"num_train_elements"}, false},
      {"cycle_other_positive", {"is not one of training_cycle_0's positives"}},
      {"cycle_repeat_positive", {"appears a second time in training_cycle_1"}, false},
      {"cycle_missing_positive", {"training_cycle_1", "is missing"}, false},
      {"eval_mask", {"duplicate_mask", "TF-MG's rule"}},
      {"eval_repeat_user", {"a second eval list"}, false},
      {"bad_label", {"feature 'labels' value [3] = 2"}},
  };
  for (const Fault& f : faults) {
    SCOPED_TRACE(f.name);
    const std::string in = t.file("in-" + f.name);
    const nlohmann::json truth = make_tfmg(t.file("ratings.tsv"), in, t.file(f.name + ".json"),
                                           "--train_batch 512 --fault " + f.name);
    const auto& where = truth["fault"];
    ASSERT_TRUE(where.contains("file")) << where.dump();
    const auto r =
        run(bin("ncf_prep") + " --input " + in + " --format tfmg --output " + t.file("out"));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("ncf_prep: error:"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(where["file"].get<std::string>()), std::string::npos) << r.output;
    if (f.record) {
      EXPECT_NE(r.output.find("at byte offset " + std::to_string(where["offset"].get<uint64_t>())),
                std::string::npos)
          << r.output;
    }
    for (const auto& part : f.message)
      EXPECT_NE(r.output.find(part), std::string::npos) << "'" << part << "' in\n" << r.output;
    if (where.contains("user")) {
      EXPECT_NE(r.output.find("user " + std::to_string(where["user"].get<int>())),
                std::string::npos)
          << r.output;
    }
  }
  // A repeated positive is named at one of its two records.
  {
    const auto r = run(bin("ncf_prep") + " --input " + t.file("in-cycle_repeat_positive") +
                       " --format tfmg --output " + t.file("out"));
    EXPECT_NE(r.output.find("training_cycle_1/shard_"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("at byte offset"), std::string::npos) << r.output;
  }
  // --tfmg_cycles first does not decode cycle 1, so its faults pass; cycle 0's do not.
  auto r = run(bin("ncf_prep") + " --input " + t.file("in-cycle_other_positive") +
               " --format tfmg --tfmg_cycles first --output " + t.file("out"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run(bin("ncf_prep") + " --input " + t.file("in-missing_cycle") +
          " --format tfmg --tfmg_cycles first --output " + t.file("out"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("training_cycle_2"), std::string::npos) << r.output;

  // meta_data.json inconsistencies, edited into good data.
  const std::string good = t.file("good");
  make_tfmg(t.file("ratings.tsv"), good, t.file("good.json"), "--train_batch 512");
  const std::string meta_path = good + "/meta_data.json";
  const nlohmann::json meta = nlohmann::json::parse(test::read_file(meta_path));
  struct MetaCase {
    std::string field;
    nlohmann::json value;
    std::string message;
  };
  const uint64_t U = meta["num_users"];
  const std::vector<MetaCase> cases = {
      {"num_train_steps", meta["num_train_steps"].get<uint64_t>() + 1, "num_train_steps is"},
      {"num_eval_steps", meta["num_eval_steps"].get<uint64_t>() - 1, "num_eval_steps is"},
      {"num_eval_elements", U * 1000 + 1, "not a multiple of num_users"},
      {"num_eval_elements", U, "eval candidates per user"},
      {"eval_prebatch_size", 4001, "not a multiple of 1000"},
      {"num_users", "60", "'num_users' must be a non-negative integer"},
      {"num_items", -1, "'num_items' must be a non-negative integer"},
      {"num_train_epochs", 2, "training_cycle_2 exists"},
      {"num_items", 3, "out of range"},
  };
  for (const MetaCase& c : cases) {
    SCOPED_TRACE(c.field + " = " + c.value.dump());
    nlohmann::json bad = meta;
    bad[c.field] = c.value;
    test::write_file(meta_path, bad.dump());
    r = run(bin("ncf_prep") + " --input " + good + " --format tfmg --output " + t.file("out"));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
  }
  test::write_file(meta_path, meta.dump());
  r = run(bin("ncf_prep") + " --input " + good + " --format tfmg --eval_negatives 99 --output " +
          t.file("out"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("999 eval negatives"), std::string::npos) << r.output;
  r = run(bin("ncf_prep") + " --input " + good + " --format tfmg --output " + t.file("out"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// The same ratings prepared directly (MovieLens u.data) and through TF-MG shards
// train the same model: the split and ids agree, so positives.bin is byte
// identical and, with the same --seed, the train shards hold the same pairs in
// the same order and every epoch's loss is equal. Only the eval lists differ
// (ours: 99 distinct negatives outside all positives; TF-MG's: 99 drawn with
// replacement outside the training positives, repeats masked), so HR@10 is
// compared within a tolerance.
TEST(Tfmg, TrainsLikeTheDirectlyPreparedData) {
  if (!tfmg_tools_missing().empty()) GTEST_SKIP() << tfmg_tools_missing();
  TempDir t;
  // Learnable data: the synthetic small shape, written back as ratings with the
  // held-out item latest.
  auto r = run(bin("ncf_prep") + " --synthetic small --output " + t.file("syn"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  {
    const DatasetMeta m = DatasetMeta::load(t.file("syn"));
    PositiveLists pos(t.file("syn"), m);
    const RawEval ev = read_eval(t.file("syn"), m);
    const uint64_t L = m.eval_negatives + 1;
    std::string text;
    for (uint64_t u = 0; u < m.num_users; ++u) {
      const int32_t held = ev.items[u * L];
      int64_t ts = 1000;
      for (const int32_t* i = pos.begin(u); i != pos.end(u); ++i)
        text += std::to_string(u + 1) + "\t" + std::to_string(*i + 1) + "\t4\t" +
                std::to_string(*i == held ? 999999 : ts++) + "\n";
    }
    test::write_file(t.file("u.data"), text);
  }
  const std::string same = " --eval_negatives 99 --seed 7 --record_rows 4096 --num_shards 2";
  r = run(bin("ncf_prep") + " --input " + t.file("u.data") + " --format ml-100k" + same +
          " --output " + t.file("direct"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  make_tfmg(t.file("u.data"), t.file("tf"), t.file("truth.json"),
            "--eval_negatives 99 --epochs 2 --train_batch 16384 --eval_users_per_batch 64");
  r = run(bin("ncf_prep") + " --input " + t.file("tf") + " --format tfmg" + same + " --output " +
          t.file("via_tf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::read_file(t.file("direct/positives.bin")),
            test::read_file(t.file("via_tf/positives.bin")));
  const DatasetMeta md = DatasetMeta::load(t.file("direct")),
                    mt = DatasetMeta::load(t.file("via_tf"));
  EXPECT_EQ(read_train_pairs(t.file("direct"), md), read_train_pairs(t.file("via_tf"), mt));

  std::map<std::string, std::vector<nlohmann::json>> epochs;
  for (const std::string d : {"direct", "via_tf"}) {
    const std::string mj = t.file(d + ".jsonl");
    r = run(bin("ncf_dist") + " --device cpu --data_dir " + t.file(d) +
            " --preset ncf-paper --batch_size 1280 --learning_rate 0.005 --train_epochs 4 "
            "--threads 2 --seed 3 --metrics_json " +
            mj);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::istringstream lines(test::read_file(mj));
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) epochs[d].push_back(nlohmann::json::parse(line));
    ASSERT_EQ(epochs[d].size(), 4u) << r.output;
  }
  for (size_t e = 0; e < 4; ++e)
    EXPECT_EQ(epochs["direct"][e]["loss"], epochs["via_tf"][e]["loss"]) << "epoch " << e + 1;
  const double hr_direct = epochs["direct"].back()["hr"], hr_tf = epochs["via_tf"].back()["hr"];
  EXPECT_GT(hr_direct, 0.4);  // it learned something
  // Same model, different eval negatives: TF-MG's lists are a little easier
  // (about 5 of the 99 draws repeat or equal the true item and are masked), and
  // both are samples over 2,000 users. Measured over 3 trainer seeds x 3
  // generator seeds: TF-MG higher by 0.004 .. 0.013; the bound allows 0.03.
  EXPECT_NEAR(hr_direct, hr_tf, 0.03);
}

// ml-100k's shape (943 users, 1,682 items, 100,000 ratings) with users of more
// than 683 positives, so 999 distinct eval negatives are impossible: ncf_prep
// with the defaults draws them with replacement and masks the repeats, which
// is TF Model Garden's protocol. So the same ratings prepared directly and
// through TF-MG shards train the same model (equal losses) and evaluate it
// alike: HR@10 over independent draws of the same rule agree within sampling
// noise. And distinct, asked for, is refused before anything is written.
TEST(Tfmg, Ml100kShapeWithTheDefaultsEvaluatesAsTfModelGarden) {
  if (!tfmg_tools_missing().empty()) GTEST_SKIP() << tfmg_tools_missing();
  TempDir t;
  // Learnable ratings of that shape: the synthetic generator's, written back
  // with each user's held-out item latest.
  auto r = run(bin("ncf_prep") +
               " --synthetic custom --users 943 --items 1682 --interactions 100000 "
               "--eval_negatives 1 --output " +
               t.file("syn"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  uint64_t over_683 = 0;
  {
    const DatasetMeta m = DatasetMeta::load(t.file("syn"));
    ASSERT_EQ(m.num_items, 1682u);
    PositiveLists pos(t.file("syn"), m);
    const RawEval ev = read_eval(t.file("syn"), m);
    std::string text;
    for (uint64_t u = 0; u < m.num_users; ++u) {
      const int32_t held = ev.items[u * 2];
      int64_t ts = 1000;
      for (const int32_t* i = pos.begin(u); i != pos.end(u); ++i)
        text += std::to_string(u + 1) + "\t" + std::to_string(*i + 1) + "\t4\t" +
                std::to_string(*i == held ? 999999 : ts++) + "\n";
      over_683 += pos.end(u) - pos.begin(u) > 683;
    }
    test::write_file(t.file("u.data"), text);
  }
  ASSERT_GT(over_683, 0u) << "the ratings must leave some user fewer than 999 items";

  const std::string same = " --seed 7 --record_rows 4096 --num_shards 2";
  r = run(bin("ncf_prep") + " --input " + t.file("u.data") + " --eval_sampling distinct" + same +
          " --output " + t.file("distinct"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--eval_sampling with_replacement"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(t.file("distinct")));
  r = run(bin("ncf_prep") + " --input " + t.file("u.data") + same + " --output " +
          t.file("direct"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("drawn with replacement"), std::string::npos) << r.output;
  make_tfmg(t.file("u.data"), t.file("tf"), t.file("truth.json"),
            "--eval_negatives 999 --epochs 2 --train_batch 16384 --eval_users_per_batch 64");
  r = run(bin("ncf_prep") + " --input " + t.file("tf") + " --format tfmg" + same + " --output " +
          t.file("via_tf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const DatasetMeta md = DatasetMeta::load(t.file("direct")),
                    mt = DatasetMeta::load(t.file("via_tf"));
  EXPECT_EQ(md.eval_sampling, "with_replacement");
  EXPECT_EQ(mt.eval_sampling, "given");
  ASSERT_EQ(md.eval_negatives, 999u);
  ASSERT_EQ(mt.eval_negatives, 999u);
  EXPECT_EQ(test::read_file(t.file("direct/positives.bin")),
            test::read_file(t.file("via_tf/positives.bin")));
  EXPECT_EQ(read_train_pairs(t.file("direct"), md), read_train_pairs(t.file("via_tf"), mt));
  // Both protocols mask repeats: about as many on either side (each list is
  // 999 draws from the 841 to 1,681 items its user leaves).
  const RawEval ed = read_eval(t.file("direct"), md), et = read_eval(t.file("via_tf"), mt);
  const auto masked = [](const RawEval& e) {
    return double(std::count(e.mask.begin(), e.mask.end(), uint8_t{0}));
  };
  EXPECT_GT(masked(ed), 943.0 * 200);
  EXPECT_NEAR(masked(ed) / masked(et), 1.0, 0.02);

  std::map<std::string, std::vector<nlohmann::json>> epochs;
  for (const std::string d : {"direct", "via_tf"}) {
    const std::string mj = t.file(d + ".jsonl");
    r = run(bin("ncf_dist") + " --device cpu --data_dir " + t.file(d) +
            " --preset ncf-paper --batch_size 1280 --learning_rate 0.005 --train_epochs 3 "
            "--threads 2 --seed 3 --metrics_json " +
            mj);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::istringstream lines(test::read_file(mj));
    for (std::string line; std::getline(lines, line);)
      if (!line.empty()) epochs[d].push_back(nlohmann::json::parse(line));
    ASSERT_EQ(epochs[d].size(), 3u) << r.output;
  }
  for (size_t e = 0; e < 3; ++e)
    EXPECT_EQ(epochs["direct"][e]["loss"], epochs["via_tf"][e]["loss"]) << "epoch " << e + 1;
  const double hr_direct = epochs["direct"].back()["hr"], hr_tf = epochs["via_tf"].back()["hr"];
  EXPECT_GT(hr_direct, 0.15);  // it learned something (chance: 10 / 1,000)
  // Same model, the same rule, independent draws: measured over 3 ncf_prep
  // seeds x 2 make_tfmg seeds, HR@10 0.212 .. 0.231 and |difference| 0.001 ..
  // 0.012; the bound allows 0.03.
  EXPECT_NEAR(hr_direct, hr_tf, 0.03);
}

// Fuzzing found (fuzz/regressions/tfmg/, the parse dataset.cc had too): a
// number beyond every JSON number type in meta_data.json escaped as a bare
// nlohmann exception naming no file; it is refused as bad JSON, naming it.
TEST(Tfmg, MetaDataWithAnUnrepresentableNumberIsRefusedNamingTheFile) {
  TempDir t;
  std::filesystem::create_directories(t.file("tf/training_cycle_0"));
  const std::string meta = t.file("tf/meta_data.json");
  test::write_file(meta, "{\"num_users\": 1e999}");
  std::string e;
  try {
    PrepOptions opt;
    opt.threads = 1;
    prepare_tfmg(t.file("tf"), t.file("out"), opt);
  } catch (const Error& err) {
    e = err.what();
  } catch (const std::exception& err) {
    ADD_FAILURE() << "not an ncf::Error: " << err.what();
  }
  EXPECT_NE(e.find(meta + ": not valid JSON"), std::string::npos) << e;
}

// Found by reading source_tfmg.cc while fuzzing it (reproducer in
// fuzz/regressions/tfmg/): meta_data.json's counts were held to the records
// only once they were read, and cycle 0's per-user offsets and the eval lists
// were sized by num_users first, so a meta claiming 10^7 users (2 x 10^9 in
// the reproducer: 16 GB) with a few small shards allocated for all of them.
// Eval shards too small for num_eval_elements rows are refused up front.
// Cycle 0 as TF-MG writes it, for a meta of 10 users, 14 items, 60 train
// elements and prebatches of 16: 4 records, 60 valid rows, each a distinct
// positive (user r % 10, item r / 10). `edit`, if given, may change record
// rec's serialized payload before it is framed.
void write_small_cycle0(const std::string& shard,
                        const std::function<void(int rec, std::string* payload)>& edit = {}) {
  RecordWriter w(shard);
  for (int rec = 0; rec < 4; ++rec) {
    tfexample::Example ex;
    auto& f = *ex.mutable_features()->mutable_feature();
    for (int k = 0; k < 16; ++k) {
      const int r = rec * 16 + k;
      const bool valid = r < 60;
      f["user_id"].mutable_int64_list()->add_value(valid ? r % 10 : 0);
      f["item_id"].mutable_int64_list()->add_value(valid ? r / 10 : 0);
      f["labels"].mutable_int64_list()->add_value(valid ? 1 : 0);
      f["valid_point_mask"].mutable_int64_list()->add_value(valid ? 1 : 0);
    }
    std::string payload = ex.SerializeAsString();
    if (edit) edit(rec, &payload);
    w.write(payload);
  }
  w.close();
}

TEST(Tfmg, UsersBeyondWhatTheEvalShardsHoldAreRefusedBeforeAllocating) {
  TempDir t;
  const std::string dir = t.file("tf");
  std::filesystem::create_directories(dir + "/training_cycle_0");
  std::filesystem::create_directories(dir + "/eval_data");
  const uint64_t users = 10000000;
  const nlohmann::json meta = {{"num_users", users},
                               {"num_items", 14},
                               {"constructor_type", "bisection"},
                               {"num_train_elements", 60},
                               {"num_eval_elements", users * 4},
                               {"num_train_epochs", 1},
                               {"train_prebatch_size", 16},
                               {"eval_prebatch_size", 12},
                               {"num_train_steps", 4},
                               {"num_eval_steps", (users * 4 + 11) / 12}};
  test::write_file(dir + "/meta_data.json", meta.dump());
  write_small_cycle0(dir + "/training_cycle_0/shard_0.tfrecords");
  test::write_file(dir + "/eval_data/shard_0.tfrecords", "");
  std::string e;
  try {
    PrepOptions opt;
    opt.threads = 1;
    opt.eval_negatives = 0;  // as many as the data has
    prepare_tfmg(dir, t.file("out"), opt);
  } catch (const Error& err) {
    e = err.what();
  }
  EXPECT_NE(e.find(dir + "/eval_data: its 1 shard files hold 0 bytes, too few for the 40000000 "
                         "eval rows"),
            std::string::npos)
      << e;
}

// A feature name that is no UTF-8 fails tf.train.Example's parse: refused
// naming the file and the record's offset, without protobuf's own log line.
TEST(Tfmg, AFeatureNameThatIsNoUtf8IsRefusedNamingTheRecord) {
  TempDir t;
  const std::string dir = t.file("tf");
  std::filesystem::create_directories(dir + "/training_cycle_0");
  std::filesystem::create_directories(dir + "/eval_data");
  const nlohmann::json meta = {
      {"num_users", 10},           {"num_items", 14},         {"constructor_type", "bisection"},
      {"num_train_elements", 60},  {"num_eval_elements", 40}, {"num_train_epochs", 1},
      {"train_prebatch_size", 16}, {"eval_prebatch_size", 4}, {"num_train_steps", 4},
      {"num_eval_steps", 10}};
  test::write_file(dir + "/meta_data.json", meta.dump());
  const std::string shard = dir + "/training_cycle_0/shard_0.tfrecords";
  // The first record's "labels" becomes "l\xffbels", the same length.
  write_small_cycle0(shard, [](int rec, std::string* payload) {
    if (rec == 0) payload->replace(payload->find("labels") + 1, 1, "\xff");
  });
  test::write_file(dir + "/eval_data/shard_0.tfrecords", std::string(4096, '\0'));
  std::string e;
  testing::internal::CaptureStderr();
  try {
    PrepOptions opt;
    opt.threads = 1;
    opt.eval_negatives = 0;
    prepare_tfmg(dir, t.file("out"), opt);
  } catch (const Error& err) {
    e = err.what();
  }
  const std::string logged = testing::internal::GetCapturedStderr();
  EXPECT_NE(e.find(shard + " at byte offset 0: record is not a tf.train.Example"),
            std::string::npos)
      << e;
  EXPECT_EQ(logged.find("libprotobuf"), std::string::npos) << logged;
}

}  // namespace
}  // namespace ncf
