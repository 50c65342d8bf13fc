// ncf_dist on a GPU, as real processes: the CUDA trainer follows the CPU
// trainer's trajectory (fp32 GEMMs, and loosely with bf16 GEMMs), GPU ranks
// sharing one GPU through --comm mpi, and NCCL ranks sharing it through host ids
// of their own, follow the 1-rank run, NCCL ranks with a host tier give the bits of the
// same ranks without one, and a checkpoint of NCCL ranks resumes on one GPU rank and on
// CPU ranks. Skipped, visibly, without a usable GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "common/device.h"
#include "test_util.h"

namespace ncf {
namespace {

using test::bin;
using test::run;
using test::TempDir;

// output: where given, what the run printed.
std::vector<nlohmann::json> train(const std::string& launcher, const std::string& data,
                                  const std::string& flags, const std::string& precision = "fp32",
                                  std::string* output = nullptr) {
  TempDir t;
  auto r = run("timeout 600 " + launcher + bin("ncf_dist") + " --data_dir " + data +
               " --batch_size 1005 --train_epochs 2 --learning_rate 0.01 --precision " + precision +
               " " + flags + " --metrics_json " + t.file("m.jsonl"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (output) *output = r.output;
  std::vector<nlohmann::json> out;
  std::ifstream f(t.file("m.jsonl"));
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

void expect_close(const std::vector<nlohmann::json>& a, const std::vector<nlohmann::json>& b,
                  double loss_rel, const std::string& what, double hr_abs = 0.02) {
  ASSERT_EQ(a.size(), 2u) << what;
  ASSERT_EQ(b.size(), 2u) << what;
  for (size_t e = 0; e < a.size(); ++e) {
    double la = a[e]["loss"], lb = b[e]["loss"];
    EXPECT_NEAR(la, lb, loss_rel * std::fabs(la)) << what << " epoch " << e;
    EXPECT_NEAR(double(a[e]["hr"]), double(b[e]["hr"]), hr_abs) << what << " epoch " << e;
  }
}

class TrainGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    NCF_GPU_OR_SKIP();
    auto r = run(bin("ncf_prep") +
                 " --synthetic custom --users 257 --items 131 "
                 "--interactions 9000 --eval_negatives 50 --record_rows 300 --output " +
                 dir_.file("data"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  TempDir dir_;
};

// Stated tolerance: fp32 GEMMs on both sides; only summation orders differ.
TEST_F(TrainGpu, CudaFollowsTheCpuTrajectory) {
  auto cpu = train("", dir_.file("data"), "--device cpu --threads 1");
  auto gpu = train("", dir_.file("data"), "--device cuda");
  expect_close(cpu, gpu, 1e-4, "cpu vs cuda");
}

// Stated tolerance, loose: both devices round the same values to BF16 at the
// first step, but FP32 summation-order differences (~1e-7) then flip the BF16
// rounding of some later GEMM inputs (a 2^-9 relative jump each), so the two
// trajectories drift apart much more than the fp32 pair above, yet stay
// statistically alike: epoch losses within 2%, HR@10 within 0.04.
TEST_F(TrainGpu, CudaBf16TracksTheCpuBf16Run) {
  auto cpu = train("", dir_.file("data"), "--device cpu --threads 1", "bf16");
  auto gpu = train("", dir_.file("data"), "--device cuda", "bf16");
  expect_close(cpu, gpu, 2e-2, "cpu bf16 vs cuda bf16", 0.04);
  // And bf16 really ran: the fp32 CUDA run takes another path, bit for bit.
  auto gpu_fp32 = train("", dir_.file("data"), "--device cuda", "fp32");
  ASSERT_EQ(gpu.size(), 2u);
  ASSERT_EQ(gpu_fp32.size(), 2u);
  EXPECT_NE(gpu[0]["loss"], gpu_fp32[0]["loss"]) << "--precision bf16 did not reach the GPU GEMMs";
}

// --cuda_graph on: each step after the first of its size is captured and launched as one
// graph. The same kernels with the same arguments: the saved parameters and every epoch's
// loss, HR@10 and NDCG@10 are the eager run's bits, under tf32 and bf16, with the
// evaluations between the epochs and the epochs' last, smaller steps run eagerly in between.
TEST_F(TrainGpu, GraphStepsAreTheEagerStepsBitForBit) {
  for (const char* precision : {"tf32", "bf16"}) {
    TempDir t;
    std::string out[2];
    std::vector<nlohmann::json> metrics[2];
    for (int g = 0; g < 2; ++g)
      metrics[g] =
          train("", dir_.file("data"),
                std::string("--device cuda --progress off --cuda_graph ") + (g ? "on" : "off") +
                    " --save_params " + t.file("p" + std::to_string(g) + ".bin"),
                precision, &out[g]);
    EXPECT_EQ(out[0].find("cuda graph"), std::string::npos) << out[0];
    EXPECT_NE(out[1].find("ncf_dist: cuda graph: on"), std::string::npos) << out[1];
    // 8,743 positives in steps of 201: 43 full steps and a smaller one per epoch.
    EXPECT_NE(out[1].find("steps launched as graphs"), std::string::npos) << out[1];
    const std::string p0 = test::read_file(t.file("p0.bin"));
    EXPECT_FALSE(p0.empty()) << precision;
    EXPECT_TRUE(p0 == test::read_file(t.file("p1.bin"))) << precision << ": other parameters";
    ASSERT_EQ(metrics[0].size(), 2u) << precision;
    ASSERT_EQ(metrics[1].size(), 2u) << precision;
    for (size_t e = 0; e < 2; ++e)
      for (const char* k : {"loss", "hr", "ndcg"})
        EXPECT_EQ(double(metrics[0][e][k]), double(metrics[1][e][k]))
            << precision << " epoch " << e + 1 << " " << k;
  }
}

TEST_F(TrainGpu, RanksSharingOneGpuViaMpiFollowOneRank) {
  auto one = train("", dir_.file("data"), "--device cuda --comm mpi");
  for (int W : {2, 3}) {
    auto many = train(test::mpirun(W) + " ", dir_.file("data"), "--device cuda --comm mpi");
    expect_close(one, many, 1e-5, "W=" + std::to_string(W));
  }
}

// The exchange, de-duplication and replicated-table paths on the GPU: 2 and 3
// ranks sharing the one GPU through --comm mpi (host-staged collectives), with
// each placement and dedup setting forced, follow the 1-rank GPU run.
TEST_F(TrainGpu, SharedGpuRanksFollowOneRankWithEveryPlacementAndDedup) {
  for (const std::string plan :
       {"row", "table", "replicated", "user=row,item=replicated", "user=table,item=row"}) {
    auto one = train("", dir_.file("data"), "--device cuda --comm mpi --shard_plan " + plan);
    for (const char* dedup : {"on", "off"})
      for (int W : {2, 3}) {
        const std::string flags =
            "--device cuda --comm mpi --shard_plan " + plan + " --dedup " + dedup;
        auto many = train(test::mpirun(W) + " ", dir_.file("data"), flags);
        expect_close(one, many, 1e-5, "W=" + std::to_string(W) + " " + flags);
      }
  }
}

// Several NCCL ranks on the one GPU: each gives NCCL a host id of its own
// (NCCL_HOSTID), so that NCCL takes them for ranks of different hosts and connects
// them through sockets on loopback; the real NCCL code path (grouped sends and
// receives on device buffers, the allreduce, our packing kernels) then runs on a
// machine with one GPU. The launcher prefix of W such ranks.
std::string nccl_on_one_gpu(int W) {
  return "env NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 " + test::mpirun(W) +
         " sh -c 'NCCL_HOSTID=ncf-share-$OMPI_COMM_WORLD_RANK exec \"$0\" \"$@\"' ";
}

// W = 2, 3 and 4 NCCL ranks on the one GPU follow the 1-rank GPU run within the
// trajectory tolerance (the W-rank sums run in other orders), for the row, table,
// mixed and replicated placements, dedup on and off.
TEST_F(TrainGpu, NcclRanksSharingTheGpuThroughHostIdsFollowOneRank) {
  for (const std::string plan : {"row", "table", "replicated", "user=row,item=replicated"}) {
    auto one = train("", dir_.file("data"), "--device cuda --shard_plan " + plan);
    for (const char* dedup : {"on", "off"})
      for (int W : {2, 3, 4}) {
        const std::string flags =
            "--device cuda --comm nccl --shard_plan " + plan + " --dedup " + dedup;
        auto many = train(nccl_on_one_gpu(W), dir_.file("data"), flags);
        expect_close(one, many, 1e-5, "NCCL W=" + std::to_string(W) + " " + flags);
      }
  }
}

// A checkpoint written by 4 NCCL ranks (on the one GPU, as above) after the first
// epoch, resumed for the second by 1 GPU rank and by 2 CPU ranks: each ends within
// the trajectory tolerance of the uninterrupted 1-rank GPU run.
TEST_F(TrainGpu, ANcclCheckpointResumesOnOneGpuRankAndOnTwoCpuRanks) {
  const std::string data = dir_.file("data");
  auto whole = train("", data, "--device cuda");
  ASSERT_EQ(whole.size(), 2u);
  for (const std::string& resumer : {std::string("--device cuda"), std::string("--device cpu")}) {
    TempDir t;
    const std::string common = " --data_dir " + data +
                               " --batch_size 1005 --learning_rate 0.01 --precision fp32 "
                               "--checkpoint_dir " +
                               t.file("ck");
    auto first = run("timeout 600 " + nccl_on_one_gpu(4) + bin("ncf_dist") + common +
                     " --device cuda --comm nccl --train_epochs 1");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const std::string launcher = resumer == "--device cpu" ? test::mpirun(2) + " " : "";
    auto second = run("timeout 600 " + launcher + bin("ncf_dist") + common + " " + resumer +
                      " --threads 1 --train_epochs 2 --allow_changed_flags train_epochs "
                      "--resume auto --metrics_json " +
                      t.file("m.jsonl"));
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("ncf_dist: resuming from " + t.file("ck") + "/step-"),
              std::string::npos)
        << second.output;
    std::ifstream f(t.file("m.jsonl"));
    std::string line;
    std::vector<nlohmann::json> resumed;
    while (std::getline(f, line)) resumed.push_back(nlohmann::json::parse(line));
    // The last checkpoint of the first run is the end of epoch 1, taken before its
    // evaluation (as over CPU ranks: Resume.SameWorldSizeContinuesTheIdenticalTrajectory),
    // so the resumed run evaluates epoch 1 again, then trains epoch 2.
    ASSERT_EQ(resumed.size(), 2u) << second.output;
    for (size_t e = 0; e < 2; ++e) {
      EXPECT_EQ(resumed[e]["epoch"], int(e) + 1) << resumer;
      const double la = whole[e]["loss"], lb = resumed[e]["loss"];
      EXPECT_NEAR(la, lb, 1e-4 * std::fabs(la))
          << "resumed with " << resumer << ", epoch " << e + 1;
      EXPECT_NEAR(double(whole[e]["hr"]), double(resumed[e]["hr"]), 0.02)
          << resumer << ", epoch " << e + 1;
    }
  }
}

// Four NCCL ranks on the one GPU (host ids of their own, as above) in 2 nodes of
// 2 declared by --topology ranks_per_node=2: the two-hop exchange (NCCL groups
// of the node and of the rail, grouped sends and receives on device buffers)
// ends with the flat exchange's parameters byte for byte, row-wise and mixed,
// dedup on; --dedup node repeats itself bit for bit and stays within the
// trajectory tolerance of flat (as over CPU ranks: test_two_hop.cc DeclaredNodes).
TEST_F(TrainGpu, NcclRanksOverDeclaredNodesTakeTwoHopWithFlatsParameters) {
  TempDir t;
  auto run_one = [&](const std::string& tag, const std::string& flags) {
    auto r = run("timeout 600 " + nccl_on_one_gpu(4) + bin("ncf_dist") + " --data_dir " +
                 dir_.file("data") +
                 " --device cuda --comm nccl --batch_size 1005 --train_epochs 2 --precision fp32 "
                 "--topology ranks_per_node=2 " +
                 flags + " --save_params " + t.file(tag + ".bin") + " --metrics_json " +
                 t.file(tag + ".jsonl"));
    EXPECT_EQ(r.exit_code, 0) << tag << ": " << r.output;
    EXPECT_NE(r.output.find("ncf_dist: nodes: 2 nodes x 2 ranks, declared by --topology "
                            "ranks_per_node=2"),
              std::string::npos)
        << tag << ": " << r.output;
    return r.output;
  };
  auto params = [&](const std::string& tag) { return test::read_file(t.file(tag + ".bin")); };
  for (const std::string plan : {"row", "user=row,item=table"}) {
    const std::string tag = plan == "row" ? "row" : "mixed";
    run_one(tag + "_flat", "--shard_plan " + plan + " --dedup on --exchange flat");
    const std::string two =
        run_one(tag + "_two", "--shard_plan " + plan + " --dedup on --exchange two_hop");
    EXPECT_NE(two.find("ncf_dist: exchange: two_hop"), std::string::npos) << two;
    EXPECT_FALSE(params(tag + "_flat").empty()) << tag;
    EXPECT_EQ(params(tag + "_flat"), params(tag + "_two"))
        << tag << ": two-hop's parameters differ from flat's";
  }
  const std::string node = run_one("node_a", "--shard_plan row --dedup node --exchange two_hop");
  run_one("node_b", "--shard_plan row --dedup node --exchange two_hop");
  EXPECT_NE(node.find("ncf_dist: exchange: two_hop + node dedup"), std::string::npos) << node;
  EXPECT_EQ(params("node_a"), params("node_b")) << "two --dedup node runs differ";
  auto metrics = [&](const std::string& tag) {
    std::ifstream f(t.file(tag + ".jsonl"));
    std::vector<nlohmann::json> out;
    for (std::string line; std::getline(f, line);)
      if (!line.empty()) out.push_back(nlohmann::json::parse(line));
    return out;
  };
  expect_close(metrics("row_flat"), metrics("node_a"), 1e-5, "node dedup vs flat", 0.005);
}

// The host tier on NCCL ranks (two on the one GPU, flat, where each step's announced ids
// go to their owners over MPI on the host; four in 2 declared nodes of 2, two-hop, where
// they go through device staging): at a budget of 90% of the rows (a step of 1,005 samples
// touches about 70% of a rank's rows of this set), with row-wise Adagrad, the losses, HR
// and NDCG are those of the same ranks without a budget, to the bit, with rows evicted and
// none inside its window.
TEST_F(TrainGpu, NcclRanksWithAHostTierGiveTheBitsOfTheAllOnDeviceRun) {
  const std::string data = dir_.file("data");
  for (const std::string& shape : {std::string("2"), std::string("4 two_hop")}) {
    const int W = shape[0] - '0';
    const std::string flags =
        "--device cuda --comm nccl --embedding_optimizer rowwise_adagrad --max_steps 30" +
        std::string(W == 4 ? " --topology ranks_per_node=2 --exchange two_hop" : "");
    std::string out;
    auto all = train(nccl_on_one_gpu(W), data, flags);
    auto tier = train(nccl_on_one_gpu(W), data, flags + " --device_table_budget 90%", "fp32", &out);
    ASSERT_EQ(all.size(), 2u) << shape;
    ASSERT_EQ(tier.size(), 2u) << shape << "\n" << out;
    for (size_t e = 0; e < 2; ++e)
      for (const char* k : {"loss", "hr", "ndcg"})
        EXPECT_EQ(all[e][k], tier[e][k]) << "W " << shape << " epoch " << e + 1 << " " << k;
    const nlohmann::json t = tier.back().value("host_tier", nlohmann::json());
    ASSERT_TRUE(t.is_object()) << out;
    EXPECT_GT(t["evictions"], 0) << shape << ": 90% of the rows cannot hold them all";
    EXPECT_EQ(t["evicted_in_window"], 0) << shape;
  }
}

// --device_table_budget auto where one rank's tables fit its share of the GPU and the other
// rank's do not (table-wise: 20,000 users on rank 0, 131 items on rank 1, and a
// --memory_limit_gb halfway between the two ranks' estimates, read from the start-up lines
// of a run without it): the tier's announcements are collective, so rank 1 takes a cache
// too, of every one of its rows, and the run ends with the bits of the run without a tier.
TEST_F(TrainGpu, NcclRanksTakeTheHostTierTogetherUnderAuto) {
  const std::string data = dir_.file("many_users");
  auto r = run(bin("ncf_prep") +
               " --synthetic custom --users 20000 --items 131 "
               "--interactions 60000 --min_per_user 3 --eval_negatives 50 --record_rows 300 "
               "--output " +
               data);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string flags =
      "--device cuda --comm nccl --embedding_optimizer rowwise_adagrad --max_steps 30 "
      "--shard_plan table";
  std::string out;
  const auto all = train(nccl_on_one_gpu(2), data, flags, "fp32", &out);
  double est[2] = {0, 0};
  const std::regex line("rank ([01]): [^\\n]*estimated memory ([0-9.]+) MiB");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), line); it != std::sregex_iterator();
       ++it)
    est[std::stoi((*it)[1])] = std::stod((*it)[2]);
  ASSERT_GT(est[1], 0.0) << out;
  ASSERT_GT(est[0], est[1] + 1.0) << "the user table's rank needs more\n" << out;
  const std::string limit = std::to_string((est[0] + est[1]) / 2 / 1024);
  const auto tier =
      train(nccl_on_one_gpu(2), data,
            flags + " --device_table_budget auto --memory_limit_gb " + limit, "fp32", &out);
  ASSERT_EQ(all.size(), 2u);
  ASSERT_EQ(tier.size(), 2u) << out;
  for (size_t e = 0; e < 2; ++e)
    for (const char* k : {"loss", "hr", "ndcg"})
      EXPECT_EQ(all[e][k], tier[e][k]) << "epoch " << e + 1 << " " << k;
  const nlohmann::json t = tier.back().value("host_tier", nlohmann::json());
  ASSERT_TRUE(t.is_object()) << out;
  EXPECT_LT(t["cache_rows"], 20000) << "rank 0's cache holds part of its users\n" << out;
}

TEST_F(TrainGpu, NcclRanksFollowOneRankWhenThereAreSeveralGpus) {
  int gpus = 0;
  auto r = run("nvidia-smi -L | wc -l");
  gpus = std::atoi(r.output.c_str());
  // The one skip NCF_REQUIRE_GPU=1 allows: the machine has fewer GPUs than the test needs.
  if (gpus < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << gpus;
  auto one = train("", dir_.file("data"), "--device cuda");
  auto two = train(test::mpirun(2) + " ", dir_.file("data"), "--device cuda --comm nccl");
  expect_close(one, two, 1e-5, "nccl W=2");
}

}  // namespace
}  // namespace ncf
