// Process start-up and shut-down for every ncf_dist main: MPI initialisation, rank and
// node-local rank, GPU choice, the Communicator for a run, and the error path that
// takes a multi-rank job down instead of leaving ranks waiting in a collective.
//
//   int main(int argc, char** argv) {
//     return ncf::run_main(argc, argv, [](int& argc, char**& argv) {
//       ncf::RankInfo info = ncf::bootstrap(&argc, &argv);
//       auto comm = ncf::make_communicator(info, ncf::Device::kCpu, "auto");
//       ...                       // throw ncf::Error on any rank: the job stops
//       return 0;                 // run_main finalizes MPI after the body returns
//     });
//   }
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "common/affinity.h"
#include "common/device.h"

namespace ncf {

struct RankInfo {
  int rank = 0;
  int world = 1;        // W
  int local_rank = 0;   // rank among the ranks sharing this node (picks the GPU)
  int local_world = 1;  // ranks on this node
  bool mpi = false;     // MPI is initialised (bootstrap_mpi), so MPI communicators work
  NodeMap nodes;        // every rank's node (empty: one node); what two-hop exchanges follow
  // Per CPU id: how many of this node's ranks may run on it (their affinity masks);
  // empty without MPI. What the default thread count divides CPUs by (common/affinity.h).
  std::vector<int> node_ranks_on;
};

// MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI) unless MPI is
// already up, then world rank/size and the node-local rank from
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), and every rank's node (nodes numbered
// by their lowest rank) from an allgather of those groups, and how many of the node's
// ranks may run on each CPU (a sum of their affinity masks). Works under mpirun,
// srun --mpi=pmix, and as a plain process (Open MPI's singleton init gives W = 1). Sets
// the rank shown in ncf::Error messages. argc/argv may be null.
RankInfo bootstrap_mpi(int* argc, char*** argv);
// W = 1 without touching MPI.
RankInfo bootstrap_single();

// The launcher that started this process, read from the variables it gives each
// rank: "open-mpi" (OMPI_COMM_WORLD_SIZE / _RANK), "pmix" (PMIX_RANK), "slurm"
// (SLURM_STEP_ID with PMI_FD or PMI_JOBID: srun --mpi=pmi2), "pmi" (PMI_RANK or
// PMI_SIZE: MPICH's Hydra and other PMI-1 launchers); "" for a plain process.
std::string detect_launcher();

// The start-up every main uses: bootstrap_mpi when detect_launcher() finds a
// launcher, else bootstrap_single. A plain `ncf_dist ...` therefore never calls
// MPI_Init: Open MPI's singleton init would need its launcher daemon (orted), which
// a bare GPU box with the MPI libraries unpacked in a prefix may not be able to
// start (MPI_Init then aborts or hangs). force_mpi (the user asked for MPI, e.g.
// --comm mpi) takes bootstrap_mpi even without a launcher: a singleton W = 1 job
// when MPI can start one, MPI's own error otherwise.
RankInfo bootstrap(int* argc, char*** argv, bool force_mpi = false);

// The identities of the GPUs the node's ranks took, in local rank order: each rank
// passes its own (select_local_gpu: the PCI bus id); *world_ranks (if given) gets
// their world ranks. With MPI and several ranks on the node it is collective over
// MPI_COMM_WORLD (the node communicator is split again); otherwise it returns {id}.
std::vector<std::string> gather_node_gpu_ids(const RankInfo& info, const std::string& id,
                                             std::vector<int>* world_ranks = nullptr);

// Makes the current CUDA device local_rank % (GPUs this process sees) and returns it;
// call it before creating the streams and buffers that the NCCL communicator will use.
// That choice is right whether every rank sees all of the node's GPUs or the launcher
// gave each rank its own (it then sees one, device 0). With MPI and several ranks on
// the node it is collective over MPI_COMM_WORLD: the node's ranks gather their GPUs'
// PCI bus ids and record which of them share one GPU (common/gpu_identity.h), for
// the memory guard and the NCCL communicator. Throws in builds without CUDA or when
// no GPU answers.
int select_local_gpu(const RankInfo& info);

// kind:
//   "single"  W = 1 only; buffers on `device`.
//   "mpi"     host buffers (device() is kCpu whatever `device` is: GPU ranks stage
//             through the host); needs MPI (bootstrap_mpi, or bootstrap with force_mpi).
//   "nccl"    CUDA builds, device kCuda: selects the local GPU (select_local_gpu),
//             refuses a node where two ranks share one GPU (naming them and the
//             GPU's bus id), rank 0 makes the NCCL id, MPI_Bcast, ncclCommInitRank;
//             collectives are ordered with the compute stream `stream` (a
//             cudaStream_t, nullptr = default stream) and run on a communication
//             stream of their own.
//   "auto"    single when W = 1 (no NCCL set-up, no copies through a communicator);
//             else kCuda -> nccl, kCpu -> mpi.
std::unique_ptr<Communicator> make_communicator(const RankInfo& info, Device device,
                                                const std::string& kind = "auto",
                                                void* stream = nullptr);

// A rank's start in a program's main, after its flags: the device chosen, bootstrap
// (MPI only under a launcher or with comm_kind "mpi"), the local GPU's context, the
// communicator, and the CPU kernel threads: `threads`, or 0 for the rank's share of the
// CPUs its affinity mask allows (default_threads: each CPU divided among the node's
// ranks that may run on it). The pool pins its workers to the mask when the rank owns
// it. The communicator goes before the context.
//
// device_flag (the programs' --device):
//   "cuda"  a GPU per rank; a rank without a usable GPU is an error naming why.
//   "cpu"   CPU ranks.
//   "auto"  CUDA when the build has it and every rank sees a GPU, else CPU for every
//           rank (one device for the job: the communicator and the trajectory need
//           it); device_note says which and why, for the program's start-up line.
//           comm_kind "nccl" with no GPU is an error naming both flags.
struct RankRuntime {
  RankInfo info;
  ExecContext ctx;
  std::unique_ptr<Communicator> comm;
  CpuShare cpus;            // this rank's mask, the machine's CPUs, the default thread count
  int threads_flag = 0;     // `threads` as given (0: the default)
  std::string device_note;  // "--device auto: ..." (empty for an explicit device)
  std::string nodes_note;   // "2 nodes x 2 ranks, declared ... (MPI finds 1 node)"; empty: MPI's
  // ranks_per_node > 0 declares nodes of that many consecutive ranks for the
  // communicator (--topology ranks_per_node; W must be a multiple of it, else an
  // error naming the flag and both values); info.nodes keeps what MPI found.
  RankRuntime(int* argc, char*** argv, const std::string& device_flag, const std::string& comm_kind,
              int threads, int ranks_per_node = 0);
  ~RankRuntime();
  RankRuntime(const RankRuntime&) = delete;
  RankRuntime& operator=(const RankRuntime&) = delete;
};

// What a program says about its ranks' CPUs at start. Collective under MPI (every
// rank calls it; only rank 0's result is filled in): `summary` reads "2 threads/rank
// (affinity 2 of 2 cores)" (ranges "1-2" when the ranks differ); `warnings` has one
// line when --threads asks for more threads than a rank's mask holds, and one when a
// rank was bound to fewer cores than the machine's cores / its node's ranks, saying how
// to give it more. `program` opens each warning.
struct CpuReport {
  std::string summary;
  std::vector<std::string> warnings;
};
CpuReport cpu_report(const RankRuntime& rt, const char* program);

// The exit code of a run that stopped on a signal (SIGTERM, SIGUSR1) after
// writing its checkpoint: "resume me". Every rank returns it; run_main then
// ends MPI normally instead of aborting the job.
constexpr int kExitPreempted = 75;

// Runs body(argc, argv) and turns every way it can fail into one clear stop:
//  - an exception (ncf::Error or other) is printed once as "<program>: error: <what>"
//    on stderr by the rank that threw; with W > 1 that rank calls
//    MPI_Abort(MPI_COMM_WORLD, 1) so that the ranks waiting for it do not hang;
//    with W = 1 the result is exit code 1;
//  - a non-zero return with W > 1 also aborts the job (the other ranks may be inside a
//    collective), with that code — except kExitPreempted, which every rank returns
//    together: MPI is finalized and the code returned;
//  - on success MPI is finalized if the body left it initialised; a body that never
//    started MPI (bootstrap_single) leaves it alone on every path.
// Returns the exit code for main.
int run_main(int argc, char** argv, const std::function<int(int& argc, char**& argv)>& body,
             const char* program = "ncf_dist");

}  // namespace ncf
