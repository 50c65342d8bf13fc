// Checkpoint directories in-process (W = 1, real files in a temp dir): the
// CRC combination against the CRC of the whole, the block partition, commit
// and retention, and that a partial, truncated or corrupted checkpoint is
// never the one taken. The multi-rank writes and exact resume run the real
// ncf_dist under mpirun (test_resume.cc).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "comm/single_communicator.h"
#include "common/check.h"
#include "data/crc32c.h"
#include "train/checkpoint.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("ncf_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = uint8_t(rng());
  return v;
}

TEST(Crc32c, CombineEqualsTheCrcOfTheConcatenation) {
  const std::vector<uint8_t> data = random_bytes(10000, 1);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {size_t(0), size_t(1), size_t(7), size_t(4096), size_t(9999), size_t(10000)}) {
    const uint32_t a = crc32c(data.data(), cut);
    const uint32_t b = crc32c(data.data() + cut, data.size() - cut);
    EXPECT_EQ(crc32c_combine(a, b, data.size() - cut), whole) << "cut " << cut;
  }
  // Three parts, combined left to right, as the checkpoint writer does.
  const uint32_t p0 = crc32c(data.data(), 3000), p1 = crc32c(data.data() + 3000, 5000),
                 p2 = crc32c(data.data() + 8000, 2000);
  EXPECT_EQ(crc32c_combine(crc32c_combine(p0, p1, 5000), p2, 2000), whole);
  // The published check value of CRC-32C ("123456789" → 0xE3069283), split.
  const char* digits = "123456789";
  EXPECT_EQ(crc32c_combine(crc32c(digits, 4), crc32c(digits + 4, 5), 5), 0xE3069283u);
}

TEST(Checkpoint, BlockRangesTileTheRowsInRankOrder) {
  for (int64_t n : {0, 1, 5, 1000, 1001})
    for (int W : {1, 2, 3, 7}) {
      int64_t at = 0;
      for (int r = 0; r < W; ++r) {
        int64_t first = 0, count = 0;
        block_range(n, W, r, &first, &count);
        EXPECT_EQ(first, at) << n << " rows, W " << W << ", rank " << r;
        EXPECT_GE(count, n / W);
        EXPECT_LE(count, n / W + 1);
        at += count;
      }
      EXPECT_EQ(at, n);
    }
}

// Writes a checkpoint at `step` with two files; returns its path.
std::string write_one(Communicator& comm, const std::string& dir, int64_t step, int keep) {
  CheckpointWriter w(comm, dir, step);
  const std::vector<uint8_t> a = random_bytes(1000 + size_t(step), uint32_t(step));
  w.write("a.bin", int64_t(a.size()), 0, a.data(), a.size());
  const std::vector<uint8_t> b = random_bytes(10, 99);
  w.write("b.bin", 10, 0, b.data(), b.size());
  CheckpointManifest m;
  m.step = step;
  m.epoch = 1;
  m.epoch_step = 3;
  m.dataset_id = "abc";
  m.config = {{"seed", 1}};
  m.tables = nlohmann::json::array();
  return w.commit(m, keep);
}

TEST(Checkpoint, CommitWritesAManifestWithSizesAndCrcsAndKeepsTheNewest) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("commit");
  for (int64_t step : {10, 20, 30}) write_one(comm, dir, step, 2);
  EXPECT_FALSE(fs::exists(dir + "/" + checkpoint_name(10)));
  ASSERT_TRUE(fs::exists(dir + "/" + checkpoint_name(20)));
  ASSERT_TRUE(fs::exists(dir + "/" + checkpoint_name(30)));
  CheckpointManifest m;
  EXPECT_EQ(check_checkpoint(comm, dir + "/" + checkpoint_name(30), &m), "");
  EXPECT_EQ(m.step, 30);
  EXPECT_EQ(m.epoch_step, 3);
  ASSERT_EQ(m.files.size(), 2u);
  const std::vector<uint8_t> a = random_bytes(1030, 30);
  EXPECT_EQ(m.files[0].bytes, 1030);
  EXPECT_EQ(m.files[0].crc32c, crc32c(a.data(), a.size()));
  // The bytes read back are the bytes written.
  std::vector<uint8_t> back(a.size());
  CheckpointReader(dir + "/" + checkpoint_name(30), m).read("a.bin", 0, back.data(), back.size());
  EXPECT_EQ(back, a);
  fs::remove_all(dir);
}

TEST(Checkpoint, AutoTakesTheNewestWholeOneAndSaysWhyItSkippedOthers) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("auto");
  write_one(comm, dir, 10, 5);
  write_one(comm, dir, 20, 5);
  write_one(comm, dir, 30, 5);
  write_one(comm, dir, 40, 5);
  // 40: a byte flipped inside a file; 30: truncated; 20: no manifest (as a
  // writer killed before the rename would leave it, had it been renamed).
  {
    std::fstream f(dir + "/" + checkpoint_name(40) + "/a.bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(500);
    char c = 0;
    f.read(&c, 1);
    c = char(c ^ 0x10);
    f.seekp(500);
    f.write(&c, 1);
  }
  fs::resize_file(dir + "/" + checkpoint_name(30) + "/b.bin", 9);
  fs::remove(dir + "/" + checkpoint_name(20) + "/manifest.json");
  // An unfinished writer's directory is not a candidate at all.
  fs::create_directories(dir + "/.tmp-" + checkpoint_name(50));
  std::vector<std::string> log;
  std::optional<CheckpointReader> got = find_checkpoint(comm, "auto", dir, &log);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->manifest().step, 10);
  ASSERT_EQ(log.size(), 4u);
  EXPECT_NE(log[0].find(checkpoint_name(40)), std::string::npos) << log[0];
  EXPECT_NE(log[0].find("a.bin has CRC-32C"), std::string::npos) << log[0];
  EXPECT_NE(log[1].find("b.bin has 9 bytes, the manifest says 10"), std::string::npos) << log[1];
  EXPECT_NE(log[2].find("no manifest.json"), std::string::npos) << log[2];
  EXPECT_NE(log[3].find("resuming from"), std::string::npos) << log[3];
  // An explicit path must be whole.
  try {
    find_checkpoint(comm, dir + "/" + checkpoint_name(40), dir, &log);
    ADD_FAILURE() << "a corrupted checkpoint was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flag --resume"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("a.bin"), std::string::npos) << e.what();
  }
  // Nothing to resume from.
  log.clear();
  const std::string empty = temp_dir("empty");
  EXPECT_FALSE(find_checkpoint(comm, "auto", empty, &log).has_value());
  EXPECT_FALSE(find_checkpoint(comm, "never", dir, &log).has_value());
  fs::remove_all(dir);
  fs::remove_all(empty);
}

TEST(Checkpoint, WritingTheSameStepAgainReplacesItWhole) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("again");
  write_one(comm, dir, 10, 2);
  write_one(comm, dir, 10, 2);
  CheckpointManifest m;
  EXPECT_EQ(check_checkpoint(comm, dir + "/" + checkpoint_name(10), &m), "");
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u);  // nothing left aside
  fs::remove_all(dir);
}

TEST(Checkpoint, ManifestErrorsNameTheFileAndField) {
  try {
    CheckpointManifest::from_json({{"format", "ncf_dist checkpoint"}, {"version", 99}}, "m.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("m.json: checkpoint format version 99"), std::string::npos)
        << e.what();
  }
  try {
    CheckpointManifest::from_json({{"format", "ncf_dist checkpoint"}, {"version", 1}}, "m.json");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("field \"step\" is missing"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ncf
