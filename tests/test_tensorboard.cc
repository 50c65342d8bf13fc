// TensorBoard event files (ncf_dist --tensorboard_dir). The writer's files read
// back frame by frame (both masked CRC-32Cs recomputed here) and record by
// record with the generated proto; whole ncf_dist runs read by an independent
// reader (tests/tensorboard/read_events.js: npm's tfrecord and protobufjs,
// with TensorBoard's field numbers from its own .proto) and held against their
// --metrics_json lines and against a run that logs every step; the step axis
// across a resume and a preemption, a new file per run, one file from rank 0
// under mpirun, nothing with --eval_only, and a refused directory named on
// every rank.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "common/check.h"
#include "data/crc32c.h"
#include "data/format.h"
#include "test_util.h"
#include "train/tensorboard.h"
#include "train/tensorboard_event.pb.h"

namespace ncf {
namespace {

namespace fs = std::filesystem;
using test::bin;
using test::run;
using test::TempDir;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<std::string> event_files(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0)
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The records of an event file through the repository's frame reader (which
// checks both CRCs) and the generated proto.
std::vector<tensorboard::Event> read_records(const std::string& path) {
  std::vector<tensorboard::Event> out;
  RecordReader reader(path);
  std::string payload;
  while (reader.read(&payload)) {
    out.emplace_back();
    EXPECT_TRUE(out.back().ParseFromString(payload)) << path << " record " << out.size() - 1;
  }
  return out;
}

uint32_t le32(const std::string& b, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | uint8_t(b[at + size_t(i)]);
  return v;
}
uint64_t le64(const std::string& b, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | uint8_t(b[at + size_t(i)]);
  return v;
}
// TFRecord's mask, written out here from its definition rather than taken
// from data/format.h, which the writer uses.
uint32_t masked(const void* p, size_t n) {
  const uint32_t c = crc32c(p, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// Walks the frames of a file byte by byte: each length and payload CRC
// recomputed and compared; returns the number of frames (-1 on a bad one).
int check_frames(const std::string& path) {
  const std::string b = test::read_file(path);
  size_t at = 0;
  int frames = 0;
  while (at < b.size()) {
    if (b.size() - at < 16) return -1;
    const uint64_t len = le64(b, at);
    if (le32(b, at + 8) != masked(b.data() + at, 8)) return -1;
    if (b.size() - at - 16 < len) return -1;
    if (le32(b, at + 12 + len) != masked(b.data() + at + 12, len)) return -1;
    at += 16 + len;
    ++frames;
  }
  return frames;
}

// ------------------------------------------------------------- the writer ---

TEST(TensorBoardWriter, FramesAndRecordsReadBack) {
  TempDir d;
  const double before = unix_now();
  std::string path;
  {
    TensorBoardWriter w(d.file("runs/a"));  // created, parents too
    path = w.path();
    w.session_start(1);
    w.scalar("train/loss", 10, 0.6931471805599453);
    w.scalar("train/loss", 20, 0.25);
    w.scalar(tb_eval_tag("HR", 10), 20, 0.123456789);
    w.scalar("epoch/allreduce_seconds", 20, 0.0);
    w.close();
  }
  const double after = unix_now();
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const std::string name = fs::path(path).filename().string();
  EXPECT_EQ(fs::path(path).parent_path().string(), d.file("runs/a"));
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(name.substr(name.size() - std::strlen(host) - 1), "." + std::string(host)) << name;
  const std::string secs = name.substr(20, name.size() - 20 - std::strlen(host) - 1);
  EXPECT_NEAR(std::stod(secs), before, 2.0) << name;

  EXPECT_EQ(check_frames(path), 6);
  const std::vector<tensorboard::Event> e = read_records(path);
  ASSERT_EQ(e.size(), 6u);
  EXPECT_EQ(e[0].what_case(), tensorboard::Event::kFileVersion);
  EXPECT_EQ(e[0].file_version(), "brain.Event:2");
  EXPECT_EQ(e[0].step(), 0);
  EXPECT_EQ(e[1].what_case(), tensorboard::Event::kSessionLog);
  EXPECT_EQ(e[1].session_log().status(), tensorboard::SessionLog::START);
  EXPECT_EQ(e[1].step(), 1);
  const struct {
    const char* tag;
    int64_t step;
    float value;
  } want[] = {{"train/loss", 10, 0.6931471805599453f},
              {"train/loss", 20, 0.25f},
              {"eval/HR@10", 20, 0.123456789f},
              {"epoch/allreduce_seconds", 20, 0.0f}};
  for (size_t k = 0; k < 4; ++k) {
    const tensorboard::Event& x = e[k + 2];
    ASSERT_EQ(x.what_case(), tensorboard::Event::kSummary) << k;
    ASSERT_EQ(x.summary().value_size(), 1) << k;
    EXPECT_EQ(x.summary().value(0).tag(), want[k].tag);
    EXPECT_EQ(x.summary().value(0).value_case(), tensorboard::Summary::Value::kSimpleValue);
    EXPECT_EQ(x.summary().value(0).simple_value(), want[k].value) << want[k].tag;
    EXPECT_EQ(x.step(), want[k].step) << want[k].tag;
  }
  for (const tensorboard::Event& x : e) {
    EXPECT_GE(x.wall_time(), before - 1e-3);
    EXPECT_LE(x.wall_time(), after + 1e-3);
  }
}

// A killed run keeps what was flushed: after flush() the records are in the
// file while the writer is still open.
TEST(TensorBoardWriter, FlushedRecordsAreInTheFileWhileItIsOpen) {
  TempDir d;
  TensorBoardWriter w(d.path());
  EXPECT_EQ(read_records(w.path()).size(), 1u);  // file_version, flushed when opened
  w.scalar("train/loss", 5, 1.5);
  w.scalar("train/loss", 10, 1.25);
  w.flush();
  const std::vector<tensorboard::Event> e = read_records(w.path());
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[2].step(), 10);
  EXPECT_EQ(e[2].summary().value(0).simple_value(), 1.25f);
  w.close();
}

TEST(TensorBoardWriter, ADamagedByteFailsItsFrameCrc) {
  TempDir d;
  std::string path;
  {
    TensorBoardWriter w(d.path());
    w.scalar("train/loss", 1, 0.5);
    path = w.path();
    w.close();
  }
  std::string b = test::read_file(path);
  b[b.size() - 6] ^= 0x01;  // inside the scalar's payload
  test::write_file(path, b);
  EXPECT_EQ(check_frames(path), -1);
  try {
    read_records(path);
    ADD_FAILURE() << "a damaged frame was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad payload CRC"), std::string::npos) << e.what();
  }
}

TEST(TensorBoardWriter, TwoWritersInOneSecondWriteTwoFiles) {
  TempDir d;
  TensorBoardWriter a(d.path()), b(d.path());
  EXPECT_NE(a.path(), b.path());
  a.close();
  b.close();
  EXPECT_EQ(event_files(d.path()).size(), 2u);
  for (const std::string& f : event_files(d.path())) EXPECT_EQ(read_records(f).size(), 1u) << f;
}

TEST(TensorBoardWriter, ADirectoryUnderAFileIsRefusedByPath) {
  TempDir d;
  test::write_file(d.file("plain"), "x");
  try {
    TensorBoardWriter w(d.file("plain/tb"));
    ADD_FAILURE() << "opened " << w.path();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(d.file("plain/tb")), std::string::npos) << e.what();
  }
}

// -------------------------------------------------------- ncf_dist runs ---

// One reader output line: {file, step, wall_time} and file_version, tag and
// value, or session_log.
using Line = nlohmann::json;

class TensorBoardRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    // 257 users, ~8.7k train positives: 44 steps of 201 positives per epoch
    // at --batch_size 1005 (as tests/test_resume.cc).
    auto r = run(bin("ncf_prep") +
                 " --synthetic custom --users 257 --items 131 --interactions 9000 "
                 "--eval_negatives 50 --record_rows 300 --num_shards 3 --seed 11 --output " +
                 data() + " --progress off");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    // The reader needs Node and npm (scripts/setup.sh installs both); only
    // their absence skips the tests that read files with it.
    if (run("command -v node && command -v npm").exit_code != 0) {
      no_node_ = new std::string("node or npm is not installed (scripts/setup.sh installs them)");
      return;
    }
    node_dir_ = new std::string(std::string(NCF_BIN_DIR) + "/../tensorboard-node");
    auto i =
        run("bash " + std::string(NCF_SOURCE_DIR) + "/tests/tensorboard/install.sh " + *node_dir_);
    ASSERT_EQ(i.exit_code, 0) << "installing tfrecord and protobufjs:\n" << i.output;
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete no_node_;
    delete node_dir_;
  }
  static std::string data() { return dir_->file("data"); }

  // ncf_dist with the flags, under `timeout 300` (a signal meant for ncf_dist
  // needs it without: timeout passes on only its own kinds).
  static std::string command(int W, const std::string& flags, bool timeout = true) {
    const std::string launch = W == 1 ? "" : test::mpirun(W) + " ";
    return (timeout ? "timeout 300 " : "") + launch + bin("ncf_dist") +
           " --device cpu --data_dir " + data() +
           " --batch_size 1005 --threads 1 --learning_rate 0.01 --progress off " + flags;
  }

  // read_events.js over the files: one JSON object per line.
  static std::vector<Line> read_events(const std::vector<std::string>& files, int expect_exit = 0) {
    std::string cmd = "NODE_PATH=" + *node_dir_ + "/node_modules node " +
                      std::string(NCF_SOURCE_DIR) + "/tests/tensorboard/read_events.js";
    for (const std::string& f : files) cmd += " " + f;
    const test::RunResult r = run(cmd);
    EXPECT_EQ(r.exit_code, expect_exit) << cmd << "\n" << r.output;
    std::vector<Line> out;
    if (r.exit_code != 0) return out;
    std::istringstream in(r.output);
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  static std::vector<nlohmann::json> read_jsonl(const std::string& path) {
    std::vector<nlohmann::json> out;
    std::ifstream f(path);
    std::string line;
    while (std::getline(f, line))
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  // The scalars of `tag`, by step (a step logged twice fails).
  static std::map<int64_t, float> series(const std::vector<Line>& lines, const std::string& tag) {
    std::map<int64_t, float> out;
    for (const Line& l : lines)
      if (l.contains("tag") && l["tag"] == tag) {
        const int64_t step = l["step"];
        EXPECT_EQ(out.count(step), 0u) << tag << " twice at step " << step;
        out[step] = float(l["value"].get<double>());
      }
    return out;
  }

  // The first line is the file_version; steps never go back within a file.
  static void expect_well_formed(const std::vector<Line>& lines, double t0, double t1) {
    ASSERT_FALSE(lines.empty());
    EXPECT_EQ(lines[0].value("file_version", ""), "brain.Event:2") << lines[0].dump();
    EXPECT_EQ(lines[0]["step"], 0);
    double wall = 0;
    for (const Line& l : lines) {
      const double w = l["wall_time"];
      EXPECT_GE(w, t0 - 1) << l.dump();
      EXPECT_LE(w, t1 + 1) << l.dump();
      EXPECT_GE(w, wall) << l.dump();
      wall = w;
    }
  }

  // Every per-epoch scalar equals its --metrics_json number (to float
  // precision) at the step the epoch ended, and there are no others; the
  // epochs' steps are counted from `first_step` (the run's starting step).
  static void expect_epoch_scalars(const std::vector<Line>& lines,
                                   const std::vector<nlohmann::json>& metrics, int64_t first_step,
                                   bool full) {
    std::vector<std::pair<std::string, std::string>> tags = {
        {"epoch/epoch", "epoch"},
        {"epoch/loss", "loss"},
        {"epoch/samples_per_second", "samples_per_second"},
        {"epoch/train_seconds", "train_seconds"},
        {"epoch/exchange_seconds", "exchange_seconds"},
        {"epoch/compute_seconds", "compute_seconds"},
        {"epoch/allreduce_seconds", "allreduce_seconds"},
        {"eval/HR@10", "hr"},
        {"eval/NDCG@10", "ndcg"},
        {"eval/seconds", "eval_seconds"}};
    if (full) {
      tags.push_back({"eval/full_HR@10", "full_hr"});
      tags.push_back({"eval/full_NDCG@10", "full_ndcg"});
    }
    std::set<std::string> epoch_tags;
    for (const Line& l : lines)
      if (l.contains("tag") && l["tag"].get<std::string>().rfind("train/", 0) != 0)
        epoch_tags.insert(l["tag"].get<std::string>());
    std::set<std::string> want;
    for (const auto& [tag, key] : tags) want.insert(tag);
    EXPECT_EQ(epoch_tags, want);
    for (const auto& [tag, key] : tags) {
      const std::map<int64_t, float> s = series(lines, tag);
      EXPECT_EQ(s.size(), metrics.size()) << tag;
      int64_t step = first_step;
      for (const nlohmann::json& m : metrics) {
        step += m["steps"].get<int64_t>();
        const auto it = s.find(step);
        ASSERT_NE(it, s.end()) << tag << " has nothing at step " << step << " (epoch " << m["epoch"]
                               << ")";
        EXPECT_EQ(it->second, float(m[key].get<double>()))
            << tag << " at step " << step << " vs --metrics_json " << key;
      }
    }
  }

  static TempDir* dir_;
  static std::string* no_node_;
  static std::string* node_dir_;
};
TempDir* TensorBoardRun::dir_ = nullptr;
std::string* TensorBoardRun::no_node_ = nullptr;
std::string* TensorBoardRun::node_dir_ = nullptr;

#define NEEDS_NODE() \
  if (no_node_) GTEST_SKIP() << *no_node_

const std::vector<std::string> kTrainTags = {"train/loss", "train/samples_per_second",
                                             "train/step_exchange_ms", "train/step_compute_ms",
                                             "train/step_allreduce_ms"};

// Two epochs of 44 steps with full ranking, logging the training scalars every
// step, then every 30: every epoch scalar is its --metrics_json number; the
// every-step losses average to the epoch loss; each 30-step window (the second
// spans the epoch boundary) averages the every-step losses it covers.
TEST_F(TensorBoardRun, EpochScalarsAreTheMetricsJsonNumbersAndWindowsAverageTheSteps) {
  NEEDS_NODE();
  TempDir t;
  const double t0 = unix_now();
  auto r = run(command(1,
                       "--train_epochs 2 --eval_full_ranking --tensorboard_every_steps 1 "
                       "--tensorboard_dir " +
                           t.file("tb1") + " --metrics_json " + t.file("m1.jsonl")));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto r30 = run(command(1, "--train_epochs 2 --tensorboard_every_steps 30 --tensorboard_dir " +
                                t.file("tb30") + " --metrics_json " + t.file("m30.jsonl")));
  ASSERT_EQ(r30.exit_code, 0) << r30.output;
  const double t1 = unix_now();

  const std::vector<std::string> files = event_files(t.file("tb1"));
  ASSERT_EQ(files.size(), 1u);
  const std::vector<Line> lines = read_events(files);
  expect_well_formed(lines, t0, t1);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[1].value("session_log", ""), "START") << lines[1].dump();
  EXPECT_EQ(lines[1]["step"], 1);
  const std::vector<nlohmann::json> metrics = read_jsonl(t.file("m1.jsonl"));
  ASSERT_EQ(metrics.size(), 2u);
  ASSERT_EQ(metrics[0]["steps"], 44);
  expect_epoch_scalars(lines, metrics, 0, true);

  // Every step 1..88 has each training scalar.
  for (const std::string& tag : kTrainTags) {
    const std::map<int64_t, float> s = series(lines, tag);
    ASSERT_EQ(s.size(), 88u) << tag;
    EXPECT_EQ(s.begin()->first, 1) << tag;
    EXPECT_EQ(s.rbegin()->first, 88) << tag;
    for (const auto& [step, v] : s) {
      EXPECT_TRUE(std::isfinite(v)) << tag << " step " << step;
      EXPECT_GE(v, 0.0f) << tag << " step " << step;
    }
  }
  const std::map<int64_t, float> loss = series(lines, "train/loss");
  const std::map<int64_t, float> sps = series(lines, "train/samples_per_second");
  const std::map<int64_t, float> compute = series(lines, "train/step_compute_ms");
  for (int64_t step = 1; step <= 88; ++step) {
    EXPECT_GT(sps.at(step), 0.0f) << step;
    EXPECT_GT(compute.at(step), 0.0f) << step;
  }
  for (int e = 0; e < 2; ++e) {
    double sum = 0;
    for (int64_t step = 44 * e + 1; step <= 44 * (e + 1); ++step) sum += loss.at(step);
    const double epoch_loss = metrics[size_t(e)]["loss"];
    EXPECT_NEAR(sum / 44, epoch_loss, 1e-6 * epoch_loss) << "epoch " << e + 1;
  }

  // Every 30 steps: 30 and 60 (88 steps: no 90); the same trajectory.
  const std::vector<Line> lines30 = read_events(event_files(t.file("tb30")));
  expect_well_formed(lines30, t0, t1);
  expect_epoch_scalars(lines30, read_jsonl(t.file("m30.jsonl")), 0, false);
  for (const std::string& tag : kTrainTags) {
    std::vector<int64_t> steps;
    for (const auto& [step, v] : series(lines30, tag)) steps.push_back(step);
    EXPECT_EQ(steps, (std::vector<int64_t>{30, 60})) << tag;
  }
  const std::map<int64_t, float> loss30 = series(lines30, "train/loss");
  for (int64_t end : {30, 60}) {
    double sum = 0;
    for (int64_t step = end - 29; step <= end; ++step) sum += loss.at(step);
    EXPECT_NEAR(loss30.at(end), sum / 30, 1e-6 * sum / 30) << "the window ending at " << end;
  }

  // The reader checks the frames: one changed byte and it refuses the file.
  std::string b = test::read_file(files[0]);
  b[b.size() / 2] ^= 0x10;
  test::write_file(t.file("damaged"), b);
  read_events({t.file("damaged")}, 1);
}

// Under mpirun with 2 ranks: rank 0 writes one file per run. The run stops
// after epoch 1 with its checkpoint, and a resumed run (another
// --tensorboard_every_steps: an output flag, not one the checkpoint holds)
// writes a second file whose steps go on from the first's.
TEST_F(TensorBoardRun, TwoRanksWriteOneFileAndAResumedRunContinuesTheSteps) {
  NEEDS_NODE();
  TempDir t;
  const std::string tb = " --tensorboard_dir " + t.file("tb");
  const std::string ck = " --checkpoint_dir " + t.file("ck");
  const double t0 = unix_now();
  auto a = run(command(2, "--train_epochs 1 --tensorboard_every_steps 10" + tb + ck +
                              " --metrics_json " + t.file("m1.jsonl")));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(event_files(t.file("tb")).size(), 1u) << "ranks other than 0 wrote files";
  const std::string first = event_files(t.file("tb"))[0];
  auto b = run(command(2,
                       "--train_epochs 2 --allow_changed_flags train_epochs --resume auto "
                       "--tensorboard_every_steps 20" +
                           tb + ck + " --metrics_json " + t.file("m2.jsonl")));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  ASSERT_NE(b.output.find("resuming from"), std::string::npos) << b.output;
  const double t1 = unix_now();
  std::vector<std::string> files = event_files(t.file("tb"));
  ASSERT_EQ(files.size(), 2u);
  files.erase(std::find(files.begin(), files.end(), first));
  const std::string second = files[0];

  const std::vector<Line> l1 = read_events({first}), l2 = read_events({second});
  expect_well_formed(l1, t0, t1);
  expect_well_formed(l2, t0, t1);
  expect_epoch_scalars(l1, read_jsonl(t.file("m1.jsonl")), 0, false);
  for (const std::string& tag : kTrainTags) {
    std::vector<int64_t> steps;
    for (const auto& [step, v] : series(l1, tag)) steps.push_back(step);
    EXPECT_EQ(steps, (std::vector<int64_t>{10, 20, 30, 40})) << tag;
  }
  int64_t last1 = 0;
  for (const Line& l : l1) last1 = std::max<int64_t>(last1, l["step"]);
  EXPECT_EQ(last1, 44);

  // The resumed run starts at step 45 (its START), evaluates epoch 1 again at
  // step 44 as its --metrics_json says, and logs every 20 steps from there.
  ASSERT_GE(l2.size(), 2u);
  EXPECT_EQ(l2[1].value("session_log", ""), "START") << l2[1].dump();
  EXPECT_EQ(l2[1]["step"], last1 + 1);
  for (size_t k = 1; k < l2.size(); ++k) EXPECT_GE(l2[k]["step"], last1) << l2[k].dump();
  const std::vector<nlohmann::json> m2 = read_jsonl(t.file("m2.jsonl"));
  ASSERT_EQ(m2.size(), 2u);
  EXPECT_EQ(m2[0]["epoch"], 1);
  EXPECT_EQ(m2[0]["steps"], 0);  // epoch 1 ended at the checkpoint
  expect_epoch_scalars(l2, m2, 44, false);
  for (const std::string& tag : kTrainTags) {
    std::vector<int64_t> steps;
    for (const auto& [step, v] : series(l2, tag)) steps.push_back(step);
    EXPECT_EQ(steps, (std::vector<int64_t>{60, 80})) << tag;
  }
}

// SIGUSR1 stops the run at a step boundary with a checkpoint (exit 75): what
// it logged is in its file, and the resumed run's file takes the steps on. The
// signal comes as step 20's line is out (test::signal_after: the run cannot go
// on far before it is there, let alone end).
TEST_F(TensorBoardRun, APreemptedRunLeavesAReadableFile) {
  NEEDS_NODE();
  TempDir t;
  const std::string f =
      "--train_epochs 30 --step_log --tensorboard_every_steps 5"
      " --tensorboard_dir " +
      t.file("tb") + " --checkpoint_dir " + t.file("ck");
  const test::RunResult r =
      run("timeout 300 " +
          test::signal_after("stdbuf -oL " + command(1, f, false), t.file("log"), "^step 20:"));
  const std::string log = test::read_file(t.file("log"));
  ASSERT_EQ(r.exit_code, 75) << r.output << log;
  ASSERT_EQ(event_files(t.file("tb")).size(), 1u);
  const std::string first = event_files(t.file("tb"))[0];
  const std::vector<Line> l1 = read_events({first});
  // The checkpoint's step is where the run stopped.
  const size_t at = log.find("ncf_dist: checkpoint ");
  ASSERT_NE(at, std::string::npos) << log;
  const size_t s = log.find(": step ", at);
  ASSERT_NE(s, std::string::npos) << log;
  const int64_t stopped = std::stoll(log.substr(s + 7));
  ASSERT_GE(stopped, 20);
  std::vector<int64_t> steps;
  for (const auto& [step, v] : series(l1, "train/loss")) steps.push_back(step);
  std::vector<int64_t> want;
  for (int64_t k = 5; k <= stopped; k += 5) want.push_back(k);
  EXPECT_EQ(steps, want) << "stopped at step " << stopped;

  // The resumed run goes on to the end of the epoch after the one it stopped in
  // (epochs of 44 steps), wherever that was.
  const int64_t epochs = stopped / 44 + 2, last = epochs * 44;
  auto b = run(command(1, "--train_epochs " + std::to_string(epochs) +
                              " --allow_changed_flags train_epochs --resume auto "
                              "--tensorboard_every_steps 5 --tensorboard_dir " +
                              t.file("tb") + " --checkpoint_dir " + t.file("ck")));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  std::vector<std::string> files = event_files(t.file("tb"));
  ASSERT_EQ(files.size(), 2u);
  files.erase(std::find(files.begin(), files.end(), first));
  const std::vector<Line> l2 = read_events(files);
  ASSERT_GE(l2.size(), 2u);
  EXPECT_EQ(l2[1].value("session_log", ""), "START");
  EXPECT_EQ(l2[1]["step"], stopped + 1);
  const std::map<int64_t, float> loss2 = series(l2, "train/loss");
  ASSERT_FALSE(loss2.empty());
  EXPECT_EQ(loss2.begin()->first, (stopped / 5 + 1) * 5);
  EXPECT_EQ(loss2.rbegin()->first, last / 5 * 5) << epochs << " epochs of 44 steps";
}

// SIGKILL (no handler, no exit path) keeps what was flushed: the training
// scalars up to the last group written before the kill, and with per-epoch
// scalars only, those of the epochs that ended. The kill comes once the
// --step_log line of a later step is out: ncf_dist prints it after it wrote
// and flushed them.
TEST_F(TensorBoardRun, AKilledRunKeepsWhatWasFlushed) {
  NEEDS_NODE();
  // The kill comes at the `times`-th "step S:" line (S counts from 0 in each
  // epoch of 44 steps): global step 21, or step 50 in epoch 2.
  for (const auto& [every, S, times] : {std::tuple{5, 20, 1}, std::tuple{0, 5, 2}}) {
    TempDir t;
    const std::string f = "--train_epochs 30 --step_log --tensorboard_every_steps " +
                          std::to_string(every) + " --tensorboard_dir " + t.file("tb");
    const test::RunResult r =
        run("timeout 300 " + test::signal_after("stdbuf -oL " + command(1, f, false), t.file("log"),
                                                "^step " + std::to_string(S) + ":", "KILL", times));
    ASSERT_EQ(r.exit_code, 137) << r.output << test::read_file(t.file("log"));
    ASSERT_EQ(event_files(t.file("tb")).size(), 1u);
    const std::vector<Line> lines = read_events(event_files(t.file("tb")));
    if (every > 0) {
      std::vector<int64_t> steps;
      for (const auto& [step, v] : series(lines, "train/loss")) steps.push_back(step);
      ASSERT_GE(steps.size(), 4u) << "the groups up to step 20 were not in the file";
      for (size_t k = 0; k < steps.size(); ++k) EXPECT_EQ(steps[k], int64_t(5 * (k + 1)));
    } else {
      EXPECT_TRUE(series(lines, "train/loss").empty());
      const std::map<int64_t, float> loss = series(lines, "epoch/loss");
      ASSERT_FALSE(loss.empty()) << "epoch 1's scalars were not in the file";
      EXPECT_EQ(loss.begin()->first, 44);
    }
  }
}

// --eval_only evaluates a checkpoint and writes no event file: the directory
// is not even created.
TEST_F(TensorBoardRun, EvalOnlyWritesNothing) {
  TempDir t;
  auto a = run(command(1, "--train_epochs 1 --max_steps 5 --checkpoint_dir " + t.file("ck")));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto b = run(command(1, "--eval_only --resume auto --checkpoint_dir " + t.file("ck") +
                              " --tensorboard_dir " + t.file("tb")));
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_NE(b.output.find("eval of the checkpoint"), std::string::npos) << b.output;
  EXPECT_FALSE(fs::exists(t.file("tb"))) << b.output;
}

// A directory that cannot be written stops the job before training, with the
// flag and the path, on one rank and on two (no rank left waiting); a
// negative --tensorboard_every_steps is refused by name.
TEST_F(TensorBoardRun, AnUnwritableDirectoryStopsEveryRankByName) {
  TempDir t;
  test::write_file(t.file("plain"), "x");
  const std::string bad = t.file("plain/tb");
  for (int W : {1, 2}) {
    auto r = run(command(W, "--train_epochs 1 --tensorboard_dir " + bad));
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.exit_code, 124) << "timed out: a rank was left waiting\n" << r.output;
    EXPECT_NE(r.output.find("flag --tensorboard_dir " + bad + ": cannot write event files there"),
              std::string::npos)
        << "W=" << W << "\n"
        << r.output;
    EXPECT_EQ(r.output.find("samples/s"), std::string::npos) << "it trained\n" << r.output;
  }
  auto r = run(command(1, "--tensorboard_every_steps -1 --tensorboard_dir " + t.file("tb")));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("flag --tensorboard_every_steps must be >= 0, got -1"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(t.file("tb")));
}

}  // namespace
}  // namespace ncf
