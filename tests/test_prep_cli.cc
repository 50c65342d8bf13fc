// ncf_prep as users run it: every bad input ends with a non-zero exit and one
// message naming the file (and line or byte offset) and the offending value;
// good runs print a summary and --verify accepts what was written.
#include <gtest/gtest.h>

#include <filesystem>

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

}  // namespace
}  // namespace ncf
