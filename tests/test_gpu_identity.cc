// Which local ranks share a GPU, from the identities (PCI bus ids) of the GPUs they
// took: the launcher bindings of launch/slurm/README.md fed as identity lists to the
// pure decision (gpu_sharing), the message NCCL's refusal carries, and the gather of
// the identities over a real node communicator (this binary again under mpirun,
// with made-up ids, as CPU ranks have no GPU to read one from).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/bootstrap.h"
#include "common/check.h"
#include "common/gpu_identity.h"
#include "test_util.h"

namespace ncf {
namespace {

// PCI bus ids as an 8-GPU board gives them.
const std::vector<std::string> kBus = {"0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0",
                                       "0000:5d:00.0", "0000:9a:00.0", "0000:ab:00.0",
                                       "0000:ba:00.0", "0000:db:00.0"};

struct Case {
  const char* binding;           // how the launcher placed the ranks
  int visible;                   // GPUs each rank sees (cudaGetDeviceCount)
  std::vector<std::string> ids;  // the bus id of each local rank's GPU
  std::vector<int> sharing;      // expected: local ranks on each rank's GPU
  int first, second;             // expected first pair on one GPU (-1: none, NCCL may run)
};

// `visible` is what the count-based rule decided from (local_world <= visible for
// NCCL, sharing = local ranks l with l % visible == this rank's % visible): it
// refused the launcher-isolated cases although every rank had a GPU of its own.
std::vector<Case> cases() {
  return {
      {"--gpus-per-task=1: 4 ranks, each sees its own GPU as device 0",
       1,
       {kBus[0], kBus[1], kBus[2], kBus[3]},
       {1, 1, 1, 1},
       -1,
       -1},
      {"--gpu-bind=single:1 or a CUDA_VISIBLE_DEVICES per rank: 8 ranks on 8 GPUs",
       1,
       kBus,
       {1, 1, 1, 1, 1, 1, 1, 1},
       -1,
       -1},
      {"every rank sees the node's 8 GPUs, local rank l takes GPU l",
       8,
       kBus,
       {1, 1, 1, 1, 1, 1, 1, 1},
       -1,
       -1},
      {"every rank sees 2 GPUs, 4 ranks: rank l takes GPU l % 2",
       2,
       {kBus[0], kBus[1], kBus[0], kBus[1]},
       {2, 2, 2, 2},
       0,
       2},
      {"CUDA_VISIBLE_DEVICES 0,0,1,1: 4 ranks on 2 GPUs, one visible each",
       1,
       {kBus[0], kBus[0], kBus[1], kBus[1]},
       {2, 2, 2, 2},
       0,
       1},
      {"4 ranks on one GPU", 1, {kBus[5], kBus[5], kBus[5], kBus[5]}, {4, 4, 4, 4}, 0, 1},
      {"5 ranks, one GPU taken by three of them",
       1,
       {kBus[0], kBus[1], kBus[0], kBus[2], kBus[0]},
       {3, 1, 3, 1, 3},
       0,
       2},
      {"one rank", 1, {kBus[7]}, {1}, -1, -1},
  };
}

TEST(GpuIdentity, SharingComesFromIdentitiesNotTheVisibleCount) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.binding);
    ASSERT_EQ(c.ids.size(), c.sharing.size());
    for (int lr = 0; lr < int(c.ids.size()); ++lr) {
      const GpuSharing s = gpu_sharing(c.ids, lr);
      EXPECT_EQ(s.sharing, c.sharing[lr]) << "local rank " << lr;
      // The pair NCCL is refused for is the node's, the same on every rank.
      EXPECT_EQ(s.first, c.first) << "local rank " << lr;
      EXPECT_EQ(s.second, c.second) << "local rank " << lr;
      EXPECT_EQ(s.exclusive(), c.first < 0) << "local rank " << lr;
      EXPECT_EQ(s.shared_id, c.first < 0 ? std::string() : c.ids[c.first]);
    }
  }
}

// The case of issue 22: Slurm isolates each of 4 ranks on its own GPU, so every
// rank sees one device. NCCL must be allowed, and each rank has its GPU's whole
// free memory.
TEST(GpuIdentity, LauncherIsolatedRanksShareNothing) {
  const std::vector<std::string> ids = {kBus[0], kBus[1], kBus[2], kBus[3]};
  for (int lr = 0; lr < 4; ++lr) {
    const GpuSharing s = gpu_sharing(ids, lr);
    EXPECT_TRUE(s.exclusive());
    EXPECT_EQ(s.sharing, 1);
    EXPECT_EQ(describe_gpu_sharing(s, {0, 1, 2, 3}), "");
  }
}

TEST(GpuIdentity, RefusalNamesTheRanksAndTheGpu) {
  const GpuSharing s = gpu_sharing({kBus[0], kBus[1], kBus[0], kBus[1]}, 1);
  EXPECT_EQ(describe_gpu_sharing(s, {8, 9, 10, 11}),
            "ranks 8 and 10 (local ranks 0 and 2) both use the GPU at PCI 0000:18:00.0");
  EXPECT_EQ(describe_gpu_sharing(s, {}),
            "local ranks 0 and 2 both use the GPU at PCI 0000:18:00.0");
}

// NCCL's duplicate-GPU refusal needs the same bus id and the same host hash, which
// NCCL takes from NCCL_HOSTID when it is set: ranks on one GPU, each with its own
// NCCL_HOSTID, are not shared in NCCL's eyes (the way to run NCCL's path with
// several ranks on a machine with one GPU); the same id, or none, stays shared.
TEST(GpuIdentity, NcclSeesRanksWithTheirOwnHostIdAsNotSharing) {
  EXPECT_EQ(nccl_host_key(nullptr), "");
  EXPECT_EQ(nccl_host_key(""), "");
  EXPECT_EQ(nccl_host_key("a").size(), 16u);
  EXPECT_EQ(nccl_host_key("ncf-share-0"), nccl_host_key("ncf-share-0"));
  EXPECT_NE(nccl_host_key("ncf-share-0"), nccl_host_key("ncf-share-1"));
  const std::vector<std::string> one_gpu = {kBus[5], kBus[5], kBus[5]};
  const std::vector<std::string> own = {nccl_host_key("h0"), nccl_host_key("h1"),
                                        nccl_host_key("h2")};
  for (int lr = 0; lr < 3; ++lr) {
    EXPECT_FALSE(gpu_sharing(one_gpu, lr).exclusive());  // the memory guard still divides
    const GpuSharing s = nccl_gpu_sharing(one_gpu, own, lr);
    EXPECT_TRUE(s.exclusive()) << "local rank " << lr;
    EXPECT_EQ(s.sharing, 1);
  }
  // Two of the three with one id: those two share in NCCL's eyes, named by bus id.
  const std::vector<std::string> two = {nccl_host_key("h0"), nccl_host_key("h1"),
                                        nccl_host_key("h0")};
  const GpuSharing s = nccl_gpu_sharing(one_gpu, two, 1);
  EXPECT_EQ(s.first, 0);
  EXPECT_EQ(s.second, 2);
  EXPECT_EQ(s.sharing, 1);
  EXPECT_EQ(describe_gpu_sharing(s, {4, 5, 6}),
            "ranks 4 and 6 (local ranks 0 and 2) both use the GPU at PCI 0000:ab:00.0");
  // No NCCL_HOSTID anywhere: exactly the bus-id decision, for every binding.
  for (const Case& c : cases()) {
    const std::vector<std::string> none(c.ids.size(), "-");
    for (int lr = 0; lr < int(c.ids.size()); ++lr) {
      const GpuSharing a = gpu_sharing(c.ids, lr), b = nccl_gpu_sharing(c.ids, none, lr);
      EXPECT_EQ(a.sharing, b.sharing) << c.binding;
      EXPECT_EQ(a.first, b.first) << c.binding;
      EXPECT_EQ(a.second, b.second) << c.binding;
      EXPECT_EQ(a.shared_id, b.shared_id) << c.binding;
    }
  }
  EXPECT_THROW(nccl_gpu_sharing(one_gpu, {"-"}, 0), Error);
}

TEST(GpuIdentity, BadInputIsRefused) {
  EXPECT_THROW(gpu_sharing({}, 0), Error);
  EXPECT_THROW(gpu_sharing({kBus[0]}, 1), Error);
  EXPECT_THROW(gpu_sharing({kBus[0]}, -1), Error);
  EXPECT_THROW(gpu_sharing({kBus[0], ""}, 0), Error);
}

TEST(GpuIdentity, WithoutMpiTheRankIsAlone) {
  RankInfo one;  // bootstrap_single
  std::vector<int> world;
  EXPECT_EQ(gather_node_gpu_ids(one, kBus[3], &world), std::vector<std::string>{kBus[3]});
  EXPECT_EQ(world, std::vector<int>{0});
}

// ---- the gather over a real node communicator -----------------------------------------

// Made-up bus ids: local ranks 2k and 2k + 1 on one GPU ("pairs"), or one each.
std::string fake_id(int local_rank, bool pairs) {
  char id[32];
  std::snprintf(id, sizeof id, "0000:%02x:00.0", pairs ? local_rank / 2 : local_rank);
  return id;
}

class GpuIdentityMpi : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuIdentityMpi, NodeRanksGatherTheirGpuIds) {
  const std::string layout = GetParam();
  const int np = 4;
  const test::RunResult r =
      test::run("NCF_GPU_ID_WORKER=" + layout + " timeout -k 5 60 env " + test::mpirun(np) + " " +
                test::self_exe() + " --gtest_filter=GpuIdentityWorker.*");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (int k = 0; k < np; ++k)
    EXPECT_NE(r.output.find("gpu identity worker: rank " + std::to_string(k) + " of " +
                            std::to_string(np) + " ok"),
              std::string::npos)
        << r.output;
  EXPECT_EQ(r.output.find("[  FAILED  ]"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Layouts, GpuIdentityMpi, ::testing::Values("pairs", "own"));

// Active only in the processes GpuIdentityMpi starts: one node, so local rank =
// world rank.
TEST(GpuIdentityWorker, Gather) {
  const char* layout = std::getenv("NCF_GPU_ID_WORKER");
  if (!layout) GTEST_SKIP() << "runs only inside the jobs that GpuIdentityMpi.* starts";
  const bool pairs = std::string(layout) == "pairs";
  const int rc = run_main(0, nullptr, [&](int& argc, char**& argv) {
    const RankInfo info = bootstrap_mpi(&argc, &argv);
    std::vector<int> world;
    const std::vector<std::string> ids =
        gather_node_gpu_ids(info, fake_id(info.local_rank, pairs), &world);
    NCF_CHECK(int(ids.size()) == info.local_world, ids.size(), " ids for ", info.local_world,
              " local ranks");
    for (int lr = 0; lr < info.local_world; ++lr) {
      NCF_CHECK(ids[lr] == fake_id(lr, pairs), "local rank ", lr, ": id ", ids[lr]);
      NCF_CHECK(world[lr] == lr, "local rank ", lr, " reported world rank ", world[lr]);
    }
    const GpuSharing s = gpu_sharing(ids, info.local_rank);
    NCF_CHECK(s.sharing == (pairs ? 2 : 1), "sharing ", s.sharing);
    const std::string why = describe_gpu_sharing(s, world);
    NCF_CHECK(why == (pairs ? "ranks 0 and 1 (local ranks 0 and 1) both use the GPU at PCI "
                              "0000:00:00.0"
                            : ""),
              "refusal '", why, "'");
    std::printf("gpu identity worker: rank %d of %d ok\n", info.rank, info.world);
    std::fflush(stdout);
    return 0;
  });
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace ncf
