// ncf_prep as users run it: every bad input ends with a non-zero exit and one
// message naming the file (and line or byte offset) and the offending value;
// good runs print a summary and --verify accepts what was written.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "data/dataset.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;

struct Case {
  std::string what, setup_file, content, flags, message;
};

TEST(PrepCli, BadInputsStopWithFileLineAndValue) {
  TempDir t;
  const std::string out = " --output " + t.file("out");
  std::vector<Case> cases = {
      {"malformed line", "ratings.dat", "1::10::5::100\n1::11::x::101\n", "", "ratings.dat:2"},
      {"mismatched format", "ratings.dat", "1::10::5::100\n", " --format ml-20m", "ratings.dat"},
      {"unknown format", "notes.txt", "hello world\n", "", "notes.txt"},
      {"empty file", "u.data", "", "", "empty"},
      {"no usable user", "u.data", "1\t10\t5\t100\n2\t11\t4\t101\n", "", "no usable user"},
  };
  for (const auto& c : cases) {
    std::string path = t.file(c.setup_file);
    test::write_file(path, c.content);
    auto r = run(bin("ncf_prep") + " --input " + path + c.flags + out);
    EXPECT_NE(r.exit_code, 0) << c.what;
    EXPECT_NE(r.output.find("ncf_prep: error:"), std::string::npos) << c.what << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.what << "\n" << r.output;
    std::remove(path.c_str());
  }
  auto r = run(bin("ncf_prep") + " --input " + t.file("missing.csv") + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("missing.csv"), std::string::npos) << r.output;

  // Files that cannot be read through: a .gz cut short (the reader's thread
  // meets the damage, and the refusal it throws reaches the user as it was),
  // and an interaction file that is a directory.
  std::string lines;
  for (int u = 1; u <= 200; ++u)
    for (int i = 1; i <= 5; ++i)
      lines +=
          std::to_string(u) + "," + std::to_string(i) + "," + std::to_string(u * 10 + i) + "\n";
  test::write_file(t.file("log.csv"), lines);
  ASSERT_EQ(run("gzip -c " + t.file("log.csv") + " > " + t.file("full.csv.gz")).exit_code, 0);
  const std::string gz = test::read_file(t.file("full.csv.gz"));
  test::write_file(t.file("cut.csv.gz"), gz.substr(0, gz.size() / 2));
  const std::string csv = " --format csv --columns user=0,item=1,timestamp=2";
  r = run(bin("ncf_prep") + " --input " + t.file("cut.csv.gz") + csv + out);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ncf_prep: error: cannot decompress " + t.file("cut.csv.gz") + " after "),
            std::string::npos)
      << r.output;
  std::filesystem::create_directories(t.file("in/log.csv"));
  r = run(bin("ncf_prep") + " --input " + t.file("in/log.csv") + csv + out);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ncf_prep: error: " + t.file("in/log.csv") +
                          ": --format csv takes the "
                          "interaction file itself, not a directory"),
            std::string::npos)
      << r.output;

  r = run(bin("ncf_prep") + " --synthetic nosuchshape" + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("nosuchshape"), std::string::npos) << r.output;

  r = run(bin("ncf_prep") +
          " --synthetic custom --users 10 --items 100 --interactions 50 --eval_negatives 10" + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("50"), std::string::npos) << r.output;

  r = run(bin("ncf_prep") + " --num_shards 0 --synthetic small" + out);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("--num_shards"), std::string::npos) << r.output;

  r = run(bin("ncf_prep") + " --verify " + t.file("nowhere"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("nowhere/metadata.json"), std::string::npos) << r.output;
}

// Writing into a directory that holds other things: an earlier dataset's
// shards go by their exact names, a user's files stay, and a link by a shard's
// name stops the run instead of being written through.
TEST(PrepCli, OutputDirectoryLosesOnlyAnEarlierDatasetsFiles) {
  namespace fs = std::filesystem;
  TempDir t;
  const std::string out = t.file("out");
  const std::string prep = bin("ncf_prep") +
                           " --synthetic custom --users 60 --items 80 --interactions 1500 "
                           "--eval_negatives 9 --record_rows 50 --progress off --output " +
                           out;
  auto r = run(prep + " --num_shards 3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(fs::exists(out + "/train-00002-of-00003.tfrecord"));
  for (const char* mine : {"train-notes.txt", "eval-plan.md", "train-00001-of-00003.tfrecord.bak",
                           "eval-1-of-2.tfrecord.txt", "README"})
    test::write_file(out + "/" + mine, "the user's");
  r = run(prep + " --num_shards 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(out + "/train-00002-of-00003.tfrecord"));  // the earlier layout's
  EXPECT_FALSE(fs::exists(out + "/eval-00000-of-00003.tfrecord"));
  for (const char* mine : {"train-notes.txt", "eval-plan.md", "train-00001-of-00003.tfrecord.bak",
                           "eval-1-of-2.tfrecord.txt", "README"})
    EXPECT_EQ(test::read_file(out + "/" + mine), "the user's") << mine;
  r = run(bin("ncf_prep") + " --verify " + out);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // A link by a shard's name: refused by name, its target untouched.
  test::write_file(t.file("elsewhere.bin"), "precious");
  fs::remove(out + "/train-00000-of-00002.tfrecord");
  fs::create_symlink(t.file("elsewhere.bin"), out + "/train-00000-of-00002.tfrecord");
  r = run(prep + " --num_shards 2");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("train-00000-of-00002.tfrecord is a symbolic link"), std::string::npos)
      << r.output;
  EXPECT_EQ(test::read_file(t.file("elsewhere.bin")), "precious");
}

TEST(PrepCli, WritesThenVerifiesAndCorruptionIsCaught) {
  TempDir t;
  std::string d = t.file("d");
  auto r = run(bin("ncf_prep") +
               " --synthetic custom --users 100 --items 80 --interactions 3000 "
               "--eval_negatives 20 --record_rows 64 --num_shards 2 --output " +
               d);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("users 100"), std::string::npos) << r.output;
  r = run(bin("ncf_prep") + " --verify " + d);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("OK"), std::string::npos) << r.output;
  // Flip one byte in the middle of a train shard.
  std::string shard = d + "/train-00001-of-00002.tfrecord";
  std::string bytes = test::read_file(shard);
  bytes[bytes.size() / 2] ^= 0x01;
  test::write_file(shard, bytes);
  r = run(bin("ncf_prep") + " --verify " + d);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("train-00001-of-00002.tfrecord"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("byte offset"), std::string::npos) << r.output;
}

// An ml-100k-shaped u.data: 943 users (raw ids 1 .. 943), 1,682 items (raw ids
// 1 .. 1682, each rated by someone), about 100,000 ratings, users 1 .. 5 with
// 690 to 737 each, so that 1,682 - 999 = 683 leaves them too few items for 999
// distinct eval negatives. Returns the raw id of the user with the most.
int64_t write_ml100k_shape(const std::string& path, uint64_t* num_ratings) {
  uint64_t x = 2024;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 33;
  };
  const int heavy[] = {690, 737, 700, 720, 732};
  std::string text;
  *num_ratings = 0;
  for (int64_t u = 1; u <= 943; ++u) {
    const size_t n = u <= 5 ? size_t(heavy[u - 1]) : size_t(20 + next() % 166);
    std::set<int64_t> mine;
    if (u <= 841) mine = {2 * u - 1, 2 * u};
    std::vector<int64_t> order(mine.begin(), mine.end());
    while (mine.size() < n) {
      const int64_t i = 1 + int64_t(next() % 1682);
      if (mine.insert(i).second) order.push_back(i);
    }
    int64_t t = 880000000 + int64_t(next() % 1000000);
    for (int64_t i : order)
      text += std::to_string(u) + "\t" + std::to_string(i) + "\t" + std::to_string(1 + next() % 5) +
              "\t" + std::to_string(t += 1 + int64_t(next() % 500)) + "\n";
    *num_ratings += order.size();
  }
  test::write_file(path, text);
  return 2;
}

nlohmann::json metadata_of(const std::string& dir) {
  return nlohmann::json::parse(test::read_file(dir + "/metadata.json"));
}

// Every file of a dataset directory, by name.
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    out[e.path().filename().string()] = test::read_file(e.path().string());
  return out;
}

// ml-100k with the defaults works: too few items remain for 999 distinct
// negatives, so auto draws them with replacement (with a note), the metadata
// says so and --verify accepts it; the result does not depend on the thread
// count and equals an explicit --eval_sampling with_replacement.
TEST(PrepCli, Ml100kWithTheDefaultsDrawsEvalNegativesWithReplacement) {
  TempDir t;
  uint64_t ratings = 0;
  const int64_t busiest = write_ml100k_shape(t.file("u.data"), &ratings);
  ASSERT_GT(ratings, 95000u);
  ASSERT_LT(ratings, 105000u);
  const std::string prep = bin("ncf_prep") + " --input " + t.file("u.data");
  auto r = run(prep + " --output " + t.file("auto"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ncf_prep: note: " + t.file("u.data") + ": user " +
                          std::to_string(busiest) + " (dense id " + std::to_string(busiest - 1) +
                          ") has 737 positives among the 1682 items"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("eval users 943 x (1 + 999, negatives drawn with replacement"),
            std::string::npos)
      << r.output;
  const nlohmann::json meta = metadata_of(t.file("auto"));
  EXPECT_EQ(meta["eval_sampling"], "with_replacement");
  EXPECT_EQ(meta["eval_negatives"], 999);
  EXPECT_EQ(meta["num_users"], 943);
  EXPECT_EQ(meta["num_items"], 1682);
  r = run(bin("ncf_prep") + " --verify " + t.file("auto"));
  EXPECT_EQ(r.exit_code, 0) << r.output;

  for (const char* threads : {"1", "2"}) {
    r = run(prep + " --eval_sampling with_replacement --threads " + threads + " --output " +
            t.file(std::string("t") + threads));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("note:"), std::string::npos) << r.output;  // asked for, not decided
  }
  const auto one = files_of(t.file("t1"));
  EXPECT_TRUE(one.count("metadata.json") && one.count("eval-00003-of-00004.tfrecord"));
  EXPECT_TRUE(one == files_of(t.file("t2"))) << "the thread count changed a file";
  EXPECT_TRUE(one == files_of(t.file("auto"))) << "auto differs from with_replacement";

  // With room for distinct negatives, auto keeps them distinct.
  r = run(prep + " --eval_negatives 99 --output " + t.file("e99"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metadata_of(t.file("e99"))["eval_sampling"], "distinct");
  EXPECT_NE(r.output.find("(1 + 99, distinct negatives)"), std::string::npos) << r.output;

  // Distinct, asked for, cannot be met: one sentence about the input naming
  // the user by its id in the file and the flags that would work.
  r = run(prep + " --eval_sampling distinct --output " + t.file("distinct"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  for (const std::string& part :
       {"ncf_prep: error: " + t.file("u.data") + ": user " + std::to_string(busiest) +
            " (dense id " + std::to_string(busiest - 1) + ") has 737 positives",
        std::string("leaves 945 to draw from: too few for 999 distinct eval negatives"),
        std::string("4 other users too"), std::string("--eval_negatives 99"),
        std::string("--eval_sampling with_replacement")})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  EXPECT_FALSE(std::regex_search(r.output, std::regex(R"(\([A-Za-z0-9_]+\.(cc|h|cu):[0-9]+\))")))
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(t.file("distinct")));

  // A dataset whose metadata claims distinct lists that repeat is refused by
  // --verify (the metadata resealed, so only the claim is wrong).
  DatasetMeta m = DatasetMeta::load(t.file("t1"));
  m.eval_sampling = "distinct";
  m.save(t.file("t1"));
  r = run(bin("ncf_prep") + " --verify " + t.file("t1"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("eval-00000-of-00004.tfrecord at byte offset"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("but the metadata says its negatives are distinct"), std::string::npos)
      << r.output;
}

// --eval_sampling is named and refused where ncf_prep draws no eval negatives,
// as the other flags of one kind of input are; --help states it.
TEST(PrepCli, EvalSamplingIsRefusedWhereNothingIsDrawn) {
  TempDir t;
  test::write_file(t.file("p.train.rating"), "0\t1\t5\t100\n0\t3\t4\t101\n1\t0\t3\t100\n");
  test::write_file(t.file("p.test.rating"), "0\t2\t5\t200\n1\t4\t4\t201\n");
  test::write_file(t.file("p.test.negative"), "(0,2)\t4\n(1,4)\t2\n");
  auto r = run(bin("ncf_prep") + " --input " + t.file("p") +
               " --format ncf-paper --eval_negatives 1 --output " + t.file("paper"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(metadata_of(t.file("paper"))["eval_sampling"], "given");
  EXPECT_NE(r.output.find("(1 + 1, negatives as given)"), std::string::npos) << r.output;
  const std::string applies = "--eval_sampling applies to MovieLens, csv and synthetic input only";
  const std::vector<std::pair<std::string, std::string>> refused = {
      {" --input " + t.file("p") + " --format ncf-paper --eval_negatives 1 --output " + t.file("o"),
       "the NCF paper's files carry their own eval negatives"},
      {" --input " + t.file("nowhere") + " --format tfmg --output " + t.file("o"),
       "TF Model Garden shards carry their own"},
      {" --verify " + t.file("paper"), "--verify checks a dataset as it is"},
  };
  for (const auto& [flags, why] : refused)
    for (const char* value : {"distinct", "with_replacement", "auto"}) {
      r = run(bin("ncf_prep") + flags + " --eval_sampling " + value);
      EXPECT_NE(r.exit_code, 0) << flags << "\n" << r.output;
      EXPECT_NE(r.output.find(applies + ": " + why), std::string::npos) << flags << "\n"
                                                                        << r.output;
      EXPECT_FALSE(std::filesystem::exists(t.file("o")));
    }
  r = run(bin("ncf_prep") + " --synthetic small --eval_sampling sometimes --output " + t.file("o"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--eval_sampling"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sometimes"), std::string::npos) << r.output;
  r = run(bin("ncf_prep") + " --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* part :
       {"--eval_sampling TEXT:{auto,distinct,with_replacement}=auto", "TF Model Garden"})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
}

}  // namespace
}  // namespace ncf
