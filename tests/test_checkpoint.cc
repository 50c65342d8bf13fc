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
#include <iterator>
#include <nlohmann/json.hpp>
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
           checkpoint_name(5) + " alone: its manifest does not load",
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

}  // namespace
}  // namespace ncf
