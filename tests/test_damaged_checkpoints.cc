// Damaged checkpoints with the real programs, real files and real mpirun: one
// changed byte in any kind of checkpoint file (table rows, optimizer state, id
// map, tower, manifest) of the only sealed checkpoint stops --resume auto on
// every rank with a message naming the checkpoint and the fault (W = 1 and
// W = 3), instead of training from step 0; of two, the older one is taken, the
// same as resuming an intact copy of it, and the damaged one is named; an
// unsealed one is skipped quietly; --resume auto_or_restart starts over and
// says so; ncf_export --verify finds every damaged file and passes every whole
// checkpoint; retention keeps the checkpoints that load; every reader given a
// directory follows the same rule; the Slurm scripts' check before resuming.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/checkpoint.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;
using test::bin;
using test::run;
using test::TempDir;

// One kind of damage: the file changed and what the message says about it.
struct Damage {
  std::string kind, file, fault;
  // The fault as a message gives it for the checkpoint at `path`.
  std::string fault_in(const std::string& path) const {
    return file == kCheckpointManifestFile ? path + "/" + file + ": " + fault : fault;
  }
};

class Damaged : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // String ids, so that checkpoints carry a copy of the id maps.
    std::string text = "user,item,time\n";
    std::mt19937 gen(5);
    for (int u = 0; u < 60; ++u)
      for (int k = 0; k < 6; ++k)
        text += "user-" + std::to_string(u) + ",sku-" + std::to_string(gen() % 40) + "," +
                std::to_string(k) + "\n";
    test::write_file(dir_->file("log.csv"), text);
    auto r = run(bin("ncf_prep") + " --input " + dir_->file("log.csv") +
                 " --format csv --columns user=user,item=item,timestamp=time --eval_negatives 5 "
                 "--output " +
                 data() + " --progress off");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // Checkpoints at steps 4, 8 and 12 (the end of each epoch).
    r = run("timeout 120 " + command(1, "") + " --checkpoint_every_steps 4 --keep_checkpoints 10 " +
            "--checkpoint_dir " + base() + " --save_params " + dir_->file("fresh.bin"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    ASSERT_TRUE(fs::exists(ck(base(), 12))) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->file("data"); }
  static std::string base() { return dir_->file("base"); }
  static TempDir* dir_;

  static std::string ck(const std::string& dir, int64_t step) {
    return dir + "/" + checkpoint_name(step);
  }

  // ncf_dist on the small set: 3 epochs of 4 steps; each flag unless `flags` sets it.
  static std::string command(int W, const std::string& flags) {
    std::string cmd = (W == 1 ? std::string() : test::mpirun(W) + " ") + bin("ncf_dist") +
                      " --device cpu --data_dir " + data() +
                      " --batch_size 60 --max_steps 4 --threads 1 --layers 16,8 "
                      "--num_factors 4 --no_eval --progress off";
    if (flags.find("--train_epochs ") == std::string::npos) cmd += " --train_epochs 3";
    return cmd + " " + flags;
  }

  // Copies checkpoints of base() into dir.
  static void copy(const std::string& dir, std::initializer_list<int64_t> steps) {
    fs::create_directories(dir);
    for (int64_t s : steps) fs::copy(ck(base(), s), ck(dir, s), fs::copy_options::recursive);
  }

  // The file of each kind, as the checkpoint names it.
  static std::vector<Damage> damages() {
    const nlohmann::json m =
        nlohmann::json::parse(test::read_file(ck(base(), 4) + "/" + kCheckpointManifestFile));
    std::string ids, state;
    for (const auto& f : m["files"]) {
      const std::string name = f["name"];
      if (name.rfind("user_ids", 0) == 0) ids = name;
      if (name == "item.v.f32") state = name;
    }
    EXPECT_FALSE(ids.empty()) << m.dump();
    EXPECT_FALSE(state.empty()) << m.dump();
    std::vector<Damage> out;
    for (const auto& [kind, file] :
         std::vector<std::pair<std::string, std::string>>{{"rows", "user.rows.f32"},
                                                          {"optimizer state", state},
                                                          {"id map", ids},
                                                          {"tower", "tower.f32"}})
      out.push_back({kind, file, "file " + file + " has CRC-32C 0x"});
    out.push_back({"manifest", kCheckpointManifestFile, "the content does not match its crc32c"});
    return out;
  }

  // One byte of d.file in the checkpoint at `path` changed (in the manifest: a
  // digit of a value, so that it still parses).
  static void damage(const std::string& path, const Damage& d) {
    const std::string file = path + "/" + d.file;
    std::string bytes = test::read_file(file);
    ASSERT_GT(bytes.size(), 2u) << file;
    size_t at = bytes.size() / 2;
    if (d.file == kCheckpointManifestFile) {
      at = bytes.find("\"world\": ");
      ASSERT_NE(at, std::string::npos) << bytes;
      at += std::strlen("\"world\": ");
      bytes[at] = bytes[at] == '1' ? '2' : '1';
    } else {
      bytes[at] = char(bytes[at] ^ 0x10);
    }
    test::write_file(file, bytes);
  }

  // A run that must fail by a message (never by a rank left waiting).
  static void expect_refused(const test::RunResult& r, const std::vector<std::string>& says,
                             const std::string& what) {
    EXPECT_NE(r.exit_code, 0) << what << "\n" << r.output;
    EXPECT_NE(r.exit_code, 124) << "a rank was left waiting: " << what << "\n" << r.output;
    for (const std::string& s : says)
      EXPECT_NE(r.output.find(s), std::string::npos) << what << ": no \"" << s << "\" in\n"
                                                     << r.output;
  }
};
TempDir* Damaged::dir_ = nullptr;

TEST_F(Damaged, TheOnlySealedCheckpointDamagedStopsEveryRankNamingIt) {
  for (const Damage& d : damages())
    for (int W : {1, 3}) {
      TempDir t;
      const std::string dir = t.file("ck");
      copy(dir, {4});
      damage(ck(dir, 4), d);
      const std::string what = d.kind + " at W = " + std::to_string(W);
      const test::RunResult r =
          run("timeout 120 " + command(W, "--resume auto --checkpoint_dir " + dir +
                                              " --save_params " + t.file("p.bin")));
      expect_refused(r,
                     {"flag --resume auto: --checkpoint_dir " + dir +
                          " holds 1 sealed checkpoint and none loads: " + ck(dir, 4) + ": " +
                          d.fault_in(ck(dir, 4)),
                      "pass --resume auto_or_restart to start from step 0 on purpose"},
                     what);
      // Nothing was trained or written.
      EXPECT_FALSE(fs::exists(t.file("p.bin"))) << what;
      int entries = 0;
      for (const auto& e : fs::directory_iterator(dir))
        entries += e.path().filename().string().find("step-") != std::string::npos;
      EXPECT_EQ(entries, 1) << what << ": the directory changed\n" << r.output;
    }
}

TEST_F(Damaged, TheNewestDamagedResumesTheOlderOneAsAnIntactCopyWouldNamingIt) {
  for (int W : {1, 3}) {
    // The reference: resumed from an intact copy of step 4, named by path.
    TempDir ref;
    copy(ref.file("src"), {4});
    auto r = run("timeout 120 " +
                 command(W, "--resume " + ck(ref.file("src"), 4) + " --checkpoint_dir " +
                                ref.file("ck") + " --save_params " + ref.file("p.bin")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string want = test::read_file(ref.file("p.bin"));
    ASSERT_FALSE(want.empty());
    const std::vector<Damage> all = damages();
    // Every kind at W = 1; at W = 3 one (the decision does not depend on the kind).
    for (const Damage& d : W == 1 ? all : std::vector<Damage>{all[0]}) {
      TempDir t;
      const std::string dir = t.file("ck");
      copy(dir, {4, 8});
      damage(ck(dir, 8), d);
      const std::string what = d.kind + " at W = " + std::to_string(W);
      r = run("timeout 120 " + command(W, "--resume auto --checkpoint_dir " + dir +
                                              " --save_params " + t.file("p.bin")));
      ASSERT_EQ(r.exit_code, 0) << what << "\n" << r.output;
      EXPECT_NE(r.output.find("ncf_dist: checkpoint directory " + dir +
                              ": 2 sealed checkpoints (steps 8, 4)"),
                std::string::npos)
          << what << "\n"
          << r.output;
      EXPECT_NE(r.output.find("ncf_dist: warning: skipping sealed checkpoint " + ck(dir, 8) +
                              ", which does not load: " + d.fault_in(ck(dir, 8))),
                std::string::npos)
          << what << "\n"
          << r.output;
      EXPECT_NE(r.output.find("ncf_dist: resuming from " + ck(dir, 4) +
                              " (step 4, epoch 1 after 4 of its steps); the newer sealed "
                              "checkpoint named above does not load"),
                std::string::npos)
          << what << "\n"
          << r.output;
      EXPECT_EQ(test::read_file(t.file("p.bin")), want)
          << what << ": not the run resumed from an intact copy";
    }
  }
}

TEST_F(Damaged, UnsealedCheckpointsAreSkippedQuietly) {
  TempDir t;
  const std::string dir = t.file("ck");
  copy(dir, {4, 8});
  fs::remove(ck(dir, 8) + "/" + kCheckpointManifestFile);  // as if never finished
  fs::create_directories(dir + "/.tmp-" + checkpoint_name(12));
  test::write_file(dir + "/.tmp-" + checkpoint_name(12) + "/user.rows.f32", "partial");
  auto r = run("timeout 120 " + command(1, "--resume auto --checkpoint_dir " + dir));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ncf_dist: resuming from " + ck(dir, 4)), std::string::npos) << r.output;
  // One short line of the resume names the unsealed one (and one of retention,
  // which leaves it); no warning, no error.
  int lines = 0;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (line.find(checkpoint_name(8)) != std::string::npos) {
      lines += line.rfind("ncf_dist: skipping " + ck(dir, 8) + ": not sealed", 0) == 0;
      EXPECT_NE(line.find("not sealed (no manifest.json"), std::string::npos) << line;
      EXPECT_LT(line.size(), 200u) << line;
    }
  EXPECT_EQ(lines, 1) << r.output;
  std::istringstream again(r.output);
  for (std::string line; std::getline(again, line);)
    EXPECT_FALSE(
        line.find("checkpoint") != std::string::npos &&
        (line.find("warning") != std::string::npos || line.find("error") != std::string::npos))
        << line;
  // Only unsealed ones: a start from step 0, no error.
  TempDir u;
  fs::create_directories(ck(u.file("ck"), 8));
  r = run("timeout 120 " + command(1, "--resume auto --checkpoint_dir " + u.file("ck")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ncf_dist: no sealed checkpoint in " + u.file("ck") +
                          " (1 unsealed skipped): starting from step 0"),
            std::string::npos)
      << r.output;
}

// auto_or_restart starts from step 0 where auto stops, naming what it
// skipped; the damaged checkpoint stays, neither removed nor counted by
// retention, which keeps the newest one that loads.
TEST_F(Damaged, AutoOrRestartStartsOverNamingWhatItSkippedAndKeepsIt) {
  TempDir t;
  const std::string dir = t.file("ck");
  copy(dir, {4});
  const Damage d = damages()[3];  // tower
  damage(ck(dir, 4), d);
  const auto r =
      run("timeout 120 " + command(1, "--resume auto_or_restart --checkpoint_dir " + dir +
                                          " --checkpoint_every_steps 3 "
                                          "--keep_checkpoints 1 --save_params " +
                                          t.file("p.bin")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ncf_dist: --resume auto_or_restart: none of the 1 sealed checkpoint "
                          "in " +
                          dir + " loads (" + ck(dir, 4) + ": " + d.fault_in(ck(dir, 4))),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("): starting from step 0, as asked; they stay in " + dir),
            std::string::npos)
      << r.output;
  // The run from step 0 is the fresh run.
  EXPECT_EQ(test::read_file(t.file("p.bin")), test::read_file(dir_->file("fresh.bin")));
  // Steps 3, 6, 9, 12 written, keep 1: 12 stays, and the damaged 4, with a note.
  EXPECT_TRUE(fs::exists(ck(dir, 12)));
  EXPECT_FALSE(fs::exists(ck(dir, 9)));
  EXPECT_TRUE(fs::exists(ck(dir, 4) + "/tower.f32"));
  EXPECT_NE(
      r.output.find("ncf_dist: retention left " + ck(dir, 4) +
                    " alone: it did not load when this run started (" + d.fault_in(ck(dir, 4))),
      std::string::npos)
      << r.output;
}

// auto_or_restart, like auto, needs the directory to look in.
TEST_F(Damaged, AutoOrRestartWithoutACheckpointDirIsRefusedByName) {
  expect_refused(run("timeout 120 " + command(1, "--resume auto_or_restart")),
                 {"flag --resume auto_or_restart needs --checkpoint_dir (where to look)"},
                 "no --checkpoint_dir");
}

// --keep_checkpoints N keeps N that load: a damaged newer one takes no place.
TEST_F(Damaged, KeepCheckpointsCountsOnlyCheckpointsThatLoad) {
  TempDir t;
  const std::string dir = t.file("ck");
  copy(dir, {4, 12});
  damage(ck(dir, 12), damages()[0]);
  // Resumed at 4 for one more epoch (to step 8), a checkpoint every 2 steps, keep 2.
  auto r =
      run("timeout 120 " + command(1, "--resume auto --checkpoint_dir " + dir +
                                          " --train_epochs 2 --allow_changed_flags train_epochs "
                                          "--checkpoint_every_steps 2 --keep_checkpoints 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(ck(dir, 12)));  // damaged: kept, not counted
  EXPECT_TRUE(fs::exists(ck(dir, 8)));
  EXPECT_TRUE(fs::exists(ck(dir, 6)));
  EXPECT_FALSE(fs::exists(ck(dir, 4)));
  // The next start takes 8, naming 12.
  r = run("timeout 120 " + command(1, "--resume auto --checkpoint_dir " + dir +
                                          " --train_epochs 2 --allow_changed_flags train_epochs"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ncf_dist: checkpoint directory " + dir +
                          ": 3 sealed checkpoints (steps 12, 8, 6)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("skipping sealed checkpoint " + ck(dir, 12)), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ncf_dist: resuming from " + ck(dir, 8)), std::string::npos) << r.output;
}

TEST_F(Damaged, VerifyFindsEveryDamagedFileAndPassesEveryWholeCheckpoint) {
  const std::string verify = "timeout 120 " + bin("ncf_export") + " --verify ";
  auto r = run(verify + base());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int64_t step : {4, 8, 12})
    EXPECT_NE(r.output.find("ncf_export: " + ck(base(), step) + ": whole: step " +
                            std::to_string(step) + " (epoch "),
              std::string::npos)
        << r.output;
  for (const std::string& s :
       {std::string(", dataset "), std::string("tables user 60 x "),
        std::string(", table dtype fp32, exchange dtype fp32, embedding optimizer dense_adam"),
        "ncf_export: --verify " + base() + ": 3 checkpoints, all whole"})
    EXPECT_NE(r.output.find(s), std::string::npos) << s << "\n" << r.output;
  r = run(verify + ck(base(), 8));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const Damage& d : damages()) {
    TempDir t;
    const std::string dir = t.file("ck");
    copy(dir, {4, 8});
    damage(ck(dir, 8), d);
    r = run(verify + dir);
    expect_refused(r,
                   {"ncf_export: " + ck(dir, 8) + ": DAMAGED: " + d.fault_in(ck(dir, 8)),
                    "ncf_export: " + ck(dir, 4) + ": whole: step 4",
                    "flag --verify " + dir + ": 1 of 2 sealed checkpoints damaged: " + ck(dir, 8) +
                        ": " + d.fault_in(ck(dir, 8))},
                   d.kind);
    r = run(verify + ck(dir, 8));
    expect_refused(r, {"flag --verify " + ck(dir, 8) + ": 1 of 1 sealed checkpoint damaged"},
                   d.kind);
  }
  // Nothing to verify is an error too; so is another flag with it.
  TempDir e;
  expect_refused(run(verify + e.path()), {"flag --verify " + e.path() + ": no sealed checkpoint"},
                 "empty");
  expect_refused(run(verify + base() + " --format npy"),
                 {"flag --format does not go with --verify"}, "--format");
}

// ncf_recommend, ncf_export, --eval_only and --init_from given a directory:
// the newest checkpoint that loads, naming the damaged newer one; none when
// none loads, naming it.
TEST_F(Damaged, EveryReaderOfADirectoryTakesTheNewestThatLoadsOrStops) {
  TempDir t;
  const std::string dir = t.file("ck");
  copy(dir, {4, 8});
  const Damage d = damages()[0];
  damage(ck(dir, 8), d);
  const std::string skipped = "skipping sealed checkpoint " + ck(dir, 8) + ", which does not load";
  const std::string export_cmd = "timeout 120 " + bin("ncf_export") + " --checkpoint " + dir +
                                 " --format npy --output " + t.file("npy");
  const std::string recommend_cmd =
      "timeout 120 " + bin("ncf_recommend") + " --device cpu --threads 1 --checkpoint " + dir +
      " --data_dir " + data() + " --users user-0,user-1 --output " + t.file("rec.csv");
  const std::string eval_cmd =
      "timeout 120 " + command(2, "--eval_only --resume auto --checkpoint_dir " + dir);
  const std::string init_cmd = "timeout 120 " + command(1, "--init_from " + dir);
  for (const std::string& cmd : {export_cmd, recommend_cmd, eval_cmd, init_cmd}) {
    const auto r = run(cmd);
    EXPECT_EQ(r.exit_code, 0) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find(skipped), std::string::npos) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find(ck(dir, 4)), std::string::npos) << cmd << "\n" << r.output;
  }
  fs::remove_all(ck(dir, 4));
  const std::string none = " and none loads: " + ck(dir, 8) + ": " + d.fault_in(ck(dir, 8));
  expect_refused(run(export_cmd),
                 {"flag --checkpoint " + dir + ": the directory holds 1 sealed checkpoint" + none},
                 "export");
  expect_refused(run(recommend_cmd),
                 {"flag --checkpoint " + dir + ": the directory holds 1 sealed checkpoint" + none},
                 "recommend");
  expect_refused(
      run(eval_cmd),
      {"flag --resume auto: --checkpoint_dir " + dir + " holds 1 sealed checkpoint" + none},
      "eval_only");
  expect_refused(run(init_cmd),
                 {"flag --init_from " + dir + ": the directory holds 1 sealed checkpoint" + none},
                 "init_from");
  // --eval_only with no checkpoint at all evaluates nothing.
  TempDir e;
  expect_refused(
      run("timeout 120 " +
          command(1, "--eval_only --resume auto --checkpoint_dir " + e.file("ck"))),
      {"flag --eval_only: --resume auto found no checkpoint to evaluate in " + e.file("ck")},
      "eval_only, empty");
}

// The Slurm scripts' check before a start resumes (launch/slurm/preempt.sh),
// with the real ncf_export: nothing to check, some whole, none whole.
TEST_F(Damaged, TheSlurmScriptsCheckBeforeResumingAndStopWhenNoneLoads) {
  auto verify = [](const std::string& dir) {
    return run("bash -c 'source " + std::string(NCF_SOURCE_DIR) +
               "/launch/slurm/preempt.sh && verify_checkpoints " + dir + " " + bin("ncf_export") +
               "'");
  };
  TempDir t;
  const std::string dir = t.file("ck");
  auto r = verify(dir);  // a first start: no directory yet
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(r.output.empty()) << r.output;
  copy(dir, {4, 8});
  const Damage d = damages()[1];
  damage(ck(dir, 8), d);
  r = verify(dir);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(ck(dir, 8) + ": DAMAGED: " + d.fault_in(ck(dir, 8))), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("resuming from the newest whole one"), std::string::npos) << r.output;
  fs::remove_all(ck(dir, 4));
  r = verify(dir);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(ck(dir, 8) + ": DAMAGED: " + d.fault_in(ck(dir, 8))), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("no sealed checkpoint in " + dir + " loads (above), so the job stops"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("RESUME=auto_or_restart"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ncf
