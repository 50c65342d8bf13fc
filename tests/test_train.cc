// ncf_dist end to end, as real processes: learning beats popularity, runs are
// deterministic, bad flags stop with a message, and the N-rank trajectory under
// mpirun equals the 1-rank one for every placement, optimizer and --dedup.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/vector_isa.h"
#include "data/dataset.h"
#include "data/reader.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;

// One dataset for the whole file (prep is the slow part).
class TrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto r = run(bin("ncf_prep") +
                 " --synthetic custom --users 300 --items 200 "
                 "--interactions 12000 --eval_negatives 99 --record_rows 512 --num_shards 3 "
                 "--seed 3 --output " +
                 data());
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string data() { return dir_->file("data"); }
  // One CPU epoch with the environment setting `env` (NAME=VALUE) and one without:
  // the first prints `note` and the second does not, and both save the same
  // parameters, byte for byte (a GPU-only switch leaves CPU ranks alone).
  static void expect_switch_noted_and_cpu_alone(const std::string& env, const std::string& note,
                                                const std::string& precision) {
    const std::string args = " --device cpu --data_dir " + data() +
                             " --batch_size 2000 --train_epochs 1 --threads 2 --no_eval "
                             "--precision " +
                             precision;
    const std::string tag = env + " " + precision;
    const std::string a = dir_->file("switch_on_" + precision + ".bin"),
                      b = dir_->file("switch_off_" + precision + ".bin");
    auto with = run(env + " timeout -k 5 120 " + bin("ncf_dist") + args + " --save_params " + a);
    auto without = run("timeout -k 5 120 " + bin("ncf_dist") + args + " --save_params " + b);
    ASSERT_EQ(with.exit_code, 0) << with.output;
    ASSERT_EQ(without.exit_code, 0) << without.output;
    EXPECT_NE(with.output.find(note), std::string::npos) << tag << "\n" << with.output;
    EXPECT_EQ(without.output.find(note), std::string::npos) << tag << "\n" << without.output;
    const std::string pa = test::read_file(a);
    EXPECT_FALSE(pa.empty()) << tag;
    EXPECT_EQ(pa, test::read_file(b)) << tag;
  }
  static TempDir* dir_;
};
TempDir* TrainTest::dir_ = nullptr;

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

// HR@10 of scoring every item by its training popularity, on the same eval
// records, with the same tie rule (the positive loses ties).
double popularity_hr10(const std::string& dir) {
  DatasetMeta m = DatasetMeta::load(dir);
  std::vector<int64_t> count(m.num_items, 0);
  TrainReader tr(dir, m, 0, 1, int64_t(m.num_train), 1, false);
  tr.start_epoch(0);
  TrainBatch b;
  while (tr.next(&b))
    for (int32_t i : b.items) ++count[i];
  EvalReader er(dir, m, 0, 1, 64);
  er.start();
  EvalBatch e;
  const int64_t L = m.eval_negatives + 1;
  double hits = 0;
  while (er.next(&e))
    for (int64_t u = 0; u < e.num_users; ++u) {
      const int32_t* it = &e.items[u * L];
      const uint8_t* mk = &e.mask[u * L];
      int rank = 0;
      for (int64_t j = 1; j < L; ++j)
        if (mk[j] && it[j] != it[0] && count[it[j]] >= count[it[0]]) ++rank;
      hits += rank < 10;
    }
  return hits / double(m.num_eval_users);
}

TEST_F(TrainTest, LearnsClearlyBetterThanPopularity) {
  TempDir t;
  std::string mj = t.file("m.jsonl");
  auto r = run(bin("ncf_dist") + " --device cpu --data_dir " + data() +
               " --preset ncf-paper --batch_size 1280 --learning_rate 0.005 --train_epochs 6 "
               "--threads 1 --metrics_json " +
               mj);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto lines = read_jsonl(mj);
  ASSERT_EQ(lines.size(), 6u) << r.output;
  const double pop = popularity_hr10(data());
  const double hr = lines.back()["hr"].get<double>();
  EXPECT_GT(hr, pop + 0.05) << "model HR@10 " << hr << " vs popularity " << pop << "\n" << r.output;
  EXPECT_LT(lines.back()["loss"].get<double>(), lines.front()["loss"].get<double>());
  // The per-epoch line and the MLPerf lines are there.
  EXPECT_NE(r.output.find("HR@10"), std::string::npos);
}

TEST_F(TrainTest, SameJobTwiceGivesIdenticalNumbers) {
  TempDir t;
  std::string cmd = bin("ncf_dist") + " --device cpu --data_dir " + data() +
                    " --batch_size 1000 --train_epochs 2 --threads 2 --mlperf_log";
  auto a = run(cmd + " --metrics_json " + t.file("a.jsonl") + " --save_params " + t.file("a.bin"));
  auto b = run(cmd + " --metrics_json " + t.file("b.jsonl") + " --save_params " + t.file("b.bin"));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto ja = read_jsonl(t.file("a.jsonl")), jb = read_jsonl(t.file("b.jsonl"));
  ASSERT_EQ(ja.size(), 2u);
  ASSERT_EQ(jb.size(), 2u);
  for (size_t e = 0; e < ja.size(); ++e)
    for (const char* k : {"loss", "hr", "ndcg"})
      EXPECT_EQ(ja[e][k], jb[e][k]) << k << " epoch " << e;
  EXPECT_EQ(test::read_file(t.file("a.bin")), test::read_file(t.file("b.bin")));
  EXPECT_NE(a.output.find(":::MLLOG"), std::string::npos);
  EXPECT_NE(a.output.find("\"eval_accuracy\""), std::string::npos);
}

// --precision bf16 on the CPU: BF16-rounded GEMM inputs, FP32 accumulation and
// FP32 master weights. It must still learn (HR@10 clearly above popularity, and
// within 0.05 of the fp32 run), repeat itself exactly, and differ from fp32 in
// its bits (otherwise the flag did not reach the GEMMs).
TEST_F(TrainTest, Bf16TrainsLikeFp32AndRepeatsExactly) {
  TempDir t;
  const std::string cmd = bin("ncf_dist") + " --device cpu --data_dir " + data() +
                          " --preset ncf-paper --batch_size 1280 --learning_rate 0.005 "
                          "--train_epochs 6 --threads 2";
  auto bf = run(cmd + " --precision bf16 --metrics_json " + t.file("bf.jsonl"));
  auto bf2 = run(cmd + " --precision bf16 --metrics_json " + t.file("bf2.jsonl"));
  auto fp = run(cmd + " --precision fp32 --metrics_json " + t.file("fp.jsonl"));
  ASSERT_EQ(bf.exit_code, 0) << bf.output;
  ASSERT_EQ(bf2.exit_code, 0) << bf2.output;
  ASSERT_EQ(fp.exit_code, 0) << fp.output;
  auto jb = read_jsonl(t.file("bf.jsonl")), jb2 = read_jsonl(t.file("bf2.jsonl")),
       jf = read_jsonl(t.file("fp.jsonl"));
  ASSERT_EQ(jb.size(), 6u) << bf.output;
  ASSERT_EQ(jb2.size(), 6u) << bf2.output;
  ASSERT_EQ(jf.size(), 6u) << fp.output;
  const double pop = popularity_hr10(data());
  const double hr_bf = jb.back()["hr"].get<double>(), hr_fp = jf.back()["hr"].get<double>();
  EXPECT_GT(hr_bf, pop + 0.05) << "bf16 HR@10 " << hr_bf << " vs popularity " << pop << "\n"
                               << bf.output;
  EXPECT_NEAR(hr_bf, hr_fp, 0.05) << "bf16 vs fp32 HR@10";
  EXPECT_LT(jb.back()["loss"].get<double>(), jb.front()["loss"].get<double>());
  for (size_t e = 0; e < jb.size(); ++e)
    for (const char* k : {"loss", "hr", "ndcg"})
      EXPECT_EQ(jb[e][k], jb2[e][k]) << k << " epoch " << e;
  bool differs = false;
  for (size_t e = 0; e < jb.size(); ++e) differs |= jb[e]["loss"] != jf[e]["loss"];
  EXPECT_TRUE(differs) << "--precision bf16 gave the fp32 losses bit for bit: the flag did not "
                          "set MathMode::kBf16 (ncf_dist should map it with parse_math_mode)";
}

struct BadFlag {
  std::string flags, message;
};

TEST_F(TrainTest, BadFlagsStopWithAClearMessage) {
  const std::vector<BadFlag> cases = {
      {"--layers 63,32,16", "layers[0] = 63"},
      {"--batch_size 0", "--batch_size must be > 0, got 0"},
      {"--batch_size -5", "--batch_size must be > 0, got -5"},
      {"--num_factors 0", "--num_factors must be > 0"},
      {"--batch_size 100000000", "holds only"},
      {"--eval_batch_size 0", "--eval_batch_size must be > 0"},
      {"--learning_rate -1", "--learning_rate must be > 0"},
      {"--beta1 1.5", "--beta1 must be in [0, 1)"},
      {"--shard_plan user=diagonal", "unknown placement 'diagonal'"},
      {"--device gpu", "--device"},
      {"--precision fp16", "--precision"},
      {"--memory_limit_gb 0.00001", "may use"},
  };
  for (const auto& c : cases) {
    auto r = run(bin("ncf_dist") + " --device cpu --data_dir " + data() + " " + c.flags +
                 " --train_epochs 1");
    EXPECT_NE(r.exit_code, 0) << c.flags;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.flags << "\n" << r.output;
  }
  auto r = run(bin("ncf_dist") + " --device cpu --data_dir /nonexistent/dir");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("/nonexistent/dir/metadata.json"), std::string::npos) << r.output;
}

TEST_F(TrainTest, MetadataMismatchWithShardsStops) {
  TempDir t;
  auto cp = run("cp -r " + data() + " " + t.file("d"));
  ASSERT_EQ(cp.exit_code, 0);
  std::string mp = t.file("d/metadata.json");
  nlohmann::json j = nlohmann::json::parse(test::read_file(mp));
  j["num_users"] = j["num_users"].get<uint64_t>() + 1;
  // Sealed with a matching checksum: the shards' check is what must stop it.
  j.erase("crc32c");
  j["crc32c"] = metadata_crc32c(j);
  test::write_file(mp, j.dump());
  auto r = run(bin("ncf_dist") + " --device cpu --data_dir " + t.file("d") + " --train_epochs 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("num_users"), std::string::npos) << r.output;
}

TEST_F(TrainTest, CudaWithoutGpuIsAClearError) {
  auto r = run(bin("ncf_dist") + " --data_dir " + data() + " --device cuda --train_epochs 1");
  if (r.exit_code == 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_NE(r.output.find("--device cuda"), std::string::npos) << r.output;
}

// --device auto is the default: CUDA where this build has it and every rank sees a
// GPU, else the CPU for every rank, and the start-up line says which and why.
TEST_F(TrainTest, TheDefaultDeviceIsAutoAndTheStartUpLineSaysWhichAndWhy) {
  std::string why;
  const bool gpu = cuda_available(&why);
  // Two ranks on one machine share its GPUs: only without one do they run here.
  for (int W : gpu ? std::vector<int>{1} : std::vector<int>{1, 2}) {
    auto r = run("timeout -k 5 120 " + (W > 1 ? test::mpirun(W) + " " : std::string()) +
                 bin("ncf_dist") + " --data_dir " + data() +
                 " --batch_size 2000 --train_epochs 1 --threads 1 --no_eval");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    if (gpu) {
      EXPECT_NE(r.output.find("ncf_dist: device cuda (--device auto: every rank sees a GPU)"),
                std::string::npos)
          << r.output;
      EXPECT_NE(r.output.find("cuda backend"), std::string::npos) << r.output;
    } else {
      EXPECT_NE(r.output.find("ncf_dist: device cpu (--device auto: " + why), std::string::npos)
          << r.output;
      EXPECT_NE(r.output.find("cpu backend"), std::string::npos) << r.output;
    }
  }
  if (gpu) return;
  // NCCL needs GPU ranks: without one, auto cannot give them, and says so.
  auto r = run("timeout -k 5 120 " + test::mpirun(2) + " " + bin("ncf_dist") + " --data_dir " +
               data() + " --comm nccl --train_epochs 1 --threads 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("flag --comm nccl needs GPU ranks, and --device auto: " + why),
            std::string::npos)
      << r.output;
}

// --cuda_graph on where a step cannot be captured (CPU ranks): the start-up line says why,
// and the steps run as they are, the same parameters byte for byte as without the flag. A
// value other than on or off is refused, named.
TEST_F(TrainTest, CudaGraphOnCpuRanksSaysWhyAndTrainsTheSame) {
  const std::string args = " --device cpu --data_dir " + data() +
                           " --batch_size 2000 --train_epochs 1 --threads 2 --no_eval";
  const std::string a = dir_->file("graph_on.bin"), b = dir_->file("graph_off.bin");
  auto on =
      run("timeout -k 5 120 " + bin("ncf_dist") + args + " --cuda_graph on --save_params " + a);
  auto off = run("timeout -k 5 120 " + bin("ncf_dist") + args + " --save_params " + b);
  ASSERT_EQ(on.exit_code, 0) << on.output;
  ASSERT_EQ(off.exit_code, 0) << off.output;
  EXPECT_NE(on.output.find("cuda graph: off (CPU ranks launch no kernels)"), std::string::npos)
      << on.output;
  EXPECT_EQ(off.output.find("cuda graph"), std::string::npos) << off.output;
  const std::string pa = test::read_file(a);
  EXPECT_FALSE(pa.empty());
  EXPECT_EQ(pa, test::read_file(b));
  auto bad = run("timeout -k 5 60 " + bin("ncf_dist") + args + " --cuda_graph yes");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--cuda_graph"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("yes"), std::string::npos) << bad.output;
}

// The CPU's element-wise loops run as compiled for the widest vector instructions the CPU
// has (common/vector_isa.h); NCF_VECTOR_ISA=avx2 or baseline narrows them. Every narrower
// path trains the same parameters, byte for byte, as the default one: FP32 and BF16, dense
// and lazy Adam, at the ml-20m preset's widths (so that the 16-lane bodies run, not only
// their tails). A name that is no path is refused, naming the variable and the value.
TEST_F(TrainTest, EveryCpuVectorPathTrainsTheSameParameters) {
  const std::string args = " --device cpu --data_dir " + data() +
                           " --batch_size 2000 --train_epochs 1 --threads 2 --no_eval"
                           " --num_factors 64 --layers 256,256,128,64";
  int compared = 0;
  for (const char* optimizer : {"dense_adam", "lazy_adam"})
    for (const char* precision : {"fp32", "bf16"}) {
      if (std::string(optimizer) == "lazy_adam" && std::string(precision) == "bf16") continue;
      const std::string run_args =
          args + " --precision " + precision + " --embedding_optimizer " + optimizer;
      const std::string tag = std::string(optimizer) + " " + precision;
      const std::string base = dir_->file(tag + " default.bin");
      auto def =
          run("timeout -k 5 120 " + bin("ncf_dist") + run_args + " --save_params '" + base + "'");
      ASSERT_EQ(def.exit_code, 0) << tag << "\n" << def.output;
      EXPECT_NE(def.output.find(std::string("CPU loops: ") + vector_isa_name(best_vector_isa())),
                std::string::npos)
          << def.output;
      const std::string want = test::read_file(base);
      ASSERT_FALSE(want.empty()) << tag;
      for (VectorIsa isa : {VectorIsa::kAvx2, VectorIsa::kBaseline}) {
        if (isa <= best_vector_isa()) continue;  // not narrower than the default here
        const std::string name = vector_isa_name(isa), file = dir_->file(tag + " " + name + ".bin");
        auto r = run("NCF_VECTOR_ISA=" + name + " timeout -k 5 120 " + bin("ncf_dist") + run_args +
                     " --save_params '" + file + "'");
        ASSERT_EQ(r.exit_code, 0) << tag << " " << name << "\n" << r.output;
        EXPECT_NE(r.output.find("NCF_VECTOR_ISA=" + name + ": CPU loops on the " + name + " path"),
                  std::string::npos)
            << r.output;
        EXPECT_TRUE(test::read_file(file) == want)
            << tag << ": " << name << " differs from " << vector_isa_name(best_vector_isa());
        ++compared;
      }
    }
  if (compared == 0) std::printf("note: this CPU has no path wider than the baseline\n");
  auto bad = run("NCF_VECTOR_ISA=sse4 timeout -k 5 60 " + bin("ncf_dist") + args);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("NCF_VECTOR_ISA=sse4: expected avx512, avx2 or baseline"),
            std::string::npos)
      << bad.output;
}

// NCF_NARROW_ITEM_LOOKUP=0 selects the GPU step's whole item rows where layer 0 runs by
// item (step.h); it says so, and CPU ranks (layer 0 per sample by default) train the same
// parameters, byte for byte, with it and without.
TEST_F(TrainTest, TheNarrowLookupSwitchIsNotedAndLeavesCpuTrainingAlone) {
  expect_switch_noted_and_cpu_alone(
      "NCF_NARROW_ITEM_LOOKUP=0",
      "NCF_NARROW_ITEM_LOOKUP=0: the step looks up, and reduces the gradients of, the samples' "
      "whole item rows",
      "bf16");
}

// Layer 0 by item on CPU ranks (--layer0_by_item on, noted; 200 items against batches of
// 2,000 samples) and per sample (their default): other bits, since dW0's items' half sums
// in another order, and the same training to FP32 rounding: each epoch's loss within 1e-4
// relative (measured: 2e-9 fp32, 6e-6 bf16) and HR@10 within 0.01, under fp32 and bf16.
// A value other than auto, on or off is refused, named.
TEST_F(TrainTest, Layer0ByItemTrainsAsThePerSampleLayer0) {
  for (const char* precision : {"fp32", "bf16"}) {
    TempDir t;
    const std::string args = " --device cpu --data_dir " + data() +
                             " --batch_size 2000 --train_epochs 2 --threads 2 --precision " +
                             precision;
    const std::string note = "--layer0_by_item on: layer 0 takes its items' half once per distinct";
    auto item = run("timeout -k 5 120 " + bin("ncf_dist") + args + " --layer0_by_item on" +
                    " --metrics_json " + t.file("i.jsonl") + " --save_params " + t.file("i.bin"));
    auto sample = run("timeout -k 5 120 " + bin("ncf_dist") + args + " --metrics_json " +
                      t.file("s.jsonl") + " --save_params " + t.file("s.bin"));
    ASSERT_EQ(item.exit_code, 0) << item.output;
    ASSERT_EQ(sample.exit_code, 0) << sample.output;
    EXPECT_NE(item.output.find(note), std::string::npos) << precision << "\n" << item.output;
    EXPECT_EQ(sample.output.find(note), std::string::npos) << precision << "\n" << sample.output;
    EXPECT_NE(test::read_file(t.file("i.bin")), test::read_file(t.file("s.bin")))
        << precision << ": the same parameters by item and per sample";
    auto ji = read_jsonl(t.file("i.jsonl")), js = read_jsonl(t.file("s.jsonl"));
    ASSERT_EQ(ji.size(), 2u) << item.output;
    ASSERT_EQ(js.size(), 2u) << sample.output;
    for (size_t e = 0; e < ji.size(); ++e) {
      const double li = ji[e]["loss"].get<double>(), ls = js[e]["loss"].get<double>();
      EXPECT_NEAR(li, ls, 1e-4 * ls) << precision << ", epoch " << e;
      EXPECT_NEAR(ji[e]["hr"].get<double>(), js[e]["hr"].get<double>(), 0.01)
          << precision << ", epoch " << e;
    }
  }
  auto bad = run("timeout -k 5 120 " + bin("ncf_dist") + " --device cpu --data_dir " + data() +
                 " --batch_size 2000 --train_epochs 1 --no_eval --layer0_by_item yes");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("--layer0_by_item"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("yes"), std::string::npos) << bad.output;
}

// A plain `ncf_dist` with no launcher starts no MPI, so it trains where Open MPI's
// singleton init cannot start (no launcher variables, an installation prefix that
// does not exist: MPI_Init finds no orted); `--comm mpi` asks for MPI and fails there,
// which shows that the environment really stops MPI. Under mpirun it is 2 ranks.
TEST_F(TrainTest, PlainRunWithoutLauncherIsOneRankWithoutMpi) {
  std::string no_launcher = "env";
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                        "SLURM_STEP_ID", "PMI_FD", "PMI_JOBID", "PMI_RANK", "PMI_SIZE"})
    no_launcher += std::string(" -u ") + v;
  no_launcher += " OPAL_PREFIX=/nonexistent-ompi-prefix timeout -k 5 120 ";
  const std::string args = " --device cpu --data_dir " + data() +
                           " --batch_size 2000 --train_epochs 1 "
                           "--threads 1";
  auto plain = run(no_launcher + bin("ncf_dist") + args);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_NE(plain.output.find("ncf_dist: 1 rank(s), cpu backend"), std::string::npos)
      << plain.output;
  EXPECT_NE(plain.output.find("single comm"), std::string::npos) << plain.output;
  EXPECT_NE(plain.output.find("HR@10"), std::string::npos) << plain.output;

  auto forced = run(no_launcher + bin("ncf_dist") + args + " --comm mpi");
  EXPECT_NE(forced.exit_code, 0) << "this environment does not stop a singleton MPI_Init, so "
                                    "the run above shows nothing\n"
                                 << forced.output;
  EXPECT_NE(forced.exit_code, 124) << "--comm mpi hung\n" << forced.output;

  auto two = run("timeout -k 5 120 " + test::mpirun(2) + " " + bin("ncf_dist") + args);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("ncf_dist: 2 rank(s), cpu backend"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("mpi comm"), std::string::npos) << two.output;
}

}  // namespace
}  // namespace ncf
