// Every numeric flag of every program has a range: --help states it, and a
// value outside it (below, above, not a number, NaN) stops the program with a
// non-zero exit and a message naming the flag and the value, leaving nothing
// running; its ends are accepted. The flags are read from each program's
// --help, so a numeric flag added later without a range fails here. Then the
// ranges only the data or a checkpoint can check: ncf_dist's --topk against
// the dataset's eval list (at one and two ranks), --eval_users against its
// users, and the flags a checkpoint's manifest records, as ncf_recommend and
// ncf_export read them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "data/crc32c.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/config.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;
using test::bin;
using test::run;
using test::TempDir;

// One numeric option as --help shows it, e.g.
//   --batch_size INT:in [1, 17179869184]=2048
//   --hr_threshold FLOAT:negative (never) or in [0, 1]=-1
struct NumericFlag {
  std::string name, type;  // "--batch_size", "INT" | "UINT" | "FLOAT"
  bool has_range = false;
  bool negative_ok = false;  // "negative (...) or in ..."
  bool lo_open = false, hi_open = false;
  std::string lo, hi;
};

std::vector<NumericFlag> numeric_flags(const std::string& help) {
  static const std::regex option(R"(^\s+(?:-\w,)?(--\w+) (INT|UINT|FLOAT|NUMBER|DOUBLE)\b(.*)$)");
  static const std::regex range(
      R"(^:(negative \([^)]*\) or )?in ([\[(])(-?[0-9.e+]+), (-?[0-9.e+]+)([\])]))");
  std::vector<NumericFlag> out;
  std::stringstream ss(help);
  std::string line;
  std::smatch m, r;
  while (std::getline(ss, line)) {
    if (!std::regex_match(line, m, option)) continue;
    NumericFlag f;
    f.name = m[1];
    f.type = m[2];
    const std::string rest = m[3];
    if (std::regex_search(rest, r, range)) {
      f.has_range = true;
      f.negative_ok = r[1].matched;
      f.lo_open = r[2] == "(";
      f.lo = r[3];
      f.hi = r[4];
      f.hi_open = r[5] == ")";
    }
    out.push_back(f);
  }
  return out;
}

// Decimal integers of any size the ranges use (up to 2^64), plus or minus one.
std::string add(const std::string& dec, int delta) {
  __int128 v = 0;
  const bool neg = !dec.empty() && dec[0] == '-';
  for (size_t k = neg ? 1 : 0; k < dec.size(); ++k) v = v * 10 + (dec[k] - '0');
  v = (neg ? -v : v) + delta;
  if (v == 0) return "0";
  std::string s;
  for (unsigned __int128 a = v < 0 ? -(unsigned __int128)v : (unsigned __int128)v; a > 0; a /= 10)
    s.insert(s.begin(), char('0' + int(a % 10)));
  return v < 0 ? "-" + s : s;
}

std::string shortest(double v) {
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

bool integral(const NumericFlag& f) { return f.type != "FLOAT" && f.type != "DOUBLE"; }

// Values outside f's range, each as the command line gives it.
std::vector<std::string> outside(const NumericFlag& f) {
  std::vector<std::string> v = {"abc"};
  // Below the range, unless that is a negative marker; -1 for an unsigned flag at 0.
  if (integral(f)) {
    const std::string below = add(f.lo, -1);
    if (!f.negative_ok || below[0] != '-') v.push_back(below);
    v.push_back(add(f.hi, +1));  // 2^64 for the seeds
    v.push_back("1.5");
  } else {
    const double lo = std::stod(f.lo), hi = std::stod(f.hi);
    if (f.lo_open)
      v.push_back(f.lo);
    else if (!f.negative_ok || lo > 1)
      v.push_back(shortest(lo - 1));
    if (f.negative_ok && lo > 0) v.push_back(shortest(lo / 2));  // between the marker and lo
    v.push_back(f.hi_open ? f.hi : shortest(hi + 1));
    v.push_back("nan");
    v.push_back("inf");
  }
  return v;
}

// The ends of f's range that belong to it.
std::vector<std::string> ends(const NumericFlag& f) {
  std::vector<std::string> v;
  if (!f.lo_open) v.push_back(f.lo);
  if (!f.hi_open) v.push_back(f.hi);
  if (f.negative_ok) v.push_back("-1");
  return v;
}

// Whether some process other than this one has `marker` on its command line.
bool running_with(const std::string& marker) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string pid = e.path().filename();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (pid == std::to_string(getpid())) continue;
    // A process that ends between the listing and the read fails the read with
    // ESRCH, which libstdc++'s filebuf throws as ios_base::failure: it is not running.
    std::string cmd;
    try {
      std::ifstream f(e.path() / "cmdline", std::ios::binary);
      cmd.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    } catch (const std::ios_base::failure&) {
      continue;
    }
    if (cmd.find(marker) != std::string::npos) return true;
  }
  return false;
}

// How each program is started with everything it requires, pointing at paths
// under `dir` that do not exist: a value that passed its check would fail on
// them, never train or write anything.
std::string base_command(const std::string& program, const std::string& dir) {
  if (program == "ncf_dist") return bin(program) + " --data_dir " + dir + "/none";
  if (program == "ncf_prep") return bin(program) + " --verify " + dir + "/none";
  if (program == "ncf_recommend")
    return bin(program) + " --checkpoint " + dir + "/none --data_dir " + dir + "/none --users all";
  return bin(program) + " --checkpoint " + dir + "/none --format npy --output " + dir + "/out";
}

class FlagRanges : public ::testing::TestWithParam<std::string> {};

TEST_P(FlagRanges, HelpStatesEveryNumericFlagsRangeAndValuesOutsideAreRefused) {
  const std::string program = GetParam();
  TempDir t;
  const auto help = run(bin(program) + " --help");
  ASSERT_EQ(help.exit_code, 0) << help.output;
  const std::vector<NumericFlag> flags = numeric_flags(help.output);
  // ncf_export's one numeric flag is hidden (a test knob), checked below.
  if (program != "ncf_export") {
    ASSERT_FALSE(flags.empty()) << program << " --help shows no numeric flag?\n" << help.output;
  }
  const std::string base = base_command(program, t.path());
  for (const NumericFlag& f : flags) {
    ASSERT_TRUE(f.has_range) << program << " " << f.name << ": --help states no range\n"
                             << help.output;
    for (const std::string& value : outside(f)) {
      const auto r = run(base + " " + f.name + " " + value);
      const std::string what = program + " " + f.name + " " + value;
      EXPECT_NE(r.exit_code, 0) << what << "\n" << r.output;
      EXPECT_NE(r.output.find("flag " + f.name + " must be"), std::string::npos)
          << what << ": the message does not name the flag\n"
          << r.output;
      EXPECT_NE(r.output.find(value), std::string::npos)
          << what << ": the message does not name the value\n"
          << r.output;
      EXPECT_FALSE(running_with(t.path())) << what << ": a process was left running";
    }
    for (const std::string& value : ends(f)) {
      const auto r = run(base + " " + f.name + " " + value);
      EXPECT_EQ(r.output.find("flag " + f.name + " must be"), std::string::npos)
          << program << " " << f.name << " " << value << " is in range\n"
          << r.output;
      EXPECT_EQ(r.output.find("Could not convert"), std::string::npos)
          << program << " " << f.name << " " << value << "\n"
          << r.output;
    }
  }
  if (program == "ncf_export") {
    for (const std::string value : {"-1", "2147483648", "x"}) {
      const auto r = run(base + " --external_data_bytes " + value);
      EXPECT_NE(r.exit_code, 0) << value << "\n" << r.output;
      EXPECT_NE(r.output.find("flag --external_data_bytes must be"), std::string::npos)
          << value << "\n"
          << r.output;
      EXPECT_NE(r.output.find(value), std::string::npos) << r.output;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Programs, FlagRanges,
                         ::testing::Values("ncf_dist", "ncf_prep", "ncf_recommend", "ncf_export"));

// One small dataset (E = 9: eval lists of 10) and one checkpoint of it.
class DataRanges : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run(bin("ncf_prep") +
                 " --synthetic custom --users 60 --items 80 --interactions 1500 "
                 "--eval_negatives 9 --record_rows 64 --num_shards 2 --seed 1 --progress off "
                 "--output " +
                 data());
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run(train(1, "--max_steps 2 --train_epochs 1 --no_eval --checkpoint_dir " + ck()));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->file("data"); }
  static std::string ck() { return dir_->file("ck"); }
  static std::string train(int W, const std::string& flags) {
    return "timeout 120 " + (W > 1 ? test::mpirun(W) + " " : std::string()) + bin("ncf_dist") +
           " --device cpu --data_dir " + data() + " --batch_size 100 --threads 1 --progress off " +
           flags;
  }
  // The checkpoint SetUpTestSuite wrote.
  static std::string step_dir() {
    std::string step;
    for (const auto& e : fs::directory_iterator(ck()))
      if (e.path().filename().string().rfind("step-", 0) == 0) step = e.path().string();
    return step;
  }
  static std::string copied_checkpoint(const TempDir& t) {
    const std::string step = step_dir();
    const std::string copy = t.file(fs::path(step).filename().string());
    fs::copy(step, copy, fs::copy_options::recursive);
    return copy;
  }
  // A copy of the checkpoint whose manifest records `key` = `value`, sealed
  // again with its checksum, as an edit that knows the format would leave it.
  static std::string edited_checkpoint(const TempDir& t, const std::string& key,
                                       const nlohmann::json& value) {
    const std::string copy = copied_checkpoint(t);
    const std::string manifest = copy + "/" + kCheckpointManifestFile;
    nlohmann::json j = nlohmann::json::parse(test::read_file(manifest));
    j["config"][key] = value;
    j["crc32c"] = checkpoint_manifest_crc32c(j);
    test::write_file(manifest, j.dump(2));
    return copy;
  }
  // A copy of the checkpoint whose file `name` holds `bytes`, listed in the
  // manifest with their size and CRC, and with `edit` applied to the manifest,
  // sealed again: damage the checksums cannot tell from a checkpoint (a tool
  // that rewrote the files knowing the format, or a fuzzer).
  static std::string rewritten_checkpoint(const TempDir& t, const std::string& name,
                                          const std::string& bytes,
                                          const nlohmann::json& edit = nlohmann::json::object()) {
    const std::string copy = copied_checkpoint(t);
    const std::string manifest = copy + "/" + kCheckpointManifestFile;
    nlohmann::json j = nlohmann::json::parse(test::read_file(manifest));
    test::write_file(copy + "/" + name, bytes);
    bool listed = false;
    for (nlohmann::json& f : j["files"])
      if (f["name"] == name) {
        f["bytes"] = bytes.size();
        f["crc32c"] = crc32c(bytes.data(), bytes.size());
        listed = true;
      }
    EXPECT_TRUE(listed) << name << " is not in " << manifest;
    for (auto it = edit.begin(); it != edit.end(); ++it) j[it.key()] = it.value();
    j.erase("crc32c");
    j["crc32c"] = checkpoint_manifest_crc32c(j);
    test::write_file(manifest, j.dump(2));
    return copy;
  }
  static TempDir* dir_;
};
TempDir* DataRanges::dir_ = nullptr;

TEST_F(DataRanges, TopkPastTheEvalListIsRefusedOnEveryRank) {
  for (int W : {1, 2}) {
    const auto r = run(train(W, "--max_steps 1 --train_epochs 1 --topk 11"));
    EXPECT_NE(r.exit_code, 0) << "W=" << W << "\n" << r.output;
    EXPECT_NE(r.exit_code, 124) << "W=" << W << ": a rank was left waiting\n" << r.output;
    EXPECT_NE(r.output.find("flag --topk 11 is more than the 10 candidates"), std::string::npos)
        << "W=" << W << "\n"
        << r.output;
    EXPECT_EQ(r.output.find("samples/s"), std::string::npos) << "it trained\n" << r.output;
    EXPECT_FALSE(running_with(data())) << "W=" << W << ": a process was left running";
  }
  // The list's length itself is a K (the whole list's NDCG); without evaluation K is unused.
  for (const std::string flags : {"--topk 10", "--topk 11 --no_eval"}) {
    const auto r = run(train(1, "--max_steps 1 --train_epochs 1 " + flags));
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
  }
  // The default K (10) past a shorter list only draws a note.
  {
    TempDir t;
    auto r = run(bin("ncf_prep") +
                 " --synthetic custom --users 30 --items 40 --interactions 600 "
                 "--eval_negatives 5 --record_rows 64 --num_shards 1 --progress off --output " +
                 t.file("e5"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run(bin("ncf_dist") + " --device cpu --data_dir " + t.file("e5") +
            " --batch_size 100 --threads 1 --progress off --max_steps 1 --train_epochs 1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("note: the default --topk 10 is more than the 6 candidates"),
              std::string::npos)
        << r.output;
  }
  // --eval_only checks it against the dataset too.
  const auto r = run(train(1, "--eval_only --resume auto --checkpoint_dir " + ck() + " --topk 12"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("flag --topk 12 is more than the 10 candidates"), std::string::npos)
      << r.output;
}

TEST_F(DataRanges, EvalUsersPastTheDatasetsUsersIsRefused) {
  auto r = run(train(1, "--max_steps 1 --train_epochs 1 --eval_users 61"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("flag --eval_users 61 is more than the 60 eval users"), std::string::npos)
      << r.output;
  r = run(train(1, "--max_steps 1 --train_epochs 1 --eval_users 60"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(DataRanges, NegativeSeedIsRefusedNotWrapped) {
  TempDir t;
  auto r = run(train(1, "--max_steps 1 --train_epochs 1 --seed -1"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("flag --seed must be >= 0, got -1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("samples/s"), std::string::npos) << "it trained\n" << r.output;
  r = run(bin("ncf_prep") + " --synthetic small --seed -1 --output " + t.file("d"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("flag --seed must be >= 0, got -1"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(t.file("d")));
  // Past 2^64 - 1 CLI11 alone would saturate; 2^64 - 1 itself is a seed.
  r = run(bin("ncf_prep") + " --synthetic small --seed 18446744073709551616 --output " +
          t.file("d"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("got 18446744073709551616"), std::string::npos) << r.output;
  r = run(bin("ncf_prep") +
          " --synthetic custom --users 30 --items 40 --interactions 600 --eval_negatives 5 "
          "--seed 18446744073709551615 --progress off --output " +
          t.file("d"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// CLI11 drops the empty pieces of a split list value, which would read
// --layers 64,,8 as 64,8: a value with an empty entry is refused whole.
TEST_F(DataRanges, ListFlagsWithAnEmptyEntryAreRefused) {
  for (const std::string flags :
       {"--layers 64,,8", "--layers=64,32,", "--layers ,64,32", "--layers '64, ,32'",
        "--allow_changed_flags learning_rate,,train_epochs"}) {
    const auto r = run(train(1, "--max_steps 1 --train_epochs 1 --no_eval " + flags));
    EXPECT_NE(r.exit_code, 0) << flags << "\n" << r.output;
    const std::string flag = flags.substr(0, flags.find_first_of(" ="));
    std::string value = flags.substr(flag.size() + 1);
    if (value.front() == '\'') value = value.substr(1, value.size() - 2);
    EXPECT_NE(r.output.find("flag " + flag + " has an empty entry in '" + value + "'"),
              std::string::npos)
        << flags << "\n"
        << r.output;
    EXPECT_EQ(r.output.find("samples/s"), std::string::npos) << "it trained\n" << r.output;
  }
  // Spaces around entries are no entries of their own.
  const auto r = run(train(1, "--max_steps 1 --train_epochs 1 --no_eval --layers '64, 32'"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// A flag the run would never read: ncf_dist names it in a note and trains on
// (a job script's shared flags stay valid across its variants); the one-shot
// tools refuse it, as ncf_prep does its csv-only and synthetic-only flags.
TEST_F(DataRanges, FlagsThisRunNeverReadsAreNamed) {
  {
    const auto r = run(
        train(1,
              "--max_steps 1 --train_epochs 1 --no_eval --hr_threshold 0.5 --topk 5 "
              "--eval_users 3 --eval_full_ranking --tensorboard_every_steps 3 --keep_checkpoints "
              "3 --checkpoint_chunk_kib 64 --allow_changed_flags learning_rate --peer_timeout 60 "
              "--checkpoint_lock_stale_seconds 60"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (const std::string note :
         {"--topk: no evaluation (--no_eval)", "--hr_threshold: no evaluation (--no_eval)",
          "--eval_users: no evaluation (--no_eval)",
          "--eval_full_ranking: no evaluation (--no_eval)",
          "--tensorboard_every_steps: no --tensorboard_dir",
          "--checkpoint_chunk_kib: no --checkpoint_dir and no --resume",
          "--keep_checkpoints: no --checkpoint_dir", "--allow_changed_flags: no --resume",
          "--peer_timeout: one rank has no peers to wait for",
          "--checkpoint_lock_stale_seconds: no --checkpoint_dir"})
      EXPECT_NE(r.output.find("ncf_dist: note: flag " + note), std::string::npos) << note << "\n"
                                                                                  << r.output;
  }
  {
    // The same flags where they are read: no note.
    TempDir t;
    const auto r = run(train(1,
                             "--max_steps 1 --train_epochs 1 --hr_threshold 0.99 --topk 5 "
                             "--eval_users 3 --tensorboard_dir " +
                                 t.file("tb") + " --tensorboard_every_steps 3 --checkpoint_dir " +
                                 t.file("ck") +
                                 " --keep_checkpoints 3 --checkpoint_chunk_kib 64 "
                                 "--checkpoint_lock_stale_seconds 60"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(r.output.find("has no effect"), std::string::npos) << r.output;
  }
  TempDir t;
  auto refused = [&](const std::string& cmd, const std::string& message) {
    const auto r = run(cmd);
    EXPECT_NE(r.exit_code, 0) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << cmd << "\n" << r.output;
  };
  test::write_file(t.file("u.data"), "1\t10\t5\t100\n1\t11\t4\t101\n1\t12\t4\t102\n");
  refused(bin("ncf_prep") + " --synthetic small --min_interactions 3 --output " + t.file("d"),
          "--min_interactions applies to MovieLens and csv input only");
  refused(bin("ncf_prep") + " --synthetic small --tfmg_cycles first --output " + t.file("d"),
          "--tfmg_cycles applies to TF Model Garden input only");
  refused(bin("ncf_prep") + " --input " + t.file("u.data") + " --tfmg_cycles all --output " +
              t.file("d"),
          "--tfmg_cycles applies to TF Model Garden input only");
  EXPECT_FALSE(fs::exists(t.file("d")));
  refused(bin("ncf_recommend") + " --device cpu --checkpoint " + ck() + " --data_dir " + data() +
              " --pairs " + t.file("pairs.csv") + " --topk 3",
          "flag --topk applies to --users only");
  refused(bin("ncf_recommend") + " --device cpu --checkpoint " + ck() + " --data_dir " + data() +
              " --pairs " + t.file("pairs.csv") + " --include_seen",
          "flag --include_seen applies to --users only");
  refused(bin("ncf_export") + " --checkpoint " + ck() + " --format npy --output " + t.file("npy") +
              " --external_data never",
          "flag --external_data applies to --format onnx only");
  refused(bin("ncf_export") + " --checkpoint " + ck() + " --format npy --output " + t.file("npy") +
              " --external_data_bytes 5",
          "flag --external_data_bytes applies to --format onnx only");
  refused(bin("ncf_export") + " --checkpoint " + ck() + " --format onnx --output " +
              t.file("m.onnx") + " --data_dir " + data(),
          "flag --data_dir applies to --format npy only");
  EXPECT_FALSE(fs::exists(t.file("npy")));
  EXPECT_FALSE(fs::exists(t.file("m.onnx")));
}

// A sealed checkpoint whose files do not fit the model its flags give: every
// program that reads it refuses it by a sentence naming the checkpoint and the
// file (no source location, no failed check: test::run holds every output to
// that), at W = 1 and on every rank at W = 2.
TEST_F(DataRanges, ACheckpointFileOfTheWrongSizeIsRefusedNamingIt) {
  auto refused = [](const std::string& cmd, const std::string& message) {
    const auto r = run(cmd);
    EXPECT_NE(r.exit_code, 0) << cmd << "\n" << r.output;
    EXPECT_NE(r.exit_code, 124) << "a rank was left waiting: " << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << cmd << "\n" << r.output;
  };
  auto resume = [](int W, const std::string& copy) {
    return train(W, "--max_steps 2 --train_epochs 1 --no_eval --resume " + copy);
  };
  auto export_npy = [](const TempDir& t, const std::string& copy) {
    return bin("ncf_export") + " --checkpoint " + copy + " --format npy --output " + t.file("npy");
  };
  auto recommend = [](const std::string& copy) {
    return "timeout 120 " + bin("ncf_recommend") + " --device cpu --checkpoint " + copy +
           " --data_dir " + data() + " --users 0 --threads 1";
  };
  {
    // A table one float short: not whole rows, and not the dataset's rows.
    TempDir t;
    std::string rows = test::read_file(step_dir() + "/user.rows.f32");
    ASSERT_GT(rows.size(), 4u);
    rows.resize(rows.size() - 4);
    const std::string copy = rewritten_checkpoint(t, "user.rows.f32", rows);
    const std::string has = ": user.rows.f32 has " + std::to_string(rows.size()) + " bytes";
    for (int W : {1, 2})
      refused(resume(W, copy), "checkpoint " + copy + has + ", table user needs");
    refused(export_npy(t, copy), copy + has + ", not whole rows of");
    refused(recommend(copy), copy + has);
    EXPECT_FALSE(fs::exists(t.file("npy")));
  }
  {
    TempDir t;
    const std::string copy = rewritten_checkpoint(t, "tower.f32", std::string(12, '\0'));
    for (int W : {1, 2})
      refused(resume(W, copy), "checkpoint " + copy + ": tower.f32 has 12 bytes, this model");
    refused(export_npy(t, copy), copy + ": tower.f32 has 12 bytes, a model of this shape needs");
  }
  {
    // The position past the epoch's steps (2, --max_steps), with the loss
    // shares of as many steps, so that only the position is wrong.
    TempDir t;
    const std::string copy =
        rewritten_checkpoint(t, "loss.f64", std::string(5 * 8, '\0'), {{"epoch_step", 5}});
    refused(resume(1, copy), "checkpoint " + copy +
                                 " was taken 5 steps into epoch 1, which has 2 steps with this "
                                 "dataset and these flags");
  }
}

// Flags refused by what they name, through the program: --shard_plan's tables
// and placements, and --comm single in a job of two ranks.
TEST_F(DataRanges, ShardPlanAndCommValuesAreRefusedNamingTheFlag) {
  const std::string steps = "--max_steps 1 --train_epochs 1 --no_eval ";
  for (const auto& [W, flags, message] :
       {std::tuple{1, "--shard_plan user=diagonal",
                   "flag --shard_plan: unknown placement 'diagonal' for table user"},
        std::tuple{2, "--shard_plan movie=row",
                   "flag --shard_plan: unknown table 'movie' (expected user or item)"},
        std::tuple{2, "--shard_plan user=row,item",
                   "flag --shard_plan: 'item' is not TABLE=PLACEMENT"},
        std::tuple{2, "--comm single",
                   "flag --comm single runs one rank, this job has W = 2: use --comm mpi"}}) {
    const auto r = run(train(W, steps + flags));
    EXPECT_NE(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_NE(r.exit_code, 124) << flags << ": a rank was left waiting\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << flags << "\n" << r.output;
  }
}

// A data file that cannot be read as one (a directory where a shard should
// be, positives.bin as well) is refused naming it, not as a failed check.
TEST_F(DataRanges, AnUnreadableDataFileIsRefusedNamingIt) {
  for (const std::string victim : {"positives.bin", "train"}) {
    TempDir t;
    const std::string copy = t.file("data");
    fs::copy(data(), copy, fs::copy_options::recursive);
    std::string name = victim;
    if (victim == "train")
      for (const auto& e : fs::directory_iterator(copy))
        if (e.path().filename().string().rfind("train", 0) == 0)
          name = e.path().filename().string();
    ASSERT_TRUE(fs::remove(copy + "/" + name)) << name;
    fs::create_directory(copy + "/" + name);
    const auto r = run("timeout 120 " + bin("ncf_dist") + " --device cpu --data_dir " + copy +
                       " --batch_size 100 --threads 1 --progress off --max_steps 1 "
                       "--train_epochs 1");
    EXPECT_NE(r.exit_code, 0) << name << "\n" << r.output;
    EXPECT_NE(r.output.find("ncf_dist: error: "), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(copy + "/" + name), std::string::npos) << name << "\n" << r.output;
  }
}

// A checkpoint's recorded flags meet the ranges of the command line, and the
// refusal names the manifest; a JSON -1 is not taken as the seed 2^64 - 1.
TEST_F(DataRanges, ManifestFlagsOutOfRangeAreRefusedNamingTheManifest) {
  {
    TempDir t;
    const std::string copy = edited_checkpoint(t, "seed", -1);
    const auto r = run("timeout 120 " + bin("ncf_recommend") + " --device cpu --checkpoint " +
                       copy + " --data_dir " + data() + " --users 0 --threads 1");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(copy + "/manifest.json: flag --seed must be >= 0, got -1"),
              std::string::npos)
        << r.output;
  }
  {
    TempDir t;
    const std::string copy = edited_checkpoint(t, "learning_rate", 0);
    const auto r = run(bin("ncf_export") + " --checkpoint " + copy + " --format npy --output " +
                       t.file("npy"));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(copy + "/manifest.json: flag --learning_rate must be > 0, got 0"),
              std::string::npos)
        << r.output;
  }
  {
    // A width past the range is refused before the model's shape is built
    // from it (ncf_export would otherwise size the tower first).
    TempDir t;
    const std::string copy = edited_checkpoint(t, "layers", {64, 1 << 30});
    const auto r = run(bin("ncf_export") + " --checkpoint " + copy + " --format npy --output " +
                       t.file("npy"));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(copy + "/manifest.json: flag --layers"), std::string::npos) << r.output;
  }
  {
    TempDir t;
    const std::string copy = edited_checkpoint(t, "num_neg", 1001);
    const auto r = run("timeout 120 " + bin("ncf_recommend") + " --device cpu --checkpoint " +
                       copy + " --data_dir " + data() + " --users 0 --threads 1");
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("manifest.json: flag --num_neg must be in [0, 1000], got 1001"),
              std::string::npos)
        << r.output;
  }
  // The checkpoint as written is served.
  const auto r = run("timeout 120 " + bin("ncf_recommend") + " --device cpu --checkpoint " + ck() +
                     " --data_dir " + data() + " --users 0 --threads 1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// --embedding_lr: given, it wins (negative: --learning_rate); not given, the Adam
// family takes --learning_rate and sgd, adagrad and rowwise_adagrad their own rate
// for the preset (docs/training.md's table), and the start-up line's words say which.
TEST(EmbeddingLr, TheFlagBeatsEachOptimizersDefaultForEachPreset) {
  auto parsed = [](std::vector<std::string> args) {
    args.insert(args.begin(), {"ncf_dist", "--data_dir", "/nonexistent"});
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    TrainConfig c;
    int code = -1;
    EXPECT_TRUE(parse_train_flags(int(argv.size()), argv.data(), &c, &code));
    return c;
  };
  struct Expected {
    const char* preset;
    double adam_lr, sgd, adagrad, rowwise;
  };
  for (const Expected& e :
       {Expected{"ncf-paper", 0.001, 30, 10, 0.1},
        Expected{"ml-20m-mlperf", 0.0045, 1000, 100, 0.3}, Expected{"", 0.001, 30, 10, 0.1}}) {
    const std::string preset = e.preset;
    const std::vector<std::string> base =
        preset.empty() ? std::vector<std::string>{} : std::vector<std::string>{"--preset", preset};
    const std::string for_preset = preset.empty() ? "" : " for " + preset;
    for (const auto& [opt, rate] :
         {std::pair{"dense_adam", -1.0}, std::pair{"lazy_adam", -1.0}, std::pair{"sgd", e.sgd},
          std::pair{"adagrad", e.adagrad}, std::pair{"rowwise_adagrad", e.rowwise}}) {
      std::vector<std::string> args = base;
      args.insert(args.end(), {"--embedding_optimizer", opt});
      TrainConfig c = parsed(args);
      EXPECT_EQ(c.embedding_lr, rate) << opt << for_preset;
      EXPECT_EQ(default_embedding_lr(opt, preset), rate) << opt << for_preset;
      EXPECT_FALSE(c.embedding_lr_given);
      std::ostringstream expected;
      if (rate < 0) {
        expected << "embedding lr " << e.adam_lr << " (--learning_rate)";
        EXPECT_EQ(effective_embedding_lr(c), e.adam_lr) << opt << for_preset;
      } else {
        expected << "embedding lr " << rate << " (" << opt << "'s default" << for_preset << ")";
        EXPECT_EQ(effective_embedding_lr(c), rate) << opt << for_preset;
      }
      EXPECT_EQ(embedding_lr_description(c), expected.str());
      // The flag beats the default, and a negative one means --learning_rate.
      args.insert(args.end(), {"--embedding_lr", "0.05"});
      c = parsed(args);
      EXPECT_EQ(c.embedding_lr, 0.05) << opt << for_preset;
      EXPECT_TRUE(c.embedding_lr_given);
      EXPECT_EQ(embedding_lr_description(c), "embedding lr 0.05 (--embedding_lr)");
      args.back() = "-1";
      c = parsed(args);
      EXPECT_EQ(effective_embedding_lr(c), e.adam_lr) << opt << for_preset;
      std::ostringstream inherited;
      inherited << "embedding lr " << e.adam_lr << " (--learning_rate, as --embedding_lr < 0 asks)";
      EXPECT_EQ(embedding_lr_description(c), inherited.str());
      // --learning_rate moves the Adam family's embedding rate, not the others'.
      args.pop_back();
      args.pop_back();
      args.insert(args.end(), {"--learning_rate", "0.002"});
      c = parsed(args);
      EXPECT_EQ(effective_embedding_lr(c), rate < 0 ? 0.002 : rate) << opt << for_preset;
    }
  }
}

// The start-up line states the embedding optimizer's rate and where it came from.
TEST_F(DataRanges, TheStartUpLineStatesTheEmbeddingRateAndWhereItCameFrom) {
  for (const auto& [flags, words] :
       {std::pair{"--preset ncf-paper --embedding_optimizer rowwise_adagrad",
                  "embedding optimizer rowwise_adagrad, embedding lr 0.1 (rowwise_adagrad's "
                  "default for ncf-paper)"},
        std::pair{"--embedding_optimizer sgd --embedding_lr 0.5",
                  "embedding optimizer sgd, embedding lr 0.5 (--embedding_lr)"},
        std::pair{"--learning_rate 0.002",
                  "embedding optimizer dense_adam, embedding lr 0.002 (--learning_rate)"}}) {
    const auto r = run(train(1, std::string(flags) + " --max_steps 1 --train_epochs 1 --no_eval"));
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    EXPECT_NE(r.output.find(words), std::string::npos) << flags << "\n" << r.output;
  }
}

}  // namespace
}  // namespace ncf
