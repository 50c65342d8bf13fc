// Checkpoint directories in-process (W = 1, real files in a temp dir): the
// CRC combination against the CRC of the whole, the block partition, commit
// and retention, and that a partial, truncated or corrupted checkpoint is
// never the one taken; the lock that gives a checkpoint directory to one job
// (who is refused, which holder is taken over, two takers at once). The
// multi-rank writes, exact resume and the lock between real jobs run the real
// ncf_dist under mpirun (test_resume.cc).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "comm/single_communicator.h"
#include "common/check.h"
#include "data/crc32c.h"
#include "train/checkpoint.h"
#include "train/checkpoint_lock.h"

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

std::string test_read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
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

// One byte of file `name` of the checkpoint at `ck` changed.
void flip_byte(const std::string& ck, const std::string& name, std::streamoff at) {
  std::fstream f(ck + "/" + name, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ 0x10);
  f.seekp(at);
  f.write(&c, 1);
}

// Sealed checkpoints only, none of which loads: --resume auto stops naming
// each and its fault and how to start over on purpose; auto_or_restart starts
// over saying what it skipped; a directory of unsealed ones only is no error.
TEST(Checkpoint, AutoStopsWhenNoSealedCheckpointLoadsAndAutoOrRestartStartsOver) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("none_loads");
  const std::string c10 = write_one(comm, dir, 10, 5), c20 = write_one(comm, dir, 20, 5);
  flip_byte(c20, "a.bin", 7);
  fs::resize_file(c10 + "/b.bin", 4);
  std::vector<std::string> log;
  std::vector<DamagedCheckpoint> damaged;
  try {
    find_checkpoint(comm, "auto", dir, &log, &damaged);
    ADD_FAILURE() << "started over although sealed checkpoints were there";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& expect :
         std::vector<std::string>{"flag --resume auto: --checkpoint_dir " + dir +
                                      " holds 2 sealed checkpoints and none "
                                      "loads: " +
                                      c20 + ": file a.bin has CRC-32C ",
                                  ", the manifest says 0x",
                                  "; " + c10 + ": file b.bin has 4 bytes, the manifest says 10",
                                  "pass --resume auto_or_restart to start from step 0 on purpose"})
      EXPECT_NE(what.find(expect), std::string::npos) << expect << "\n" << what;
  }
  log.clear();
  EXPECT_FALSE(find_checkpoint(comm, "auto_or_restart", dir, &log, &damaged).has_value());
  ASSERT_EQ(damaged.size(), 2u);
  EXPECT_EQ(damaged[0].path, c20);
  EXPECT_EQ(damaged[1].path, c10);
  ASSERT_FALSE(log.empty());
  EXPECT_NE(log.back().find("--resume auto_or_restart: none of the 2 sealed checkpoints in " + dir +
                            " loads ("),
            std::string::npos)
      << log.back();
  EXPECT_NE(log.back().find("starting from step 0, as asked"), std::string::npos) << log.back();
  // The tools given the directory: refused, naming each.
  try {
    open_checkpoint(comm, dir, &log, "--init_from");
    ADD_FAILURE() << "a tool took a damaged checkpoint";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flag --init_from " + dir +
                                         ": the directory holds 2 sealed checkpoints and none "
                                         "loads: " +
                                         c20 + ": file a.bin"),
              std::string::npos)
        << e.what();
  }
  // Unsealed ones only (no manifest: never finished): skipped, one line each.
  fs::remove(c10 + "/manifest.json");
  fs::remove(c20 + "/manifest.json");
  log.clear();
  EXPECT_FALSE(find_checkpoint(comm, "auto", dir, &log, &damaged).has_value());
  EXPECT_TRUE(damaged.empty());
  ASSERT_EQ(log.size(), 3u);
  EXPECT_NE(log[0].find(c20 + ": not sealed"), std::string::npos) << log[0];
  EXPECT_EQ(log[2],
            "no sealed checkpoint in " + dir + " (2 unsealed skipped): starting from step 0");
  fs::remove_all(dir);
}

// Of a newest damaged and an older whole one, the tools take the older one
// and say what they skipped.
TEST(Checkpoint, ToolsGivenADirectoryTakeTheNewestThatLoadsNamingTheSkipped) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("tool_dir");
  write_one(comm, dir, 10, 5);
  const std::string c20 = write_one(comm, dir, 20, 5);
  flip_byte(c20, "b.bin", 3);
  std::vector<std::string> log;
  const CheckpointReader ck = open_checkpoint(comm, dir, &log);
  EXPECT_EQ(ck.manifest().step, 10);
  ASSERT_EQ(log.size(), 2u);
  EXPECT_NE(log[0].find("skipping sealed checkpoint " + c20 + ", which does not load: file b.bin"),
            std::string::npos)
      << log[0];
  EXPECT_NE(log[1].find("the newer sealed checkpoint named above does not load"), std::string::npos)
      << log[1];
  fs::remove_all(dir);
}

// Retention counts only checkpoints that load: the damaged ones a resume
// found, and ones whose manifest or file sizes are wrong, are neither counted
// among the kept nor removed, so they never push out the last good one.
TEST(Checkpoint, RetentionNeitherCountsNorRemovesCheckpointsThatDoNotLoad) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("keep_good");
  const std::string c5 = write_one(comm, dir, 5, 9), c6 = write_one(comm, dir, 6, 9);
  const std::string c30 = write_one(comm, dir, 30, 9), c40 = write_one(comm, dir, 40, 9);
  flip_byte(c40, "a.bin", 11);         // found by the resume's scan only
  fs::resize_file(c30 + "/a.bin", 1);  // seen by its size
  std::vector<std::string> log;
  std::vector<DamagedCheckpoint> damaged;
  ASSERT_EQ(find_checkpoint(comm, "auto", dir, &log, &damaged)->manifest().step, 6);
  ASSERT_EQ(damaged.size(), 2u);
  // A run resumed at 6 writes 7 and keeps 2: 7 and 6 load and stay; 5 goes;
  // 40 and 30 stay, uncounted, with a note each.
  CheckpointWriter w(comm, dir, 7);
  w.set_damaged(damaged);
  w.write("a.bin", 3, 0, "xyz", 3);
  CheckpointManifest m;
  m.config = nlohmann::json::object();
  m.tables = nlohmann::json::array();
  w.commit(m, 2);
  EXPECT_TRUE(fs::exists(dir + "/" + checkpoint_name(7)));
  EXPECT_TRUE(fs::exists(c6));
  EXPECT_FALSE(fs::exists(c5));
  EXPECT_TRUE(fs::exists(c40 + "/a.bin"));
  EXPECT_TRUE(fs::exists(c30 + "/a.bin"));
  std::string all;
  for (const std::string& n : w.retention_notes()) all += n + "\n";
  EXPECT_NE(all.find(checkpoint_name(40) + " alone: it did not load when this run started (file "
                                           "a.bin has CRC-32C"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find(checkpoint_name(30) +
                     " alone: it did not load when this run started (file a.bin has 1 bytes"),
            std::string::npos)
      << all;
  // The same without the scan's list (a run that did not resume): 40 counts,
  // as retention does not read the files; 30 still does not.
  CheckpointWriter w2(comm, dir, 8);
  w2.write("a.bin", 3, 0, "xyz", 3);
  w2.commit(m, 2);
  EXPECT_TRUE(fs::exists(c40));
  EXPECT_TRUE(fs::exists(c30));
  all.clear();
  for (const std::string& n : w2.retention_notes()) all += n + "\n";
  EXPECT_NE(all.find(checkpoint_name(30) +
                     " alone: file a.bin has 1 bytes, the manifest says 1030; neither removed "
                     "nor counted"),
            std::string::npos)
      << all;
  EXPECT_TRUE(fs::exists(dir + "/" + checkpoint_name(8)));  // the newest that loads
  EXPECT_FALSE(fs::exists(dir + "/" + checkpoint_name(7)));
  EXPECT_FALSE(fs::exists(c6));
  fs::remove_all(dir);
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

// The manifest's text, and its text written back.
std::string read_manifest(const std::string& ck) { return test_read(ck + "/manifest.json"); }
void write_manifest(const std::string& ck, const std::string& text) {
  std::ofstream(ck + "/manifest.json", std::ios::binary | std::ios::trunc) << text;
}

TEST(Checkpoint, AChangedDigitAnywhereInTheManifestIsRefusedNamingIt) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("digits");
  const std::string ck = write_one(comm, dir, 120, 2);
  const std::string text = read_manifest(ck);
  CheckpointManifest m;
  ASSERT_EQ(check_checkpoint(comm, ck, &m), "");
  EXPECT_TRUE(m.unsealed_warning.empty());
  int digits = 0;
  for (size_t k = 0; k < text.size(); ++k) {
    if (text[k] < '0' || text[k] > '9') continue;
    ++digits;
    std::string edited = text;
    edited[k] = char('0' + (text[k] - '0' + 1) % 10);
    write_manifest(ck, edited);
    const std::string why = check_checkpoint(comm, ck, &m);
    EXPECT_NE(why.find("manifest.json"), std::string::npos)
        << "digit at byte " << k << " changed and accepted: " << edited;
  }
  EXPECT_GT(digits, 30);  // counters, sizes, CRCs, config, the manifest's own CRC
  // Whitespace is not content: re-indenting the same values still loads.
  write_manifest(ck, nlohmann::json::parse(text).dump(4));
  EXPECT_EQ(check_checkpoint(comm, ck, &m), "");
  // Taken by --resume and by the tools (open_checkpoint): refused by name.
  std::string edited = text;
  edited[edited.find("\"step\": 120") + 9] = '3';
  write_manifest(ck, edited);
  std::vector<std::string> log;
  try {
    open_checkpoint(comm, ck, &log);
    ADD_FAILURE() << "an edited manifest was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("manifest.json: the content does not match its crc32c"),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, AManifestWithoutItsChecksumLoadsOnlyAsVersionOneWithAWarning) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("unsealed");
  const std::string ck = write_one(comm, dir, 7, 2);
  nlohmann::json j = nlohmann::json::parse(read_manifest(ck));
  j.erase("crc32c");
  write_manifest(ck, j.dump(1));  // version 2 without its checksum: refused
  CheckpointManifest m;
  EXPECT_NE(check_checkpoint(comm, ck, &m).find("manifest.json: no crc32c field"),
            std::string::npos);
  j["version"] = 1;  // what an older ncf_dist wrote
  write_manifest(ck, j.dump(1));
  ASSERT_EQ(check_checkpoint(comm, ck, &m), "");
  EXPECT_NE(m.unsealed_warning.find("cannot be detected"), std::string::npos);
  std::vector<std::string> log;
  ASSERT_TRUE(find_checkpoint(comm, ck, dir, &log).has_value());
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[1].rfind("warning: ", 0), 0u) << log[1];
  j["crc32c"] = "0x1234";  // a checksum of the wrong type
  write_manifest(ck, j.dump(1));
  EXPECT_NE(check_checkpoint(comm, ck, &m).find("field \"crc32c\""), std::string::npos);
  fs::remove_all(dir);
}

TEST(Checkpoint, FileNamesInTheManifestArePlainNamesInsideTheCheckpoint) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("names");
  const std::string ck = write_one(comm, dir, 5, 2);
  const std::string outside = dir + "/secret.bin";
  std::ofstream(outside) << "not part of any checkpoint";
  const nlohmann::json good = nlohmann::json::parse(read_manifest(ck));
  for (const std::string& name :
       std::vector<std::string>{"../secret.bin", "..", ".", "", "/etc/passwd", "sub/a.bin",
                                "manifest.json", std::string("a.bin\0x", 7)}) {
    nlohmann::json j = good;
    j.erase("crc32c");
    j["files"][0]["name"] = name;
    j["crc32c"] = checkpoint_manifest_crc32c(j);  // sealed: only the name is wrong
    write_manifest(ck, j.dump(1));
    CheckpointManifest m;
    const std::string why = check_checkpoint(comm, ck, &m);
    EXPECT_NE(why.find("is not a plain file name"), std::string::npos) << name << ": " << why;
    EXPECT_NE(why.find("manifest.json"), std::string::npos) << why;
  }
  nlohmann::json j = good;
  j.erase("crc32c");
  j["files"][1]["name"] = j["files"][0]["name"];
  j["crc32c"] = checkpoint_manifest_crc32c(j);
  write_manifest(ck, j.dump(1));
  CheckpointManifest m;
  EXPECT_NE(check_checkpoint(comm, ck, &m).find("listed twice"), std::string::npos);
  // Counters and sizes: integers in range, not fractions or negative numbers.
  for (const auto& [key, value] :
       {std::pair{"step", nlohmann::json(-1)}, std::pair{"step", nlohmann::json(1.5)},
        std::pair{"world", nlohmann::json(0)},
        std::pair{"world", nlohmann::json(uint64_t(1) << 40)}}) {
    nlohmann::json k = good;
    k.erase("crc32c");
    k[key] = value;
    k["crc32c"] = checkpoint_manifest_crc32c(k);
    write_manifest(ck, k.dump(1));
    EXPECT_NE(check_checkpoint(comm, ck, &m).find(std::string("field \"") + key + "\""),
              std::string::npos)
        << key << " = " << value;
  }
  nlohmann::json k = good;
  k.erase("crc32c");
  k["files"][0]["crc32c"] = -5;
  k["crc32c"] = checkpoint_manifest_crc32c(k);
  write_manifest(ck, k.dump(1));
  EXPECT_NE(check_checkpoint(comm, ck, &m).find("field \"crc32c\""), std::string::npos);
  EXPECT_EQ(test_read(outside), "not part of any checkpoint");
  fs::remove_all(dir);
}

TEST(Checkpoint, RetentionDeletesOnlyWholeCheckpointsOfItsOwnAndSaysWhatItLeft) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("retention");
  const std::string elsewhere = temp_dir("retention_elsewhere");
  // A checkpoint somewhere else, reached from the directory through a link
  // with an old step number.
  const std::string target = write_one(comm, elsewhere, 1, 5);
  write_one(comm, dir, 3, 5);
  const std::string with_extra = write_one(comm, dir, 4, 5);
  const std::string linked_in = write_one(comm, dir, 6, 5);
  fs::create_directory_symlink(target, dir + "/" + checkpoint_name(2));
  std::ofstream(with_extra + "/my-notes.txt") << "the user's";
  fs::create_directories(dir + "/" + checkpoint_name(5));  // a user's folder: no manifest
  std::ofstream(dir + "/" + checkpoint_name(5) + "/data.csv") << "1,2\n";
  fs::create_directory_symlink(elsewhere, linked_in + "/b.bin.link");
  fs::create_directories(dir + "/.tmp-" + checkpoint_name(7) + "/sub");  // not a writer's
  fs::create_directories(dir + "/.tmp-" + checkpoint_name(8));           // a writer's
  std::ofstream(dir + "/.tmp-" + checkpoint_name(8) + "/a.bin") << "partial";
  fs::create_directories(dir + "/.tmp-mine");
  std::ofstream(dir + "/notes.txt") << "keep me";
  // Keep 1: the new checkpoint 9 stays; 3 goes; the others are not wholly ours.
  CheckpointWriter w(comm, dir, 9);
  w.write("a.bin", 3, 0, "xyz", 3);
  CheckpointManifest m;
  m.config = nlohmann::json::object();
  m.tables = nlohmann::json::array();
  w.commit(m, 1);
  EXPECT_TRUE(fs::exists(dir + "/" + checkpoint_name(9) + "/a.bin"));
  EXPECT_FALSE(fs::exists(dir + "/" + checkpoint_name(3)));
  EXPECT_FALSE(fs::exists(dir + "/.tmp-" + checkpoint_name(8)));
  EXPECT_TRUE(fs::is_symlink(dir + "/" + checkpoint_name(2)));
  CheckpointManifest t;
  EXPECT_EQ(check_checkpoint(comm, target, &t), "") << "what the link points to was touched";
  EXPECT_EQ(test_read(with_extra + "/my-notes.txt"), "the user's");
  EXPECT_TRUE(fs::exists(with_extra + "/a.bin"));  // not half-deleted either
  EXPECT_TRUE(fs::exists(dir + "/" + checkpoint_name(5) + "/data.csv"));
  EXPECT_TRUE(fs::exists(linked_in + "/a.bin"));
  EXPECT_TRUE(fs::exists(elsewhere));
  EXPECT_TRUE(fs::exists(dir + "/.tmp-" + checkpoint_name(7) + "/sub"));
  EXPECT_TRUE(fs::exists(dir + "/.tmp-mine"));
  EXPECT_EQ(test_read(dir + "/notes.txt"), "keep me");
  const std::vector<std::string>& notes = w.retention_notes();
  std::string all;
  for (const std::string& n : notes) all += n + "\n";
  EXPECT_EQ(notes.size(), 5u) << all;
  for (const std::string& expect : std::vector<std::string>{
           checkpoint_name(2) + " alone: it is a symbolic link",
           checkpoint_name(4) + " alone: it holds my-notes.txt, which its manifest does not list",
           checkpoint_name(5) + " alone: it is not sealed (no manifest.json)",
           checkpoint_name(6) + " alone: it holds a symbolic link, b.bin.link",
           checkpoint_name(7) + " alone: it holds sub, which is not a regular file"})
    EXPECT_NE(all.find(expect), std::string::npos) << expect << "\n" << all;
  // The same notes are not repeated at the next checkpoint.
  CheckpointWriter w2(comm, dir, 10);
  w2.write("a.bin", 3, 0, "xyz", 3);
  w2.commit(m, 1);
  EXPECT_FALSE(fs::exists(dir + "/" + checkpoint_name(9)));
  EXPECT_TRUE(w2.retention_notes().empty()) << w2.retention_notes()[0];
  // A link in the place of the writer's own temporary directory stops it,
  // naming the path, instead of being removed.
  fs::create_directory_symlink(elsewhere, dir + "/.tmp-" + checkpoint_name(11));
  try {
    CheckpointWriter w3(comm, dir, 11);
    ADD_FAILURE() << "wrote through a link";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".tmp-" + checkpoint_name(11)), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::exists(target + "/a.bin"));
  fs::remove_all(dir);
  fs::remove_all(elsewhere);
}

// ------------------------------------------------------------------ lock ---

std::string lock_path(const std::string& dir) { return dir + "/" + kCheckpointLockFile; }

std::string hostname() {
  char name[256] = "";
  gethostname(name, sizeof name - 1);
  return name;
}

// A lock of `h` in dir as a job would have left it, its heartbeat `age` s ago.
void plant_lock(const std::string& dir, const LockHolder& h, double age) {
  std::ofstream(lock_path(dir)) << h.to_json().dump() << "\n";
  struct timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= time_t(age);
  t[1] = t[0];
  ASSERT_EQ(utimensat(AT_FDCWD, lock_path(dir).c_str(), t, 0), 0);
}

std::string token_in(const std::string& dir) {
  LockHolder h;
  std::string why;
  return LockHolder::from_json(test_read(lock_path(dir)), &h, &why) ? h.token : "(" + why + ")";
}

// The lock's helper files (.ncf_dist.lock.*) left in dir: none, ever.
std::vector<std::string> helper_files(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(".ncf_dist.lock.", 0) == 0)
      out.push_back(e.path().filename().string());
  return out;
}

struct Taken {
  std::unique_ptr<CheckpointLock> lock;
  std::string refused;  // the error, "" when taken
  std::vector<std::string> notes;
  std::string all_notes() const {
    std::string all;
    for (const std::string& n : notes) all += n + "\n";
    return all;
  }
};

Taken take(const std::string& dir, CheckpointLockOptions options = {}) {
  SingleCommunicator comm;
  Taken t;
  try {
    t.lock = CheckpointLock::acquire(comm, dir, options, &t.notes);
  } catch (const Error& e) {
    t.refused = e.what();
  }
  return t;
}

// Field 22 of /proc/PID/stat, and its state (field 3).
int64_t start_of(pid_t pid, std::string* state = nullptr) {
  const std::string text = test_read("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream rest(text.substr(text.rfind(')') + 1));
  std::vector<std::string> f;
  for (std::string x; rest >> x;) f.push_back(x);
  if (state) *state = f.empty() ? "" : f[0];
  return f.size() > 19 ? std::stoll(f[19]) : -1;
}

TEST(CheckpointLock, ASecondJobIsRefusedNamingTheDirectoryHostAndPidUntilTheFirstReleases) {
  const std::string dir = temp_dir("lock_second");
  Taken a = take(dir);
  ASSERT_TRUE(a.lock) << a.refused;
  EXPECT_TRUE(a.notes.empty()) << a.all_notes();
  LockHolder h;
  std::string why;
  ASSERT_TRUE(LockHolder::from_json(test_read(lock_path(dir)), &h, &why)) << why;
  EXPECT_EQ(h.pid, getpid());
  EXPECT_EQ(h.host, hostname());
  EXPECT_EQ(h.pid_start, start_of(getpid()));
  EXPECT_EQ(h.token, a.lock->holder().token);
  // The same process counts as a live holder like any other on this host.
  Taken b = take(dir);
  EXPECT_FALSE(b.lock);
  for (const std::string& expect :
       {"flag --checkpoint_dir " + dir + ": another job holds this directory",
        "pid " + std::to_string(getpid()) + " on host " + hostname() + ", since " + h.since,
        std::string("that process is running on this host"), lock_path(dir)})
    EXPECT_NE(b.refused.find(expect), std::string::npos) << expect << "\n" << b.refused;
  EXPECT_EQ(token_in(dir), h.token) << "the refused job touched the lock";
  a.lock.reset();
  EXPECT_FALSE(fs::exists(lock_path(dir))) << "not released";
  Taken c = take(dir);
  EXPECT_TRUE(c.lock) << c.refused;
  EXPECT_TRUE(c.notes.empty()) << c.all_notes();
  c.lock.reset();
  EXPECT_TRUE(helper_files(dir).empty());
  fs::remove_all(dir);
}

TEST(CheckpointLock, AHolderGoneFromThisHostIsTakenOverWithANote) {
  const std::string dir = temp_dir("lock_dead");
  const LockHolder me = LockHolder::self(300);
  const std::string at = " on host " + hostname();
  // An ended process, one that has exited but is not reaped yet (a zombie), and a
  // live process whose pid the holder had (another start time). The ended one is a
  // pid above the kernel's pid_max, which no process can have: the pid of a child
  // that ended and was reaped can be another process's by the time the lock is
  // judged, on a busy machine with pid_max 32768.
  int64_t ended = 0;
  {
    std::ifstream f("/proc/sys/kernel/pid_max");
    f >> ended;
    ASSERT_GT(ended, 0) << "cannot read /proc/sys/kernel/pid_max";
    ++ended;
  }
  int status = 0;
  pid_t zombie = fork();
  if (zombie == 0) _exit(0);
  std::string state;
  int64_t zombie_start = -1;
  for (int i = 0; i < 10000 && state != "Z"; ++i) {
    zombie_start = start_of(zombie, &state);
    if (state != "Z") std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(state, "Z");
  struct Case {
    int64_t pid, start;
    std::string why;
  };
  for (const Case& c : std::vector<Case>{
           {ended, 12345, "no process " + std::to_string(ended) + " runs on this host any more"},
           {zombie, zombie_start, "process " + std::to_string(zombie) + " has exited (a zombie)"},
           {getpid(), start_of(getpid()) - 1,
            "pid " + std::to_string(getpid()) + " is now another process"}}) {
    LockHolder h = me;
    h.pid = c.pid;
    h.pid_start = c.start;
    h.token = "0123456789abcdef";
    plant_lock(dir, h, 0);
    Taken t = take(dir);
    ASSERT_TRUE(t.lock) << c.why << ": " << t.refused;
    ASSERT_EQ(t.notes.size(), 1u) << t.all_notes();
    EXPECT_NE(t.notes[0].find("took over the lock of ncf_dist pid " + std::to_string(c.pid) + at),
              std::string::npos)
        << t.notes[0];
    EXPECT_NE(t.notes[0].find(c.why), std::string::npos) << c.why << "\n" << t.notes[0];
    EXPECT_EQ(token_in(dir), t.lock->holder().token);
    t.lock.reset();
    EXPECT_FALSE(fs::exists(lock_path(dir)));
  }
  ASSERT_EQ(waitpid(zombie, &status, 0), zombie);
  EXPECT_TRUE(helper_files(dir).empty());
  fs::remove_all(dir);
}

TEST(CheckpointLock, ALockOfAnotherHostIsTakenOverOnlyOnceItsHeartbeatIsStale) {
  const std::string dir = temp_dir("lock_foreign");
  LockHolder h = LockHolder::self(300);
  h.host = "node-elsewhere";
  h.pid = 4242;
  h.slurm_job = "777";
  h.slurm_step = "0";
  h.token = "feedfacefeedface";
  const std::string holder = "pid 4242 on host node-elsewhere (Slurm job 777, step 0)";
  auto refused = [&](double age, double mine, const std::string& limit) {
    plant_lock(dir, h, age);
    const std::string before = test_read(lock_path(dir));
    CheckpointLockOptions o;
    o.stale_seconds = mine;
    Taken t = take(dir, o);
    EXPECT_FALSE(t.lock) << "age " << age;
    for (const std::string& expect :
         {"flag --checkpoint_dir " + dir + ": another job holds this directory", holder,
          std::string("it runs on another host"), "more than " + limit + " s old"})
      EXPECT_NE(t.refused.find(expect), std::string::npos) << expect << "\n" << t.refused;
    EXPECT_EQ(test_read(lock_path(dir)), before);
  };
  refused(0, 300, "300");
  refused(250, 300, "300");
  // The holder refreshes it every fifth of its own age: a taker with a shorter
  // one waits for the holder's.
  h.stale_seconds = 7200;
  refused(3600, 300, "7200");
  h.stale_seconds = 300;
  refused(3600, 7200, "7200");
  // Its own host name, but another boot: its pid means nothing here.
  {
    LockHolder other_boot = LockHolder::self(300);
    other_boot.boot_id = "another-boot";
    other_boot.token = "0011223344556677";
    plant_lock(dir, other_boot, 0);
    Taken t = take(dir);
    EXPECT_FALSE(t.lock);
    EXPECT_NE(t.refused.find("its pid cannot be checked from here"), std::string::npos)
        << t.refused;
  }
  plant_lock(dir, h, 3600);
  Taken t = take(dir);
  ASSERT_TRUE(t.lock) << t.refused;
  ASSERT_EQ(t.notes.size(), 1u) << t.all_notes();
  EXPECT_NE(t.notes[0].find("took over the lock of ncf_dist " + holder), std::string::npos)
      << t.notes[0];
  EXPECT_NE(t.notes[0].find("more than the 300 s after which a lock of another host is stale"),
            std::string::npos)
      << t.notes[0];
  EXPECT_EQ(token_in(dir), t.lock->holder().token);
  t.lock.reset();
  EXPECT_FALSE(fs::exists(lock_path(dir)));
  EXPECT_TRUE(helper_files(dir).empty());
  fs::remove_all(dir);
}

TEST(CheckpointLock, AFileThatIsNoLockIsRefusedAndLeftAsItIs) {
  const std::string dir = temp_dir("lock_garbage");
  nlohmann::json no_token = LockHolder::self(300).to_json();
  no_token.erase("token");
  for (const auto& [content, why] : std::vector<std::pair<std::string, std::string>>{
           {"hello\n", "it is no JSON object"},
           {"", "it is empty"},
           {"{\"format\": \"something else\"}", "its \"format\" is not"},
           {no_token.dump(), "field \"token\" is missing or wrong"}}) {
    std::ofstream(lock_path(dir)) << content;
    Taken t = take(dir);
    EXPECT_FALSE(t.lock) << content;
    for (const std::string& expect : {"flag --checkpoint_dir " + dir + ": " + lock_path(dir) +
                                          " is not a lock that ncf_dist wrote (" + why,
                                      std::string("if none does, remove the file and start again")})
      EXPECT_NE(t.refused.find(expect), std::string::npos) << expect << "\n" << t.refused;
    EXPECT_EQ(test_read(lock_path(dir)), content);
  }
  fs::remove(lock_path(dir));
  // A directory or a symbolic link (even to a lock) in its place.
  fs::create_directory(lock_path(dir));
  EXPECT_NE(take(dir).refused.find("(it is not a regular file)"), std::string::npos);
  fs::remove(lock_path(dir));
  const std::string elsewhere = temp_dir("lock_garbage_elsewhere");
  plant_lock(elsewhere, LockHolder::self(300), 0);
  fs::create_symlink(lock_path(elsewhere), lock_path(dir));
  EXPECT_NE(take(dir).refused.find("(it is a symbolic link)"), std::string::npos);
  EXPECT_TRUE(fs::is_symlink(lock_path(dir)));
  EXPECT_TRUE(helper_files(dir).empty());
  fs::remove_all(dir);
  fs::remove_all(elsewhere);
}

// Two jobs that both found the same stale lock: the interleavings where the
// other one acts between this one's judgement and its move, run through the
// test hook (no timing). Exactly one of them holds the directory after.
TEST(CheckpointLock, OfTwoJobsTakingOverOneStaleLockExactlyOneGetsIt) {
  const std::string dir = temp_dir("lock_race");
  LockHolder stale = LockHolder::self(300);
  stale.host = "node-elsewhere";
  stale.token = "5555555555555555";
  // 1. The other job takes over first and holds: this one moves the other's
  //    fresh lock aside, sees it is not the stale one, puts it back, and is
  //    refused by the other's live holder.
  {
    plant_lock(dir, stale, 3600);
    Taken other;
    CheckpointLockOptions o;
    o.before_takeover = [&] { other = take(dir); };
    Taken me = take(dir, o);
    ASSERT_TRUE(other.lock) << other.refused;
    EXPECT_NE(other.all_notes().find("took over the lock of ncf_dist pid"), std::string::npos);
    EXPECT_FALSE(me.lock) << "both jobs hold the directory";
    EXPECT_NE(me.refused.find("another job holds this directory"), std::string::npos) << me.refused;
    EXPECT_TRUE(me.notes.empty()) << me.all_notes();
    EXPECT_EQ(token_in(dir), other.lock->holder().token);
    EXPECT_NO_THROW(other.lock->check_held("a checkpoint"));
    other.lock.reset();
    EXPECT_FALSE(fs::exists(lock_path(dir)));
  }
  // 2. The other job has moved the stale lock aside but not yet made its own:
  //    this one finds nothing to move, makes its lock, and the other one is
  //    then refused.
  {
    plant_lock(dir, stale, 3600);
    CheckpointLockOptions o;
    o.before_takeover = [&] { fs::rename(lock_path(dir), dir + "/moved-by-the-other"); };
    Taken me = take(dir, o);
    ASSERT_TRUE(me.lock) << me.refused;
    Taken other = take(dir);
    EXPECT_FALSE(other.lock) << "both jobs hold the directory";
    EXPECT_EQ(token_in(dir), me.lock->holder().token);
    me.lock.reset();
  }
  EXPECT_TRUE(helper_files(dir).empty());
  fs::remove_all(dir);
}

TEST(CheckpointLock, RetentionAndResumeLeaveTheLockAloneAndTheHolderChecksItBeforeWriting) {
  SingleCommunicator comm;
  const std::string dir = temp_dir("lock_retention");
  Taken a = take(dir);
  ASSERT_TRUE(a.lock) << a.refused;
  const std::string token = a.lock->holder().token;
  for (int64_t step : {10, 20, 30}) write_one(comm, dir, step, 1);
  EXPECT_EQ(token_in(dir), token);
  std::vector<std::string> log;
  std::optional<CheckpointReader> ck = find_checkpoint(comm, "auto", dir, &log);
  ASSERT_TRUE(ck);
  EXPECT_EQ(ck->manifest().step, 30);
  ASSERT_EQ(log.size(), 1u) << "a skipped checkpoint, or the lock taken for one";
  EXPECT_NO_THROW(a.lock->check_held("checkpoint 40"));
  // Taken over by a job on another host (this one stopped for too long):
  // the holder refuses to write, naming the new holder, and does not remove
  // that job's lock when it ends.
  LockHolder h = LockHolder::self(300);
  h.host = "node-elsewhere";
  h.pid = 4242;
  h.token = "9999999999999999";
  plant_lock(dir, h, 0);
  try {
    a.lock->check_held("checkpoint " + checkpoint_name(40));
    ADD_FAILURE() << "wrote into a directory another job holds";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const std::string& expect :
         {"not writing checkpoint " + checkpoint_name(40) + ": this job no longer holds the lock " +
              lock_path(dir),
          std::string("it is now held by ncf_dist pid 4242 on host node-elsewhere")})
      EXPECT_NE(what.find(expect), std::string::npos) << expect << "\n" << what;
  }
  a.lock.reset();
  EXPECT_EQ(token_in(dir), h.token);
  fs::remove(lock_path(dir));
  Taken b = take(dir);
  ASSERT_TRUE(b.lock) << b.refused;
  fs::remove(lock_path(dir));
  try {
    b.lock->check_held("checkpoint 50");
    ADD_FAILURE() << "wrote without the lock";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("it was removed"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(CheckpointLock, TheHolderRefreshesItsHeartbeat) {
  const std::string dir = temp_dir("lock_heartbeat");
  CheckpointLockOptions o;
  o.stale_seconds = 2;  // a heartbeat every 0.4 s
  Taken a = take(dir, o);
  ASSERT_TRUE(a.lock) << a.refused;
  LockHolder me;
  std::string why;
  ASSERT_TRUE(LockHolder::from_json(test_read(lock_path(dir)), &me, &why)) << why;
  plant_lock(dir, me, 3600);  // the same lock, its heartbeat set back an hour
  // Waits for the event (at most 60 s): the next heartbeat makes it recent.
  bool fresh = false;
  for (int i = 0; i < 6000 && !fresh; ++i) {
    struct stat st {};
    ASSERT_EQ(stat(lock_path(dir).c_str(), &st), 0);
    fresh = time(nullptr) - st.st_mtime < 600;
    if (!fresh) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(fresh) << "the heartbeat did not refresh the lock";
  a.lock.reset();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ncf
