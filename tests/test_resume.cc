// Checkpoint and resume with the real ncf_dist under real mpirun, against the
// run that was never interrupted: at the same W the resumed trajectory is the
// same bit for bit (epoch loss, HR, NDCG and every final parameter); at
// another W, or with another placement, it stays within the tolerance of
// trajectory invariance. A signal stops every rank at one step boundary with
// a checkpoint and exit code 75; bad resumes end with a message. One job
// holds a checkpoint directory: a second one is refused, a dead holder is
// taken over, and the lock goes with every end of the job that holds it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train/checkpoint.h"
#include "train/checkpoint_lock.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;

constexpr double kLossRel = 1e-5;  // as test_distributed.cc
constexpr double kParamAbs = 2e-5;

class Resume : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // 257 users, ~8.7k train positives: 44 steps of 201 positives per epoch.
    for (const auto& [name, seed] : {std::pair{"data", 11}, std::pair{"other", 12}}) {
      auto r = run(bin("ncf_prep") +
                   " --synthetic custom --users 257 --items 131 --interactions 9000 "
                   "--eval_negatives 50 --record_rows 300 --num_shards 3 --seed " +
                   std::to_string(seed) + " --output " + dir_->file(name) + " --progress off");
      ASSERT_EQ(r.exit_code, 0) << r.output;
    }
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->file("data"); }
  static TempDir* dir_;

  struct Run {
    int exit_code = -1;
    std::vector<nlohmann::json> epochs;  // the epochs this run trained
    std::vector<float> params;
    std::string output;
  };

  // The common flags, each unless `flags` sets it (the parser takes a flag once).
  static std::string command(int W, const std::string& flags, const TempDir& t) {
    const std::string launch = W == 1 ? "" : test::mpirun(W) + " ";
    std::string cmd = launch + bin("ncf_dist") + " --device cpu --data_dir " + data();
    for (const auto& [flag, value] :
         {std::pair{"--batch_size", "1005"}, std::pair{"--train_epochs", "2"},
          std::pair{"--threads", "1"}, std::pair{"--learning_rate", "0.01"},
          std::pair{"--progress", "off"}})
      if (flags.find(std::string(flag) + " ") == std::string::npos)
        cmd += std::string(" ") + flag + " " + value;
    return cmd + " " + flags + " --metrics_json " + t.file("m.jsonl") + " --save_params " +
           t.file("p.bin");
  }

  static Run collect(const test::RunResult& r, const TempDir& t) {
    Run out;
    out.exit_code = r.exit_code;
    out.output = r.output;
    std::ifstream f(t.file("m.jsonl"));
    std::string line;
    while (std::getline(f, line)) out.epochs.push_back(nlohmann::json::parse(line));
    if (std::filesystem::exists(t.file("p.bin"))) {
      const std::string bytes = test::read_file(t.file("p.bin"));
      out.params.resize(bytes.size() / 4);
      std::memcpy(out.params.data(), bytes.data(), out.params.size() * 4);
    }
    return out;
  }

  static Run train(int W, const std::string& flags, int expect_exit = 0) {
    TempDir t;
    const std::string cmd = command(W, flags, t);
    Run out = collect(run("timeout 300 " + cmd), t);
    EXPECT_EQ(out.exit_code, expect_exit) << cmd << "\n" << out.output;
    return out;
  }

  // `resumed` trained the last epochs of `whole`: the same numbers, bit for bit.
  static void expect_identical(const Run& whole, const Run& resumed, const std::string& what) {
    ASSERT_GE(whole.epochs.size(), resumed.epochs.size()) << what;
    ASSERT_FALSE(resumed.epochs.empty()) << what << "\n" << resumed.output;
    const size_t skip = whole.epochs.size() - resumed.epochs.size();
    for (size_t e = 0; e < resumed.epochs.size(); ++e) {
      const nlohmann::json& a = whole.epochs[skip + e];
      const nlohmann::json& b = resumed.epochs[e];
      EXPECT_EQ(a["epoch"], b["epoch"]) << what;
      EXPECT_EQ(double(a["loss"]), double(b["loss"])) << what << " epoch " << a["epoch"];
      EXPECT_EQ(double(a["hr"]), double(b["hr"])) << what << " epoch " << a["epoch"];
      EXPECT_EQ(double(a["ndcg"]), double(b["ndcg"])) << what << " epoch " << a["epoch"];
    }
    ASSERT_EQ(whole.params.size(), resumed.params.size()) << what;
    ASSERT_GT(whole.params.size(), 0u);
    EXPECT_EQ(std::memcmp(whole.params.data(), resumed.params.data(), whole.params.size() * 4), 0)
        << what << ": the final parameters differ";
  }

  // Within the tolerance of trajectory invariance (test_distributed.cc).
  static void expect_close(const Run& whole, const Run& resumed, const std::string& what) {
    ASSERT_GE(whole.epochs.size(), resumed.epochs.size()) << what;
    ASSERT_FALSE(resumed.epochs.empty()) << what << "\n" << resumed.output;
    const size_t skip = whole.epochs.size() - resumed.epochs.size();
    for (size_t e = 0; e < resumed.epochs.size(); ++e) {
      const double la = whole.epochs[skip + e]["loss"], lb = resumed.epochs[e]["loss"];
      EXPECT_NEAR(la, lb, kLossRel * std::fabs(la)) << what;
      EXPECT_NEAR(double(whole.epochs[skip + e]["hr"]), double(resumed.epochs[e]["hr"]), 1.01 / 257)
          << what;
    }
    ASSERT_EQ(whole.params.size(), resumed.params.size()) << what;
    double worst = 0;
    for (size_t k = 0; k < whole.params.size(); ++k)
      worst = std::max(worst, std::fabs(double(whole.params[k]) - resumed.params[k]));
    EXPECT_LE(worst, kParamAbs) << what;
  }

  static std::string ckpt(const TempDir& d, int64_t step) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%012lld", static_cast<long long>(step));
    return d.file("ck/") + name;
  }
};
TempDir* Resume::dir_ = nullptr;

TEST_F(Resume, SameWorldSizeContinuesTheIdenticalTrajectory) {
  for (int W : {1, 2}) {
    const std::string w = "W=" + std::to_string(W);
    const Run plain = train(W, "--shard_plan row");
    TempDir d;
    const std::string ck = " --checkpoint_dir " + d.file("ck");
    const Run whole = train(W,
                            "--shard_plan row --checkpoint_every_steps 10 --keep_checkpoints 100 "
                            "--checkpoint_chunk_kib 1" +
                                ck);
    // Taking checkpoints does not change the run.
    expect_identical(plain, whole, w + ", checkpointing");
    // 10 and 40: inside epoch 1 (44 steps); 44: its end, before its eval; 50
    // and 80: inside epoch 2.
    for (int64_t step : {10, 40, 44, 50, 80}) {
      if (step == 44) {
        // No periodic checkpoint falls there; one written by a resumed run does.
        TempDir e;
        train(W, "--shard_plan row --train_epochs 1 --checkpoint_dir " + e.file("ck"));
        expect_identical(
            whole,
            train(W, "--shard_plan row --checkpoint_dir " + e.file("ck") +
                         " --allow_changed_flags train_epochs --resume " + ckpt(e, 44)),
            w + ", resumed at the end of epoch 1");
        continue;
      }
      ASSERT_TRUE(std::filesystem::exists(ckpt(d, step))) << whole.output;
      expect_identical(whole, train(W, "--shard_plan row" + ck + "x --resume " + ckpt(d, step)),
                       w + ", resumed at step " + std::to_string(step));
    }
  }
}

TEST_F(Resume, AnotherWorldSizeOrPlacementFollowsTheTrajectory) {
  TempDir d;
  const std::string ck = " --checkpoint_dir " + d.file("ck");
  // Written in chunks of 6 rows (1 KiB), read back in one: the chunking is
  // not part of the format.
  const Run whole = train(3,
                          "--shard_plan row --checkpoint_every_steps 25 --keep_checkpoints 10 "
                          "--checkpoint_chunk_kib 1" +
                              ck);
  for (int64_t step : {25, 50}) {
    const std::string from = " --checkpoint_dir " + d.file("x") + " --resume " + ckpt(d, step);
    const std::string at = " from W=3 row-wise at step " + std::to_string(step);
    expect_close(whole, train(2, "--shard_plan row" + from), "W=2 row-wise" + at);
    expect_close(whole, train(4, "--shard_plan replicated --checkpoint_chunk_kib 2" + from),
                 "W=4 replicated, read in chunks of 12 rows" + at);
    expect_close(whole, train(1, "" + from), "W=1" + at);
    expect_close(whole, train(2, "--shard_plan user=table,item=row --dedup" + from),
                 "W=2 table/row with dedup" + at);
  }
  // And back: a replicated W=2 checkpoint into row-wise W=3.
  TempDir e;
  const Run rep = train(
      2,
      "--shard_plan replicated --checkpoint_every_steps 30 --keep_checkpoints 9 --checkpoint_dir " +
          e.file("ck"));
  expect_close(
      rep,
      train(3, "--shard_plan row --checkpoint_dir " + e.file("x") + " --resume " + ckpt(e, 30)),
      "W=3 row-wise from W=2 replicated at step 30");
}

TEST_F(Resume, OptimizerStateOfEveryOptimizerIsRestored) {
  for (const std::string opt :
       {"lazy_adam", "sgd --embedding_lr 0.5", "adagrad --embedding_lr 0.01",
        "rowwise_adagrad --embedding_lr 0.05"}) {
    TempDir d;
    const std::string f = "--shard_plan row --embedding_optimizer " + opt;
    const Run whole = train(2, f + " --checkpoint_every_steps 30 --checkpoint_dir " + d.file("ck"));
    expect_identical(
        whole, train(2, f + " --checkpoint_dir " + d.file("x") + " --resume " + ckpt(d, 60)), opt);
  }
  // Row-wise Adagrad's accumulators ([N x 1] files) go to the new owners like
  // the rows: W = 2's checkpoint resumed at W = 3 row-wise and at W = 1.
  TempDir d;
  const std::string f = "--embedding_optimizer rowwise_adagrad --embedding_lr 0.05";
  const Run whole = train(
      2,
      f + " --shard_plan row --checkpoint_every_steps 30 --keep_checkpoints 9 --checkpoint_dir " +
          d.file("ck"));
  EXPECT_TRUE(std::filesystem::exists(ckpt(d, 30) + "/user.row_accumulator.f32"));
  EXPECT_EQ(std::filesystem::file_size(ckpt(d, 30) + "/user.row_accumulator.f32") * 40,
            std::filesystem::file_size(ckpt(d, 30) + "/user.rows.f32"))
      << "one float per row, D = 40 floats per row";
  expect_close(whole,
               train(3, f + " --shard_plan row --checkpoint_dir " + d.file("x") + " --resume " +
                            ckpt(d, 30)),
               "rowwise_adagrad: W=3 from W=2 at step 30");
  expect_close(whole,
               train(1, f + " --shard_plan row --checkpoint_dir " + d.file("y") + " --resume " +
                            ckpt(d, 30)),
               "rowwise_adagrad: W=1 from W=2 at step 30");
}

// sgd, adagrad and rowwise_adagrad have their own default rate now; before, they
// took --learning_rate's, and their checkpoints record --embedding_lr -1 (as one
// written with --embedding_lr -1 does today). Resumed without --embedding_lr, such
// a checkpoint keeps the rate it was written with, says so, and the run continues
// the identical trajectory and records -1 again; a checkpoint of the default rate
// records it and resumes without a word; a different rate given is refused unless
// allowed.
TEST_F(Resume, ACheckpointKeepsItsEmbeddingRateWhenTheFlagIsNotGiven) {
  auto recorded_lr = [](const std::string& ck) {
    return nlohmann::json::parse(test::read_file(ck + "/manifest.json"))["config"]["embedding_lr"];
  };
  const std::string f = "--embedding_optimizer rowwise_adagrad";
  {
    TempDir d;
    const Run whole = train(1, f +
                                   " --embedding_lr -1 --checkpoint_every_steps 30 "
                                   "--keep_checkpoints 9 --checkpoint_dir " +
                                   d.file("ck"));
    EXPECT_EQ(recorded_lr(ckpt(d, 30)), -1);
    const Run resumed =
        train(1, f + " --checkpoint_dir " + d.file("x") + " --resume " + ckpt(d, 30));
    expect_identical(whole, resumed, "rowwise_adagrad at --learning_rate's rate, resumed");
    EXPECT_NE(
        resumed.output.find("embedding lr 0.01 (--learning_rate, as checkpoint " + ckpt(d, 30) +
                            " records): kept, as no --embedding_lr was given (instead of "
                            "embedding lr 0.1 (rowwise_adagrad's default))"),
        std::string::npos)
        << resumed.output;
    for (const auto& e : std::filesystem::directory_iterator(d.file("x"))) {
      if (e.path().filename().string().rfind("step-", 0) == 0) {
        EXPECT_EQ(recorded_lr(e.path().string()), -1) << e.path();
      }
    }
    const Run r = train(
        1, f + " --embedding_lr 0.1 --checkpoint_dir " + d.file("y") + " --resume " + ckpt(d, 30),
        1);
    EXPECT_NE(r.output.find("was written with --embedding_lr -1.0, this run has --embedding_lr 0.1 "
                            "(pass --allow_changed_flags embedding_lr to change it)"),
              std::string::npos)
        << r.output;
  }
  TempDir d;
  const Run whole = train(1, f +
                                 " --checkpoint_every_steps 30 --keep_checkpoints 9 "
                                 "--checkpoint_dir " +
                                 d.file("ck"));
  EXPECT_EQ(recorded_lr(ckpt(d, 30)), 0.1);
  const Run resumed = train(1, f + " --checkpoint_dir " + d.file("x") + " --resume " + ckpt(d, 30));
  expect_identical(whole, resumed, "rowwise_adagrad at its default rate, resumed");
  EXPECT_EQ(resumed.output.find("kept, as no --embedding_lr"), std::string::npos) << resumed.output;
}

// BF16 rows: a resumed run continues the identical trajectory (the rows are
// stored widened, exactly, and the rounding keys carry no state); a checkpoint
// of the other dtype is refused unless converting is allowed, which says what
// it converted.
TEST_F(Resume, Bf16RowsResumeIdenticallyAndConvertOnlyWhenAsked) {
  TempDir d;
  const std::string f = "--shard_plan row --table_dtype bf16";
  const Run whole = train(2, f + " --checkpoint_every_steps 30 --checkpoint_dir " + d.file("ck"));
  expect_identical(whole,
                   train(2, f + " --checkpoint_dir " + d.file("x") + " --resume " + ckpt(d, 60)),
                   "bf16 rows resumed at step 60");
  expect_close(whole, train(3, f + " --checkpoint_dir " + d.file("w") + " --resume " + ckpt(d, 60)),
               "bf16 rows resharded from W=2 to W=3 at step 60");
  const auto refused = run(
      "timeout 120 " +
      command(2, "--shard_plan row --resume " + ckpt(d, 60) + " --checkpoint_dir " + d.file("y"),
              d));
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("was written with --table_dtype \"bf16\", this run has "
                                "--table_dtype \"fp32\" (pass --allow_changed_flags "
                                "table_dtype to convert the tables)"),
            std::string::npos)
      << refused.output;
  const Run widened = train(2, "--shard_plan row --allow_changed_flags table_dtype --resume " +
                                   ckpt(d, 60) + " --checkpoint_dir " + d.file("z"));
  EXPECT_NE(widened.output.find("table rows converted from bf16 to fp32 (widened, exact)"),
            std::string::npos)
      << widened.output;
}

// --precision bf16 keeps the tower's activations and gradients in BF16, derived
// from the FP32 master weights each step: a checkpoint (FP32 weights and Adam
// state) resumes the identical trajectory, at W = 1 and 2, inside an epoch.
TEST_F(Resume, Bf16TowerResumesIdentically) {
  for (int W : {1, 2}) {
    TempDir d;
    const std::string f = "--shard_plan row --precision bf16";
    const Run whole =
        train(W, f + " --checkpoint_every_steps 20 --keep_checkpoints 100 --checkpoint_dir " +
                     d.file("ck"));
    for (int64_t step : {20, 60})
      expect_identical(
          whole,
          train(W, f + " --checkpoint_dir " + d.file("x" + std::to_string(step)) + " --resume " +
                       ckpt(d, step)),
          "bf16 tower, W=" + std::to_string(W) + ", resumed at step " + std::to_string(step));
    const Run fp32 = train(W, "--shard_plan row --precision fp32");
    ASSERT_FALSE(fp32.epochs.empty());
    EXPECT_NE(double(fp32.epochs[0]["loss"]), double(whole.epochs[0]["loss"]))
        << "--precision bf16 gave the fp32 loss: the BF16 tower did not run";
  }
}

// A signal lands in the middle of a step, wherever the process is; run on the
// interrupted stack, the handler's frame corrupted the heap in about 1 of 25
// such stops (glibc aborted in the next tower product's free). 24 stops of a
// one-rank run, each sent as step 20's line is out, must all end with exit 75.
// (test::signal_after: the run cannot have ended, nor gone far, before the
// signal is there, since 30 epochs print 240 KB of step lines; and the line
// it waits for is this run's own output, never an earlier run's left in a log.)
TEST_F(Resume, StoppingMidStepNeverCorruptsTheProcess) {
  TempDir t;
  const std::string cmd = "stdbuf -oL " + command(1,
                                                  "--shard_plan row --train_epochs 30 --step_log "
                                                  "--checkpoint_dir " +
                                                      t.file("ck"),
                                                  t);
  for (int k = 1; k <= 24; ++k) {
    std::filesystem::remove_all(t.file("ck"));
    std::filesystem::remove(t.file("log"));
    const test::RunResult r =
        run("timeout 300 " + test::signal_after(cmd, t.file("log"), "^step 20:"));
    EXPECT_EQ(r.exit_code, 75) << "run " << k << "\n" << r.output << test::read_file(t.file("log"));
  }
}

// A signal at any rank stops every rank at one step boundary: a checkpoint,
// exit code 75, and --resume auto finishes the identical run.
TEST_F(Resume, SignalStopsTheJobWithACheckpointAndAutoResumeFinishesIt) {
  for (const auto& [W, sig] : {std::pair{2, "USR1"}, std::pair{1, "TERM"}}) {
    const std::string what = "W=" + std::to_string(W) + " SIG" + sig;
    // 30 epochs of 44 steps, whose step lines (240 KB) could not get past the
    // unread pipe of test::signal_after: the signal, sent as step 20's line is
    // out, lands long before the end.
    const std::string f = "--shard_plan row --train_epochs 30 --step_log";
    const Run whole = train(W, f);
    TempDir d, t;
    const std::string ck = " --checkpoint_dir " + d.file("ck");
    // Line-buffered output, so the log shows each step as it ends; the signal
    // goes to mpirun (which forwards SIGUSR1 to the ranks: the ranks write their
    // output themselves, and are held until they have the signal) or the process.
    std::string cmd = command(W, f + ck, t);
    if (W > 1) {
      const size_t at = cmd.find(bin("ncf_dist"));
      cmd.insert(at, test::signal_rank() + "stdbuf -oL ");
    } else {
      cmd = "stdbuf -oL " + cmd;
    }
    const test::RunResult r =
        run("timeout 300 " +
            test::signal_after(cmd, t.file("log"), "^step 20:", sig, 1, 0, W > 1 ? W : 0));
    const std::string log = test::read_file(t.file("log"));
    ASSERT_EQ(r.exit_code, 75) << what << "\n" << r.output << log;
    EXPECT_NE(log.find(std::string("stopped by SIG") + sig), std::string::npos) << log;
    EXPECT_NE(log.find("ncf_dist: checkpoint "), std::string::npos) << log;
    // It stopped before the end, so the run left epochs to train.
    EXPECT_EQ(log.find("\n    30 "), std::string::npos) << log;
    const Run resumed = train(W, f + ck + " --resume auto");
    EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
    // The epochs the stopped run finished and the resumed run's are the whole run's.
    const Run stopped = collect(r, t);
    EXPECT_EQ(stopped.epochs.size() + resumed.epochs.size(), 30u) << what;
    for (size_t e = 0; e < stopped.epochs.size(); ++e)
      EXPECT_EQ(double(stopped.epochs[e]["loss"]), double(whole.epochs[e]["loss"])) << what;
    expect_identical(whole, resumed, what);
  }
}

// SIGKILL (no handler runs) at many instants while a run checkpoints after
// every step, and a double SIGTERM (the second ends the process at once):
// --resume auto always finds a whole checkpoint, and the run it finishes is
// the uninterrupted one, bit for bit.
TEST_F(Resume, KilledAtAnyInstantLeavesALoadableCheckpoint) {
  // 16 epochs (704 steps, each checkpointed, each commit a line): the 12 runs
  // together take at most 24 commits plus what a one-page pipe holds after each
  // kill's line (test::signal_after), far from the end.
  const std::string f = "--shard_plan row --train_epochs 16";
  const Run whole = train(1, f);
  TempDir d, t;
  const std::string ck = " --checkpoint_dir " + d.file("ck") + " --keep_checkpoints 2";
  const std::string cmd = "stdbuf -oL " + command(1, f + ck + " --checkpoint_every_steps 1", t);
  // Each kill waits for the run to commit 1-3 more checkpoints, then lands a
  // few milliseconds later: the instants are spread over steps, checkpoint
  // writes and evals by the run's own progress, not by the machine's speed.
  const std::string committed = "^ncf_dist: checkpoint /";
  int killed_mid_run = 0;
  for (int k = 0; k < 12; ++k) {
    const std::string resume = k == 0 ? "" : " --resume auto";
    std::filesystem::remove(t.file("log"));
    const test::RunResult r =
        run("timeout 300 " + test::signal_after(cmd + resume, t.file("log"), committed, "KILL",
                                                1 + k % 3, 0.001 * k));
    const bool killed = r.exit_code == 137;
    killed_mid_run += killed;
    if (!killed)
      ADD_FAILURE() << "run " << k << " was not ended by its kill (exit " << r.exit_code << "):\n"
                    << r.output << test::read_file(t.file("log"));
  }
  EXPECT_EQ(killed_mid_run, 12) << "a run ended before its kill";
  // Two SIGTERMs in a row: stopped at once, or after its checkpoint when the
  // two arrive as one. Not by its end: the run cannot get there before them.
  std::filesystem::remove(t.file("log"));
  const test::RunResult r =
      run("timeout 300 " +
          test::signal_after(cmd + " --resume auto", t.file("log"), committed, "TERM", 1, 0, 0,
                             "kill -TERM $NCF_SIGNAL_PID; kill -TERM $NCF_SIGNAL_PID"));
  EXPECT_TRUE(r.exit_code == 143 || r.exit_code == 75)
      << "exit " << r.exit_code << "\n"
      << r.output << test::read_file(t.file("log"));
  const Run resumed = train(1, f + ck + " --resume auto");
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("skipping"), std::string::npos)
      << "a committed checkpoint was not whole:\n"
      << resumed.output;
  ASSERT_EQ(whole.params.size(), resumed.params.size());
  EXPECT_EQ(std::memcmp(whole.params.data(), resumed.params.data(), whole.params.size() * 4), 0);
}

TEST_F(Resume, RefusesAnotherDatasetOrChangedFlagsByName) {
  TempDir d;
  const std::string ck = " --checkpoint_dir " + d.file("ck");
  train(1, "--max_steps 5 --train_epochs 1" + ck);
  const std::string from = ck + " --resume auto --max_steps 5 --train_epochs 1";
  Run r = train(1, "--batch_size 2010" + from, 1);
  EXPECT_NE(r.output.find("was written with --batch_size 1005, this run has --batch_size 2010"),
            std::string::npos)
      << r.output;
  r = train(1, "--learning_rate 0.02" + from, 1);
  EXPECT_NE(r.output.find("pass --allow_changed_flags learning_rate"), std::string::npos)
      << r.output;
  r = train(1, "--learning_rate 0.02 --allow_changed_flags learning_rate" + from, 0);
  EXPECT_NE(r.output.find("resuming from"), std::string::npos) << r.output;
  TempDir t;
  const test::RunResult o =
      run(bin("ncf_dist") + " --device cpu --data_dir " + dir_->file("other") +
          " --batch_size 1005 --threads 1 --progress off" + from);
  EXPECT_EQ(o.exit_code, 1) << o.output;
  EXPECT_NE(o.output.find("belongs to dataset"), std::string::npos) << o.output;
  r = train(1, "--resume " + d.file("nothing-here") + ck, 1);
  EXPECT_NE(r.output.find("flag --resume " + d.file("nothing-here")), std::string::npos)
      << r.output;
}

// One changed digit in a checkpoint's manifest, in a flag that no program
// compares, is refused by every program that reads checkpoints, naming the
// manifest, before any value of it is used; no rank is left waiting.
TEST_F(Resume, EveryProgramRefusesAManifestWithAChangedDigitNamingIt) {
  TempDir d;
  train(1, "--max_steps 5 --train_epochs 1 --checkpoint_dir " + d.file("ck"));
  const std::string ck = ckpt(d, 5), manifest = ck + "/manifest.json";
  const std::string export_cmd = "timeout 120 " + bin("ncf_export") + " --checkpoint " + ck +
                                 " --format npy --output " + d.file("npy");
  const std::string recommend_cmd = "timeout 120 " + bin("ncf_recommend") +
                                    " --device cpu --checkpoint " + ck + " --data_dir " + data() +
                                    " --users 0,1 --output " + d.file("rec.csv");
  // Untouched, the tools take it (the refusals below are the edit's doing).
  test::RunResult r = run(export_cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(recommend_cmd);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string text = test::read_file(manifest);
  const size_t at = text.find("\"adagrad_init\": -1");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + std::strlen("\"adagrad_init\": -")] = '2';  // not used by dense Adam at all
  test::write_file(manifest, text);
  const std::string why = manifest + ": the content does not match its crc32c";
  for (const std::string& cmd :
       {export_cmd, recommend_cmd,
        "timeout 120 " + command(1, "--resume " + ck + " --max_steps 5 --train_epochs 1", d),
        "timeout 120 " + command(2, "--resume " + ck + " --max_steps 5 --train_epochs 1", d)}) {
    r = run(cmd);
    EXPECT_EQ(r.exit_code, 1) << cmd << "\n" << r.output;
    EXPECT_NE(r.output.find(why), std::string::npos) << cmd << "\n" << r.output;
  }
}

// A manifest sealed with counters no run could have written (as a tool that
// rewrote it, or a fuzzer, would): refused by name, without arithmetic
// overflowing on them.
TEST_F(Resume, ImpossibleCountersInASealedManifestAreRefusedByName) {
  TempDir d;
  train(1, "--max_steps 5 --train_epochs 1 --checkpoint_dir " + d.file("ck"));
  const std::string ck = ckpt(d, 5), manifest = ck + "/manifest.json";
  nlohmann::json j = nlohmann::json::parse(test::read_file(manifest));
  j.erase("crc32c");
  j["epoch_step"] = int64_t(1) << 61;
  j["crc32c"] = checkpoint_manifest_crc32c(j);
  test::write_file(manifest, j.dump(1));
  const Run r = train(1, "--resume " + ck + " --max_steps 5 --train_epochs 1", 1);
  EXPECT_NE(r.output.find("epoch_step 2305843009213693952"), std::string::npos) << r.output;
}

// ------------------------------------------------------------------ lock ---

std::string hostname() {
  char name[256] = "";
  gethostname(name, sizeof name - 1);
  return name;
}

// The lock file's holder (a failure when it is none).
LockHolder lock_holder(const std::string& path) {
  LockHolder h;
  std::string why;
  EXPECT_TRUE(LockHolder::from_json(test::read_file(path), &h, &why)) << path << ": " << why;
  return h;
}

// `h`'s lock in dir, its heartbeat `age` seconds ago.
void plant_lock(const std::string& dir, const std::string& text, double age) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + kCheckpointLockFile;
  test::write_file(path, text);
  struct timespec t[2];
  clock_gettime(CLOCK_REALTIME, &t[0]);
  t[0].tv_sec -= time_t(age);
  t[1] = t[0];
  ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), t, 0), 0);
}

// The value after "KEY=" in text, up to the line's end or a space.
std::string value_of(const std::string& text, const std::string& key) {
  const size_t at = text.find(key + "=");
  if (at == std::string::npos) return "";
  const size_t from = at + key.size() + 1;
  return text.substr(from, text.find_first_of(" \n", from) - from);
}

// Two jobs on one directory: the second, at W = 2, is refused at start naming
// the directory and the holder's host and pid, and writes nothing; the first
// then ends as it would have alone. The first is stopped (SIGSTOP) as its step 5
// line is out, through test::signal_after, so it cannot have ended before (it
// surely holds the directory while the second starts); the script checks that
// it was stopped.
TEST_F(Resume, ASecondJobOnTheDirectoryIsRefusedAndTheFirstEndsAsIfAlone) {
  const std::string f = "--shard_plan row --train_epochs 10 --step_log";
  TempDir a, d, t, t2;
  const Run alone = train(1, f + " --checkpoint_dir " + a.file("ck"));
  const std::string ck = " --checkpoint_dir " + d.file("ck");
  test::write_file(t.file("second.sh"),
                   "pid=$NCF_SIGNAL_PID\n"
                   "kill -STOP $pid\n"
                   // The stop takes effect asynchronously: wait for it.
                   "for i in $(seq 3000); do state=$(cut -d' ' -f3 /proc/$pid/stat); "
                   "case $state in T|Z) break;; esac; sleep 0.01; done\n"
                   "echo first=$pid state=$state\n"
                   "ls -a " +
                       d.file("ck") + " > " + t.file("before") + "\n" + command(2, f + ck, t2) +
                       " > " + t2.file("log") + " 2>&1\n" +
                       "echo second_exit=$?\n"
                       "ls -a " +
                       d.file("ck") + " > " + t.file("after") + "\n" + "kill -CONT $pid\n");
  const test::RunResult r =
      run("timeout 300 " +
          test::signal_after("stdbuf -oL " + command(1, f + ck, t), t.file("log"),
                             "^step 5:", "STOP", 1, 0, 0, "bash " + t.file("second.sh")) +
          "; echo first_exit=$?");
  const std::string pid = value_of(r.output, "first");
  ASSERT_EQ(value_of(r.output, "state"), "T")
      << "the first job was not stopped while it trained: the test proves nothing\n"
      << r.output << test::read_file(t.file("log"));
  const std::string second = test::read_file(t2.file("log"));
  EXPECT_EQ(value_of(r.output, "second_exit"), "1") << second;
  // Whichever rank prints first: each refuses alike, then ends the job.
  EXPECT_NE(second.find("] flag --checkpoint_dir " + d.file("ck") +
                        ": another job holds this directory: ncf_dist pid " + pid + " on host " +
                        hostname() + ", since "),
            std::string::npos)
      << second;
  EXPECT_NE(second.find("that process is running on this host"), std::string::npos) << second;
  EXPECT_EQ(second.find("samples/s"), std::string::npos) << "it trained\n" << second;
  EXPECT_FALSE(std::filesystem::exists(t2.file("m.jsonl"))) << "the refused job wrote metrics";
  EXPECT_EQ(test::read_file(t.file("before")), test::read_file(t.file("after")))
      << "the refused job changed the checkpoint directory";
  EXPECT_EQ(value_of(r.output, "first_exit"), "0") << r.output;
  expect_identical(alone, collect(r, t), "the first job");
  EXPECT_FALSE(std::filesystem::exists(d.file("ck/ncf_dist.lock"))) << "not released";
}

// SIGKILL leaves the lock (no code runs): the next run on this host finds
// its pid gone, takes the directory over with a note, and --resume auto
// finishes the identical run.
TEST_F(Resume, AKilledHoldersLockIsTakenOverAndAutoResumeFinishesTheRun) {
  const std::string f = "--shard_plan row --train_epochs 4";
  const Run whole = train(1, f);
  TempDir d, t;
  const std::string ck = " --checkpoint_dir " + d.file("ck");
  // Killed at its first checkpoint's line through test::signal_after: with
  // --step_log (which changes nothing else) it has far more to print than the
  // unread pipe holds, so it cannot have ended first.
  const test::RunResult r =
      run("timeout 300 " +
          test::signal_after(
              "stdbuf -oL " + command(1, f + ck + " --checkpoint_every_steps 10 --step_log", t),
              t.file("log"), "^ncf_dist: checkpoint /", "KILL", 1, 0, 0,
              "echo pid=$NCF_SIGNAL_PID; kill -KILL $NCF_SIGNAL_PID") +
          "; echo exit=$?");
  ASSERT_EQ(value_of(r.output, "exit"), "137") << r.output << test::read_file(t.file("log"));
  const std::string pid = value_of(r.output, "pid");
  ASSERT_TRUE(std::filesystem::exists(d.file("ck/ncf_dist.lock"))) << "the killed job left none";
  EXPECT_EQ(std::to_string(lock_holder(d.file("ck/ncf_dist.lock")).pid), pid);
  const Run resumed = train(1, f + ck + " --resume auto");
  EXPECT_NE(
      resumed.output.find("ncf_dist: note: flag --checkpoint_dir " + d.file("ck") +
                          ": took over the lock of ncf_dist pid " + pid + " on host " + hostname()),
      std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("no process " + pid + " runs on this host any more"),
            std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  expect_identical(whole, resumed, "resumed after the holder was killed");
  EXPECT_FALSE(std::filesystem::exists(d.file("ck/ncf_dist.lock"))) << "not released";
}

// A lock of another host (its pid cannot be checked here): refused while its
// heartbeat is fresh (at W = 2: every rank ends), taken over with a note once
// it is older than the stale age; a file that is no lock is refused.
TEST_F(Resume, ALockOfAnotherHostIsTakenOverOnlyOnceStaleAndGarbageIsRefused) {
  TempDir d;
  const std::string dir = d.file("ck");
  const std::string ck = " --checkpoint_dir " + dir + " --max_steps 5 --train_epochs 1";
  LockHolder h = LockHolder::self(300);
  h.host = "node-elsewhere";
  h.pid = 4242;
  h.slurm_job = "555";
  h.token = "abababababababab";
  const std::string text = h.to_json().dump() + "\n";
  const std::string holder = "pid 4242 on host node-elsewhere (Slurm job 555), since " + h.since;
  plant_lock(dir, text, 0);
  Run r = train(2, ck, 1);
  EXPECT_NE(r.output.find("] flag --checkpoint_dir " + dir +
                          ": another job holds this directory: ncf_dist " + holder +
                          "; it runs on another host and its heartbeat is "),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(r.epochs.empty()) << r.output;
  EXPECT_EQ(test::read_file(dir + "/ncf_dist.lock"), text);
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + checkpoint_name(5)));
  // Stale: an hour without a heartbeat (the default age is 300 s).
  plant_lock(dir, text, 3600);
  r = train(1, ck);
  EXPECT_NE(r.output.find("ncf_dist: note: flag --checkpoint_dir " + dir +
                          ": took over the lock of ncf_dist " + holder + ": its heartbeat is "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("more than the 300 s after which a lock of another host is stale"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(std::filesystem::exists(dir + "/" + checkpoint_name(5))) << r.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/ncf_dist.lock")) << "not released";
  // No lock of this program: nothing proves its writer gone.
  plant_lock(dir, "locked by hand\n", 3600);
  r = train(1, ck + " --resume auto", 1);
  EXPECT_NE(r.output.find("flag --checkpoint_dir " + dir + ": " + dir +
                          "/ncf_dist.lock is not a lock that ncf_dist wrote (it is no JSON "
                          "object), so this job cannot tell whether another job uses the "
                          "directory; if none does, remove the file and start again"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(test::read_file(dir + "/ncf_dist.lock"), "locked by hand\n");
}

// The lock is there while a job runs (rank 0's pid, this host), and gone after
// it is preempted (SIGUSR1: checkpoint, exit 75), after the resumed run's
// normal end, and after a run that fails (a refused resume): the next run
// takes the directory without taking anything over.
TEST_F(Resume, TheLockIsHeldWhileAJobRunsAndReleasedByPreemptionEndAndError) {
  // 100 steps: what the ranks print after step 20 (80 step lines) is more than the
  // unread pipe of test::signal_after holds, so they are held before the end; the
  // lock is copied while they are, and mpirun passes SIGUSR1 on.
  const std::string f = "--shard_plan row --train_epochs 30 --max_steps 100 --no_eval --step_log";
  TempDir d, t;
  const std::string ck = " --checkpoint_dir " + d.file("ck");
  const std::string lock = d.file("ck/ncf_dist.lock");
  std::string cmd = command(2, f + ck, t);
  cmd.insert(cmd.find(bin("ncf_dist")), test::signal_rank() + "stdbuf -oL ");
  const test::RunResult r = run(
      "timeout 300 " +
      test::signal_after(cmd, t.file("log"), "^step 20:", "USR1", 1, 0, 2,
                         "cp " + lock + " " + t.file("held") + " && kill -USR1 $NCF_SIGNAL_PID") +
      "; echo exit=$?");
  ASSERT_EQ(value_of(r.output, "exit"), "75") << r.output << test::read_file(t.file("log"));
  ASSERT_TRUE(std::filesystem::exists(t.file("held"))) << "no lock while the job ran";
  const LockHolder held = lock_holder(t.file("held"));
  EXPECT_EQ(held.host, hostname());
  EXPECT_NE(held.pid, 0);
  EXPECT_FALSE(std::filesystem::exists(lock)) << "not released at exit 75";
  const Run resumed = train(2, f + ck + " --resume auto");
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  EXPECT_EQ(resumed.output.find("took over"), std::string::npos) << resumed.output;
  EXPECT_FALSE(std::filesystem::exists(lock)) << "not released at the end";
  const Run failed = train(1, f + ck + " --resume auto --batch_size 2010", 1);
  EXPECT_NE(failed.output.find("was written with --batch_size 1005"), std::string::npos)
      << failed.output;
  EXPECT_FALSE(std::filesystem::exists(lock)) << "not released after the error";
  const Run again = train(1, f + ck + " --resume auto");
  EXPECT_EQ(again.output.find("took over"), std::string::npos) << again.output;
}

// An error on a rank other than the holder's (here rank 1 reads a damaged eval
// record that rank 0 never reads) ends the job through run_main's MPI_Abort,
// which kills rank 0 before it could release the lock: rank 1 releases it
// while its exception unwinds, so the next job finds the directory free.
TEST_F(Resume, AnErrorOnARankOtherThanTheHoldersReleasesTheLock) {
  TempDir d;
  std::filesystem::copy(data(), d.file("data"), std::filesystem::copy_options::recursive);
  std::string last;
  for (const auto& e : std::filesystem::directory_iterator(d.file("data")))
    if (e.path().filename().string().rfind("eval-", 0) == 0)
      last = std::max(last, e.path().string());
  ASSERT_FALSE(last.empty());
  {
    // A byte of the last eval record's payload: rank 1 evaluates the last users.
    std::fstream f(last, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-50, std::ios::end);
    const char c = char(f.get());
    f.seekp(-50, std::ios::end);
    f.put(char(~c));
  }
  const test::RunResult r =
      run("timeout 300 " + test::mpirun(2) + " " + bin("ncf_dist") + " --device cpu --data_dir " +
          d.file("data") +
          " --batch_size 1005 --threads 1 --progress off --max_steps 3 --train_epochs 1 "
          "--checkpoint_dir " +
          d.file("ck"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("[rank 1] record file " + last + ": bad payload CRC"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("[rank 0] record file"), std::string::npos) << r.output;
  EXPECT_FALSE(std::filesystem::exists(d.file("ck/ncf_dist.lock"))) << "the lock outlived the job\n"
                                                                    << r.output;
}

}  // namespace
}  // namespace ncf
