// Start-up, communicator choice and the error path of the mains: see bootstrap.h.
#include "comm/bootstrap.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "comm/nccl_communicator.h"
#include "comm/peer_watch.h"
#include "comm/single_communicator.h"
#include "common/check.h"
#include "common/cuda_context.h"
#include "common/gpu_identity.h"
#include "common/parallel.h"

#ifdef NCF_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace ncf {

RankInfo bootstrap_mpi(int* argc, char*** argv) {
  int initialized = 0, finalized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  MPI_CHECK(MPI_Finalized(&finalized));
  NCF_CHECK(!finalized, "bootstrap_mpi after MPI_Finalize: MPI cannot be started twice");
  if (!initialized) {
    int provided = 0;
    MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    NCF_REQUIRE(provided >= MPI_THREAD_FUNNELED, "this MPI library provides thread level ",
                provided, ", below the MPI_THREAD_FUNNELED (", MPI_THREAD_FUNNELED,
                ") ncf_dist needs: use an MPI built with thread support");
  }
  RankInfo info;
  info.mpi = true;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &info.rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &info.world));
  set_error_rank(info.rank);
  // Ranks that can share memory are the ranks of one node: what GPU choice needs,
  // without trusting launcher-specific variables (OMPI_*, SLURM_LOCALID, PMIX_*).
  MPI_Comm node = MPI_COMM_NULL;
  MPI_CHECK(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &node));
  MPI_CHECK(MPI_Comm_rank(node, &info.local_rank));
  MPI_CHECK(MPI_Comm_size(node, &info.local_world));
  // A node is named by its lowest world rank; every rank learns every rank's node.
  int lowest = info.rank;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &lowest, 1, MPI_INT, MPI_MIN, node));
  // How many of the node's ranks may run on each CPU: the sum of their masks.
  const std::vector<int> cpus = allowed_cpus();
  int width = cpus.back() + 1;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &width, 1, MPI_INT, MPI_MAX, node));
  info.node_ranks_on.assign(static_cast<size_t>(width), 0);
  for (int c : cpus) info.node_ranks_on[static_cast<size_t>(c)] = 1;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, info.node_ranks_on.data(), width, MPI_INT, MPI_SUM, node));
  MPI_CHECK(MPI_Comm_free(&node));
  std::vector<int64_t> ids(static_cast<size_t>(info.world));
  const int64_t mine = lowest;
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT64_T, ids.data(), 1, MPI_INT64_T, MPI_COMM_WORLD));
  info.nodes = node_map_from_ids(ids);
  return info;
}

RankInfo bootstrap_single() { return RankInfo{}; }

namespace {
bool has_env(const char* name) { return std::getenv(name) != nullptr; }
}  // namespace

std::string detect_launcher() {
  // Open MPI's mpirun sets both; either alone still means a launcher is there.
  if (has_env("OMPI_COMM_WORLD_SIZE") || has_env("OMPI_COMM_WORLD_RANK")) return "open-mpi";
  if (has_env("PMIX_RANK")) return "pmix";  // prterun, srun --mpi=pmix
  // srun sets SLURM_STEP_ID for every step; only with a PMI plugin can MPI wire up.
  if (has_env("SLURM_STEP_ID") && (has_env("PMI_FD") || has_env("PMI_JOBID"))) return "slurm";
  if (has_env("PMI_RANK") || has_env("PMI_SIZE")) return "pmi";  // Hydra (MPICH), PMI-1
  return "";
}

RankInfo bootstrap(int* argc, char*** argv, bool force_mpi) {
  if (force_mpi || !detect_launcher().empty()) return bootstrap_mpi(argc, argv);
  return bootstrap_single();
}

std::vector<std::string> gather_node_gpu_ids(const RankInfo& info, const std::string& id,
                                             std::vector<int>* world_ranks) {
  std::vector<int> ranks{info.rank};
  std::vector<std::string> ids{id};
  if (info.mpi && info.local_world > 1) {
    struct Entry {
      int world_rank;
      char id[60];
    };
    Entry mine{};
    mine.world_rank = info.rank;
    NCF_CHECK(id.size() < sizeof mine.id, "GPU identity '", id, "' is longer than ",
              sizeof mine.id - 1, " characters");
    id.copy(mine.id, id.size());
    // The node communicator again (bootstrap_mpi freed its own): the same split and
    // key, so the ranks come back in local rank order.
    struct NodeComm {
      MPI_Comm c = MPI_COMM_NULL;
      ~NodeComm() {
        if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
      }
    } node;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL,
                                  &node.c));
    int size = 0;
    MPI_CHECK(MPI_Comm_size(node.c, &size));
    NCF_CHECK(size == info.local_world, "the node communicator has ", size,
              " ranks, bootstrap counted ", info.local_world);
    std::vector<Entry> all(static_cast<size_t>(size));
    MPI_CHECK(MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, all.data(), int(sizeof mine),
                            MPI_BYTE, node.c));
    NCF_CHECK(all[size_t(info.local_rank)].world_rank == info.rank, "local rank ", info.local_rank,
              " is world rank ", all[size_t(info.local_rank)].world_rank, ", bootstrap said ",
              info.rank);
    ranks.clear();
    ids.clear();
    for (const Entry& e : all) {
      ids.push_back(std::string(e.id, strnlen(e.id, sizeof e.id)));
      ranks.push_back(e.world_rank);
    }
  }
  if (world_ranks) *world_ranks = ranks;
  return ids;
}

int select_local_gpu(const RankInfo& info) {
#ifdef NCF_WITH_CUDA
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  NCF_CHECK(e == cudaSuccess && count > 0, "no usable GPU on this node for local rank ",
            info.local_rank, ": ", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
  // local_rank % count is right both when every rank sees all of the node's GPUs
  // (local rank l takes GPU l) and when the launcher gave each rank its own (each
  // sees one: device 0). Whether ranks share a GPU is read from the bus ids.
  const int gpu = info.local_rank % count;
  e = cudaSetDevice(gpu);
  NCF_CHECK(e == cudaSuccess, "cudaSetDevice(", gpu, "): ", cudaGetErrorString(e));
  // The PCI bus id ("0000:1b:00.0") is one string for one physical GPU whatever
  // ordinal CUDA_VISIBLE_DEVICES gave it in each process; NCCL tells GPUs apart by it too.
  char bus_id[64] = {};
  e = cudaDeviceGetPCIBusId(bus_id, int(sizeof bus_id), gpu);
  NCF_CHECK(e == cudaSuccess, "cudaDeviceGetPCIBusId(", gpu, "): ", cudaGetErrorString(e));
  LocalGpu me;
  me.device = gpu;
  me.id = bus_id;
  const std::vector<std::string> ids = gather_node_gpu_ids(info, me.id, &me.world_ranks);
  me.sharing = gpu_sharing(ids, ids.size() > 1 ? info.local_rank : 0);
  // NCCL's own view: the same GPU is shared only among ranks of one NCCL host id.
  const std::string key = nccl_host_key(std::getenv("NCCL_HOSTID"));
  const std::vector<std::string> keys = gather_node_gpu_ids(info, key.empty() ? "-" : key, nullptr);
  me.nccl_sharing = nccl_gpu_sharing(ids, keys, ids.size() > 1 ? info.local_rank : 0);
  set_local_gpu(me);
  return gpu;
#else
  NCF_FAIL("select_local_gpu: this build has no CUDA backend (configure with -DNCF_CUDA=ON)");
#endif
}

std::unique_ptr<Communicator> make_communicator(const RankInfo& info, Device device,
                                                const std::string& kind, void* stream) {
  std::string k = kind;
  if (k == "auto") {
    if (info.world == 1)
      k = "single";
    else
      k = device == Device::kCuda ? "nccl" : "mpi";
  }
  if (k == "single") {
    NCF_REQUIRE(info.world == 1, "flag --comm single runs one rank, this job has W = ", info.world,
                ": use --comm mpi (or auto)");
    return std::make_unique<SingleCommunicator>(device, stream);
  }
  if (k == "mpi") {
    NCF_CHECK(info.mpi, "communicator 'mpi' needs MPI: start the process with bootstrap_mpi");
    return std::make_unique<MpiCommunicator>(info);
  }
  if (k == "nccl") {
    NCF_CHECK(device == Device::kCuda, "communicator 'nccl' needs device cuda, got ",
              device_name(device));
#ifdef NCF_WITH_CUDA
    NCF_CHECK(info.world == 1 || info.mpi, "communicator 'nccl' with W = ", info.world,
              " needs MPI to share the NCCL id");
    select_local_gpu(info);
    return make_nccl_communicator(info, stream);
#else
    NCF_FAIL("communicator 'nccl': this build has no CUDA backend (configure with -DNCF_CUDA=ON)");
#endif
  }
  NCF_FAIL("unknown communicator kind '", kind, "' (expected auto, mpi, nccl or single)");
}

namespace {

int mpi_world_if_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return 0;
  int w = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &w);
  return w;
}

// The one way out after a failure: with W > 1 the peers may be blocked in a collective
// that this rank will never join, so only MPI_Abort ends the job promptly.
int fail(const char* program, const std::string& what, int code) {
  if (!what.empty()) {
    // ncf::Error carries the rank already; other exceptions get it here.
    if (error_rank() >= 0 && what.rfind("[rank ", 0) != 0)
      std::fprintf(stderr, "%s: error: [rank %d] %s\n", program, error_rank(), what.c_str());
    else
      std::fprintf(stderr, "%s: error: %s\n", program, what.c_str());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  // The other ranks learn that this one ends with an error before the launcher takes
  // them down, so that none reports another as lost on the way.
  announce_job_ending(what.empty() ? "exit code " + std::to_string(code) : what);
  const int w = mpi_world_if_running();
  if (w > 1) MPI_Abort(MPI_COMM_WORLD, code);
  if (w == 1) MPI_Finalize();
  return code;
}

}  // namespace

int run_main(int argc, char** argv, const std::function<int(int& argc, char**& argv)>& body,
             const char* program) {
  int code = 0;
  try {
    code = body(argc, argv);
  } catch (const std::exception& e) {
    return fail(program, e.what(), 1);
  } catch (...) {
    return fail(program, "unknown exception", 1);
  }
  if (code != 0 && code != kExitPreempted) return fail(program, "", code);
  stop_peer_watch();  // goodbye to the neighbours: this rank is not lost
  if (mpi_world_if_running() > 0) MPI_Finalize();
  return code;
}

RankRuntime::RankRuntime(int* argc, char*** argv, const std::string& device_flag,
                         const std::string& comm_kind, int threads, int ranks_per_node) {
  Device device = Device::kCpu;
  std::string why;
  const bool gpu = device_flag != "cpu" && cuda_available(&why);
  if (device_flag == "cuda") {
    if (!gpu) NCF_FAIL("--device cuda: no usable GPU (", why, ")");
    device = Device::kCuda;
  } else if (device_flag != "auto" && device_flag != "cpu") {
    NCF_FAIL("flag --device: unknown device '", device_flag, "' (expected auto, cpu or cuda)");
  }
  info = bootstrap(argc, argv, comm_kind == "mpi");
  if (device_flag == "auto") {
    // One device for the whole job: the lowest rank without a GPU decides for all.
    int first_without = gpu ? info.world : info.rank;
    if (info.mpi && info.world > 1)
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &first_without, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
    if (first_without == info.world) {
      device = Device::kCuda;
      device_note = "--device auto: every rank sees a GPU";
    } else if (first_without == info.rank) {
      device_note = "--device auto: " + why +
                    (info.world > 1 ? std::string(", so every rank runs on the CPU") : "");
    } else {
      device_note = "--device auto: rank " + std::to_string(first_without) +
                    " sees no usable GPU, so every rank runs on the CPU";
    }
    if (device == Device::kCpu && comm_kind == "nccl")
      NCF_FAIL("flag --comm nccl needs GPU ranks, and ", device_note,
               "; use --comm mpi, or --device cuda on GPU nodes");
  }
  if (device == Device::kCuda) ctx = make_cuda_context(select_local_gpu(info));
  RankInfo declared = info;
  if (ranks_per_node > 0) {
    const int L = ranks_per_node, W = info.world;
    NCF_REQUIRE(W % L == 0, "flag --topology ranks_per_node=", L, ": the job's ", W,
                " ranks do not fill nodes of ", L, " ranks");
    declared.nodes.node_of.assign(size_t(W), 0);
    for (int r = 0; r < W; ++r) declared.nodes.node_of[size_t(r)] = r / L;
    const int found = info.nodes.node_of.empty() ? 1 : info.nodes.nodes();
    nodes_note = std::to_string(W / L) + " node" + (W / L == 1 ? "" : "s") + " x " +
                 std::to_string(L) + " rank" + (L == 1 ? "" : "s") +
                 ", declared by --topology ranks_per_node=" + std::to_string(L) + " (MPI finds " +
                 std::to_string(found) + " node" + (found == 1 ? "" : "s") + ")";
  }
  comm = make_communicator(declared, device, comm_kind, ctx.stream);
  ctx.device = device;
  threads_flag = threads;
  cpus = cpu_share(info.node_ranks_on);
  set_pool_cpus(cpus.owned ? cpus.cpus : std::vector<int>{});
  ctx.threads = threads > 0 ? threads : cpus.threads;
}

RankRuntime::~RankRuntime() {
  comm.reset();
  destroy_cuda_context(ctx);
}

CpuReport cpu_report(const RankRuntime& rt, const char* program) {
  enum { kThreads, kAllowed, kMachine, kLocal, kFields };
  const int mine[kFields] = {rt.ctx.threads, rt.cpus.allowed(), rt.cpus.machine,
                             rt.info.local_world};
  const int W = rt.info.world;
  std::vector<int> all(static_cast<size_t>(kFields) * W);
  if (rt.info.mpi && W > 1)
    MPI_CHECK(MPI_Gather(mine, kFields, MPI_INT, all.data(), kFields, MPI_INT, 0, MPI_COMM_WORLD));
  else
    std::copy(mine, mine + kFields, all.begin());
  CpuReport report;
  if (rt.info.rank != 0) return report;
  auto at = [&](int r, int field) { return all[static_cast<size_t>(r) * kFields + field]; };
  auto range = [&](int field) {
    int lo = at(0, field), hi = lo;
    for (int r = 1; r < W; ++r) lo = std::min(lo, at(r, field)), hi = std::max(hi, at(r, field));
    return lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
  };
  report.summary = range(kThreads) + " threads/rank (affinity " + range(kAllowed) + " of " +
                   range(kMachine) + " cores)";
  // The rank with the fewest CPUs among those a condition holds for, and how many hold it.
  auto worst = [&](const std::function<bool(int)>& cond, int* count) {
    int pick = -1;
    *count = 0;
    for (int r = 0; r < W; ++r)
      if (cond(r)) {
        ++*count;
        if (pick < 0 || at(r, kAllowed) < at(pick, kAllowed)) pick = r;
      }
    return pick;
  };
  auto alike = [&](int count) {
    return W > 1 ? "; " + std::to_string(count) + " of " + std::to_string(W) + " ranks likewise"
                 : std::string();
  };
  int n = 0;
  const int flag = rt.threads_flag;
  int r = worst([&](int q) { return flag > at(q, kAllowed); }, &n);
  if (r >= 0)
    report.warnings.push_back(std::string(program) + ": warning: --threads " +
                              std::to_string(flag) + " is more than the " +
                              std::to_string(at(r, kAllowed)) + " core(s) rank " +
                              std::to_string(r) + " may run on (its affinity mask" + alike(n) +
                              "): threads will take turns on a core");
  auto share = [&](int q) { return std::max(1, at(q, kMachine) / std::max(1, at(q, kLocal))); };
  r = worst([&](int q) { return at(q, kAllowed) < share(q); }, &n);
  if (r >= 0)
    report.warnings.push_back(
        std::string(program) + ": note: rank " + std::to_string(r) + " is bound to " +
        std::to_string(at(r, kAllowed)) + " of the machine's " + std::to_string(at(r, kMachine)) +
        " cores, fewer than its share (" + std::to_string(share(r)) + " = cores / " +
        std::to_string(at(r, kLocal)) + " rank(s) on the node" + alike(n) +
        "); Open MPI's default for -np <= 2 binds each rank to one core. Give it more with "
        "`mpirun --bind-to none` or `mpirun --map-by slot:PE=" +
        std::to_string(share(r)) + " --bind-to core` (what launch/ncf_launch passes)");
  return report;
}

}  // namespace ncf
